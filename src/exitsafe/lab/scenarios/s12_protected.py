"""S12 protected: the worker is parked between two native calls, before the exit handler.

Changes from ``s12_unprotected.py``: one line, ``exitsafe.quiesce()``.  When the
main thread finishes, before any ``atexit`` callback (the binding's
``rt_shutdown`` included, whatever the order of imports), the worker is parked
for good at its next call made from the program's own code: it finishes the
``rt_filter`` call in flight, is parked at its next call of the binding's
``apply_filter``, and never enters the runtime again.  Then ``rt_shutdown()``
runs with no call in progress.  Exit 0, no leaks.
"""

from __future__ import annotations

import atexit
import threading
import time

import exitsafe
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
atexit.register(_rt.rt_shutdown)  # the binding's exit cleanup, registered at import

exitsafe.quiesce()  # at exit, other threads park between two calls, before any atexit callback


def apply_filter(ms: int) -> None:
    _rt.rt_filter(ms)  # the binding's function over the native one


def process() -> None:
    while True:
        apply_filter(200)  # 200 ms of native work per frame


threading.Thread(target=process, name="filter", daemon=True).start()
while _rt.rt_filters_running() == 0:  # the worker is inside its native call
    time.sleep(0.001)
print("S12 protected: main done, exiting while the worker is in rt_filter", flush=True)
