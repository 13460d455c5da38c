"""PROTECTED: cairocffi_daemon.py with the surface adopted in place of its ``atexit``
finish: ``exitsafe.adopt(surface, close="finish")``, the one line.

The painter refers to the surface (a module global its code names) and to a context of
cairocffi, the surface's package: the exit teardown counts it as using the surface.
Before finishing it, it parks the painter at its next call made from this program's code,
once the fill in flight has returned (within the bound, 1 s), then finishes the surface
with no thread left to paint on it.  Exits 0 every time (20 runs of 20 on
each of CPython 3.9 to 3.13, 2026-11-29).
"""

import sys
import threading

import cairocffi as cairo

import exitsafe

surface = cairo.ImageSurface(cairo.FORMAT_ARGB32, 2048, 2048)
exitsafe.adopt(surface, close="finish")  # the one line
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
