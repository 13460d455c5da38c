"""Executor / server, before: request handlers run in a ThreadPoolExecutor until told to
stop, and the program tells them in an atexit handler. But at exit the interpreter joins
the executor's threads before it runs any atexit handler: the handlers never hear the
request, and the process never ends."""

import atexit
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import cffi

from exitsafe.lab import shim

ffi = cffi.FFI()
ffi.cdef(shim.CDEF)
lib = ffi.dlopen(str(shim.runtime_path()))
instance = lib.rt_instance_create()
device = lib.rt_device_create(instance)
stop = threading.Event()
requests = queue.Queue()


def serve():
    while not stop.is_set():
        try:
            work_ms = requests.get(timeout=0.05)
        except queue.Empty:
            continue
        lib.rt_device_run(device, work_ms)
        requests.task_done()


executor = ThreadPoolExecutor(max_workers=2)
for _ in range(2):
    executor.submit(serve)
for _ in range(10):
    requests.put(5)
requests.join()
atexit.register(stop.set)  # too late: runs after the executor's threads are joined
print("work done")
