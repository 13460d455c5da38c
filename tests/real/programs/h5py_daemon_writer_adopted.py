"""PROTECTED: h5py_daemon_writer.py with the file adopted in place of its ``atexit`` close:
``exitsafe.adopt(f, close="close")``, the one line.

The writer thread refers to the dataset the file made, not to the file; it is the
program's own thread and the dataset an object of h5py, the file's package, so the exit
teardown counts it as using the file.  Before closing the file it parks the writer at its
next call made from this program's code (never inside h5py, where it may hold h5py's
lock), then closes the file with no thread left to write.  Exits 0 every time (20 runs
of 20 on CPython 3.9 to 3.13), and the file reads back.

Before the teardown parked such threads (it only looked for the file itself) this was the
docs' half-recipe: the file was closed under the writer, whose next write raised, or
which, stopped by finalization inside h5py holding h5py's lock, hung the exit.
"""

import sys
import threading

import h5py
import numpy as np

import exitsafe

f = h5py.File("frames.h5", "w", rdcc_nbytes=64 << 20)  # a chunk cache for the whole dataset
exitsafe.adopt(f, close="close")  # the one line
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
