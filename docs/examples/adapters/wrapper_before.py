"""New bindings, before: every wrapper class repeats the lifetime code (__del__,
close(), "already closed" checks), and forgetting one detail, here keeping the parent
alive, is an abort at exit."""

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))


class Instance:
    def __init__(self):
        self._ptr = lib.rt_instance_create()

    def close(self):
        if self._ptr is not None:
            lib.rt_instance_release(self._ptr)
            self._ptr = None

    __del__ = close


class Device:
    def __init__(self, instance):
        self._ptr = lib.rt_device_create(instance._ptr)   # the parent is not kept

    def close(self):
        if self._ptr is not None:
            lib.rt_device_release(self._ptr)
            self._ptr = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


instance = Instance()
with Device(instance) as scratch:
    pass
device = Device(instance)   # left to the end of the program
del instance                # the device has what it needs (or so it seems)
print("work done")
