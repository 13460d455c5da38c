"""A daemon thread still painting into a pixel buffer when the program's own exit
handler frees it (the shape of cairocffi's ``surface.finish()`` under a fill in flight):
the thread's next write crashes the process, on that thread.

The buffer is an anonymous mapping that the exit handler unmaps, so the thread's next
write faults whatever the allocator would have done; the handler then waits (bounded)
with the GIL released, so the thread does run again.
"""

import atexit
import ctypes
import threading

libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
SIZE = 1 << 24
PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS = 3, 0x22
pixels = libc.mmap(None, SIZE, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
painting = threading.Event()


def paint_forever() -> None:
    value = 0
    while True:
        libc.memset(pixels, value, SIZE)  # native code, the GIL released
        value = (value + 1) % 256
        painting.set()


def free_pixels() -> None:
    libc.munmap(pixels, SIZE)
    threading.Event().wait(5)  # (never set: the painter runs meanwhile, and crashes)


atexit.register(free_pixels)
threading.Thread(target=paint_forever, name="painter", daemon=True).start()
painting.wait(5)
print("painting; main thread ends", flush=True)
