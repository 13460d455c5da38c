"""Forked child, after: the objects are tracked handles. A handle remembers the process
that created it: in the child, the exit teardown leaves inherited handles alone
(leaked_inherited), and the parent releases them at its own exit."""

import os
import sys

import cffi

import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = es.track(ffi, lib.rt_instance_create(), lib.rt_instance_release,
                    kind="instance")

pid = os.fork()
if pid == 0:  # the child: some work, then a normal exit
    count = es.call(lib.rt_instance_device_count, instance)
    print("child sees", count, "devices", flush=True)
    sys.exit(0)
os.waitpid(pid, 0)
device = es.track(ffi, lib.rt_device_create(instance.raw), lib.rt_device_release,
                  kind="device", depends_on=[instance])  # the parent goes on
print("parent done")
