"""Exits 0, but a cffi pointer's destructor runs after exitsafe's teardown, while the
interpreter finalizes (a latent hazard the audit reports)."""

import cffi

import exitsafe

ffi = cffi.FFI()
ffi.cdef("void *malloc(size_t); void free(void *);")
libc = ffi.dlopen(None)
runtime = exitsafe.track(1, lambda raw: None, kind="runtime", name="runtime")
scratch = ffi.gc(libc.malloc(64), libc.free)
print("done", flush=True)
