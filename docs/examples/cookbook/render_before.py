"""GPU object on its own thread, before: a render thread creates its device (like a GL
context, it belongs to that thread) and draws frames until the process ends. The binding
frees its objects in an atexit handler, on the main thread, in the middle of a frame."""

import atexit
import threading
import time

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = lib.rt_instance_create()
devices = []


@atexit.register
def free_all():  # the binding's clean-up, on the main thread
    for device in devices:
        lib.rt_device_release(device)
    lib.rt_instance_release(instance)


def render_loop():
    device = lib.rt_device_create(instance)  # owned by this thread
    devices.append(device)
    while True:
        lib.rt_device_run(device, 1000)  # one frame of native work (1 s)


threading.Thread(target=render_loop, name="render", daemon=True).start()
while not devices or not lib.rt_device_running(devices[0]):
    time.sleep(0.001)
print("work done")  # and exit, a frame in flight
