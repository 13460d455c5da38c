"""PROTECTED: h5py_daemon_writer.py with the file adopted as a borrowing view in place of its
``atexit`` close.

The writer thread's code is not changed: it writes through what it was given, and the
dataset made by the view is a view too (the same library), so each ``frames[i] = row``
borrows the file's handle.  At exit the teardown waits for the write in flight, closes the
file, and the writer is parked at its next write: never inside h5py, never under the close.
"""

import sys
import threading

import h5py
import numpy as np

import exitsafe

f = h5py.File("frames.h5", "w", rdcc_nbytes=64 << 20)  # a chunk cache for the whole dataset
f = exitsafe.adopt(f, close="close").borrowing()  # the one line
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
