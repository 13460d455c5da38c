"""S4 unprotected: a native thread calls a Python logger callback during and after finalization.

The binding routes the runtime's log messages to `logging` through an
``ffi.callback`` that the runtime's logger thread calls every millisecond,
and never unregisters it (nothing tells it the interpreter is going away).
At exit the interpreter finalizes with the native thread still calling in,
and the runtime's unload code logs its goodbye through the callback after
``Py_Finalize``: a crash (SIGSEGV, or SIGILL/SIGBUS when the callback's
trampoline was already freed with its Python object).
"""

from __future__ import annotations

import logging
import time

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
_log = logging.getLogger("lab.runtime")
_messages = 0


def _on_log(level: int, message: object) -> None:
    global _messages
    _messages += 1
    _log.debug("runtime[%d]: %s", level, ffi.string(message).decode())


_on_log_callback = ffi.callback("void(int, const char *)", _on_log)
_rt.rt_logger_register(_on_log_callback, 1000)
_instance = _rt.rt_instance_create()

while _rt.rt_logger_calls() < 10:  # let the native thread get going
    time.sleep(0.001)
_rt.rt_instance_release(_instance)
print(f"S4 unprotected: {_messages}+ log messages received, exiting", flush=True)
