"""Forked child, before: a pre-fork worker. The parent opens an instance, forks a child
that uses it and exits normally. The child's interpreter shutdown runs the ffi.gc
destructor: the child releases the instance it inherited, and the driver state it shares
with the parent goes with it. The parent's next call aborts."""

import os
import sys

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = ffi.gc(lib.rt_instance_create(), lib.rt_instance_release)

pid = os.fork()
if pid == 0:  # the child: some work, then a normal exit
    print("child sees", lib.rt_instance_device_count(instance), "devices", flush=True)
    sys.exit(0)
os.waitpid(pid, 0)
device = lib.rt_device_create(instance)  # the parent goes on using its instance
print("parent done")
