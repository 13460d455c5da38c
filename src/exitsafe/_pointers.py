"""Tracked pointers: the address table the adapters share and a pointer's release function.

A native address is owned by at most one live handle, whichever FFI tracked it
(`addresses`, a `ClaimTable`): `Adapter.track` claims the address (in the claim's own
section), registers the handle, then binds the address to it; the handle's release
function, a `PointerRelease`, forgets the address and calls the program's release.  The
compiled core makes the same objects and steps in C (`pointer_release` is its
``PointerRelease`` then).

An interrupt anywhere in a track leaves no address claimed and no handle registered that
its caller did not get (`undo_claimed_track`), except as the handle is handed over: an
interrupt acted on as the registry's track returns it to the adapter (CPython acts on a
signal right after a C function returns), or as the adapter's track returns it, reaches the
caller with the handle tracked, and dropped with the exception: released then, as for
`Registry.track` (see its documentation).
"""

from __future__ import annotations

from ._claims import ClaimTable
from ._core import speedups
from ._releases import undo_track

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from ._handle import Handle

__all__ = [
    "PointerRelease", "addresses", "already_tracked", "pointer_release", "undo_claimed_track",
]

#: Native addresses owned by live handles, whichever FFI tracked them.
addresses = ClaimTable(strong=False)


class PointerRelease:
    """The release function of a tracked pointer: forget the address, call ``release``.
    ``handle`` is a weak reference to the handle once its track bound it (else ``None``)."""

    __slots__ = ("address", "handle", "keep", "release")

    def __init__(self, release: Callable[[Any], object], address: int, keep: object) -> None:
        self.release = release
        self.address = address
        self.keep = keep  # what the release call needs (ffi, library), kept referenced
        self.handle: Optional[Callable[[], Optional[Handle]]] = None

    def __call__(self, raw: Any) -> None:
        addresses.forget(self.address, self.handle() if self.handle is not None else None)
        self.release(raw)


def already_tracked(address: object, existing: Optional[Handle]) -> str:
    """The message of a second ``track`` of a tracked pointer (see `ClaimTable.claim`)."""
    where = (
        f"as {existing.kind} {existing.name!r}" if existing is not None
        else "by another thread right now"
    )
    return (
        f"pointer 0x{address:x} is already tracked {where}; releasing it twice "
        f"would be a double free (use handle_of(ptr).retain() to share ownership)"
    )


def undo_claimed_track(handle: Optional[Handle], address: int, bound: bool) -> None:
    """A track that claimed ``address`` raises (an interrupt): its registration, if it got
    the handle, is undone as `Registry.track` undoes its own (detached, never released:
    the caller still owns the pointer), and the address, unless already ``bound`` to the
    handle, is given back."""
    try:
        if handle is not None:
            undo_track(handle)
    finally:
        if not bound:
            addresses.cancel(address)


#: What `Adapter.track` makes: the compiled core's `PointerRelease` (the same fields and
#: call, in C) when it runs, else the class above.
pointer_release: Callable[[Callable[[Any], object], int, object], Any] = PointerRelease
if speedups is not None:
    speedups.setup_pointers(*addresses.shared_with_core(), addresses.forget)
    pointer_release = speedups.PointerRelease
