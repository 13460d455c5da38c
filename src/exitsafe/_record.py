"""The handle record and its state machine: the one module that writes a record's fields.

`Record` is the base class of [`exitsafe.Handle`][exitsafe.Handle]: a handle *is* its record
(one object per native object, no second allocation).  Its fields are named with a leading
underscore only to keep them off the public `Handle` API; they are the data exitsafe's
layers share.  Those layers read them freely; **only the functions of this module write
them** (`tests/core/test_layers.py` checks it).  Each function is one transition of
the state machine below, written so that an exception raised between any two of its
instructions (a ``KeyboardInterrupt`` under a tracer, a signal on CPython 3.9) leaves the
record in a state the caller can recognise and settle: a claim names its thread before
the state says ``RELEASING``, and an end is recorded before the parents let go.

States move one way::

    LIVE --claim--> RELEASING --end--> RELEASED | LEAKED | DETACHED
    LIVE --end--> LEAKED | DETACHED                      (no release function runs)
    RELEASING --unclaim--> LIVE                          (a fork; a queued release taken back)

A record is *due* (its native release may run now) when it is ``LIVE`` with no owner, no
live dependent and no borrow: `is_due` is the one place that says so.

Fields are written under `exitsafe._sync.LOCK`, except by the one thread that claimed the
record (state ``RELEASING``) and the compiled core, whose C code mirrors the hot
transitions (`claim`, `end` with ``released``, `add_owner`, `drop_owner`) field for field
(``exitsafe._speedups.Node`` keeps the same fields in C).
"""

from __future__ import annotations

from ._core import speedups
from ._ledger import Outcome, ends_with, packed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    _R = TypeVar("_R", bound="Record")

# States of the native object.  States above RELEASING are final.
LIVE, RELEASING, RELEASED, LEAKED, DETACHED = 0, 1, 2, 3, 4
STATE_NAMES = ("live", "live", "released", "leaked", "detached")

#: ``_releaser`` of a record that ended in an exit teardown, once recorded (``0``: it
#: ended outside one).  Read only once the state is final, where it names no thread.
ENDED_AT_EXIT = 1

_RELEASED = Outcome.RELEASED
#: The class of a live pure-Python handle, and the same class without its finalizer
#: (see `finalizer_free`), registered by the module that defines them.
_FINALIZING: type = type(None)
_WITHOUT_FINALIZER: type = type(None)
#: The pure-Python live table is a dict of creation number -> weak reference (see
#: exitsafe._live), whose own ``pop`` runs no Python frame.
_DICT_TABLE = speedups is None

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

#: The record's fields, in one place (the compiled record declares the same in C).
FIELDS = (
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


class Record(_RecordBase):
    """One native object's bookkeeping (see the module documentation)."""

    __slots__ = ("__weakref__", *FIELDS) if _RecordBase is object else ()

    #: The registry's state (an ``exitsafe._state.RegistryState``) the record belongs to.
    _registry: Any
    #: The raw object and its release function; both ``None`` once the record ended.
    #: A hook's ``_raw`` is ``None`` and its ``_fn`` calls the hook.
    _raw: Any
    _fn: Optional[Callable[[Any], object]]
    _kind: str
    _name: Optional[str]  # the name given at registration, or None ("<kind>#<seq>")
    _seq: int  # creation number, set when registered (0 until then)
    _rank: float  # topological rank: lower than every dependent's (see _graph)
    _parents: tuple[Record, ...]  # the records this one depends on; () once it ended
    _policy: Any  # exit policy, or None for the registry's default
    _timeout: Optional[float]  # seconds its teardown step may take, or None
    _role: int
    _refs: int  # owners
    _children: int  # live records depending on this one (a hook's edges not counted)
    _borrows: int  # borrows in progress
    _state: int
    _releaser: int  # while RELEASING: ident of the releasing thread; then ENDED_AT_EXIT or 0
    _taint: Optional[str]  # why it must be leaked (a dependent may still use it)
    _gen: int  # fork generation it was created in (read without the lock)
    _thread_id: int  # the creating thread (read without the lock)
    _affinity: Any  # the threading.Thread its release must run on, or None (any)
    _in_child: bool  # a hook that also runs in a forked child (see on_teardown)


_new = object.__new__


# ---------------------------------------------------------------------- creation


def new(
    cls: type[_R],
    registry: Any,
    raw: object,
    fn: Optional[Callable[[Any], object]],
    kind: str,
    name: Optional[str],
    parents: tuple[Record, ...],
    policy: Any,
    timeout: Optional[float],
    role: int,
    gen: int,
    thread_id: int,
    affinity: Any = None,
    in_child: bool = False,
    seq: int = 0,
) -> _R:
    """A new record of class ``cls`` with one owner and the creation number ``seq`` (0:
    given when it is registered, `number`).

    Every field is set once; the owner count last: until then the handle's finalizer
    does nothing.  Its finalizer also does nothing while the record is not in its
    registry's live table, so a record an interrupt left unregistered is never
    released."""
    node = _new(cls)
    node._seq = seq
    node._rank = seq
    node._registry = registry
    node._raw = raw
    node._fn = fn
    node._kind = kind
    node._name = name
    node._parents = parents
    node._policy = policy
    node._timeout = timeout
    node._role = role
    node._children = 0
    node._borrows = 0
    node._state = LIVE
    node._releaser = 0
    node._taint = None
    node._gen = gen
    node._thread_id = thread_id
    node._affinity = affinity
    node._in_child = in_child
    node._refs = 1
    return node


def number(node: Record, seq: int) -> None:
    """Give ``node`` its creation number (and the rank that goes with it): registered."""
    node._rank = seq
    node._seq = seq


def unnumber(node: Record) -> None:
    """Take back a creation number given to a registration that is refused after all."""
    node._seq = 0
    node._rank = 0.0


def disown(node: Record) -> None:
    """Forget a record whose registration was refused: the caller still owns its object.

    The handle's finalizer then finds no owner and never calls the release function."""
    node._refs = 0
    node._state = LEAKED
    node._raw = None
    node._fn = None
    node._parents = ()


# ---------------------------------------------------------------------- the graph


def set_rank(node: Record, rank: float) -> None:
    """Move ``node`` in the topological numbering (see ``exitsafe._graph``)."""
    node._rank = rank


def add_parent(node: Record, parent: Record) -> None:
    """``node`` depends on ``parent`` from now on.  The dependent count of ``parent`` goes
    up too unless ``node`` is a hook (a hook's edges order the teardown only: they never
    keep a handle alive)."""
    if node._role != HOOK:
        parent._children += 1
    node._parents = (*node._parents, parent)


def number_with_parents(node: Record, seq: int) -> None:
    """Register ``node``, created depending on its parents: its creation number (see
    `number`), and, unless it is a hook, one more live dependent for each parent.  An
    exception in the middle (an interrupt) completes it first: numbered, and each
    parent counted once (the caller holds the lock throughout)."""
    parents = node._parents if node._role != HOOK else ()
    counts = [p._children for p in parents]
    try:
        for parent in parents:
            parent._children += 1
        node._rank = seq
        node._seq = seq
    except BaseException:
        for parent, count in zip(parents, counts):
            if parent._children == count:
                parent._children = count + 1
        node._rank = seq
        node._seq = seq
        raise


# ---------------------------------------------------------------------- owners and borrows


def add_owner(node: Record) -> None:
    node._refs += 1


def drop_owner(node: Record) -> int:
    """One owner fewer; how many are left."""
    refs = node._refs = node._refs - 1
    return refs


def release_owner(node: Record, me: int) -> bool:
    """One owner fewer, and if that was the last thing holding ``node`` (no owner, no
    live dependent, no borrow left), thread ``me`` claims it (see `claim`): whether it
    did.  The caller checked the registry is open.  (`drop_owner` then `claim`, in one
    call: the release hot path's.)"""
    refs = node._refs = node._refs - 1
    if refs or node._children or node._borrows:
        return False
    node._releaser = me
    node._state = RELEASING
    return True


def collect(node: Record, me: int, live: Any) -> bool:
    """The garbage collection of ``node`` (its last reference was dropped) while its
    registry is open: if it is usable and in ``live`` (its registry's live table; a
    record an interrupted `track` left unregistered is not), it is held strongly there
    from now on (see `exitsafe._live.LiveTable.hold`), it has no owner any more, and if
    nothing else holds it (no live dependent, no borrow) thread ``me`` claims it:
    whether it did.  (`is_usable`, the table's ``hold``, `drop_all_owners` and `claim`, in
    one call: the garbage collection's hot path.)  The caller holds the lock."""
    if node._state != LIVE or not node._refs:
        return False
    seq = node._seq
    if _DICT_TABLE:  # (LiveTable.hold, written out)
        if seq not in live:
            return False
        live[seq] = node
    elif not live.hold(node):
        return False
    node._refs = 0
    if node._children or node._borrows:
        return False
    node._releaser = me
    node._state = RELEASING
    return True


def drop_all_owners(node: Record) -> None:
    """Nobody can release ``node`` any more (its last reference was dropped, or it is
    given back to the program)."""
    node._refs = 0


def add_borrow(node: Record) -> None:
    node._borrows += 1


def drop_borrow(node: Record) -> int:
    """One borrow fewer; how many are left."""
    borrows = node._borrows = node._borrows - 1
    return borrows


def is_due(node: Record) -> bool:
    """Whether ``node``'s native release may run now: ``LIVE``, and no owner, no live
    dependent and no borrow holds it.  (The registry also asks whether it is open.)"""
    return node._state == LIVE and not (node._refs or node._children or node._borrows)


def claimed_by(node: Record, me: int) -> bool:
    """Whether thread ``me`` claimed ``node`` and has not ended it yet (it must release
    it: see `claim`)."""
    return node._state == RELEASING and node._releaser == me


def is_usable(node: Record) -> bool:
    """Whether ``node`` still has an owner and is not being released or ended."""
    return node._state == LIVE and bool(node._refs)


# ---------------------------------------------------------------------- claims


def claim(node: Record, me: int) -> None:
    """Thread ``me`` releases ``node`` (``LIVE`` -> ``RELEASING``): no other thread will.

    The thread is named first: a ``RELEASING`` record always names its releaser."""
    node._releaser = me
    node._state = RELEASING


def unclaim(node: Record) -> None:
    """Give a claimed record back (``RELEASING`` -> ``LIVE``): its release will not run
    where it was claimed (a forked child, a queued release the teardown takes over)."""
    node._state = LIVE
    node._releaser = 0


def queue_for(node: Record, owner_ident: int) -> None:
    """A claimed thread-affine record waits for its owning thread, named as its releaser."""
    node._releaser = owner_ident


def mark(node: Record, outcome: str) -> None:
    """A teardown decided ``outcome`` for ``node`` (claimed by it): visible at once to
    ``Handle.state`` and to later hooks, recorded when the teardown records its
    decisions (`end`)."""
    node._state = LEAKED if outcome in TAINTING else RELEASED


def finalizer_free(cls: type, without: type) -> None:
    """Instances of ``cls`` become ``without`` (the same layout, no finalizer) once they
    ended released (`end_released`): their collection then runs no Python code."""
    global _FINALIZING, _WITHOUT_FINALIZER
    _FINALIZING, _WITHOUT_FINALIZER = cls, without


def end_released(node: Record, records: list[Any], live: Any, cap: int) -> bool:
    """A claimed leaf's release function returned (no parents, not a hook, not
    thread-affine, not inherited): it ends ``released``, its ledger record appended to
    ``records`` (its registry's ledger) and itself removed from ``live`` (its live table),
    the release hot path's `end`; the compiled core's ``record_released`` does the same.
    Returns whether ``records`` now hold more than ``cap`` (the caller then trims the
    ledger in its section).  The caller holds the lock; it also holds its
    own references to the raw object and the release function until its section ended
    (the record lets go of them here: their last reference must not go inside the
    section, where it could run the object's ``__del__``).  The record's finalizer goes
    too (see `finalizer_free`): it has nothing left to do.  A record a teardown already
    settled (it gave up waiting for this release) keeps its outcome.  An exception in the
    middle (an interrupt) completes the end first: one record, one removal."""
    if node._state != RELEASING:
        return False
    record = (node._seq, node._kind, node._name, _RELEASED, None, False)
    try:
        if _DICT_TABLE:  # (the pure-Python core, whose records are flat: _ledger.WIDTH)
            records += record  # the end's commit
            live.pop(node._seq, None)  # (LiveTable.discard, written out)
        else:
            records.append(record)  # the end's commit
            live.discard(node)
        node._state = RELEASED
        node._releaser = 0
    except BaseException:
        if not ends_with(records, record):
            records += packed(record)
        live.discard(node)
        node._state = RELEASED
        node._releaser = 0
        raise
    node._raw = node._fn = None
    if node.__class__ is _FINALIZING:
        node.__class__ = _WITHOUT_FINALIZER
    return len(records) > cap


def end_released_dependent(
    node: Record,
    records: list[Any],
    live: Any,
    cap: int,
    ready: Optional[list[Record]],
    me: int,
) -> bool:
    """`end_released` for a claimed record with parents (not tainted, not a hook, not
    thread-affine, not inherited): the same end, and each parent loses this dependent.
    A parent left due is appended to ``ready`` (the caller's list, made before the
    section) and claimed by thread ``me``, in that order, for the caller to release
    after its section, as a release chain would; ``ready`` is ``None`` once the registry
    is not open (nothing is claimed: the teardown settles them).  The caller holds the
    lock, and its own references to the raw object, the release function and the parents
    (see `end_released`).  Returns whether ``records`` now hold more than ``cap``.  An
    exception in the middle completes the end first: one record, one
    removal, each parent's count down once.

    Kept apart from `end_released` on purpose: one function for both (the parents' steps
    behind ``if parents``) cost a leaf's track + release about 300 more instructions in
    steady state (21,493 -> 21,805, pure core, ``python -m benchmarks.steady``), past the
    pure core's 6x bar."""
    if node._state != RELEASING:
        return False
    parents = node._parents
    counts = [p._children for p in parents]
    record = (node._seq, node._kind, node._name, _RELEASED, None, False)
    try:
        if _DICT_TABLE:  # (the pure-Python core, whose records are flat: _ledger.WIDTH)
            records += record  # the end's commit
            live.pop(node._seq, None)  # (LiveTable.discard, written out)
        else:
            records.append(record)  # the end's commit
            live.discard(node)
        node._state = RELEASED
        node._releaser = 0
        lose_dependents(parents, counts, ready, me)
    except BaseException:
        if not ends_with(records, record):
            records += packed(record)
        live.discard(node)
        node._state = RELEASED
        node._releaser = 0
        lose_dependents(parents, counts, ready, me)
        raise
    node._parents = ()
    node._raw = node._fn = None
    if node.__class__ is _FINALIZING:
        node.__class__ = _WITHOUT_FINALIZER
    return len(records) > cap


def lose_dependents(
    parents: tuple[Record, ...], counts: list[int], ready: Optional[list[Record]], me: int
) -> None:
    """Each of ``parents`` lost one dependent (its count was ``counts`` before: down once,
    even when this runs a second time after an interrupt; the caller holds the lock
    throughout).  Unless ``ready`` is ``None``, those left due are appended to it, then
    claimed by thread ``me``."""
    for parent, count in zip(parents, counts):
        if parent._children == count:
            parent._children = count - 1
        if (
            ready is not None
            and parent._state == LIVE
            and not (parent._children or parent._refs or parent._borrows)
        ):
            if parent not in ready:
                ready.append(parent)
            parent._releaser = me
            parent._state = RELEASING


# ---------------------------------------------------------------------- ends


def end(node: Record, outcome: str, at_exit: bool) -> tuple[Any, Any, tuple[Record, ...]]:
    """``node`` ends in ``outcome``: its final state, and it lets go of what it held.

    Returns ``(raw, fn, parents)``, which the caller drops outside its section (dropping
    a user object may run its ``__del__``) after it has told each parent it lost a
    dependent (`lose_dependents`).  A tainting outcome first taints the parents."""
    if outcome == Outcome.DETACHED:
        node._state = DETACHED
    else:
        node._state = LEAKED if outcome in TAINTING else RELEASED
    # Once ended, a nonzero ``_releaser`` means "ended at exit" (see the borrow gate).
    node._releaser = ENDED_AT_EXIT if at_exit else 0
    if outcome in TAINTING:
        taint_parents(node, outcome)
    held = (node._raw, node._fn, node._parents)
    node._parents = ()
    node._raw = node._fn = None
    return held


def end_after_close(node: Record) -> tuple[Any, ...]:
    """``node`` was registered after its registry's teardown began: leaked at once
    (``leaked_after_close``), owning nothing.  Returns its parents, to drop outside the
    section."""
    node._releaser = ENDED_AT_EXIT  # (a daemon thread's borrow of it parks)
    node._state = LEAKED
    node._refs = 0
    parents = node._parents
    node._parents = ()
    return parents


def drop_payload(node: Record) -> None:
    """Let go of the raw object and the release function (outside any section: dropping
    them may run the object's ``__del__``)."""
    node._raw = node._fn = None


def taint_parents(node: Record, outcome: str) -> None:
    """``node`` ended ``outcome`` (a tainting one): the native object may still exist and
    use what it depends on, so those must be leaked, never released.  A hook's edges are
    soft (they never kept anything alive), but a hook that was abandoned may still touch
    what it was to run before: that is leaked too."""
    parents = node._parents
    if parents:
        reason = f"{node._kind} {display_name(node)!r} depending on it ended {outcome}"
        for parent in parents:
            if parent._taint is None:
                parent._taint = reason


def set_in_child(node: Record, run: bool) -> None:
    """Whether an inherited hook also runs in a forked child (``on_teardown(in_child=)``)."""
    node._in_child = run


# ---------------------------------------------------------------------- reading


def display_name(node: Record) -> str:
    """The name given at registration, or ``"<kind>#<creation number>"``."""
    name = node._name
    return name if name is not None else f"{node._kind}#{node._seq}"


def closed_message(node: Record) -> str:
    """Why ``node``'s raw object must not be used any more (no import here: this may run
    from a finalizer late in interpreter shutdown)."""
    state = node._state
    if state == RELEASED:
        what = "was released"
    elif state == LEAKED:
        what = "was leaked"
    elif state == DETACHED:
        what = "was detached (the program owns it again)"
    elif state == RELEASING:
        what = "is being released"
    else:
        what = "has no owner left (its release is pending"
        if node._children:
            what += f" until {node._children} dependent(s) are released"
        what += ")"
    return f"{node._kind} {display_name(node)!r} {what}; its native object must not be used"
