"""The borrow gate: a thread's use of a handle's raw object inside native code
(``with handle.borrow() as raw``), and what happens to it once a teardown began.

A borrow counts on the record: while it is held the handle is not released (its release
becomes due when the last borrow ends), and the teardown leaks it (``leaked_in_use``)
rather than release it under the call.  Once a teardown began, the *gate* is closed to
every thread but the teardown's own and its step workers (`BorrowGate.allowed`): a daemon
thread is parked (it never returns into native code), any other thread gets
[`HandleClosedError`][exitsafe.HandleClosedError].  A borrow from a finalizer that
interrupted one of this thread's sections is counted without the lock (see
`exitsafe._sync`).
"""

from __future__ import annotations

import _thread

from . import _record, _sync, _threads
from ._errors import HandleClosedError
from ._process import process_ending
from ._record import RELEASING, Record, closed_message, display_name
from ._releases import release_chain as _release_chain
from ._releases import settle as _settle
from ._report import log_if_loaded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, Optional

__all__ = ["Borrow", "BorrowGate", "borrow_enter", "borrow_exit"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_acquire = _sync.acquire
_wait = _sync.wait
_release = _sync.release
_deferred = _sync.deferred
_run_deferred = _sync.run_deferred
_held = _threads.held

#: The registry's phase once closed (see exitsafe._phase), spelled out for the paths that
#: may run late in interpreter shutdown.
_CLOSED = 2


class BorrowGate:
    """A registry's borrow gate: who may still borrow once its teardown began, and how
    many threads it parked."""

    __slots__ = ("allowed", "parked")

    def __init__(self) -> None:
        #: Threads that may still borrow once the teardown began: its own, its workers.
        self.allowed: set[int] = set()
        #: Threads parked at a borrow after the teardown began.
        self.parked = 0

    def close_to_all_but(self, ident: int) -> set[int]:
        """The teardown begins on thread ``ident``: only it (and the workers it admits to
        the returned set) may borrow from now on."""
        allowed = self.allowed = {ident}
        return allowed

    def reopen(self) -> None:
        """In a forked child whose parent's teardown ran on another thread."""
        self.allowed = set()

    def count_parked(self) -> None:
        self.parked += 1


class Borrow:
    """Context manager returned by [`Handle.borrow`][exitsafe.Handle.borrow]:
    `with h.borrow() as raw:`.

    Its end is certain: an interrupt (a ``KeyboardInterrupt``) delivered exactly as the
    ``with`` statement enters or leaves its block (as `__enter__` returns, as `__exit__`
    is called), where no code of exitsafe can catch it, leaves the borrow open; the
    statement then drops this object, whose finalizer ends the borrow.
    """

    __slots__ = ("_node", "_open")

    def __init__(self, node: Record) -> None:
        self._node = node
        self._open = False  # counted and not yet ended (written in the sections)

    def __enter__(self) -> Any:
        return borrow_enter(self._node, self)

    def __exit__(self, *exc_info: object) -> None:
        borrow_exit(self._node, self)

    def __del__(self) -> None:
        try:
            still_open = self._open
        except AttributeError:  # (never initialized)
            return
        if still_open:
            self._end(self._node, self)

    #: Reached through the class: module globals may be None when the finalizer runs.
    _end: Any = None


def borrow_enter(node: Record, borrow: Optional[Borrow] = None) -> Any:
    """``handle.borrow().__enter__()``: count the borrow and return the raw object.
    ``borrow``, the context manager, is marked open in the same section."""
    state = node._registry
    if state.phase == _CLOSED:  # every handle ended; no lock after close (late_request)
        if _ended_in_the_exit(node) and _threads.is_daemon_thread():
            _park(node)  # (see _refuse)
        raise HandleClosedError(closed_message(node))
    if _reentered():
        # A finalizer interrupted a section of this thread: no other thread can change
        # the record now, and no native release can run before this finalizer returns
        # (releases run after sections).  So the count can be taken without the lock;
        # the matching exit does the same.
        if not _record.is_usable(node):
            raise HandleClosedError(closed_message(node))
        _record.add_borrow(node)
        _held().append(node)
        if borrow is not None:
            borrow._open = True
        return node._raw
    held = _held()
    depth = len(held)
    borrows = None
    gated = False
    try:
        _acquire(False) or _wait()
        borrows = node._borrows
        if state.phase and _get_ident() not in state.gate.allowed:
            gated = True  # a teardown began: this thread may not enter native code
        else:
            if not _record.is_usable(node) and not _teardown_owns(node):
                raise HandleClosedError(closed_message(node))
            _record.add_borrow(node)
            held.append(node)  # the borrows this thread holds (see _threads.held)
            if borrow is not None:
                borrow._open = True
        _release()  # (the section's shape: see exitsafe._sync.locked)
        if gated:
            _refuse(node)  # parks this thread or raises
        if _deferred:
            _run_deferred()
        return node._raw
    except BaseException:
        if _reentered():  # in the section: what it counted is taken back
            _undo_borrow(node, borrows, held, depth)
            if borrow is not None:
                borrow._open = False
            _release()
        elif borrow is None:  # counted, but the caller never gets the raw object
            abandon_borrow(node, held, depth)
        # (a `Borrow` left open is ended by its finalizer: the caller drops it)
        raise


def abandon_borrow(node: Record, held: list[Record], depth: int) -> None:
    """A borrow counted by this thread whose caller never got the raw object (an
    interrupt on the way out of `borrow_enter`): ``held`` has more than its ``depth``
    entries then.  Take it back, and release the handle if that was all that held it."""
    if len(held) <= depth:
        return

    def undo() -> bool:
        if len(held) > depth:
            del held[depth:]
            _record.drop_borrow(node)
        return _record.is_due(node)

    if _sync.locked_quietly(undo):
        _settle(node)


def _undo_borrow(node: Record, borrows: Optional[int], held: list[Record], depth: int) -> None:
    """Take back a borrow this thread's section counted (``borrows`` was the count before
    it, and ``held`` had ``depth`` entries): the caller holds the lock and raises."""
    if borrows is not None and node._borrows == borrows + 1:
        _record.drop_borrow(node)
    del held[depth:]


def _teardown_owns(node: Record) -> bool:
    """Whether the running teardown claimed ``node`` and has not settled it yet."""
    state = node._registry
    return (
        node._state == RELEASING
        and bool(state.phase)
        and node._releaser == state.closing.thread
    )


def _refuse(node: Record) -> None:
    """A borrow after the teardown began, on a thread that is not the teardown's.

    A daemon thread is parked (it never returns into native code), also when the process
    is ending and its teardown already released the handle: a thread that loops over
    borrows cannot tell whether the release came a moment before or after it asked, and
    an error would print its traceback during the exit.  A non-daemon thread, which the
    interpreter would wait for, gets [`HandleClosedError`][exitsafe.HandleClosedError],
    and so does any thread for a handle that ended otherwise (released before, or by the
    teardown of this one registry while the program goes on): a use after release, as
    always.
    """
    if node._state > RELEASING:
        in_the_exit = _ended_in_the_exit(node)
    else:
        in_the_exit = True  # not ended: the teardown is still to reach it
    if not in_the_exit or not _threads.is_daemon_thread():
        raise HandleClosedError(
            f"{closed_message(node)}: the teardown of registry {node._registry.name!r} began"
            if node._state <= RELEASING
            else closed_message(node)
        )
    _park(node)


def refuse_raw(node: Record) -> NoReturn:
    """``handle.raw`` of a handle that is not usable (its cold path).

    As at a borrow (see `_refuse`): a daemon thread reading the handle of an exit's
    teardown (released by it, or claimed by it and about to be) is parked, since its next
    step would be a native call with what it read, and an error would print its traceback
    during the exit.  Anything else raises
    [`HandleClosedError`][exitsafe.HandleClosedError]: a non-daemon thread, a handle
    released before, or whose last owner let go while dependents keep it alive, or the
    teardown of one registry while the program goes on.
    """
    if node._state > RELEASING:
        in_the_exit = _ended_in_the_exit(node)
    else:
        in_the_exit = (
            node._state == RELEASING and bool(node._registry.phase) and process_ending()
        )
    if in_the_exit and _threads.is_daemon_thread():
        _park(node, "raw")
    raise HandleClosedError(closed_message(node))


def _ended_in_the_exit(node: Record) -> bool:
    """Whether ``node``, ended, was ended by the teardown of the process's exit: a teardown
    leaves its ident on what it settled until it records them, then ENDED_AT_EXIT; a release
    outside a teardown leaves 0."""
    return bool(node._releaser) and process_ending()


def _park(node: Record, where: str = "borrow()") -> NoReturn:
    """Park this daemon thread for good, at a borrow (or a ``raw``) of ``node`` in the exit
    (counted and logged).  After the close the count is taken as a late record is: without
    the lock if a thread frozen in the exit holds it."""
    state = node._registry
    try:
        if state.phase == _CLOSED:
            _sync.enter_if_possible()
        else:
            _sync.enter()
        state.gate.count_parked()
    finally:
        if _reentered():
            _release()
    logger = log_if_loaded()  # (an import here could freeze half-way: see park())
    if logger is not None:
        logger.info(
            "exitsafe: %r parked at %s of %s %r: the teardown of %r began",
            _threads.thread_name(_get_ident()),
            where,
            node._kind,
            display_name(node),
            state.name,
        )
    _threads.park()


def borrow_exit(node: Record, borrow: Optional[Borrow] = None) -> None:
    """The end of a borrow: the release it held back runs now if it became due.  An
    exception (an interrupt) anywhere in it ends the borrow all the same.  ``borrow``,
    the context manager, is marked ended in the same section (an ended one: nothing to
    do)."""
    if borrow is not None and not borrow._open:
        return
    state = node._registry
    if state.phase == _CLOSED:  # the record ended: nothing to release, no lock to take
        _threads.forget_held(node)
        _record.drop_borrow(node)
        if borrow is not None:
            borrow._open = False
        return
    if _reentered():
        _threads.forget_held(node)
        if borrow is not None:
            borrow._open = False
        if not _record.drop_borrow(node):
            _sync.defer(_settle, node)
        return
    me = _get_ident()
    held = _held()
    depth = len(held)
    borrows = None
    try:
        _acquire(False) or _wait()
        borrows = node._borrows
        _record.drop_borrow(node)
        _threads.forget_held(node)
        if borrow is not None:
            borrow._open = False
        if _record.is_due(node) and not state.phase:
            _record.claim(node, me)
        _release()  # (the section's shape: see exitsafe._sync.locked)
        if _record.claimed_by(node, me):
            error = _release_chain(node)
        else:
            error = None
        if _deferred:
            _run_deferred()
    except BaseException:
        if _reentered():  # in the section: the borrow ends all the same
            if borrows is None or node._borrows == borrows:  # (not dropped yet)
                _record.drop_borrow(node)
            if len(held) == depth:
                _threads.forget_held(node)
            if borrow is not None:
                borrow._open = False
            if _record.is_due(node) and not state.phase:
                _record.claim(node, me)
            _release()
        if _record.claimed_by(node, me):
            _release_chain(node)  # claimed, not yet released: released all the same
        raise
    if error is not None:
        try:
            raise error
        finally:
            error = None  # (no frame of ours keeps it: see exitsafe._releases.release_chain)


Borrow._end = staticmethod(borrow_exit)
