"""The handle record: one native object's bookkeeping, the data the core's layers share.

`Node` is the base class of [`exitsafe.Handle`][exitsafe.Handle]: the record's fields live
in the handle object itself (one object per native handle).  Its fields, all named
with a leading underscore, are the private record of the core: the graph
(`exitsafe._graph`), the teardown executor (`exitsafe._teardown`) and the
registry (`exitsafe._registry`) read and write them; nothing outside those layers
does, and the public API of [`exitsafe.Handle`][exitsafe.Handle] reads them through properties.

A registry refers to its nodes *weakly* (so that the garbage collection of a handle,
even in a reference cycle through its own raw object, means "its owner let go"),
except teardown hooks, which it owns.  A node refers to the nodes it depends on
strongly, so a parent lives at least as long as its dependents.

Fields are written only under `exitsafe._sync.LOCK`, except by a thread that
has *claimed* the node (state ``RELEASING``) and is the only one touching it.  States
move one way: ``LIVE -> RELEASING -> RELEASED | LEAKED`` (or ``LIVE -> LEAKED |
DETACHED`` directly when no release function runs).
"""

from __future__ import annotations

from ._core import speedups
from ._ledger import Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from ._registry import Registry

# States of the native object.  States above RELEASING are final.
LIVE, RELEASING, RELEASED, LEAKED, DETACHED = 0, 1, 2, 3, 4
STATE_NAMES = ("live", "live", "released", "leaked", "detached")

#: ``_releaser`` of a node that ended in an exit teardown, once recorded (``0``: it
#: ended outside one).  Read only once the state is final, where it names no thread.
ENDED_AT_EXIT = 1

# Roles, which are also the planner's step priorities among ready steps: hooks first,
# then ordinary handles, then libraries (whose code the others' releases may run).
HOOK, HANDLE, LIBRARY = 0, 1, 2

#: Outcomes after which the native object may still exist: whatever it depends on must
#: then be leaked too, never released from under it.
TAINTING = frozenset(
    {
        Outcome.LEAKED_POLICY,
        Outcome.LEAKED_IN_USE,
        Outcome.LEAKED_TIMEOUT,
        Outcome.LEAKED_DEPENDENT,
        Outcome.LEAKED_AFTER_CLOSE,
        Outcome.LEAKED_INHERITED,
        Outcome.LEAKED_INTERRUPTED,
        Outcome.LEAKED_AFFINITY,
        Outcome.RELEASE_FAILED,
        Outcome.HOOK_TIMEOUT,
    }
)


if TYPE_CHECKING:
    _RecordBase = object
else:
    # The compiled core's record keeps the same fields in C (see exitsafe._core).
    _RecordBase = speedups.Node if speedups is not None else object

_FIELDS = (
    "__weakref__",
    "_affinity",
    "_borrows",
    "_children",
    "_fn",
    "_gen",
    "_in_child",
    "_kind",
    "_name",
    "_parents",
    "_policy",
    "_rank",
    "_raw",
    "_refs",
    "_registry",
    "_releaser",
    "_role",
    "_seq",
    "_state",
    "_taint",
    "_thread_id",
    "_timeout",
)


class Node(_RecordBase):
    """One handle's record (see the module documentation)."""

    __slots__ = _FIELDS if _RecordBase is object else ()

    _registry: Registry
    #: The raw object and its release function; both ``None`` once the node ended.
    #: A hook's ``_raw`` is ``None`` and its ``_fn`` calls the hook.
    _raw: Any
    _fn: Optional[Callable[[Any], object]]
    _kind: str
    _name: Optional[str]  # the name given at registration, or None ("<kind>#<seq>")
    _seq: int  # creation number, set when registered
    _rank: float  # topological rank: lower than every dependent's (see _graph)
    _parents: tuple[Node, ...]  # the nodes this one depends on; () once it ended
    _policy: Any  # exit policy, or None for the registry's default
    _timeout: Optional[float]  # seconds its teardown step may take, or None
    _role: int
    _refs: int  # owners
    _children: int  # live nodes depending on this one (a hook's edges not counted)
    _borrows: int  # borrows in progress
    _state: int
    _releaser: int  # while RELEASING: ident of the releasing thread; then ENDED_AT_EXIT or 0
    _taint: Optional[str]  # why it must be leaked (a dependent may still use it)
    _gen: int  # fork generation it was created in (read without the lock)
    _thread_id: int  # the creating thread (read without the lock)
    _affinity: Any  # the threading.Thread its release must run on, or None (any)
    _in_child: bool  # a hook that also runs in a forked child (see on_teardown)

    def _init(
        self,
        registry: Registry,
        raw: object,
        fn: Optional[Callable[[Any], object]],
        kind: str,
        name: Optional[str],
        parents: tuple[Node, ...],
        policy: Any,
        timeout: Optional[float],
        role: int,
        gen: int,
        thread_id: int,
    ) -> None:
        self._registry = registry
        self._raw = raw
        self._fn = fn
        self._kind = kind
        self._name = name
        self._seq = 0
        self._rank = 0.0
        self._parents = parents
        self._policy = policy
        self._timeout = timeout
        self._role = role
        self._refs = 1
        self._children = 0
        self._borrows = 0
        self._state = LIVE
        self._releaser = 0
        self._taint = None
        self._gen = gen
        self._thread_id = thread_id
        self._affinity = None
        self._in_child = False

    def _taint_parents(self, outcome: str) -> None:
        """This node ended ``outcome`` (a tainting one): the native object may still
        exist and use what it depends on, so those must be leaked, never released."""
        parents = self._parents
        if parents:
            reason = f"{self._kind} {self._display_name()!r} depending on it ended {outcome}"
            for parent in parents:
                if parent._taint is None:
                    parent._taint = reason

    def _display_name(self) -> str:
        name = self._name
        return name if name is not None else f"{self._kind}#{self._seq}"
