"""PROTECTED: dask_worker_shards.py with the recipe of docs/scaling.md ("dask
distributed"): a ``WorkerPlugin`` whose ``setup`` (on the worker's main thread, in every
worker, those the nanny starts later included) turns SIGTERM into exitsafe's teardown:

    class ExitsafeSignals(WorkerPlugin):
        def setup(self, worker):
            teardown_on_signals("SIGTERM", mode="immediate")

    client.register_plugin(ExitsafeSignals(), name="exitsafe-signals")

A worker sent SIGTERM (``kill``, a container stop, the nanny's memory monitor) then closes
its shard and writes its ledger before it dies by SIGTERM; the nanny starts a new one.
``close`` and ``restart`` need nothing (the worker process exits normally and exitsafe's
exit teardown runs there).  ``crash`` (``os._exit``) is not covered: nothing runs.
Every shard reads back for ``close``, ``restart`` and ``sigterm``.  Exit 0.
"""

import sys

from dask_worker_shards import main
from distributed import WorkerPlugin

from exitsafe.signals import teardown_on_signals


class ExitsafeSignals(WorkerPlugin):
    """SIGTERM runs the worker's exitsafe teardown (then the worker dies by it)."""

    def setup(self, worker) -> None:
        teardown_on_signals("SIGTERM", mode="immediate")


def register(client) -> None:
    client.register_plugin(ExitsafeSignals(), name="exitsafe-signals")


if __name__ == "__main__":
    sys.exit(main(register))
