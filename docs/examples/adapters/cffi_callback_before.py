"""cffi, before: the runtime's logger thread calls a Python callback every
millisecond, and nothing unregisters it. The interpreter finalizes with the native
thread still calling in, and the runtime's unload code logs its goodbye through the
callback after that."""

import time

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
messages = []


@ffi.callback("void(int, const char *)")
def on_log(level, message):
    messages.append(ffi.string(message))


lib.rt_logger_register(on_log, 1000)   # a native thread calls on_log every millisecond
while lib.rt_logger_calls() < 10:
    time.sleep(0.001)
print("work done")
