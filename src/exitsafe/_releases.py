"""Releases outside a teardown: owners dropped, handles collected, chains of parents.

[`Handle.release`][exitsafe.Handle.release] drops one owner (`drop_owner`); the garbage
collection of a handle with owners drops all of them (`exitsafe._collected`); the end of the last
borrow settles a handle whose release waited for it (`settle`).  Whichever makes a record
due *claims* it in a section (`exitsafe._record.claim`), then runs its release function
outside the lock, records the outcome in another section, and goes on, iteratively, with
every parent that end left due (`release_chain`).  A release due on a thread that does
not own a thread-affine handle is queued for that thread (`run_pending`).

Each function takes the record (its registry's state is the record's ``_registry``).
The pure-Python core runs all of them; the compiled core runs its own copy of the common
cases (a leaf with no taint, affinity or inheritance) and calls these for the rest.  The
common cases of the pure-Python core are written out too: a release whose end only lets
its parents lose a dependent (`drop_owner`) skips the general chain.
"""

from __future__ import annotations

import _thread

from . import _record, _sync, _threads
from ._errors import HandleClosedError, LiveDependentsError, RegistryClosedError
from ._ledger import Outcome
from ._record import RELEASING, Record, closed_message, display_name
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = [
    "detach", "drop_owner", "record_end", "release_all", "release_chain", "retain", "run_pending",
]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_acquire = _sync.acquire
_wait = _sync.wait
_release = _sync.release
_deferred = _sync.deferred  # the queue itself: a cheap truthiness test on the hot path
_run_deferred = _sync.run_deferred
_defer = _sync.defer
_until_done = _sync.until_done
_affine = _threads.pending  # owner thread -> queued releases: a cheap truthiness test
_RELEASED = Outcome.RELEASED
_FAILED = Outcome.RELEASE_FAILED
_is_usable = _record.is_usable
_drop_one = _record.drop_owner
_claim = _record.claim
_release_owner = _record.release_owner
_end_released = _record.end_released
_end_released_dependent = _record.end_released_dependent


# ---------------------------------------------------------------------- owners


def retain(node: Record) -> None:
    """``Handle.retain()``: one owner more, or `HandleClosedError`.  An exception (an
    interrupt) anywhere in it leaves the count as it was."""
    state = node._registry
    if state.phase == 2:  # CLOSED: every handle ended; no lock after close (late_request)
        raise HandleClosedError(closed_message(node))
    if _reentered():
        raise _sync.refused("retain()")
    refs = None
    try:
        _acquire(False) or _wait()
        refs = node._refs
        if not _is_usable(node):
            raise HandleClosedError(closed_message(node))
        _record.add_owner(node)
        _release()
    except BaseException:
        if _reentered():  # (the section's shape: see exitsafe._sync.locked)
            if refs is not None and node._refs == refs + 1:
                _drop_one(node)  # (not retained after all: the caller gets the error)
            _release()
        raise
    if _deferred:
        _run_deferred()


def drop_owner(node: Record) -> None:
    """``Handle.release()``: drop one owner; release natively when nothing holds it.

    An exception (an interrupt) at any line either leaves the owner in place or, once it
    is dropped, still releases a record it left due (once), records it, then is raised:
    every ``try`` line comes before the owner is dropped (CPython covers none with a
    handler), and ``stage`` tells what happened (see `exitsafe._sync.locked`)."""
    state = node._registry
    if state.phase == 2:  # CLOSED, spelled out: this may run from a finalizer late in
        state.late_request(node)  # shutdown, when module globals can already be None
        return
    if _reentered():
        _defer(drop_owner, node)
        return
    me = _get_ident()
    target = refs = error = None
    ready: Optional[list[Record]] = None
    stage = 0  # 1: the release function is called; 2: it returned (then its end recorded)
    try:
        _acquire(False) or _wait()
        refs = node._refs
        if state.phase or state.strict or node._state or not refs:
            target = _drop_rarely(node, refs)  # (in one test: the common case's)
        elif _release_owner(node, me):
            target = node
        _release()  # (the section's shape: see exitsafe._sync.locked)
        if target is None:
            pass
        elif target is state:  # a late request (the registry closed meanwhile)
            if state.trace:
                state.trace_late(node)
            return
        elif target._taint is not None or target._affinity is not None or (
            target._gen != _sync.generation  # (the chain is needed; parents only: below)
        ):
            error = release_chain(target)
        else:  # (the chain's steps when parents only lose a dependent: see the module)
            fn, raw, parents = target._fn, target._raw, target._parents  # (dropped last)
            ready = [] if parents else None  # (the parents its end leaves due, claimed)
            stage = 1
            try: fn(raw)  # noqa: E701  (one line: see exitsafe._sync.until_done)
            except BaseException as exc:  # recorded, then raised (an interrupt: stage 1)
                error = record_end(target, _FAILED, repr(exc), exc, None, ready)
            else:
                stage = 2
                if ready is not None:
                    error = _end_dependent(target, state, ready, me)
                elif _acquire(False):  # (record_end's common case, written out)
                    if _end_released(target, state.records, state.live, state.cap):
                        state.ledger.trim()
                    _release()
                    error = None
                else:
                    error = record_end(target, _RELEASED, None, None)
            if ready:  # (an exception from here on finds the end recorded, once)
                error = first_error(error, release_all(ready))
        if _deferred:
            _run_deferred()
    except BaseException as exc:
        if _reentered():  # (in a section: what it did is settled before the lock goes)
            if not stage:  # (else the section recording the end: record_end completes it)
                target = _claim_dropped(node, refs, me)
            _release()
        if stage == 1:  # the release function raised (or its call was interrupted)
            error = record_end(target, _FAILED, repr(exc), exc, None, ready)  # type: ignore[arg-type]
        elif stage == 2:  # it returned (its end recorded, or now)
            error = record_end(target, _RELEASED, None, exc, None, ready)  # type: ignore[arg-type]
        else:
            error = None
            if target is not None and target is not state and _record.claimed_by(target, me):
                release_chain(target)  # claimed, not yet released: released all the same
        if ready:  # the parents its end left due (claimed): released all the same
            error = first_error(error, release_all(ready))
        if error is None or error is exc:
            error = None  # (no frame of ours keeps the exception: see release_chain)
            raise
    if error is not None:
        try:
            raise error
        finally:
            error = None  # (see release_chain: no frame of ours keeps it)
    if _affine:
        _run_mine_quietly()


def _end_dependent(
    node: Record, state: Any, ready: list[Record], me: int
) -> Optional[BaseException]:
    """The end of claimed ``node`` with parents, whose release function returned (see
    `exitsafe._record.end_released_dependent`): in one section when the lock is free at
    once, else as `record_end` records it (it waits, and goes on past interrupts).
    The interrupt that came meanwhile, or ``None``."""
    if _acquire(False):
        if _end_released_dependent(
            node, state.records, state.live, state.cap, None if state.phase else ready, me
        ):
            state.ledger.trim()
        _release()
        return None
    return record_end(node, _RELEASED, None, None, None, ready)


def first_error(
    first: Optional[BaseException], then: Optional[BaseException]
) -> Optional[BaseException]:
    """The error to raise of two: an interrupt first, else the earlier one."""
    try:
        if first is None or (then is not None and _sync.is_interrupt(then)
                             and not _sync.is_interrupt(first)):
            return then
        return first
    finally:
        del first, then  # (see release_chain: no frame of ours keeps them)


def _drop_rarely(node: Record, refs: int) -> Any:
    """`drop_owner`'s section when anything is unusual (the registry not open, strict,
    the record not usable): ``None``, or the registry's state for a late request (the
    caller holds the lock)."""
    state = node._registry
    if state.phase == 2:
        state.ledger.add_late_request()
        return state
    if node._state or not refs:
        return None  # ended, or being released
    if state.strict and refs == 1 and node._children:
        names = state.dependent_names(node)
        raise LiveDependentsError(
            f"{node._kind} {display_name(node)!r} still has live dependents: "
            + ", ".join(names)
            + "; release them first",
            names,
        )
    if state.phase:
        _drop_one(node)  # (the running teardown settles it)
        return None
    if _release_owner(node, _get_ident()):
        return node
    return None


def _claim_dropped(node: Record, refs: Optional[int], me: int) -> Optional[Record]:
    """`drop_owner`'s section was interrupted (the lock still held): ``node`` if it is
    claimed by this thread or due after this call dropped its owner (then it is claimed
    now), else ``None``."""
    if _record.claimed_by(node, me):
        return node
    if refs is not None and node._refs == refs - 1 and _record.is_due(node):
        if not node._registry.phase:
            _claim(node, me)
            return node
    return None


def record_end(
    node: Record,
    outcome: str,
    detail: Optional[str],
    error: Optional[BaseException],
    trash: Optional[list[object]] = None,
    ready: Optional[list[Record]] = None,
) -> Optional[BaseException]:
    """Record the outcome of claimed ``node`` whose release step ran; returns the first
    interrupt that came meanwhile, else ``error``.  Tried again until the record ended:
    an interrupt while it waits for the lock or records (`RegistryState.finish`
    completes an end it began) does not lose the record."""
    own_trash: list[object] = [] if trash is None else trash
    interrupt = _until_done(_record_once, node, outcome, detail, own_trash, ready)
    if trash is None:
        own_trash.clear()
    try:
        return interrupt if interrupt is not None else error
    finally:
        del interrupt, error


def _record_once(
    node: Record,
    outcome: str,
    detail: Optional[str],
    trash: list[object],
    ready: Optional[list[Record]],
) -> None:
    """One try of `record_end`: in one section, the end of ``node`` (nothing if it
    ended: a teardown gave up waiting for it and recorded it, or a try before)."""
    state = node._registry
    try:
        _acquire(False) or _wait()
        if outcome is _RELEASED and ready is None:
            if _end_released(node, state.records, state.live, state.cap):
                state.ledger.trim()
        else:
            state.finish(node, outcome, detail, False, trash, ready=ready)
        _release()
    except BaseException:
        if _reentered():  # (the section's shape: see exitsafe._sync.locked)
            _release()
        raise


def release_failed(
    node: Record, exc: BaseException, ready: Optional[list[Record]] = None
) -> Optional[BaseException]:
    """The compiled core's: the release function of ``node`` (claimed) raised ``exc``.

    Record it and go on with the parents this frees, as `release_chain` does: they are
    tainted by the failure, so they end leaked, never released.  They are claimed into
    ``ready`` (the caller's list, kept across tries: the compiled core calls this again
    when an interrupt stops it, and it then goes on with the same list).  Returns the
    interrupt that came meanwhile, for the caller to raise once its chain is done
    (``None``: none)."""
    if ready is None:
        ready = []
    interrupt = record_end(node, Outcome.RELEASE_FAILED, repr(exc), None, None, ready)
    error = release_all(ready)  # (last first, as release_chain's stack takes them)
    try:
        return interrupt if interrupt is not None else _interrupt_only(error)
    finally:
        del interrupt, exc, error  # (see release_chain)


def release_all(nodes: list[Record]) -> Optional[BaseException]:
    """Release each of ``nodes`` still claimed by this thread, last first, with
    `release_chain`, whatever interrupts it; the first error (an interrupt first), for
    the caller to raise.  Safe to call again: what it released is no longer claimed."""
    errors: list[Optional[BaseException]] = [None]
    interrupt = _until_done(_release_each, nodes, errors)
    try:
        return interrupt if interrupt is not None else errors[0]
    finally:
        del interrupt, errors


def _release_each(nodes: list[Record], errors: list[Optional[BaseException]]) -> None:
    me = _get_ident()
    for node in reversed(nodes):
        if _record.claimed_by(node, me):
            error = release_chain(node)  # (goes on past interrupts: see release_chain)
            if error is not None and errors[0] is None:
                errors[0] = error
            error = None


def _interrupt_only(error: Optional[BaseException]) -> Optional[BaseException]:
    return error if error is not None and _sync.is_interrupt(error) else None


#: ``decided`` value of a record whose release function is being called (see
#: `release_chain`).
_CALLING = ("", None)


class _Chain:
    """A release chain in progress: what it claimed and decided, and what it raises."""

    __slots__ = ("decided", "error", "interrupt", "me", "pending", "trash")

    def __init__(self, first: Record) -> None:
        self.me = _get_ident()
        #: The records this thread claimed and has not ended yet (each in the list
        #: before it is claimed: see RegistryState.finish), last first.
        self.pending = [first]
        #: record -> (outcome, detail) once its release step ran (or _CALLING as it runs).
        self.decided: dict[Record, tuple[str, Optional[str]]] = {}
        self.error: Optional[BaseException] = None  # the first release function's error
        self.interrupt: Optional[BaseException] = None  # the first interrupt
        self.trash: list[object] = []


def release_chain(first: Record) -> Optional[BaseException]:
    """Release ``first`` (claimed by this thread) and every parent it frees, iteratively.

    Runs each release function outside the lock; returns the first exception a release
    function raised (after recording it), for the caller to re-raise.

    An interrupt (``KeyboardInterrupt``) does not stop the chain: every record this
    thread claimed in it is in its ``pending`` list before it is claimed (see
    `RegistryState.finish`), and the chain goes on (`_resume_chain`) until each ended
    with one outcome; the first interrupt is then returned.  A release function is
    called at most once: one interrupted as it was called ends ``release_failed``
    (which leaks what it depends on).
    """
    chain = _Chain(first)
    interrupt = _until_done(_run_chain, chain)
    if interrupt is not None and chain.interrupt is None:
        chain.interrupt = interrupt
    interrupt = None
    error = chain.interrupt if chain.interrupt is not None else chain.error
    chain.error = chain.interrupt = None
    # The exception's traceback holds this frame, and through its callers' frames
    # (f_back) every object they refer to: a local of this frame (or of any of theirs)
    # holding the exception would make a cycle, keeping all of that, handles of the
    # program included, alive until a collection.  So no frame of ours keeps it.
    try:
        return error
    finally:
        del error


def _run_chain(chain: _Chain) -> None:
    """The steps of a release chain, until nothing it claimed is left (see
    `release_chain`, which resumes it after an interrupt)."""
    me, pending, decided = chain.me, chain.pending, chain.decided
    while pending:
        top = len(pending) - 1
        node = pending[top]
        if node._state != RELEASING or node._releaser != me:
            del pending[top]  # ended, or queued for its owner thread
            continue
        verdict = decided.get(node)
        if verdict is None:
            if (
                node._affinity is not None
                and not _threads.on_owner_thread(node)
                and node._gen == _sync.generation
            ):
                _sync.locked_quietly(_threads.queue_for_owner, node)
                continue
            if node._gen != _sync.generation:  # checked per record: a release may fork
                verdict = (Outcome.LEAKED_INHERITED, "inherited from the parent process")
            elif node._taint is not None:
                verdict = (Outcome.LEAKED_DEPENDENT, node._taint)
            else:
                decided[node] = _CALLING
                verdict = _call_release(node, chain)
            decided[node] = verdict
        elif verdict is _CALLING:  # (an interrupt as it was called: it may have run)
            verdict = decided[node] = (
                Outcome.RELEASE_FAILED,
                "interrupted as its release function was called",
            )
        stop = record_end(node, verdict[0], verdict[1], None, chain.trash, pending)
        if stop is not None and chain.interrupt is None:
            chain.interrupt = stop
        stop = None
        if pending[top] is node:
            del pending[top]
        chain.trash.clear()  # drops the raw object and release function: outside the lock


def _call_release(node: Record, chain: _Chain) -> tuple[str, Optional[str]]:
    """Call ``node``'s release function; its outcome (its error is kept in ``chain``)."""
    try: node._fn(node._raw)  # type: ignore[misc]  # noqa: E701  (one line: see release_chain)
    except BaseException as exc:  # recorded, then re-raised to the caller
        if chain.error is None:
            chain.error = exc
        return (Outcome.RELEASE_FAILED, repr(exc))
    return (Outcome.RELEASED, None)


# ---------------------------------------------------------------------- borrows, detach, undo


def settle(node: Record) -> None:
    """Release ``node`` if nothing holds it any more (queued after a re-entrant borrow)."""
    state = node._registry

    me = _get_ident()

    def claim_if_due() -> bool:
        if _record.is_due(node) and state.phase == 0:
            _claim(node, me)
        return _record.claimed_by(node, me)

    try:
        claimed = _sync.locked_quietly(claim_if_due)
    except BaseException:
        if _record.claimed_by(node, me):
            release_chain(node)  # claimed, then interrupted: see drop_owner
        raise
    if claimed:
        error = release_chain(node)
        if error is not None:
            try:
                raise error
            finally:
                error = None  # (see release_chain)


def detach(node: Record) -> Any:
    """``Handle.detach()``: stop owning the object without releasing it; return it."""
    state = node._registry
    trash: list[object] = []
    ready: list[Record] = []

    def end_detached() -> Any:
        if state.phase != 0:
            raise RegistryClosedError(
                f"registry {state.name!r} is tearing down or closed; "
                f"{node._kind} {display_name(node)!r} can no longer be detached"
            )
        if not _is_usable(node):
            raise HandleClosedError(closed_message(node))
        if node._borrows:
            raise HandleClosedError(
                f"{node._kind} {display_name(node)!r} is borrowed; "
                f"it cannot be detached while in use"
            )
        if node._children:
            names = state.dependent_names(node)
            raise LiveDependentsError(
                f"{node._kind} {display_name(node)!r} still has live dependents: "
                + ", ".join(names)
                + "; they need it, release them before detaching it",
                names,
            )
        raw = node._raw
        try:
            _record.drop_all_owners(node)  # exitsafe owns nothing of it any more
            state.finish(node, Outcome.DETACHED, None, False, trash, ready=ready)
        except BaseException:  # (the program owns it now: never released by exitsafe)
            state.finish(node, Outcome.DETACHED, None, False, trash, ready=ready)
            raise
        return raw

    if _reentered():
        raise _sync.refused("detach()")
    # (on the `try` line itself: no line between the section and the releases of what it
    # freed, where an interrupt could land; see exitsafe._sync.until_done)
    try: raw = _sync.locked_quietly(end_detached); error = release_all(ready)  # noqa: E701, E702
    except BaseException:
        release_all(ready)  # (parents the end freed are released all the same)
        raise
    trash.clear()
    if _deferred:
        _run_deferred()
    if error is not None:
        try:
            raise error
        finally:
            error = None  # (see release_chain)
    return raw


def undo_track(node: Record) -> None:
    """Detach ``node``, registered by a ``track()`` that raises after all: recorded
    ``detached``, never released (its caller still owns the object), and each parent it
    was the last dependent of is released as usual.  Both cores call it.

    A record the teardown may already have planned (the registry is no longer open) is
    left to the teardown: that window, a teardown beginning on another thread while
    queued work raises here, is the one case where ``track()`` raises and the object is
    still released.  Runs no queued work: the error in flight is the caller's.  A record
    never registered (no number yet) is only disowned.
    """
    if not node._seq:  # (nobody else has it: the registration never happened)
        _record.disown(node)
        return
    state = node._registry
    trash: list[object] = []
    ready: list[Record] = []

    def end_undone() -> None:
        if (
            state.phase != 0
            or not _is_usable(node)
            or node._refs != 1
            or node._borrows
            or node._children
        ):
            return
        try:
            _record.drop_all_owners(node)
            state.finish(node, Outcome.DETACHED, None, False, trash, ready=ready)
        except BaseException:  # (its caller owns it: never released by exitsafe)
            state.finish(node, Outcome.DETACHED, None, False, trash, ready=ready)
            raise

    # (an error of the releases is recorded; the caller's is raised; on the `try` line:
    # see detach)
    try: _sync.locked_quietly(end_undone); release_all(ready)  # noqa: E701, E702
    except BaseException:
        release_all(ready)
        raise
    trash.clear()


def run_deferred_after_track(node: Record, affine: bool = False) -> None:
    """Run the queued work after the registration of ``node`` by ``track()`` (and, with
    ``affine``, this thread's queued thread-affine releases); if it raises (a
    ``KeyboardInterrupt`` in a queued release, a logging filter that raises), undo the
    registration before ``track()`` raises it: the caller never got the handle and still
    owns the object (see `undo_track`)."""
    try:
        if _deferred:
            _run_deferred()
        if affine and _affine:
            _run_mine_quietly()
    except BaseException:
        undo_track(node)
        raise


# ---------------------------------------------------------------------- thread-affine releases


def run_pending() -> None:
    """Run the releases queued for the calling thread, and any queued release requests.

    A thread-affine handle (``track(..., affinity="creator")``) whose release became due
    on another thread waits in a queue for its owning thread; that thread runs it at its
    next exitsafe call, or here.  Call it where the owning thread can safely release
    (between two frames of a render loop, with its GL context current).  An exception of
    a release function propagates here after every queued release ran.
    """
    error = _run_mine()
    if error is not None:
        try:
            raise error
        finally:
            error = None  # (no frame of ours keeps it: see release_chain)


def _run_mine() -> Optional[BaseException]:
    """Run the calling thread's queued affine releases; the first error, not raised."""
    if _reentered():
        return None  # never inside a section: it runs after it
    nodes = _sync.locked_quietly(_threads.take_mine)
    first: Optional[BaseException] = None
    for node in nodes:
        error = release_chain(node)
        if first is None:
            first = error
        error = None  # (no frame of ours keeps it: see release_chain)
    if _deferred:
        _run_deferred()
    try:
        return first
    finally:
        del first


def run_mine_quietly() -> None:
    """`_run_mine` from an unrelated exitsafe call: errors are logged, not raised."""
    import threading

    if threading.current_thread() not in _affine:
        return
    error = _run_mine()
    try:
        if error is not None and _sync.is_interrupt(error):
            raise error  # a Ctrl-C that came meanwhile: the caller's, as for any exitsafe call
        if error is not None:
            log().error("exitsafe: a queued thread-affine release failed: %s", repr(error))
    finally:
        error = None  # (no frame of ours keeps it: see release_chain)


_run_mine_quietly = run_mine_quietly
