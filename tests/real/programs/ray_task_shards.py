"""Ray tasks: a task opens an HDF5 shard (``shard-<pid>.h5``) in the worker process that runs
it, adopts it (``exitsafe.adopt(f, close="close")``) and keeps it in a module global for
the tasks that worker runs next (a worker process is reused from task to task), as a task
keeps a model or a device context.  After the run the driver reads every shard back.  A
shard whose file was never closed reads back as unreadable (HDF5's superblock is written
at close).

One driver (``ray.init(address="local", num_cpus=1)``) runs one task per way its worker
ends, each in a worker of its own, in this order:

* ``max_calls``: the task is declared ``max_calls=1``: its worker exits once it has run it
  (the recipe of docs/scaling.md for a task that keeps a native object);
* ``cancel``: ``ray.cancel(ref, force=True)`` while the task runs (Ray's force exit);
* ``shutdown``: the worker is idle, its shard open, when the driver calls
  ``ray.shutdown()`` (the raylet force-exits the job's workers).

Printed for each: ``task worker ended by HOW: shard readable|unreadable, ledger
released|none``, then ``shards N, unreadable M``; exit 1 if a shard is unreadable.  Each
worker writes its own ledger (``<dir>/ledger-{pid}.json``, set before ``ray.init`` as in
``ray_actor_shards.py``).  ``SHARD_HANG=1``: as there.
"""

import os
import shutil
import sys
import tempfile
import time

import ray
from ray_actor_shards import report, start_ray, wait_gone
from shards import adopt_shard, write_row

import exitsafe  # noqa: F401  (imported first, as the quick start says; shards adopts)

_shard = None


def write(directory: str, start: int, hold: bool = False) -> int:
    """Write 20 rows to this worker's shard (opened and adopted by its first task);
    ``hold``: then say so in a file and sleep (until the driver cancels the task)."""
    global _shard
    if _shard is None:
        _shard = adopt_shard(directory)
    for i in range(start, start + 20):
        write_row(_shard, i)
    if hold:
        open(os.path.join(directory, f"holding-{os.getpid()}"), "w").close()
        time.sleep(120)  # (a bound for a broken run: the driver cancels it long before)
    return os.getpid()


def holding(directory: str, limit: float = 60.0) -> int:
    """The pid of the worker whose task holds (see ``write``), once it does."""
    deadline = time.monotonic() + limit  # (a bound for a broken run, not a timing)
    while time.monotonic() < deadline:
        marks = [n for n in os.listdir(directory) if n.startswith("holding-")]
        if marks:
            return int(marks[0].split("-")[1])
        time.sleep(0.02)
    raise SystemExit("the task to cancel never started")


def main() -> int:
    directory = tempfile.mkdtemp()
    ended = {}  # pid -> how its worker ended
    try:
        start_ray(directory)
        task = ray.remote(num_cpus=1, max_retries=0)(write)
        # (max_calls is fixed where the task is declared: Ray refuses it in .options())
        once = ray.remote(num_cpus=1, max_retries=0, max_calls=1)(write)

        pid = ray.get(once.remote(directory, 0))
        wait_gone(pid, "max_calls")
        ended[pid] = "max_calls"

        ref = task.remote(directory, 20, True)
        pid = holding(directory)
        ray.cancel(ref, force=True)
        wait_gone(pid, "cancel")
        ended[pid] = "cancel"

        pid = ray.get(task.remote(directory, 40))
        ray.shutdown()
        wait_gone(pid, "shutdown")
        ended[pid] = "shutdown"

        bad = report(ended, directory, "task worker")
    finally:
        ray.shutdown()
        shutil.rmtree(directory)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
