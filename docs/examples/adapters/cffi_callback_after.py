"""cffi, after: the callback is made with exitsafe.cffi.callback (kept alive for as
long as native code may call it; returns its default once the teardown has begun), and
a teardown hook unregisters it, which joins the logger thread, before anything is
released."""

import time

import cffi

import exitsafe
import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
messages = []


def on_log(level, message):
    messages.append(ffi.string(message))


log_cb = es.callback(ffi, "void(*)(int, const char *)", on_log)
lib.rt_logger_register(log_cb.raw, 1000)
exitsafe.on_teardown(lib.rt_logger_unregister, before=[log_cb],
                     name="unregister logger")
while lib.rt_logger_calls() < 10:
    time.sleep(0.001)
print("work done")
