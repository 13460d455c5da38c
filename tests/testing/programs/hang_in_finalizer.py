"""A ``__del__`` stuck in a native call while the interpreter finalizes: the shape of a wgpu
buffer whose read-back waits for a GPU that no longer answers.

The lab runtime's device is "lost" (``rt_device_lose``): its release blocks for ever in C,
with the GIL released.  The ``Buffer`` is a global, finalized with the module.
"""

from exitsafe.lab import shim

rt = shim.load_runtime()
rt.rt_init(shim.ffi.NULL)
instance = rt.rt_instance_create()


class Buffer:
    def __init__(self) -> None:
        self._lib = rt
        self._ptr = rt.rt_device_create(instance)

    def __del__(self) -> None:
        self._lib.rt_device_release(self._ptr)  # a read-back the device never answers


buffer = Buffer()
rt.rt_device_lose(buffer._ptr)
print("mapped", flush=True)
