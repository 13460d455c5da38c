"""dask distributed: each nanny worker of a ``LocalCluster(processes=True)`` opens its own
HDF5 shard (``shard-<pid>.h5``; Parquet under ``SHARD_FORMAT=parquet``: see ``shards.py``)
in a ``WorkerPlugin``'s ``setup``, adopts it
(``exitsafe.adopt(f, close="close")``) and writes rows to it from tasks; after the run the
client reads every shard back.  A shard whose file was never closed reads back as
unreadable (HDF5's superblock is written at close).

How the workers end is chosen with ``DASK_END``, one step or several in order
(``restart,sigterm,crash``), the last workers then closed:

* ``close`` (default): ``with Client(cluster)`` / ``with LocalCluster(...)``: the nanny asks
  each worker to close, the worker process returns and exits normally;
* ``restart``: ``client.restart()``: the nanny asks the workers to stop and starts new ones;
* ``sigterm``: one worker process is sent SIGTERM (as by ``kill``, a container stop or a
  supervisor); the nanny starts a new one;
* ``crash``: one worker calls ``os._exit(1)`` (a crash: nothing runs in that process);
* ``memory``: a task on one worker holds more memory than the worker's limit (the cluster
  gets ``memory_limit=MEMORY_LIMIT``): the nanny's own memory monitor sends it SIGTERM,
  and SIGKILL at its next look (``monitor-interval``, 100 ms by default) if the process
  is still there; the nanny starts a new one.

Printed for each worker process: ``worker ended by HOW: shard readable|unreadable, ledger
released|none``, then ``shards N, unreadable M``; exit 1 if a shard is unreadable.  With
``EXITSAFE_LEDGER=ledger-{pid}.json`` (cwd: the run's directory) each worker writes its own
ledger: ``released`` when it records the shard released.  One worker (``DASK_WORKERS``).
``SHARD_HANG=1``: each worker also adopts, before its shard, an object whose close never
returns (``shards.Stuck``), which its ledger must then record ``leaked_timeout``.

Measured (tests/real/test_scaling_dask.py, docs/scaling.md): ``close`` and ``restart``
read every shard back, the workers' exitsafe teardown ran (their ledgers record it);
``sigterm`` and ``crash`` leave the dead worker's shard unreadable, and no ledger.
``dask_worker_shards_protected.py`` runs the same with the recipe's ``WorkerPlugin``.
"""

import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np
from distributed import Client, LocalCluster, WorkerPlugin, get_worker
from shards import adopt_shard, read_back, shard_path, write_row

import exitsafe  # noqa: F401  (imported first, as the quick start says; shards adopts)

HERE = os.path.dirname(os.path.abspath(__file__))


class ShardPlugin(WorkerPlugin):
    """Each worker's shard, opened in ``setup`` (in every worker, those the nanny starts
    later included) and adopted; kept on the plugin, not on the ``Worker``: see
    docs/scaling.md."""

    name = "shard"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.shard = None

    def setup(self, worker) -> None:
        self.shard = adopt_shard(self.directory)


def write(i: int) -> int:
    write_row(get_worker().plugins["shard"].shard, i)
    return os.getpid()


def crash() -> None:
    os._exit(1)


#: the workers' memory limit when a run has a ``memory`` step (the nanny's monitor ends a
#: worker above 95 % of it, dask's default ``memory.terminate``); a worker with its shard
#: open and nothing else uses about 150 MiB
MEMORY_LIMIT = 600 * 2**20


def hog() -> None:
    """Hold more memory than the worker's limit (touched, so resident) until the nanny's
    monitor ends the worker."""
    block = np.ones(MEMORY_LIMIT + 100 * 2**20, dtype=np.uint8)
    time.sleep(120)  # (a bound for a broken run: the nanny ends the worker long before)
    del block


def pids(client) -> dict:
    return client.run(os.getpid)  # address -> pid


def end_one(client, how: str, workers: int) -> int:
    """Send the first worker SIGTERM, make it crash, or make it go over its memory limit;
    wait for the nanny's new one."""
    victim, pid = sorted(pids(client).items())[0]
    doomed = None
    if how == "sigterm":
        os.kill(pid, signal.SIGTERM)
    else:  # (restricted to that worker: the task is not retried on another one)
        doomed = client.submit(crash if how == "crash" else hog, workers=[victim],
                               allow_other_workers=False, pure=False)
    deadline = time.monotonic() + 60  # (a bound for a broken run, not a timing)
    while victim in client.scheduler_info()["workers"]:
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker sent {how} did not go away")
        time.sleep(0.05)
    client.wait_for_workers(workers, timeout=60)
    if doomed is not None:
        doomed.release()
    return pid


def main(register=None) -> int:
    """The run; ``register(client)``, if given, is called first (the protected program
    registers its worker plugin there)."""
    steps = [s for s in os.environ.get("DASK_END", "close").split(",") if s != "close"]
    workers = int(os.environ.get("DASK_WORKERS", "1"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH")) if p
    )  # (inherited by the spawned workers: exitsafe, and the programs' modules)
    directory = tempfile.mkdtemp()
    ended = {}  # pid -> how its worker ended
    try:
        with LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
            silence_logs=50, **({"memory_limit": MEMORY_LIMIT} if "memory" in steps else {}),
        ) as cluster, Client(cluster) as client:
            if register is not None:
                register(client)
            client.register_plugin(ShardPlugin(directory))
            for n, how in enumerate(steps):
                client.gather(client.map(write, range(20 * n, 20 * n + 20)))
                if how == "restart":
                    ended.update(dict.fromkeys(pids(client).values(), how))
                    client.restart()
                elif how in ("sigterm", "crash", "memory"):
                    ended[end_one(client, how, workers)] = how
                else:
                    raise SystemExit(f"unknown DASK_END step {how!r}")
            client.gather(client.map(write, range(20 * len(steps), 20 * len(steps) + 20)))
            last = pids(client).values()
        ended.update(dict.fromkeys(last, "close"))
        bad = 0
        for pid, how in ended.items():
            ok, read = read_back(shard_path(directory, pid), pid)
            bad += not ok
            print(f"worker ended by {how}: {read}", flush=True)
        print(f"shards {len(os.listdir(directory))}, unreadable {bad}", flush=True)
    finally:
        shutil.rmtree(directory)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
