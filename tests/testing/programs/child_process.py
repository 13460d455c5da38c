"""A forked child crashes in native code while the parent waits for it."""

import ctypes
import os

pid = os.fork()
if pid == 0:
    ctypes.string_at(0)
    os._exit(0)
os.waitpid(pid, 0)
print("child waited for", flush=True)
