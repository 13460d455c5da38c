"""cffi, before: each wrapper owns an ffi.gc pointer, and the device keeps only its
instance's pointer: the instance object, not needed once the device exists, is dropped
and its ffi.gc destructor releases the instance under the live device; at exit the
device's release finds its parent gone."""

import cffi

from exitsafe.lab import shim  # the lab runtime: a C library built on first use

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))


class Instance:
    def __init__(self):
        self._ptr = ffi.gc(lib.rt_instance_create(), lib.rt_instance_release)


class Device:
    def __init__(self, instance):
        ptr = lib.rt_device_create(instance._ptr)
        self._ptr = ffi.gc(ptr, lib.rt_device_release)


device = Device(Instance())  # the instance object is not needed any more
print("work done")
