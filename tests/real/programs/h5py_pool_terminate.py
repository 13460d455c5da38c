"""UNPROTECTED: a ``multiprocessing.Pool`` used as a context manager, whose workers each
write an HDF5 shard with h5py (opened by the pool's initializer).

Leaving the ``with`` block calls ``pool.terminate()``: SIGTERM to every worker, which by
default dies at once, so no worker closes its file and every shard is left unreadable
(its metadata never flushed).  The parent then opens each shard and says how many it
could not read; it exits 1 when one is unreadable.
"""

import multiprocessing
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np

_file = None


def init(directory: str) -> None:
    global _file
    _file = h5py.File(os.path.join(directory, f"shard-{os.getpid()}.h5"), "w")


def work(i: int) -> int:
    _file.create_dataset(f"row{i}", data=np.full(1000, i))
    return i


def unreadable(directory: str) -> list:
    bad = []
    for name in sorted(os.listdir(directory)):
        try:
            with h5py.File(os.path.join(directory, name), "r") as shard:
                len(shard)
        except OSError as exc:
            bad.append(f"{name}: {exc}")
    return bad


if __name__ == "__main__":
    directory = tempfile.mkdtemp()
    try:
        with multiprocessing.Pool(2, initializer=init, initargs=(directory,)) as pool:
            print("rows", sum(pool.map(work, range(40))), flush=True)
        bad = unreadable(directory)
        print(f"shards {len(os.listdir(directory))}, unreadable {len(bad)}", flush=True)
        for line in bad:
            print(line, flush=True)
    finally:
        shutil.rmtree(directory)
    sys.exit(1 if bad else 0)
