"""The toy C library of the adapter tests: where its sources are, and test markers."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

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


class PinReleasedInACollection:
    """``with PinReleasedInACollection(pin, address) as collection: <one track call>``:
    garbage collection is forced inside the call (threshold 1: at its first allocations of
    tracked objects), and the collection's gc callback releases ``pin``;
    ``collection.window`` then says whether that ran while ``address`` was reserved in the
    adapters' address table: the compiled track reserves it after checking the pin and
    before registering the handle.  The call must be written inside the block itself: a
    wrapper's frame or argument tuple would be an allocation of its own (3.9, 3.10), and so
    would a profile hook's frame objects."""

    def __init__(self, pin: Any, address: int) -> None:
        from exitsafe._pointers import addresses

        self._pin = pin
        self._address = address
        self._entries, self._reserved = addresses.shared_with_core()
        self._armed: list[Any] = []
        self._inside: list[bool] = []
        self._threshold = (700, 10, 10)

    def _release_the_pin(self, phase: str, info: object) -> None:
        if phase == "start" and self._armed:
            self._inside.append(self._entries.get(self._address) is self._reserved)
            self._armed.pop().release()

    def __enter__(self) -> PinReleasedInACollection:
        import gc

        self._threshold = gc.get_threshold()
        gc.callbacks.append(self._release_the_pin)
        gc.collect()
        gc.set_threshold(1)
        self._armed.append(self._pin)  # (after the collection above, which must not take it)
        return self

    def __exit__(self, *exc: object) -> None:
        import gc

        gc.set_threshold(*self._threshold)
        gc.callbacks.remove(self._release_the_pin)
        assert not self._armed, "no collection ran inside the call"

    @property
    def window(self) -> bool:
        """Whether the pin was released inside the compiled track's window."""
        return self._inside == [True]


def python_frames_of_adapter_track(call: object) -> int:
    """How many times ``call()`` entered the adapters' Python ``track`` (a profile hook)."""
    from exitsafe import _adapter

    entered = 0

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal entered
        if event == "call" and frame.f_code is _adapter.Adapter.track.__code__:
            entered += 1

    sys.setprofile(profile)
    try:
        call()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return entered


def remembers_no_pin_until_one_is_made(
    track: Any, handles: list[Any], make_pin: Any
) -> Any:
    """``track()`` (which appends a handle to ``handles``) of a function of an unpinned
    library, while another library is pinned: the first track looks for its pin (the
    Python path), the next one remembers there is none (the compiled path); the pin
    ``make_pin()`` returns is then found, and remembered, the same way.  Returns it."""
    assert python_frames_of_adapter_track(track) == 1  # finds no pin
    assert python_frames_of_adapter_track(track) == 0  # remembers that
    pin = make_pin()  # forgets it
    assert python_frames_of_adapter_track(track) == 1
    assert python_frames_of_adapter_track(track) == 0
    assert [h.depends_on for h in handles] == [(), (), (pin,), (pin,)]
    return pin
