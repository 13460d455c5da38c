"""S12 unprotected: a daemon thread is inside a stateless native function at exit.

The library has no object: a worker applies ``rt_filter`` (a native function
that works for 200 ms and releases the GIL, like an OpenCV filter or a codec's
module function) in a loop on a daemon thread.  The binding registers the
runtime's shutdown as an exit handler at import, as many bindings do.  The main
thread finishes; ``atexit`` runs ``rt_shutdown()`` while the worker is still
inside ``rt_filter``: the runtime **aborts** (``FATAL: rt_shutdown() while
rt_filter is running on another thread``), as a real runtime does when its
global state is torn down under a running call.  There is no object to borrow
and nothing to release: only the thread is in the way.
"""

from __future__ import annotations

import atexit
import threading
import time

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
atexit.register(_rt.rt_shutdown)  # the binding's exit cleanup, registered at import


def apply_filter(ms: int) -> None:
    _rt.rt_filter(ms)  # the binding's function over the native one


def process() -> None:
    while True:
        apply_filter(200)  # 200 ms of native work per frame


threading.Thread(target=process, name="filter", daemon=True).start()
while _rt.rt_filters_running() == 0:  # the worker is inside its native call
    time.sleep(0.001)
print("S12 unprotected: main done, exiting while the worker is in rt_filter", flush=True)
