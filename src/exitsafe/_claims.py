"""A table of keys (an object's id, a native address) that at most one live handle owns:
how `adopt` refuses a second adoption of an object and the adapters a second `track` of
a pointer, with no window between the check and the registration.

A key is *claimed* (reserved) before the handle is made, then *bound* to the handle, or
*cancelled* if making it failed; it goes when the handle is released (*forgotten*).
Every change runs under exitsafe's one lock (`exitsafe._sync`); a lookup reads without
it.
"""

from __future__ import annotations

from _weakref import ref as _weakref

from . import _sync
from ._errors import AlreadyTrackedError
from ._record import RELEASING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from ._handle import Handle

__all__ = ["ClaimTable"]


class ClaimTable:
    """Keys (an object's id, a native address) owned by at most one live handle.

    `claim` reserves a key atomically before the handle is registered, so two
    threads tracking the same object cannot both succeed (a double release later);
    `bind` then records the handle, `cancel` drops a reservation whose
    registration failed, `forget` removes a key when its handle ends.  Guarded
    by exitsafe's one lock (see `exitsafe._sync`).  ``strong=True`` keeps the
    handles referenced (an adopted object's handle must live until it is released);
    otherwise they are held weakly.
    """

    __slots__ = ("_entries", "_identities", "_strong")

    def __init__(self, strong: bool) -> None:
        # key -> the handle owning it (strong), a weak reference to it, or _RESERVED while
        # it is being registered (one object per entry: the compiled core's track makes no
        # tuple for it)
        self._entries: dict[object, Any] = {}
        # key -> what a claim said the key stands for (`adopt`: the object, against a
        # reused id), for the keys claimed with one
        self._identities: dict[object, object] = {}
        self._strong = strong

    def shared_with_core(self) -> tuple[dict[object, Any], object]:
        """The table's dict and its reservation marker, for the compiled core (which
        claims and forgets keys under the same lock, with the same entries; it claims none
        with an identity).  Neither is ever replaced."""
        return self._entries, _RESERVED

    def get(self, key: object, identity: object = None) -> Optional[Handle]:
        """The live handle owning ``key`` (and, if given, standing for ``identity``)."""
        entry = self._entries.get(key)
        if entry is None or entry is _RESERVED:
            return None
        if identity is not None and self._identities.get(key) is not identity:
            return None
        handle = entry if self._strong else entry()
        if handle is None or handle.state != "live" or not handle.owners:
            return None
        return handle  # type: ignore[no-any-return]

    def claim(
        self,
        key: object,
        identity: object,
        describe: Callable[[object, Optional[Handle]], str],
        mark: Optional[list[object]] = None,
    ) -> None:
        """Reserve ``key``; raise [`AlreadyTrackedError`][exitsafe.AlreadyTrackedError] if a live
        handle owns it, with the message ``describe(key, that handle)`` (``None``: another
        thread is registering the key right now).  When the queued work run on leaving
        the section raises, the reservation is dropped before that error is raised.

        ``mark``: an empty list of the caller's, which gets ``key`` in the section that
        reserves it: from then on the reservation is the caller's, to `bind` or `cancel`
        whatever raises (in here too, an interrupt as this returns included).  Without
        it, an interrupt anywhere in here drops the reservation it made."""
        if _sync.reentered():
            raise _sync.refused("track()")
        entries, identities = self._entries, self._identities
        taken = reserved = False
        existing = _UNREAD
        try:
            _sync.acquire(False) or _sync.wait()
            entry = entries.get(key)
            if entry is not None:
                if entry is _RESERVED:
                    taken = True
                else:
                    existing = self.get(key, identity)
                    taken = existing is not None
            if not taken:
                reserved = True  # (first: an interrupt before the store finds it free)
                entries[key] = _RESERVED
                if identity is not None:
                    identities[key] = identity
                elif identities:
                    identities.pop(key, None)
                if mark is not None:
                    mark.append(key)  # (the caller's now)
            _sync.release()  # (the section's shape: see exitsafe._sync.locked)
            if taken:
                found = None if existing is _UNREAD else existing
                raise AlreadyTrackedError(describe(key, found), found)
            if _sync.deferred:
                _sync.run_deferred()
        except BaseException:  # (an interrupt, or the queued work raised: the error first)
            ours = reserved and not mark  # (reserved here, and not handed to the caller)
            if _sync.reentered():
                if ours and entries.get(key) is _RESERVED:
                    self._drop_reserved(key)
                _sync.release()
            elif ours:
                _sync.locked_quietly(self._drop_reserved, key)
            raise

    def bind(self, key: object, handle: Handle) -> None:
        """Record the handle of a claimed key (or drop the claim if it is not live)."""
        if handle._state <= RELEASING:  # (Handle.state == "live")
            self._entries[key] = handle if self._strong else _weakref(handle)
        else:
            self.cancel(key)

    def cancel(self, key: object) -> None:
        """Drop a reservation whose registration failed."""
        _sync.locked("track()", lambda: self._drop_reserved(key))

    def forget(self, key: object, handle: Optional[Handle]) -> None:
        """Remove ``key`` if ``handle`` (or a dead handle) still owns it.  (A section
        written out: this runs in every adapter handle's release.)"""
        if _sync.reentered():
            raise _sync.refused("release")
        entries = self._entries
        try:
            _sync.acquire(False) or _sync.wait()
            entry = entries.get(key)
            if entry is not None and entry is not _RESERVED:
                current = entry if self._strong else entry()
                if current is None or current is handle:
                    del entries[key]
                    self._identities.pop(key, None)
            _sync.release()  # (the section's shape: see exitsafe._sync.locked)
        except BaseException:
            if _sync.reentered():  # (the section's shape: see exitsafe._sync.locked)
                _sync.release()
            raise
        if _sync.deferred:
            _sync.run_deferred()

    def _drop_reserved(self, key: object) -> None:
        """Drop ``key`` if it is still only reserved (under the lock)."""
        if self._entries.get(key) is _RESERVED:
            del self._entries[key]
            self._identities.pop(key, None)


_RESERVED = object()
#: A value not read yet (in `ClaimTable.claim`'s section).
_UNREAD: Any = object()
