"""UNPROTECTED: a daemon thread paints on a cairo image surface (cairocffi) in a loop while
the main thread ends; the program finishes the surface at exit itself, with
``atexit.register(surface.finish)``.

Each ``ctx.fill()`` of a radial gradient over a 2048x2048 surface runs in cairo/pixman
with the GIL released for a few hundred milliseconds, nearly all the painter's time.
The ``atexit`` callback finishes the surface, which frees its pixels, while the fill in
flight is still writing them: SIGSEGV in ``pixman_fill``, on the painter's thread.

(``exitsafe.adopt(surface, close="finish")`` in place of the ``atexit`` line is the fix:
``cairocffi_daemon_adopted.py``.)
"""

import atexit
import sys
import threading

import cairocffi as cairo

surface = cairo.ImageSurface(cairo.FORMAT_ARGB32, 2048, 2048)
atexit.register(surface.finish)
started = threading.Event()


def paint_forever() -> None:
    ctx = cairo.Context(surface)
    i = 0
    while True:
        gradient = cairo.RadialGradient(1024, 1024, 0, 1024, 1024, 700 + i % 300)
        gradient.add_color_stop_rgb(0, 1, 0.5, 0)
        gradient.add_color_stop_rgb(1, 0, 0.2, 1)
        ctx.set_source(gradient)
        ctx.arc(1024, 1024, 1000, 0, 6.2832)
        ctx.fill()
        i += 1
        started.set()


threading.Thread(target=paint_forever, name="painter", daemon=True).start()
started.wait()
print("painting; main thread ends", flush=True)
sys.exit(0)
