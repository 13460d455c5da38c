"""Inference worker, after: the device is a tracked handle and the worker borrows it
around each inference. At exit the teardown waits for the inference in flight (bounded),
then releases the device; the worker's next borrow parks the daemon thread, so it never
re-enters the runtime."""

import threading
import time

import cffi

import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = es.track(ffi, lib.rt_instance_create(), lib.rt_instance_release,
                    kind="instance")
device = es.track(ffi, lib.rt_device_create(instance.raw), lib.rt_device_release,
                  kind="device", depends_on=[instance])


def infer_forever():
    while True:
        with device.borrow() as ptr:  # never released under a run; parks at exit
            lib.rt_device_run(ptr, 1000)  # one inference: 1 s of native work
        # the same, shorter: es.call(lib.rt_device_run, device, 1000)


threading.Thread(target=infer_forever, daemon=True).start()
while not lib.rt_device_running(device.raw):
    time.sleep(0.001)
print("work done")  # and exit, an inference in flight
