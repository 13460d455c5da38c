"""S1 protected: the compiler is pinned, so it is unloaded after every device.

Changes from ``s1_unprotected.py``: the compiler is pinned with
``exitsafe.cffi.pin`` instead of being closed by an ``atexit`` handler, the
instance and the device are tracked handles (the device depends on the
instance and on the compiler pin) instead of a raw pointer and a ``__del__``.

At exit exitsafe's teardown releases the device, then the instance, then
closes the compiler (libraries go last).  Exit status 0, no leaks.
"""

from __future__ import annotations

from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_compiler = shim.load_compiler()
_rt = shim.load_runtime()
_rt.rt_init(str(shim.compiler_path()).encode())
_compiler_pin = exitsafe_cffi.pin(ffi, _compiler, name="lab compiler")  # closed last
_default_instance = exitsafe_cffi.track(
    ffi, _rt.rt_instance_create(), _rt.rt_instance_release, kind="instance", name="default"
)


class Device:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_device_create(_default_instance.raw),
            _rt.rt_device_release,
            kind="device",
            depends_on=[_default_instance, _compiler_pin],
        )

    def submit(self) -> int:
        with self.handle.borrow() as ptr:
            return int(_rt.rt_device_submit(ptr))


device = Device()
device.submit()
print("S1 protected: work done, exiting", flush=True)
