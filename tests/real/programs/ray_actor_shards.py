"""Ray: each actor opens its own HDF5 shard (``shard-<pid>.h5``) with h5py, adopts it
(``exitsafe.adopt(f, close="close")``) and writes rows to it; each actor is then ended a
different way, and after the run the driver reads every shard back.  A shard whose file was
never closed reads back as unreadable (HDF5's superblock is written at close).

One driver (``ray.init(address="local", num_cpus=1)``) runs one actor per way an actor
ends, chosen with ``RAY_END`` (comma-separated, default all of them, in this order):

* ``scope``: the driver drops its last handle (``del actor``): Ray 2.60 ends the actor
  gracefully (its ``__ray_shutdown__`` hook, then the process exits), Ray 2.51
  force-exits it;
* ``terminate``: ``actor.__ray_terminate__.remote()``: a task that calls ``exit_actor()``;
* ``exit_actor``: the actor calls ``ray.actor.exit_actor()`` itself;
* ``kill``: ``ray.kill(actor)`` (Ray's force exit: the worker ``_exit``\\ s);
* ``crash``: the actor reads address 0 (``ctypes.string_at(0)``: SIGSEGV);
* ``shutdown``: the actor still runs when the driver calls ``ray.shutdown()``.

Printed for each actor: ``actor ended by HOW: shard readable|unreadable, ledger
released|none``, then ``shards N, unreadable M``; exit 1 if a shard is unreadable.  Each
worker writes its own ledger (``EXITSAFE_LEDGER``, set here to ``<dir>/ledger-{pid}.json``
before ``ray.init``, so that the raylet and the workers it starts inherit it):
``released`` when it records the shard released.  ``SHARD_HANG=1``: each actor also adopts,
before its shard, an object whose close never returns (``shards.Stuck``), which its ledger
must then record ``leaked_timeout``.

Measured (tests/real/test_scaling_ray.py, docs/scaling.md "Ray"): ``terminate`` and
``exit_actor`` read back and the worker's ledger records the shard released, and so does
``scope`` with Ray 2.60 (CPython 3.10+), not with Ray 2.51 (3.9); ``kill``, ``crash`` and
``shutdown`` leave the shard unreadable and no ledger.  ``ray_actor_shards_protected.py``
adds actors ended with the recipe (``__ray_terminate__`` first).
"""

import ctypes
import os
import shutil
import sys
import tempfile
import time

import ray
from shards import adopt_shard, read_back, shard_path, write_row

import exitsafe  # noqa: F401  (imported first, as the quick start says; shards adopts)

HERE = os.path.dirname(os.path.abspath(__file__))
ENDS = ("scope", "terminate", "exit_actor", "kill", "crash", "shutdown")


class Shard:
    """An actor with its own adopted HDF5 shard."""

    def __init__(self, directory: str) -> None:
        self.shard = adopt_shard(directory)

    def write(self, start: int) -> int:
        for i in range(start, start + 20):
            write_row(self.shard, i)
        return os.getpid()

    def leave(self) -> None:
        ray.actor.exit_actor()

    def crash(self) -> None:
        ctypes.string_at(0)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, how: str) -> None:
    deadline = time.monotonic() + 60  # (a bound for a broken run, not a timing)
    while alive(pid):
        if time.monotonic() > deadline:
            raise SystemExit(f"the actor ended by {how} (pid {pid}) did not go away")
        time.sleep(0.02)


def start_ray(directory: str) -> None:
    """``ray.init`` a local node of one CPU whose workers import this directory's modules
    (and exitsafe) and write their ledgers to ``directory/ledger-{pid}.json``; the driver's
    own ``EXITSAFE_LEDGER`` is left as it was."""
    # inherited by the raylet and the workers it starts: exitsafe, and each one's ledger
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH")) if p
    )
    own_ledger = os.environ.get("EXITSAFE_LEDGER")
    os.environ["EXITSAFE_LEDGER"] = os.path.join(directory, "ledger-{pid}.json")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", configure_logging=False)
    if own_ledger is None:
        del os.environ["EXITSAFE_LEDGER"]
    else:
        os.environ["EXITSAFE_LEDGER"] = own_ledger


def report(ended: dict, directory: str, what: str) -> int:
    """Read back the shard and ledger of each worker of ``ended`` (pid -> how it ended) and
    print ``<what> ended by HOW: ...`` for each, then the totals; how many were unreadable."""
    bad = 0
    for pid, how in ended.items():
        ok, read = read_back(shard_path(directory, pid), pid, directory)
        bad += not ok
        print(f"{what} ended by {how}: {read}", flush=True)
    print(f"shards {len(ended)}, unreadable {bad}", flush=True)
    return bad


def main(recipe=None) -> int:
    """The run.  ``recipe(actor)``, if given (the protected program's), is run before the
    driver ends the actors of ``RAY_RECIPE`` (comma-separated ways, default ``scope,kill,
    shutdown``): each such way then gets a second actor, printed as ``HOW+recipe``."""
    ends = [e for e in os.environ.get("RAY_END", ",".join(ENDS)).split(",") if e]
    unknown = set(ends) - set(ENDS)
    if recipe is not None:
        recipe_ends = [e for e in os.environ.get("RAY_RECIPE", "scope,kill,shutdown")
                       .split(",") if e]
        unknown |= set(recipe_ends) - set(ENDS)
        ends += [f"{how}+recipe" for how in recipe_ends]
    if unknown:
        raise SystemExit(f"unknown RAY_END or RAY_RECIPE {sorted(unknown)}")
    directory = tempfile.mkdtemp()
    ended = {}  # pid -> how its actor ended
    try:
        start_ray(directory)
        # (num_cpus=0: every actor runs at once on the one CPU the node has)
        remote = ray.remote(num_cpus=0, max_restarts=0)(Shard)
        actors = {how: remote.remote(directory) for how in ends}
        pids = dict(zip(ends, ray.get([actors[how].write.remote(0) for how in ends])))
        last = [how for how in ends if how.startswith("shutdown")]
        for how in [how for how in ends if how not in last] + last:
            if how.endswith("+recipe"):
                recipe(actors[how])
            if how.startswith("shutdown"):
                continue
            actor = actors.pop(how)
            way = how.split("+")[0]
            if way == "scope":
                del actor
            elif way == "terminate":
                actor.__ray_terminate__.remote()
            elif way == "exit_actor":
                actor.leave.remote()
            elif way == "kill":
                ray.kill(actor)
            elif way == "crash":
                actor.crash.remote()
            wait_gone(pids[how], how)
            ended[pids[how]] = how
        ray.shutdown()
        for how in last:
            wait_gone(pids[how], how)
            ended[pids[how]] = how
        bad = report(ended, directory, "actor")
    finally:
        ray.shutdown()
        shutil.rmtree(directory)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
