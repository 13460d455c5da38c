"""exitsafe.ctypes against the lab's runtime: a ctypes binding written the usual way crashes at
exit; the same binding with exitsafe.ctypes exits cleanly with zero leaks.

(The scenario catalogue drives the runtime through cffi; this is the ctypes way in.)
"""

from __future__ import annotations

from pathlib import Path

from exitsafe.lab import report as lab_report

from .conftest import needs_posix, run_python

pytestmark = needs_posix

BINDING = """
import ctypes
{protect}
from exitsafe.lab import shim

rt = ctypes.CDLL(str(shim.runtime_path()))
vp = ctypes.c_void_p
rt.rt_instance_create.restype = vp
rt.rt_device_create.restype = vp
rt.rt_device_create.argtypes = [vp]
rt.rt_buffer_create.restype = vp
rt.rt_buffer_create.argtypes = [vp, ctypes.c_size_t]
for name in ("rt_instance_release", "rt_device_release", "rt_buffer_release"):
    getattr(rt, name).argtypes = [vp]

{classes}

instance = Instance()          # module globals: cleared in this order at shutdown
device = Device(instance)
buffer = Buffer(device)
print("work done")
"""

NAIVE = """
class Instance:
    def __init__(self):
        self.p = rt.rt_instance_create()
    def __del__(self):
        rt.rt_instance_release(self.p)

class Device:
    def __init__(self, instance):
        self.p = rt.rt_device_create(instance.p)   # keeps the pointer, not the instance
    def __del__(self):
        rt.rt_device_release(self.p)

class Buffer:
    def __init__(self, device):
        self.p = rt.rt_buffer_create(device.p, 64)
    def __del__(self):
        rt.rt_buffer_release(self.p)
"""

PROTECTED = """
class Instance:
    def __init__(self):
        self.h = es.track(rt.rt_instance_create(), rt.rt_instance_release, kind="instance",
                          depends_on=[runtime_pin])

class Device:
    def __init__(self, instance):
        self.h = es.track(rt.rt_device_create(instance.h.raw), rt.rt_device_release,
                          kind="device", depends_on=[instance.h])

class Buffer:
    def __init__(self, device):
        self.h = es.track(rt.rt_buffer_create(device.h.raw, 64), rt.rt_buffer_release,
                          kind="buffer", depends_on=[device.h])

runtime_pin = es.pin(rt)
"""


def test_naive_ctypes_binding_aborts_at_exit(lab: Path) -> None:
    proc = run_python(BINDING.format(protect="", classes=NAIVE))
    assert proc.stdout.strip() == "work done", proc
    assert proc.signal == "SIGABRT", proc
    assert "FATAL:" in proc.stderr, proc


def test_ctypes_binding_with_exitsafe_exits_cleanly_in_order(lab: Path) -> None:
    code = BINDING.format(protect="import exitsafe.ctypes as es", classes=PROTECTED)
    proc = run_python(code, env={"EXITSAFE_TRACE": "1", "EXITSAFE_AT_EXIT": "release"})
    assert proc.returncode == 0, proc
    assert proc.stdout.strip() == "work done"
    for bad in ("FATAL", "Exception ignored", "Fatal Python error", "Traceback"):
        assert bad not in proc.stderr, proc
    steps = [
        line.split(" name=")[0].split(" kind=")[1]
        for line in proc.stderr.splitlines()
        if line.startswith("exitsafe: step ")
    ]
    assert steps == ['"buffer"', '"device"', '"instance"', '"library"'], proc
    reports = lab_report.parse_leak_reports(proc.stderr)
    assert reports and reports[-1].total == 0, proc
