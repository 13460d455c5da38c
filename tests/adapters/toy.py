"""The toy C library of the adapter tests: where its sources are, and test markers."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

NATIVE = Path(__file__).resolve().parent / "native"
HEADER = (NATIVE / "toy.h").read_text()

needs_posix = pytest.mark.skipif(
    sys.platform == "win32", reason="the toy library is built with a POSIX C compiler"
)
needs_proc_maps = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)"
)


#: The compiled tracks' window between the check of a remembered pin and the registration
#: can be entered by Python code only through a garbage collection run inside the C call,
#: which CPython does up to 3.11 (from 3.12 a collection waits for a bytecode boundary).
collection_inside_a_c_call = pytest.mark.skipif(
    sys.version_info >= (3, 12),
    reason="from CPython 3.12 a collection runs at the next bytecode boundary, never inside "
    "a C call, so no Python code can land in this window (only another thread, under "
    "contention for exitsafe's lock)",
)


def release_inside_a_collection(
    pin: Any, address: int, call: Callable[[], Any]
) -> tuple[Any, bool]:
    """``call()`` with garbage collection forced at its second allocation of a tracked
    object (threshold 1), whose gc callback releases ``pin``; returns what ``call``
    returned and whether that collection ran while ``address`` was reserved in the
    adapters' address table (the compiled track reserves it after checking the pin, before
    registering the handle: the window).  No profiling: a frame object made for a profile
    hook is an allocation too, and would move the collection."""
    import gc

    from exitsafe._adapter import addresses

    entries, reserved = addresses.shared_with_core()
    armed: list[Any] = []
    inside: list[bool] = []

    def release_the_pin(phase: str, info: object) -> None:
        if phase == "start" and armed:
            inside.append(entries.get(address, (None, None))[1] is reserved)
            armed.pop().release()

    threshold = gc.get_threshold()
    gc.callbacks.append(release_the_pin)
    try:
        gc.collect()
        gc.set_threshold(1)
        armed.append(pin)  # (after the collection above: its callback must not take it)
        result = call()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(release_the_pin)
    assert not armed, "no collection ran inside the call"
    return result, inside == [True]
