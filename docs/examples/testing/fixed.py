"""The same toy binding with exitsafe: both releases are tracked and the device
depends on the runtime, so at exit the device is released first and the runtime last,
before the interpreter starts finalizing modules."""

import ctypes

import exitsafe


class Runtime:
    """A toy native runtime: a block of native memory that devices use."""

    def __init__(self):
        self._memory = ctypes.create_string_buffer(64)
        self.address = ctypes.addressof(self._memory)

    def device_release(self):
        ctypes.string_at(self.address)  # native code reading the runtime's state

    def shutdown(self):
        self.address = 0  # the runtime's memory is gone


class Device:
    def __init__(self, runtime, runtime_handle, name):
        self.handle = exitsafe.track(
            runtime, Runtime.device_release, kind="device", name=name,
            depends_on=[runtime_handle],
        )


runtime = Runtime()
runtime_handle = exitsafe.track(runtime, Runtime.shutdown, kind="runtime",
                                name="runtime")
device = Device(runtime, runtime_handle, "dev0")
print("work done")
