"""A cffi binding as it is usually written: ffi.gc on every pointer, an ffi.callback
for the logger, the dependency library closed in an atexit handler. It works, and then
the process dies on its way out."""

import atexit
import time

import cffi

from exitsafe.lab import shim  # builds the lab runtime; gives its paths and cdef

# ---------------------------------------------------------------- the binding
ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
compiler = ffi.dlopen(str(shim.compiler_path()))  # the runtime calls into it
lib = ffi.dlopen(str(shim.runtime_path()))
lib.rt_init(str(shim.compiler_path()).encode())
atexit.register(ffi.dlclose, compiler)  # "clean up" at exit


class Instance:
    def __init__(self):
        self._ptr = ffi.gc(lib.rt_instance_create(), lib.rt_instance_release)

    def create_device(self):
        return Device(self)


class Device:
    def __init__(self, instance):
        ptr = lib.rt_device_create(instance._ptr)  # keeps the pointer, not the wrapper
        self._ptr = ffi.gc(ptr, lib.rt_device_release)

    def create_buffer(self, size):
        return Buffer(self, size)

    def submit(self):
        return lib.rt_device_submit(self._ptr)


class Buffer:
    def __init__(self, device, size):
        ptr = lib.rt_buffer_create(device._ptr, size)
        self._ptr = ffi.gc(ptr, lib.rt_buffer_release)

    def write(self, data):
        lib.rt_buffer_write(self._ptr, 0, data, len(data))


def set_logger(fn):
    """Route the runtime's log lines (sent from its own thread) to fn(level, text)."""
    @ffi.callback("void(int, const char *)")
    def on_log(level, message):
        fn(level, ffi.string(message).decode())

    set_logger.callback = on_log  # kept alive: C holds the pointer
    lib.rt_logger_register(on_log, 1000)


# ---------------------------------------------------------------- a program using it
lines = []
set_logger(lambda level, text: lines.append(text))
instance = Instance()
device = instance.create_device()
buffers = [device.create_buffer(64) for _ in range(3)]
buffers[0].write(b"hello")
device.submit()
while lib.rt_logger_calls() < 10:
    time.sleep(0.001)
print("work done")
