"""GPU object on its own thread, after: the render thread is a declared worker. At exit
exitsafe asks it to stop and joins it before releasing what it uses; the thread releases
its own device on its way out, after its last frame."""

import threading
import time

import cffi

import exitsafe
import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = es.track(ffi, lib.rt_instance_create(), lib.rt_instance_release,
                    kind="instance")
stop = threading.Event()
started = threading.Event()


def render_loop():
    device = es.track(ffi, lib.rt_device_create(instance.raw), lib.rt_device_release,
                      kind="device", depends_on=[instance])
    started.set()
    try:
        while not stop.is_set():
            es.call(lib.rt_device_run, device, 1000)  # one frame of native work (1 s)
    finally:
        device.release()  # on this thread, after the last frame
        print("render thread: device released")


render = threading.Thread(target=render_loop, name="render", daemon=True)
render.start()
exitsafe.worker(render, stop=stop, uses=[instance], timeout=5)
started.wait()
print("work done")  # and exit, a frame in flight
