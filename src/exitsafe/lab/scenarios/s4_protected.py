"""S4 protected: a teardown hook unregisters the logger first; the callback is guarded.

Changes from ``s4_unprotected.py``: the callback is made with
``exitsafe.cffi.callback`` (it returns at once once teardown has begun, and
its trampoline is kept alive for as long as native code may call it), and
``exitsafe.on_teardown`` registers ``rt_logger_unregister`` as a hook that
runs before the instance is released.

At exit the hook joins the logger thread before the interpreter finalizes:
after it no native thread calls Python, and the runtime's unload code finds
no logger to call.  Exit 0, no leaks.
"""

from __future__ import annotations

import logging
import time

import exitsafe
from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
_log = logging.getLogger("lab.runtime")
_messages = 0


def _on_log(level: int, message: object) -> None:
    global _messages
    _messages += 1
    _log.debug("runtime[%d]: %s", level, ffi.string(message).decode())


_callback = exitsafe_cffi.callback(ffi, "void(*)(int, const char *)", _on_log, name="logger")
_rt.rt_logger_register(_callback.raw, 1000)
_instance = exitsafe_cffi.track(
    ffi, _rt.rt_instance_create(), _rt.rt_instance_release, kind="instance"
)
exitsafe.on_teardown(
    _rt.rt_logger_unregister, before=[_instance, _callback], name="unregister the logger"
)

while _rt.rt_logger_calls() < 10:
    time.sleep(0.001)
print(f"S4 protected: {_messages}+ log messages received, exiting", flush=True)
