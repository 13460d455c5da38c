"""The same ctypes binding with exitsafe: the libraries pinned, every pointer tracked
with what it depends on, no __del__, the logger a guarded callback unregistered by a
teardown hook. The program using it is unchanged, and exits 0."""

import ctypes
import time

import exitsafe
import exitsafe.ctypes as es
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
compiler_pin = es.pin(compiler, name="compiler")  # closed after its dependents
es.pin(lib, close=False, name="runtime")  # what lib's functions release depends on it


class Instance:
    def __init__(self):
        ptr = lib.rt_instance_create()
        self._h = es.track(ptr, lib.rt_instance_release, kind="instance")

    def create_device(self):
        return Device(self)


class Device:
    def __init__(self, instance):
        ptr = lib.rt_device_create(instance._h.raw)
        # its release calls into the compiler: it depends on that library too
        self._h = es.track(ptr, lib.rt_device_release, kind="device",
                           depends_on=[instance._h, compiler_pin])

    def create_buffer(self, size):
        return Buffer(self, size)

    def submit(self):
        return es.call(lib.rt_device_submit, self._h)  # borrowed during the call


class Buffer:
    def __init__(self, device, size):
        ptr = lib.rt_buffer_create(device._h.raw, size)
        self._h = es.track(ptr, lib.rt_buffer_release, kind="buffer",
                           depends_on=[device._h])

    def write(self, data):
        es.call(lib.rt_buffer_write, self._h, 0, data, len(data))


def set_logger(fn):
    """Route the runtime's log lines (sent from its own thread) to fn(level, text)."""
    def on_log(level, message):
        fn(level, message.decode())

    callback = es.callback(LOG_FN, on_log, name="logger")
    lib.rt_logger_register(callback.raw, 1000)
    # at exit, before anything is released: stop the logger thread (it is joined)
    exitsafe.on_teardown(lib.rt_logger_unregister, before=[callback],
                         name="unregister logger")


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
