"""cffi, before: the runtime calls into a compiler library while it releases a device,
and the binding unloads that library in an atexit handler. The device is released
later, from the interpreter's shutdown, and jumps into unmapped code."""

import atexit

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
compiler = ffi.dlopen(str(shim.compiler_path()))  # a plugin the runtime calls into
lib = ffi.dlopen(str(shim.runtime_path()))
lib.rt_init(str(shim.compiler_path()).encode())  # the runtime borrows the plugin
atexit.register(ffi.dlclose, compiler)            # the binding unloads it at exit

instance = lib.rt_instance_create()               # process-wide, never released


class Device:
    def __init__(self):
        ptr = lib.rt_device_create(instance)
        self._ptr = ffi.gc(ptr, lib.rt_device_release)  # calls into the compiler


device = Device()
print("work done")
