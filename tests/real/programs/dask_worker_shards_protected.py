"""PROTECTED: dask_worker_shards.py with the recipe of docs/scaling.md ("dask
distributed"): a ``WorkerPlugin`` whose ``setup`` (on the worker's main thread, in every
worker, those the nanny starts later included) turns SIGTERM into exitsafe's teardown:

    class ExitsafeSignals(WorkerPlugin):
        def setup(self, worker):
            teardown_on_signals("SIGTERM", mode="immediate", watch=True)

    client.register_plugin(ExitsafeSignals(), name="exitsafe-signals")

A worker sent SIGTERM (``kill``, a container stop, the nanny's memory monitor) then closes
its shard and writes its ledger before it dies by SIGTERM; the nanny starts a new one.
``watch=True``: the nanny's memory monitor sends SIGKILL at its next look (100 ms) if the
worker is still there, and the SIGTERM often reaches a thread other than the main one,
which waits in the event loop until its next timer: without the watcher, which wakes it,
the SIGKILL came first in 7 runs of 12 (four programs at a time on 2 cores, CPython 3.13);
with it, 12 of 12.  Under more load 100 ms is still too short for a process to be
scheduled at all (6 runs of 18 lost with six programs at a time on 3.11), so the
program also gives the teardown 1 s: ``distributed.worker.memory.monitor-interval``,
set where the nannies run, 18 of 18 under the same load.  (The workers then also look at
their own memory once a second, for spilling and pausing.)
``close`` and ``restart`` need nothing (the worker process exits normally and exitsafe's
exit teardown runs there).  ``crash`` (``os._exit``) is not covered: nothing runs.
Every shard reads back for ``close``, ``restart`` and ``sigterm``.  Exit 0.
"""

import sys

import dask
from dask_worker_shards import main
from distributed import WorkerPlugin

from exitsafe.signals import teardown_on_signals


class ExitsafeSignals(WorkerPlugin):
    """SIGTERM runs the worker's exitsafe teardown (then the worker dies by it)."""

    def setup(self, worker) -> None:
        teardown_on_signals("SIGTERM", mode="immediate", watch=True)


def register(client) -> None:
    client.register_plugin(ExitsafeSignals(), name="exitsafe-signals")


if __name__ == "__main__":
    # the nanny's next look, and its SIGKILL, 1 s after its SIGTERM (not 100 ms): set where
    # the nannies run (here, the cluster's process); see the docstring
    dask.config.set({"distributed.worker.memory.monitor-interval": "1s"})
    sys.exit(main(register))
