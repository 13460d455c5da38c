"""PROTECTED: cairocffi_daemon.py plus ``exitsafe.quiesce()``.

At exit, before any ``atexit`` callback (exitsafe's teardown, which finishes the
surface, included), the painter is parked at its next call made from this program's
code, once the fill in flight has returned (it is waited for).  Then the surface is
finished with no thread left to paint on it.  Exit 0.
"""

import sys
import threading

import cairocffi as cairo

import exitsafe

surface = cairo.ImageSurface(cairo.FORMAT_ARGB32, 2048, 2048)
exitsafe.adopt(surface, close="finish")
exitsafe.quiesce()  # the painter stops between two calls, before the surface goes
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
