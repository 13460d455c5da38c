"""cffi, after: the wrappers hold exitsafe handles, and the device says it depends on
its instance. At exit exitsafe releases the device, then the instance, before the
interpreter starts finalizing modules."""

import cffi

import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))


class Instance:
    def __init__(self):
        ptr = lib.rt_instance_create()
        self._h = es.track(ffi, ptr, lib.rt_instance_release, kind="instance")


class Device:
    def __init__(self, instance):
        ptr = lib.rt_device_create(instance._h.raw)
        self._h = es.track(ffi, ptr, lib.rt_device_release, kind="device",
                           depends_on=[instance._h])


instance = Instance()
device = Device(instance)
print("work done")
