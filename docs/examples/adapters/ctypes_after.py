"""ctypes, after: no __del__. The library is pinned, the handles are tracked with
exitsafe.ctypes, and the device depends on its instance: at exit the device goes
first, then the instance, then (never, with close=False) the library."""

import ctypes

import exitsafe.ctypes as es
from exitsafe.lab import shim

lib = ctypes.CDLL(str(shim.runtime_path()))
lib.rt_instance_create.restype = ctypes.c_void_p
lib.rt_instance_release.argtypes = [ctypes.c_void_p]
lib.rt_device_create.restype = ctypes.c_void_p
lib.rt_device_create.argtypes = [ctypes.c_void_p]
lib.rt_device_release.argtypes = [ctypes.c_void_p]
pin = es.pin(lib, close=False)  # CDLL, PyDLL, WinDLL, or a raw handle int


class Instance:
    def __init__(self):
        self._h = es.track(lib.rt_instance_create(), lib.rt_instance_release,
                           kind="instance")


class Device:
    def __init__(self, instance):
        ptr = lib.rt_device_create(instance._h.raw)
        self._h = es.track(ptr, lib.rt_device_release, kind="device",
                           depends_on=[instance._h])


instance = Instance()
device = Device(instance)
assert pin in instance._h.depends_on   # found from rt_instance_release's library
print("work done")
