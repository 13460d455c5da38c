"""Inference worker, before: a daemon thread runs inferences on a device (a native call
that takes a while and releases the GIL). The binding releases its objects in an atexit
handler, so that they go before the interpreter does. The main thread finishes while an
inference is in progress, and the handler releases the device under it."""

import atexit
import threading
import time

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = lib.rt_instance_create()
device = lib.rt_device_create(instance)


@atexit.register
def close():
    lib.rt_device_release(device)
    lib.rt_instance_release(instance)


def infer_forever():
    while True:
        lib.rt_device_run(device, 1000)  # one inference: 1 s of native work


threading.Thread(target=infer_forever, daemon=True).start()
while not lib.rt_device_running(device):
    time.sleep(0.001)
print("work done")  # and exit, an inference in flight
