"""A ctypes binding as it is usually written: a __del__ on every wrapper, a CFUNCTYPE
for the logger, the dependency library closed in an atexit handler. It works, and then
the process dies on its way out."""

import _ctypes
import atexit
import ctypes
import time

from exitsafe.lab import shim  # builds the lab runtime; gives its paths

# ---------------------------------------------------------------- the binding
P = ctypes.c_void_p
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p)
compiler = ctypes.CDLL(str(shim.compiler_path()))  # the runtime calls into it
lib = ctypes.CDLL(str(shim.runtime_path()))
for name, restype, argtypes in [
    ("rt_init", ctypes.c_int, [ctypes.c_char_p]),
    ("rt_instance_create", P, []),
    ("rt_instance_release", ctypes.c_int, [P]),
    ("rt_device_create", P, [P]),
    ("rt_device_release", ctypes.c_int, [P]),
    ("rt_device_submit", ctypes.c_int, [P]),
    ("rt_buffer_create", P, [P, ctypes.c_size_t]),
    ("rt_buffer_release", ctypes.c_int, [P]),
    ("rt_buffer_write", ctypes.c_int, [P, ctypes.c_size_t, ctypes.c_char_p,
                                       ctypes.c_size_t]),
    ("rt_logger_register", ctypes.c_int, [LOG_FN, ctypes.c_uint]),
    ("rt_logger_unregister", ctypes.c_int, []),
    ("rt_logger_calls", ctypes.c_ulonglong, []),
]:
    getattr(lib, name).restype, getattr(lib, name).argtypes = restype, argtypes
lib.rt_init(str(shim.compiler_path()).encode())
atexit.register(_ctypes.dlclose, compiler._handle)  # "clean up" at exit


class Instance:
    def __init__(self):
        self._ptr = lib.rt_instance_create()

    def create_device(self):
        return Device(self)

    def __del__(self):
        lib.rt_instance_release(self._ptr)


class Device:
    def __init__(self, instance):
        self._ptr = lib.rt_device_create(instance._ptr)  # the pointer, not the wrapper

    def create_buffer(self, size):
        return Buffer(self, size)

    def submit(self):
        return lib.rt_device_submit(self._ptr)

    def __del__(self):
        lib.rt_device_release(self._ptr)


class Buffer:
    def __init__(self, device, size):
        self._ptr = lib.rt_buffer_create(device._ptr, size)

    def write(self, data):
        lib.rt_buffer_write(self._ptr, 0, data, len(data))

    def __del__(self):
        lib.rt_buffer_release(self._ptr)


def set_logger(fn):
    """Route the runtime's log lines (sent from its own thread) to fn(level, text)."""
    def on_log(level, message):
        fn(level, message.decode())

    set_logger.callback = LOG_FN(on_log)  # kept alive: C holds the pointer
    lib.rt_logger_register(set_logger.callback, 1000)


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
