"""New bindings, after: subclass NativeObject. Class keywords give the kind and the
release function; parent= makes the child depend on its parent. No __del__, no
close(), no "already closed" checks: raw raises HandleClosedError once the object is
closed."""

import cffi

import exitsafe
from exitsafe.lab import shim
from exitsafe import NativeObject

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))


class Instance(NativeObject, kind="instance", release=lib.rt_instance_release):
    def __init__(self):
        super().__init__(lib.rt_instance_create())


class Device(NativeObject, kind="device", release=lib.rt_device_release):
    def __init__(self, instance):
        super().__init__(lib.rt_device_create(instance.raw), parent=instance)


instance = Instance()
with Device(instance) as scratch:
    pass
try:
    scratch.raw
except exitsafe.HandleClosedError:
    print("closed")
device = Device(instance)   # left to the teardown: the device first, then the instance
print("work done")
