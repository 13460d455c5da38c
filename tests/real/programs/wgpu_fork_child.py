"""UNPROTECTED: a process that holds a wgpu device forks; the child ends normally.

wgpu-py (a cffi binding over wgpu-native) on Mesa's software Vulkan driver (lavapipe).
The parent creates an adapter, a device and a buffer, then calls ``os.fork()``.  The
child does nothing with the GPU and ends with ``sys.exit(0)``: its interpreter
finalizes and runs the finalizers of the objects it inherited from the parent -- the
wgpu-py ``__del__`` methods call ``wgpuBufferRelease`` / ``wgpuDeviceRelease`` on driver
objects whose threads do not exist in the child: the release waits forever for them
(the parent waits for the child, so the whole program hangs) or the driver aborts the
child (SIGABRT; the parent prints ``child exited with -6``).
(``os._exit(0)`` in the child instead of ``sys.exit(0)`` exits cleanly.)
"""

import os
import sys

import wgpu

adapter = wgpu.gpu.request_adapter_sync(power_preference="low-power")
device = adapter.request_device_sync()
buffer = device.create_buffer(size=1 << 16, usage=wgpu.BufferUsage.STORAGE)
print(f"adapter: {adapter.info.get('device', '?')}", flush=True)

pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's normal exit: finalizes the inherited wgpu objects

_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
print(f"child exited with {code}", flush=True)
sys.exit(0 if code == 0 else 1)
