"""LeakSanitizer: native objects leaked on purpose are not leaks.

With ``EXITSAFE_LSAN=1`` (exitsafe imports this module then), every handle that ends
with a ``leaked_*`` ledger outcome (exit policy ``leak``, inherited by a fork, timed out,
dependent of one of those) has its raw pointer handed to ``__lsan_ignore_object``, so
LeakSanitizer's report at process exit lists only the objects nobody decided to keep:
a leak-checked CI stays green without forcing ``EXITSAFE_AT_EXIT=release``.

The symbol is looked up once, in the process (``LD_PRELOAD=libasan.so`` or
``liblsan.so``, or an interpreter built with the sanitizer); when it is absent every
call is a no-op.  The pointer is the handle's raw value: a cffi pointer, a ctypes pointer
(``c_void_p``, ``POINTER(T)``) or an ``int`` address, which must be the start of the
heap block (what the native allocator returned), as ``__lsan_ignore_object`` requires.

Interface for the core: `leaked` is called with the raw object when a handle ends
leaked.  Never raises.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_ignore: Optional[Callable[[int], Any]] = None
_looked_up = False
#: Addresses handed to LeakSanitizer in this process (for tests and the trace).
ignored: list[int] = []


def enabled() -> bool:
    """Whether ``EXITSAFE_LSAN`` asks for the hand-over."""
    return os.environ.get("EXITSAFE_LSAN", "").strip().lower() in ("1", "true", "yes", "on")


def _lookup() -> Optional[Callable[[int], Any]]:
    global _ignore, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            import ctypes

            function = ctypes.CDLL(None).__lsan_ignore_object
            function.argtypes = [ctypes.c_void_p]
            function.restype = None
            _ignore = function
        except (OSError, AttributeError):
            _ignore = None
    return _ignore


def available() -> bool:
    """Whether the LeakSanitizer runtime is loaded in this process."""
    return _lookup() is not None


def address_of(raw: object) -> Optional[int]:
    """The address a raw handle points to: cffi pointer, ctypes pointer or ``int``."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw or None
    cls = type(raw)
    if getattr(cls, "__module__", "") == "_cffi_backend":
        import _cffi_backend  # type: ignore[import-untyped]

        return int(_cffi_backend.FFI().cast("uintptr_t", raw)) or None
    value = getattr(raw, "value", None)
    if isinstance(value, int):
        return value or None
    try:
        import ctypes

        return ctypes.cast(raw, ctypes.c_void_p).value  # type: ignore[arg-type]
    except Exception:
        return None


def leaked(raw: object) -> None:
    """Tell LeakSanitizer that the native object ``raw`` points to is leaked on purpose."""
    try:
        ignore = _lookup()
        if ignore is None:
            return
        address = address_of(raw)
        if address:
            ignore(address)
            ignored.append(address)
    except Exception:
        pass
