"""A deadlock at module finalization on a lock a stopped daemon thread still holds: the shape
of h5py, whose objects take its global lock when they are deallocated.

The writer thread takes the lock, then blocks in a native call (``time.sleep`` stands for
an HDF5 write); it is a daemon, so the interpreter does not wait for it and stops it when
finalization begins.  The dataset's finalizer (``weakref.finalize``, which runs it at exit)
calls ``lock.acquire``, a C function, as h5py's deallocators take the lock in C.
"""

import threading
import time
import weakref

lock = threading.Lock()  # h5py's "phil"
writing = threading.Event()


def write_chunks() -> None:
    with lock:
        writing.set()
        time.sleep(3600)  # a native write that holds the lock


class Dataset:
    pass


dataset = Dataset()
weakref.finalize(dataset, lock.acquire)  # C code that takes the lock as the dataset goes
threading.Thread(target=write_chunks, name="writer", daemon=True).start()
if not writing.wait(30):
    raise SystemExit("the writer never started")
print("writing", flush=True)
