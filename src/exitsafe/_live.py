"""A registry's handles not yet ended, oldest first: its ``_live`` table.

A handle is held *weakly*: dropping the last reference to it (even in a reference cycle
through its own raw object) means its owner let go, and its finalizer releases it.  A
teardown hook is held *strongly*: the registry owns it until its teardown.  The table
is changed only under `exitsafe._sync.LOCK`; reading it (`nodes`, ``len``) is done
under the lock too.

`LiveTable` is the compiled core's (``exitsafe._speedups.LiveTable``: the records are
linked in place, so adding and removing one allocates nothing) or, in pure Python, the
class below: a dict from creation number to a weak reference or the hook itself.  Both
keep insertion order, which is creation order (numbers are handed out under the lock).
"""

from __future__ import annotations

from _weakref import ref as _weakref

from ._core import speedups

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._node import Node

__all__ = ["LiveTable"]


class PurePythonLiveTable:
    """The pure-Python `LiveTable` (see the module documentation)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, Any] = {}

    def add(self, node: Node, owned: bool) -> None:
        """Add ``node``: held strongly if ``owned`` (a hook), else weakly (a handle)."""
        self._entries[node._seq] = node if owned else _weakref(node)

    def hold(self, node: Node) -> None:
        """Hold ``node`` strongly from now on, if it is here: a handle whose garbage
        collection began but which has not ended (its release runs, or waits for its
        dependents or borrows).  A cyclic collection clears the weak reference before the
        finalizer runs; without this the teardown would not see the handle, which would
        end with no outcome, and its parents would be released under it."""
        if node._seq in self._entries:
            self._entries[node._seq] = node

    def discard(self, node: Node) -> None:
        """Remove ``node`` if it is here."""
        self._entries.pop(node._seq, None)

    def nodes(self) -> list[Node]:
        """The handles and hooks still here and alive, oldest first."""
        found = [e() if type(e) is _weakref else e for e in self._entries.values()]
        return [n for n in found if n is not None]

    def __len__(self) -> int:
        return len(self._entries)


LiveTable: Any = speedups.LiveTable if speedups is not None else PurePythonLiveTable
