"""A daemon thread inside a C++ worker loop (``noexcept``) when the interpreter finalizes:
up to CPython 3.13 it is unwound with ``pthread_exit`` and the C++ runtime aborts.  The
shape of onnxruntime's or pyopencl's pools.  ``sys.argv[1]``: the loop's library, built by
the catalogue test."""

import ctypes
import sys
import threading
import types

lib = ctypes.CDLL(sys.argv[1])
TICK = ctypes.CFUNCTYPE(None)
in_native_code = threading.Event()


@TICK
def tick() -> None:
    in_native_code.set()


lib.spin_calling.argtypes = [TICK]


def run_pool() -> None:
    lib.spin_calling(tick)


class Session:
    def __del__(self, close=lib.session_close) -> None:
        close()  # a native release at finalization: the GIL is let go meanwhile


binding = sys.modules["binding"] = types.ModuleType("binding")
binding.session = Session()  # type: ignore[attr-defined]
del binding
threading.Thread(target=run_pool, name="inference-pool", daemon=True).start()
in_native_code.wait(30)
print("inference done", flush=True)
