"""PROTECTED: h5py_pool_terminate.py with one line changed, the pool's initializer wrapped
(the recipe of docs/fork.md), and the shard adopted where it is opened:

    multiprocessing.Pool(2, initializer=pool_initializer(init), initargs=(directory,))

``pool_initializer`` turns SIGTERM into the worker's teardown, with
``teardown_on_signals("SIGTERM", mode="immediate", watch=True)``, and runs ``init`` inside
``exitsafe.signals.deferred()``, so that no teardown runs between the open and the adoption.

``pool.terminate()``'s SIGTERM then runs each worker's teardown, which closes its file,
and the worker dies by SIGTERM as ``terminate()`` expects.  Every shard reads back, and
with ``EXITSAFE_LEDGER=ledger-{pid}.json`` (the case's environment; the current directory)
each worker's own ledger records its shard ``released_at_exit`` (``shards.py``).  Exit 0.
(Without deferring the teardown, a worker still in its initializer when ``terminate()``
came died with its file opened but not yet adopted: 1 run in 20.  Without ``watch=True``, a
SIGTERM that landed just before an idle worker blocked on its task queue's lock waited for
a second signal that ``terminate()`` never sends: a hang, 2 runs in 300.)
"""

import multiprocessing
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np
from shards import readable, released

import exitsafe
from exitsafe.signals import pool_initializer

_file = None


def init(directory: str) -> None:
    global _file
    _file = h5py.File(os.path.join(directory, f"shard-{os.getpid()}.h5"), "w")
    exitsafe.adopt(_file, name="shard")  # which closes the shard


def work(i: int) -> int:
    _file.create_dataset(f"row{i}", data=np.full(1000, i))
    return i


def unreadable(directory: str) -> list:
    """What is wrong with each worker's shard: unreadable, or (with ``EXITSAFE_LEDGER``)
    not recorded ``released_at_exit`` by its worker's ledger."""
    bad = []
    for name in sorted(os.listdir(directory)):
        pid = name[len("shard-"):-len(".h5")]
        if not readable(os.path.join(directory, name)):
            bad.append(f"{name}: unreadable")
        elif os.environ.get("EXITSAFE_LEDGER") and not released(pid):
            bad.append(f"{name}: its worker's ledger does not record it released_at_exit")
    return bad


if __name__ == "__main__":
    directory = tempfile.mkdtemp()
    try:
        with multiprocessing.Pool(
            2, initializer=pool_initializer(init), initargs=(directory,)
        ) as pool:
            print("rows", sum(pool.map(work, range(40))), flush=True)
        bad = unreadable(directory)
        print(f"shards {len(os.listdir(directory))}, unreadable {len(bad)}", flush=True)
        for line in bad:
            print(line, flush=True)
    finally:
        shutil.rmtree(directory)
    sys.exit(1 if bad else 0)
