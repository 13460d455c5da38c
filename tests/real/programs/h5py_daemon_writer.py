"""UNPROTECTED: a daemon thread writes frames to an h5py dataset in a loop while the main
thread ends; the program closes the file at exit itself, with ``atexit.register(f.close)``.

The dataset is gzip-compressed with a chunk cache that holds all of it, so the close
compresses and writes every chunk: it lasts far longer than the interpreter's switch
interval, and the writer, which asked for the GIL meanwhile, runs again before the
interpreter finalizes.  Its next write uses the closed dataset: ``RuntimeError`` (or
``ValueError``), printed as "Exception in thread writer" (cut short when the thread is
ended in the middle of printing it).  When the writer is instead stopped by finalization
inside one of h5py's calls, it holds h5py's global lock (``phil``) for good, and the
first h5py object deallocated during finalization waits for it: a hang.  Measured
(2026-11-29): unclean in 10 runs of 10 on each of CPython 3.9 to 3.13 (the writer's
exception, or a hang).
"""

import atexit
import sys
import threading

import h5py
import numpy as np

f = h5py.File("frames.h5", "w", rdcc_nbytes=64 << 20)  # a chunk cache for the whole dataset
atexit.register(f.close)  # the file is closed at exit...
frames = f.create_dataset(
    "frames", shape=(64, 16384), dtype="f4", chunks=(8, 16384), compression="gzip"
)
row = np.random.default_rng(0).random(16384, dtype="f4")
started = threading.Event()


def record() -> None:
    i = 0
    while True:  # ...but nothing stops this thread
        frames[i % 64] = row
        i += 1
        started.set()


threading.Thread(target=record, name="writer", daemon=True).start()
started.wait()
print("writing; main thread ends", flush=True)
sys.exit(0)
