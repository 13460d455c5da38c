"""UNPROTECTED: a daemon thread decodes a video in a loop (a preview that replays the clip)
while the main thread works and then ends; the program closes the input container at exit
itself, with ``atexit.register(container.close)``.

The clip is raw YUV (``yuv4mpegpipe``, 1920x1080 yuv420p: 3 MB a frame), so the player
spends most of its time in ``av_read_frame`` with the GIL released.  The ``atexit``
callback closes the container (``avformat_close_input``, with the GIL released too) while
a read is in flight, or lets the player, waiting for the GIL, run on into the demuxer of
a context being freed: the process dies by SIGSEGV or SIGABRT (glibc's heap checks, no
message), or, once in 40 runs, the player's ``IndexError`` from PyAV's emptied stream list
is printed.  Measured: 17 runs of 20 fail on CPython 3.9 (PyAV 15.1), 15 on 3.10 (17.1),
18 on 3.11 (18.1), 14 on 3.12 and 17 on 3.13 (19.0); the other runs exit 0 (the player was
stopped by finalization before it touched the context).

(``exitsafe.adopt(container, close="close")`` in place of the ``atexit`` line is one fix:
``pyav_daemon_decoder_adopted.py``.)
"""

import atexit
import sys
import threading
import time

import av
import numpy as np

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
