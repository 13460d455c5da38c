"""ctypes, before: wrapper classes release their object in __del__ and keep only their
parent's pointer. At exit the interpreter clears the module's globals in order, so the
instance is released before the device that still needs it."""

import ctypes

from exitsafe.lab import shim

lib = ctypes.CDLL(str(shim.runtime_path()))
lib.rt_instance_create.restype = ctypes.c_void_p
lib.rt_instance_release.argtypes = [ctypes.c_void_p]
lib.rt_device_create.restype = ctypes.c_void_p
lib.rt_device_create.argtypes = [ctypes.c_void_p]
lib.rt_device_release.argtypes = [ctypes.c_void_p]


class Instance:
    def __init__(self):
        self._ptr = lib.rt_instance_create()

    def __del__(self):
        lib.rt_instance_release(self._ptr)


class Device:
    def __init__(self, instance):
        self._ptr = lib.rt_device_create(instance._ptr)

    def __del__(self):
        lib.rt_device_release(self._ptr)


instance = Instance()
device = Device(instance)
print("work done")
