import os
import exitsafe

# --- stand-in for the native library: `lib = ffi.dlopen("libruntime.so")` ----------
class FakeLib:
    """Checks what a C runtime would not, and aborts like one."""
    def __init__(self):
        self.parents = {}                                # live object -> its parent
    def _new(self, parent=None):
        obj = object(); self.parents[obj] = parent; return obj
    def _free(self, obj):
        if obj not in self.parents or obj in self.parents.values():
            os.write(2, b"FATAL: double release, or parent released before child\n")
            os.abort()
        del self.parents[obj]
    rt_instance_create = rt_device_create = rt_buffer_create = _new
    rt_instance_release = rt_device_release = rt_buffer_release = _free

lib = FakeLib()
# ------------------------------------------------------------------------------------

_lib = exitsafe.pin(lib, name="libruntime")   # real code: pin(lib, close=ffi.dlclose)


class Instance:
    def __init__(self):
        self._h = exitsafe.track(lib.rt_instance_create(), lib.rt_instance_release,
                                 kind="instance", depends_on=[_lib])

    def create_device(self):
        return Device(self)


class Device:
    def __init__(self, instance):
        self._h = exitsafe.track(lib.rt_device_create(instance._h.raw),
                                 lib.rt_device_release,
                                 kind="device", depends_on=[instance._h])

    def create_buffer(self):
        return Buffer(self)

    def close(self):
        self._h.release()


class Buffer:
    def __init__(self, device):
        self._h = exitsafe.track(lib.rt_buffer_create(device._h.raw),
                                 lib.rt_buffer_release,
                                 kind="buffer", depends_on=[device._h])


# --- a program using the binding carelessly ----------------------------------------
instance = Instance()
device = instance.create_device()
buffers = [device.create_buffer() for _ in range(3)]
device.close()      # deferred: its buffers still need it
del instance        # nothing happens: the device still needs the instance
# The program ends with everything alive, in globals: exit code 0, nothing printed.
