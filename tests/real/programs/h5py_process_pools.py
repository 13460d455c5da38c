"""PROTECTED: the workers of a standard-library process pool each write an HDF5 shard with
h5py (a Parquet one with pyarrow under ``SHARD_FORMAT=parquet``: see ``shards.py``),
opened and adopted by the pool's initializer, wrapped in the one line of the recipe of
docs/scaling.md, which turns SIGTERM into the worker's teardown and holds it back while the
initializer opens and adopts the shard:

    Pool(2, initializer=exitsafe.signals.pool_initializer(init), initargs=(directory,))

    h5py_process_pools.py ENGINE END [--plain] [--hang]

ENGINE is ``pool`` (``multiprocessing.Pool``) or ``executor``
(``concurrent.futures.ProcessPoolExecutor``); END is how the workers end:

* ``close``: ``pool.close(); pool.join()`` / ``executor.shutdown(wait=True)``, a normal end
  (exitsafe's teardown runs there without the recipe);
* ``cancel`` (executor): ``shutdown(wait=True, cancel_futures=True)`` with tasks queued;
* ``sigterm`` (executor): SIGTERM sent to every worker from outside;
* ``spawn-terminate`` (pool): the spawn start method, ``terminate()`` right after the work,
  when a worker may still be in its initializer (its first task done by the other one);
  a spawned worker has numpy's OpenBLAS threads, which take the SIGTERM a blocked main
  thread would not, so only ``exitsafe.signals.deferred()`` (inside ``pool_initializer``)
  keeps the teardown out from between the open and the adopt (blocking SIGTERM left 2
  shards of 16 unreadable);
* ``forkserver-terminate`` (pool): the same with the forkserver start method, the
  default on Linux from CPython 3.14.  After either, one line per worker says how it
  ended: ``worker ended by sigterm|itself: rows N, shard readable|unreadable|none``
  (``itself``: it took the pool's stop sentinel before the SIGTERM reached it);
* ``crash``: one task segfaults (``ctypes.string_at(0)``).  Nothing runs in that worker: its
  shard stays unreadable.  A ``Pool`` replaces it and is then terminated (``join()`` would
  wait for ever for the lost task); a ``ProcessPoolExecutor`` is broken and sends SIGTERM
  to the other workers itself.

``--plain``: the initializer not wrapped (the program without the recipe), for the tests'
controls.

``--hang``: each worker's initializer first adopts an object whose close never returns (a
release that hangs, as a driver call can), then the shard.  The teardown closes the shard
first (newest first), then waits on that close until ``EXITSAFE_TEARDOWN_TIMEOUT`` (which
the caller sets), abandons it and leaks it: the worker still ends, its shard reads back,
and its ledger says ``leaked_timeout`` for the object (named ``stuck``) and
``released_at_exit`` for the shard.

The parent then opens every shard but the crashed worker's, and the ledger each worker
wrote (``EXITSAFE_LEDGER=ledger-{pid}.json``, in the current directory) when it is set.
It prints ``shards N, unreadable M`` and exits 1 when a shard it should read is unreadable
or a ledger does not say ``released_at_exit``.

Signals are sent to idle workers only (each seen sleeping in the kernel).  A SIGTERM that
lands just before an idle worker blocks on its task queue's lock would not be acted on
until a second one came: ``watch=True`` wakes that wait (docs/fork.md).
"""

import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time

from shards import SUFFIX, Stuck, open_shard, readable, shard_path, write_row

import exitsafe
from exitsafe.signals import pool_initializer

_file = None


def init(directory: str, hang: bool = False) -> None:
    global _file
    if hang:  # (adopted first: the teardown reaches it after the shard)
        exitsafe.adopt(Stuck(), name="stuck")
    _file = open_shard(directory)
    exitsafe.adopt(_file, close="close", name="shard")


def initializer():
    """The recipe's one line: the pool's initializer wrapped (``--plain``: not)."""
    return init if "--plain" in sys.argv[3:] else pool_initializer(init)


def initargs(directory: str) -> tuple:
    return (directory, "--hang" in sys.argv[3:])


def work(i: int) -> int:
    write_row(_file, i)
    return os.getpid()


def slow(i: int) -> int:
    time.sleep(0.05)
    return work(i)


def crash(directory: str) -> None:
    write_row(_file, -1)
    open(os.path.join(directory, f"crashed-{os.getpid()}"), "w").close()
    ctypes.string_at(0)  # SIGSEGV


def idle(pids: list, limit: float = 20.0) -> None:
    """Wait until every worker has been sleeping in the kernel (blocked on its task queue)
    for 0.2 s in a row, or is dead, at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    calm = 0
    while calm < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
        states = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    states.append(stat.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                states.append("gone")
        calm = calm + 1 if all(state in ("S", "Z", "gone") for state in states) else 0


def check(directory: str) -> list:
    crashed = {name.split("-")[1] for name in os.listdir(directory) if name.startswith("crashed-")}
    bad = []
    shards = sorted(name for name in os.listdir(directory) if name.endswith(SUFFIX))
    for name in shards:
        pid = name[len("shard-"):-len(SUFFIX)]
        if pid in crashed:
            print(f"{name}: the crashed worker's, not read", flush=True)
            continue
        if not readable(os.path.join(directory, name)):
            bad.append(f"{name}: unreadable")
            continue
        if os.environ.get("EXITSAFE_LEDGER") == "ledger-{pid}.json":
            try:
                with open(f"ledger-{pid}.json") as file:
                    ledger = json.load(file)
            except OSError as exc:
                bad.append(f"{name}: no ledger ({exc})")
                continue
            outcomes = {e["name"]: e["outcome"] for r in ledger["registries"]
                        for e in r["entries"]}
            expected = {"shard": "released_at_exit"}
            if "--hang" in sys.argv[3:]:
                expected["stuck"] = "leaked_timeout"
            if outcomes != expected:
                bad.append(f"{name}: ledger outcomes {outcomes}")
    print(f"shards {len(shards)}, crashed {len(crashed)}, unreadable {len(bad)}", flush=True)
    return bad


def with_pool(directory: str, end: str) -> None:
    method = end.split("-")[0] if end in ("spawn-terminate", "forkserver-terminate") else None
    context = multiprocessing.get_context(method)
    pool = context.Pool(2, initializer=initializer(), initargs=initargs(directory))
    writers = pool.map(work, range(40))
    print("rows", len(writers), flush=True)
    if end == "close":
        pool.close()
        pool.join()
        return
    if end in ("spawn-terminate", "forkserver-terminate"):
        workers = list(pool._pool)
        pool.terminate()  # at once: the recipe's teardown in every worker it finds
        endings(directory, workers, writers)
        return
    assert end == "crash", end
    pool.apply_async(crash, (directory,))
    deadline = time.monotonic() + 20
    while len(os.listdir(directory)) < 4 and time.monotonic() < deadline:  # 3 shards, 1 mark
        time.sleep(0.05)
    idle([p.pid for p in pool._pool])  # the replacement too
    pool.terminate()  # SIGTERM: the recipe's teardown in each worker still alive


def endings(directory: str, workers: list, writers: list) -> None:
    """One line per worker of a terminated pool: how it ended (``sigterm``, or ``itself``
    when it took the pool's stop sentinel before the SIGTERM came), the rows it wrote and
    whether its shard reads back (``none``: it never opened one)."""
    for process in workers:
        ended = {0: "itself", -signal.SIGTERM: "sigterm"}.get(process.exitcode,
                                                               f"exit-{process.exitcode}")
        path = shard_path(directory, process.pid)
        shard = ("none" if not os.path.exists(path)
                 else "readable" if readable(path) else "unreadable")
        print(f"worker ended by {ended}: rows {writers.count(process.pid)}, shard {shard}",
              flush=True)


def with_executor(directory: str, end: str) -> None:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    executor = ProcessPoolExecutor(2, initializer=initializer(), initargs=initargs(directory))
    print("rows", len(list(executor.map(work, range(40)))), flush=True)
    workers = list(executor._processes.values())
    if end == "close":
        executor.shutdown(wait=True)
    elif end == "cancel":
        for i in range(40):
            executor.submit(slow, 100 + i)
        executor.shutdown(wait=True, cancel_futures=True)
    elif end == "sigterm":
        idle([p.pid for p in workers])
        for process in workers:
            os.kill(process.pid, signal.SIGTERM)
        for process in workers:
            process.join(30)
        try:
            executor.shutdown(wait=True)
        except BrokenProcessPool:
            pass
    elif end == "crash":
        idle([p.pid for p in workers])
        try:
            executor.submit(crash, directory).result(30)
        except BrokenProcessPool:
            print("broken process pool", flush=True)
        executor.shutdown(wait=True)
    else:
        raise ValueError(end)
    for process in workers:
        process.join(30)
    print("worker exit codes", sorted(p.exitcode for p in workers), flush=True)


if __name__ == "__main__":
    engine, end = sys.argv[1], sys.argv[2]
    directory = tempfile.mkdtemp()
    try:
        (with_pool if engine == "pool" else with_executor)(directory, end)
        bad = check(directory)
        for line in bad:
            print(line, flush=True)
    finally:
        shutil.rmtree(directory)
    sys.exit(1 if bad else 0)
