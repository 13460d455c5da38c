"""Reference points for the hot path: the least a pure-Python tracker can cost.

These are not exitsafe.  They show how close a pure-Python design could get to
cffi's ``ffi.gc`` (implemented in C) on this machine: a handle registered weakly
in a dict and released by popping it, first with no lock at all (relying on the
GIL, so not safe for concurrent double releases), then with one lock section for
track and one for release, which is the least a thread-safe design needs.
"""

from __future__ import annotations

import _thread
from _weakref import ref
from itertools import count
from typing import Any, Callable, Dict


class MinimalHandle:
    __slots__ = ("__weakref__", "_fn", "_key", "_owner", "_raw")

    def release(self) -> None:
        fn = self._fn
        if fn is None:
            return
        self._fn = None
        del self._owner._live[self._key]
        fn(self._raw)


class MinimalRegistry:
    """Weak registration + release by key: no lock, no ledger, no graph."""

    def __init__(self) -> None:
        self._live: Dict[int, Any] = {}
        self._next = count().__next__

    def track(self, raw: object, fn: Callable[[Any], object]) -> MinimalHandle:
        h = MinimalHandle()
        h._raw = raw
        h._fn = fn
        h._owner = self
        key = h._key = self._next()
        self._live[key] = ref(h)
        return h


class LockedHandle(MinimalHandle):
    __slots__ = ()

    def release(self) -> None:
        owner = self._owner
        with owner._lock:
            fn = self._fn
            if fn is None:
                return
            self._fn = None
            del owner._live[self._key]
        fn(self._raw)


class LockedRegistry(MinimalRegistry):
    """As :class:`MinimalRegistry`, with one lock section in track and one in release."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = _thread.allocate_lock()

    def track(self, raw: object, fn: Callable[[Any], object]) -> MinimalHandle:
        h = LockedHandle()
        h._raw = raw
        h._fn = fn
        h._owner = self
        with self._lock:
            key = h._key = self._next()
            self._live[key] = ref(h)
        return h
