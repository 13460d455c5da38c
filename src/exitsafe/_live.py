"""A registry's handles not yet ended, oldest first: its ``_live`` table.

A handle is held *weakly*: dropping the last reference to it (even in a reference cycle
through its own raw object) means its owner let go, and its finalizer releases it.  A
teardown hook is held *strongly*: the registry owns it until its teardown.  The table
is changed and read (`nodes`, ``len``) under `exitsafe._sync.LOCK`.

`LiveTable` is the compiled core's (``exitsafe._speedups.LiveTable``: the records are
linked in place, so adding and removing one allocates nothing) or, in pure Python, the
class below: a dict from creation number to a weak reference or the hook itself.  Both
list their nodes in the order they were added (creation order).
"""

from __future__ import annotations

from _weakref import ref as _weakref

from ._core import speedups

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._record import Record as Node

__all__ = ["LiveTable", "take_lost"]


class PurePythonLiveTable(dict):  # type: ignore[type-arg]
    """The pure-Python `LiveTable` (see the module documentation).

    It is the dict itself, creation number -> weak reference (a handle) or node (a hook,
    or a handle being collected).  Removing an entry decides who records a handle's end:
    whoever removes it (`take`) records the outcome, so a release finishing on one thread
    and a teardown giving up waiting for it on another never both do.
    """

    __slots__ = ()

    def add(self, node: Node, owned: bool) -> None:
        """Add ``node``: held strongly if ``owned`` (a hook), else weakly (a handle)."""
        self[node._seq] = node if owned else _weakref(node)

    def hold(self, node: Node) -> bool:
        """Hold ``node`` strongly from now on, if it is here; whether it is (a record
        never registered is not).  For a handle whose garbage collection began but which
        has not ended (its release runs, or waits for its dependents or borrows): a
        cyclic collection clears the weak reference before the finalizer runs; without
        this the teardown would not see the handle, which would end with no outcome, and
        its parents would be released under it."""
        if node._seq in self:
            self[node._seq] = node
            return True
        return False

    def discard(self, node: Node) -> None:
        """Remove ``node`` if it is here."""
        self.pop(node._seq, None)

    def take(self, node: Node) -> bool:
        """Remove ``node``; whether it was here (then the caller records its end)."""
        return self.pop(node._seq, None) is not None

    def nodes(self) -> list[Node]:
        """The handles and hooks still here and alive, oldest first (in the order they
        were added)."""
        found = [e() if type(e) is _weakref else e for e in self.values()]
        return [n for n in found if n is not None]

    def since(self, seq: int) -> list[Node]:
        """The handles and hooks still here and alive created after creation number
        ``seq``, oldest first: the newest entries, found without listing the others (for
        the graph's index of dependents, `exitsafe._graph`).  Entries are added under the
        lock in the order of their numbers, so they are the dict's last ones."""
        found = []
        for key in reversed(self):  # (a dict in insertion order: creation order)
            if key <= seq:
                break
            found.append(self[key])
        found.reverse()
        nodes = [e() if type(e) is _weakref else e for e in found]
        return [n for n in nodes if n is not None]


LiveTable: Any = speedups.LiveTable if speedups is not None else PurePythonLiveTable


def take_lost(table: Any) -> list[int]:
    """Remove the handles that died without their finalizer running, and return their
    creation numbers (the caller holds the lock and records their end).

    Only the pure-Python table can have any: its handles' finalizer is a Python
    ``__del__``, and CPython 3.11+ acts on a pending signal as that frame starts, before
    any of its code runs; the ``KeyboardInterrupt`` is then reported as an exception
    ignored in the finalizer, and the handle is freed with only a dead weak reference
    left here.  The compiled core's finalizer is C code, run whole.

    Call it only when no garbage collection is running (`exitsafe._collection`): a
    collection clears the weak references to its garbage before it runs their
    finalizers, which are then still to come."""
    if type(table) is not PurePythonLiveTable:
        return []
    lost = [seq for seq, e in table.items() if type(e) is _weakref and e() is None]
    for seq in lost:
        del table[seq]
    return lost
