"""PROTECTED: pyav_daemon_decoder.py plus ``exitsafe.quiesce()``, its own ``atexit`` close kept.

At exit, before any ``atexit`` callback (the container's ``close`` included), the player
is parked at its next call made from this program's code: the read or decode in flight is
waited for (it is inside PyAV, Cython and FFmpeg's demuxer, with the GIL released), and the
thread stops before the next call (``container.seek``, ``started.set``), for good.  Then
``close()`` frees the demuxer's context with no thread left to read from it: exit 0, 20
runs of 20 on each of CPython 3.9 (PyAV 15.1), 3.10 (17.1), 3.11 (18.1), 3.12 and 3.13
(19.0); 60 of 60 on each over three series, on a loaded machine (where the unprotected
program failed 10 runs of 10 on 3.9 and on 3.13).
"""

import atexit
import sys
import threading
import time

import av
import numpy as np

import exitsafe

# the clip: 8 frames of raw video, written once
with av.open("clip.y4m", "w") as out:
    video = out.add_stream("rawvideo", rate=25)
    video.width, video.height, video.pix_fmt = 1920, 1080, "yuv420p"
    noise = np.random.default_rng(0).integers(0, 255, (1080, 1920, 3), dtype=np.uint8)
    for i in range(8):
        frame = av.VideoFrame.from_ndarray(noise, format="rgb24")
        frame.pts = i
        out.mux(video.encode(frame))
    out.mux(video.encode())

container = av.open("clip.y4m")
atexit.register(container.close)
exitsafe.quiesce()  # the player stops between two calls, before the container closes
started = threading.Event()
shown = None  # the frame a preview would display


def play_forever() -> None:
    global shown
    while True:  # the thread's own code: it never checks a stop flag
        container.seek(0)
        for frame in container.decode(video=0):
            shown = frame
            started.set()


threading.Thread(target=play_forever, name="player", daemon=True).start()
started.wait()
time.sleep(0.3)  # the main thread's own work
print("playing; main thread ends", flush=True)
sys.exit(0)
