"""An ``ffi.gc`` destructor stuck in native code while the interpreter finalizes: no Python
frame is left on the main thread (the shape of a Cython ``__dealloc__`` blocking).  Run
audited, the report names the object, its type and where it was made.
"""

from exitsafe.lab import shim

ffi = shim.ffi
rt = shim.load_runtime()
rt.rt_init(shim.ffi.NULL)
instance = rt.rt_instance_create()
device = ffi.gc(rt.rt_device_create(instance), rt.rt_device_release)
rt.rt_device_lose(device)
print("lost", flush=True)
