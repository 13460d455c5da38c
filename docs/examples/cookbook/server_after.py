"""Executor / server, after: the stop request is an early-exit hook, which runs when the
main thread finishes, before the interpreter joins the executor's threads. The device is
tracked; the handlers borrow it, so it is released after the last request, at exit."""

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import cffi

import exitsafe
import exitsafe.cffi as es
from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = es.track(ffi, lib.rt_instance_create(), lib.rt_instance_release,
                    kind="instance")
device = es.track(ffi, lib.rt_device_create(instance.raw), lib.rt_device_release,
                  kind="device", depends_on=[instance])
stop = threading.Event()
requests = queue.Queue()


def serve():
    while not stop.is_set():
        try:
            work_ms = requests.get(timeout=0.05)
        except queue.Empty:
            continue
        es.call(lib.rt_device_run, device, work_ms)  # the device, borrowed
        requests.task_done()


executor = ThreadPoolExecutor(max_workers=2)
for _ in range(2):
    executor.submit(serve)
for _ in range(10):
    requests.put(5)
requests.join()
exitsafe.on_early_exit(stop.set)  # a grpc server: lambda: server.stop(None).wait(5)
print("work done")
