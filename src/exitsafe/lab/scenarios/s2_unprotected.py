"""S2 unprotected: an instance and its device in globals and a reference cycle.

The device references its instance (so the instance should outlive it) and
the instance lists its devices: a reference cycle, as bindings often have.
At shutdown the interpreter collects the module's globals as garbage and
runs the finalizers of garbage objects in the garbage collector's order,
whatever references they hold: ``Instance.__del__`` runs first (the instance
is released while its device lives: an orphan), then ``Device.__del__``
releases the device after its parent: **SIGABRT**, ``FATAL: device
released after its parent instance was released``.
"""

from __future__ import annotations

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_instance_create()
        self.devices: list[Device] = []

    def __del__(self) -> None:
        self._lib.rt_instance_release(self._ptr)


class Device:
    def __init__(self, instance: Instance) -> None:
        self._lib = _rt
        self.instance = instance  # the device keeps its instance alive...
        instance.devices.append(self)  # ...and the instance lists its devices: a cycle
        self._ptr = _rt.rt_device_create(instance._ptr)

    def submit(self) -> int:
        return int(self._lib.rt_device_submit(self._ptr))

    def __del__(self) -> None:
        self._lib.rt_device_release(self._ptr)


instance = Instance()
device = Device(instance)
device.submit()
print("S2 unprotected: work done, exiting", flush=True)
