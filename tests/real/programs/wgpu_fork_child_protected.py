"""PROTECTED: wgpu_fork_child.py with the forked-child setting.

The child still ends with ``sys.exit(0)``; with ``exitsafe.lowlevel.set_fork_exit("quiet")`` its
exit tears down what the child itself owns, flushes stdio and ends with
``os._exit(0)``: no finalizer of the wgpu objects it inherited runs, and neither do the
Vulkan driver's C-level atexit handlers.  Exit 0, parent and child.
"""


import os
import sys

import wgpu

import exitsafe

# A forked child that ends normally leaves quietly: its own teardown, flushed stdio,
# os._exit(status); the parent's wgpu objects are never finalized there.  (The same as
# EXITSAFE_FORK_EXIT=quiet in the environment, for programs you do not edit.)
exitsafe.lowlevel.set_fork_exit("quiet")

adapter = wgpu.gpu.request_adapter_sync(power_preference="low-power")
device = adapter.request_device_sync()
buffer = device.create_buffer(size=1 << 16, usage=wgpu.BufferUsage.STORAGE)
print(f"adapter: {adapter.info.get('device', '?')}", flush=True)

pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's normal exit: quiet, with this status

_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
print(f"child exited with {code}", flush=True)
sys.exit(0 if code == 0 else 1)
