"""UNPROTECTED: a daemon thread filters video frames with OpenCV in a loop while the main
thread ends.

``cv2.GaussianBlur`` on a 1280x720 frame runs in OpenCV's C++ code with the GIL released
for milliseconds, nearly all the worker's time, so the interpreter finalizes while the
worker is inside it.  When the call returns, the worker tries to take the GIL back: on
CPython <= 3.13.7 it is ended with ``pthread_exit()``, whose forced unwinding runs
through OpenCV's C++ frames and aborts ("terminate called without an active exception",
or glibc's "FATAL: exception not rethrown" where a ``catch (...)`` swallowed the unwind:
SIGABRT either way); on 3.14+ the thread hangs instead (gh-87135).
"""

import sys
import threading

import cv2
import numpy as np

frame = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
started = threading.Event()


def process_forever() -> None:
    while True:
        cv2.GaussianBlur(frame, (31, 31), 0)
        started.set()


threading.Thread(target=process_forever, name="video", daemon=True).start()
started.wait()
print("processing frames; main thread ends", flush=True)
sys.exit(0)
