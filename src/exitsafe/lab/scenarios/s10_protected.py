"""S10 protected: the process-wide "release everything" override gives zero leaks.

Changes from ``s10_unprotected.py``: the wrappers own tracked handles whose
exit policy is ``"leak"`` (the binding still prefers leaking to crashing at
exit), in dependency order.  The leak-checker run sets
``EXITSAFE_AT_EXIT=release``: exitsafe's teardown then releases every handle
in dependency order while everything is still loaded, so the runtime's leak
report is all zeros and the run passes.  Exit 0.
"""

from __future__ import annotations

from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_instance_create(),
            _rt.rt_instance_release,
            kind="instance",
            exit_policy="leak",
        )


class Device:
    def __init__(self, instance: Instance) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_device_create(instance.handle.raw),
            _rt.rt_device_release,
            kind="device",
            depends_on=[instance.handle],
            exit_policy="leak",
        )


class Buffer:
    def __init__(self, device: Device, size: int) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_buffer_create(device.handle.raw, size),
            _rt.rt_buffer_release,
            kind="buffer",
            depends_on=[device.handle],
            exit_policy="leak",
        )


instance = Instance()
device = Device(instance)
buffer = Buffer(device, 256)
print("S10 protected: work done, exiting", flush=True)
