"""PROTECTED: wgpu_del_readback.py, its ``Readback`` adopted with its own ``__del__`` as
the close (the shape ``exitsafe run --audit`` suggests for a class with no close method):

    exitsafe.adopt(result, close=type(result).__del__)

exitsafe's teardown runs the read-back before any module is cleared, while the device
and its queue are whole, so ``result.bin`` is written, and exactly once: the interpreter
does not run the ``__del__`` again when it collects the object.  Exit 0, nothing ignored.

The unprotected program:

wgpu-py (a cffi binding over wgpu-native) on Mesa's software Vulkan driver (lavapipe).
``Readback`` holds the device and a buffer and, when it is collected, copies the buffer
back to the host (``device.queue.read_buffer``) into ``result.bin``: the program's result.
Nothing collects it before the interpreter's finalization, which runs its ``__del__`` in
whatever order it clears modules: the device's queue is already gone then, the read-back
raises (``Exception ignored in: <function Readback.__del__>``, an ``AttributeError``) and
``result.bin`` is never written.  Exit status 0.  Measured on CPython 3.9-3.13: every run.
(Its ``__del__`` is not idempotent: run twice, it reads back twice.)
"""

import wgpu

import exitsafe

adapter = wgpu.gpu.request_adapter_sync(power_preference="low-power")
device = adapter.request_device_sync()
buffer = device.create_buffer_with_data(
    data=bytes(range(256)) * 256, usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.STORAGE
)


class Readback:
    """The program's own: copies the buffer back to the host when it is collected."""

    def __init__(self, device, buffer, path):
        self.device, self.buffer, self.path = device, buffer, path

    def __del__(self):
        data = self.device.queue.read_buffer(self.buffer)
        with open(self.path, "wb") as out:
            out.write(data)
        print(f"read back {len(data)} bytes", flush=True)


result = Readback(device, buffer, "result.bin")
exitsafe.adopt(result, close=type(result).__del__)  # read back at teardown, once
print("work done", flush=True)
