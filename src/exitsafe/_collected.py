"""Releases after garbage collection: a handle dropped with owners left.

The finalizer of a handle whose last reference goes (pure-Python `OwnedHandle.__del__`,
or the compiled record's) calls `collected`, on whatever thread the collection runs, maybe
inside an exitsafe section of that very thread (then the work is queued), maybe during
interpreter finalization (then the registry is closed and nothing runs).  The record is
claimed in a section (`exitsafe._record.collect`), released outside it (a leaf by
`_release_collected` itself, anything else by the general chain of `exitsafe._releases`),
and a failure is logged: nobody can receive it.
"""

from __future__ import annotations

import _thread

from . import _record, _sync
from ._ledger import Outcome
from ._record import Record, display_name
from ._releases import record_end, release_chain
from ._report import error_from_finalizer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["collected", "log_collected_failure"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_acquire = _sync.acquire
_wait = _sync.wait
_release = _sync.release
_deferred = _sync.deferred  # the queue itself: a cheap truthiness test on the hot path
_run_deferred = _sync.run_deferred
_defer = _sync.defer
_RELEASED = Outcome.RELEASED
_is_usable = _record.is_usable
_collect = _record.collect
_claim = _record.claim
_end_released = _record.end_released


def collected(node: Record) -> None:
    """The garbage collection of a handle that still has owners (its finalizer), on any
    thread, possibly during interpreter finalization (then the registry is closed) or
    while this very thread is inside an exitsafe section (a collection can run at any
    bytecode: then it is queued, and runs again from the queue).  Attributes only until
    the registry is known open: module globals may already be None.  Safe to call again
    after an interrupt cut it short: it goes on from where it stopped, and does nothing
    once the handle has no owner."""
    if not getattr(node, "_refs", 0):  # no owner left, or never initialized
        return
    state = node._registry
    if state.phase and node._state:  # claimed by the teardown, or ended: no request
        return
    if _reentered():
        _defer(collected, node)
        return
    trash: Optional[list[object]] = None
    me = _get_ident()
    target = None
    refs = None
    try:
        if not state.phase:
            _acquire(False) or _wait()
        else:  # possibly late in interpreter shutdown: see _sync.enter_if_possible
            _sync.enter_if_possible()  # (without the lock: no other thread runs)
        refs = node._refs
        if not state.phase:
            if _collect(node, me, state.live):
                target = node
        # (below, and for a record not in the live table: never registered, track() was
        # interrupted and its caller still owns the object)
        elif _is_usable(node) and state.live.hold(node):
            # A teardown began but its snapshot did not hold this handle: a cyclic
            # collection cleared our weak reference to it before running this
            # finalizer.  Native code must not run any more: leak it, so that it
            # still ends in exactly one outcome, and taint what it depends on.
            trash = []
            state.finish(
                node, Outcome.LEAKED_AFTER_CLOSE,
                "collected while the teardown began, unseen by it", True, trash,
            )
        if _reentered():  # (the section's shape: see exitsafe._sync.locked)
            _release()
        trash = None
        if target is not None:
            _release_collected(target)
            target = None
    except BaseException:
        if _reentered():  # (in the section: complete what it began before the lock goes)
            if refs and node._state != 0:
                pass  # ended (finish completes what it began) or claimed
            elif refs and not state.phase:  # (the owners' drop, completed)
                _record.drop_all_owners(node)
                state.live.hold(node)
                if _record.is_due(node):
                    _claim(node, me)
            if _record.claimed_by(node, me):
                target = node
            _release()
        if target is not None and _record.claimed_by(target, me):
            _release_collected(target)  # claimed, then interrupted: see drop_owner
        raise
    if _deferred:
        _run_deferred()


def _release_collected(node: Record) -> None:
    """Release ``node``, claimed after its last reference was dropped; log a failure
    (nobody can receive it).  A leaf (no parents, no taint, no thread affinity, not
    inherited) is released here: its release function is called at most once and its
    end recorded once, whatever interrupts it; anything else needs the general chain.

    No ``try`` line comes after the call (CPython 3.11+ covers none with a handler: see
    `exitsafe._sync.locked`): an interrupt escaping from one would reach the caller with
    the record still claimed, which would release it again."""
    if (
        node._parents
        or node._taint is not None
        or node._affinity is not None
        or node._gen != _sync.generation
    ):  # (anything but a leaf needs the general chain)
        error = release_chain(node)
        if error is not None:
            log_collected_failure(node, error)
            error = None  # (see release_chain)
        return
    state = node._registry
    fn, raw = node._fn, node._raw  # (dropped as this returns: outside the lock)
    error = None
    stage = 0  # 1: the release function is called; 2: it returned (then its end recorded)
    try:
        stage = 1
        try: fn(raw)  # type: ignore[misc]  # noqa: E701  (one line: see _sync.until_done)
        except BaseException as exc:  # recorded and logged (an interrupt here: stage 1)
            error = record_end(node, Outcome.RELEASE_FAILED, repr(exc), exc)
        else:
            stage = 2
            if _acquire(False):  # (record_end's common case, written out)
                if _end_released(node, state.records, state.live, state.cap):
                    state.ledger.trim()
                _release()
                return
            error = record_end(node, _RELEASED, None, None)
        if error is not None:
            log_collected_failure(node, error)
            error = None  # (see release_chain: no frame of ours keeps it)
    except BaseException as exc:
        error = None
        if _reentered():  # (in the end's section: _end_released completed it)
            _release()
        if stage == 2:
            error = record_end(node, _RELEASED, None, exc)
        elif stage == 1:  # it raised (or its call was interrupted)
            error = record_end(node, Outcome.RELEASE_FAILED, repr(exc), exc)
        else:  # not called yet: the general chain calls it
            error = release_chain(node)
        if error is not None and error is not exc:
            log_collected_failure(node, error)
        error = None
        raise


def log_collected_failure(node: Record, error: BaseException) -> None:
    """Log that the release of a collected handle failed (the compiled core's too).

    The repr, not the exception: a handler that keeps records (pytest's caplog, a
    MemoryHandler) would otherwise keep its traceback, and through its frames every
    handle they refer to."""
    error_from_finalizer(
        "release of %s %r failed after its last reference was dropped: %s",
        node._kind,
        display_name(node),
        repr(error),
    )
