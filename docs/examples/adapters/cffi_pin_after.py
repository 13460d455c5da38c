"""cffi, after: both libraries are pinned. Each handle depends on the pin of the
library its release function comes from (lib=), and the device also on the compiler
its release calls into. At exit: the device, the instance, then the libraries."""

import cffi

import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
compiler = ffi.dlopen(str(shim.compiler_path()))
lib = ffi.dlopen(str(shim.runtime_path()))
lib.rt_init(str(shim.compiler_path()).encode())
compiler_pin = es.pin(ffi, compiler)   # dlclose'd after every handle that depends on it
runtime_pin = es.pin(ffi, lib)

instance = es.track(ffi, lib.rt_instance_create(), lib.rt_instance_release,
                    lib=lib, kind="instance")


class Device:
    def __init__(self):
        ptr = lib.rt_device_create(instance.raw)
        self._h = es.track(ffi, ptr, lib.rt_device_release, lib=lib, kind="device",
                           depends_on=[instance, compiler_pin])


device = Device()
assert runtime_pin in device._h.depends_on
print("work done")
