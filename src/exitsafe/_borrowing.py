"""Borrowing, a part of [`Registry`][exitsafe.Registry]: a thread's use of a handle's raw
object inside native code (``with handle.borrow() as raw``).

A borrow counts on the handle: while it is held the handle is not released (its release
becomes due when the last borrow ends), and the teardown leaks it (``leaked_in_use``)
rather than release it under the call.  Once a teardown began, the *borrow gate* is
closed to every thread but the teardown's own and its workers: a daemon thread is
parked (it never returns into native code), any other thread gets
[`HandleClosedError`][exitsafe.HandleClosedError]. A borrow from a finalizer that interrupted one of
this thread's sections is counted without the lock (see `exitsafe._sync`).
"""

from __future__ import annotations

import _thread

from . import _sync, _threads
from ._errors import HandleClosedError
from ._handle import closed_message
from ._node import LIVE, RELEASING
from ._node import Node as _Node
from ._phase import CLOSED
from ._process import process_ending
from ._report import log_if_loaded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, Optional

__all__ = ["Borrowing"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_acquire = _sync.acquire
_release = _sync.release
_wait = _sync.wait
_defer = _sync.defer
_deferred = _sync._deferred
_run_deferred = _sync.run_deferred
_held = _threads.held
_local = _threads._local


class Borrowing:
    """The borrow half of [`Registry`][exitsafe.Registry] (a mixin)."""

    if TYPE_CHECKING:
        name: str
        _phase: int
        _teardown_thread: int
        _teardown_threads: set[int]
        _parked: int

        def _settle(self, node: _Node) -> None: ...
        def _release_chain(self, first: _Node) -> Optional[BaseException]: ...

    def _borrow_enter(self, node: _Node) -> Any:
        if self._phase == CLOSED:  # every handle ended; no lock after close (_late_request)
            if node._releaser and process_ending() and _threads.is_daemon_thread():
                self._park(node)  # it ended in the exit (see _refuse_borrow)
            raise HandleClosedError(closed_message(node))
        if _reentered():
            # A finalizer interrupted a section of this thread: no other thread can
            # change the node now, and no native release can run before this
            # finalizer returns (releases run after sections).  So the count can be
            # taken without the lock; the matching exit does the same.
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            node._borrows += 1
            _held().append(node)
            return node._raw
        try:
            if not _acquire(False):
                _wait()
            if self._phase and _get_ident() not in self._teardown_threads:
                gated = True  # a teardown began: this thread may not enter native code
            else:
                gated = False
                if node._state != LIVE or not node._refs:
                    if not self._teardown_owns(node):
                        raise HandleClosedError(closed_message(node))
                node._borrows += 1
                raw = node._raw
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        if gated:
            self._refuse_borrow(node)  # parks this thread or raises
        try:
            _local.held.append(node)  # the borrows this thread holds (see _threads.held)
        except AttributeError:
            _local.held = [node]
        if _deferred:
            _run_deferred()
        return raw

    def _teardown_owns(self, node: _Node) -> bool:
        """Whether the running teardown claimed ``node`` and has not settled it yet."""
        return (
            node._state == RELEASING
            and bool(self._phase)
            and node._releaser == self._teardown_thread
        )

    def _refuse_borrow(self, node: _Node) -> None:
        """A borrow after the teardown began, on a thread that is not the teardown's.

        A daemon thread is parked (it never returns into native code), also when the
        process is ending and its teardown already released the handle: a thread that
        loops over borrows cannot tell whether the release came a moment before or after
        it asked, and an error would print its traceback during the exit.  A non-daemon
        thread, which the interpreter would wait for, gets
        [`HandleClosedError`][exitsafe.HandleClosedError], and so does any thread for a
        handle that ended otherwise (released before, or by the teardown of this one
        registry while the program goes on): a use after release, as always.
        """
        if node._state > RELEASING:
            # A teardown leaves its ident on what it settled until it records them, then
            # ENDED_AT_EXIT; a release outside a teardown leaves 0.
            ended_in_the_exit = bool(node._releaser) and process_ending()
        else:
            ended_in_the_exit = True  # not ended: the teardown is still to reach it
        if not ended_in_the_exit or not _threads.is_daemon_thread():
            raise HandleClosedError(
                f"{closed_message(node)}: the teardown of registry {self.name!r} began"
                if node._state <= RELEASING
                else closed_message(node)
            )
        self._park(node)

    def _park(self, node: _Node) -> NoReturn:
        """Park this daemon thread for good, at a borrow of ``node`` in the exit (counted
        and logged).  After the close the count is taken as a late record is: without the
        lock if a thread frozen in the exit holds it."""
        try:
            if self._phase == CLOSED:
                _sync.enter_if_possible()
            else:
                _sync.enter()
            self._parked += 1
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        logger = log_if_loaded()  # (an import here could freeze half-way: see park())
        if logger is not None:
            logger.info(
                "exitsafe: %r parked at borrow() of %s %r: the teardown of %r began",
                _threads.thread_name(_get_ident()),
                node._kind,
                node._display_name(),
                self.name,
            )
        _threads.park()

    def _borrow_exit(self, node: _Node) -> None:
        try:
            held = _local.held
        except AttributeError:  # entered on another thread, before a fork
            held = None
        if held and held[-1] is node:
            held.pop()
        else:
            _threads.forget_held(node)
        if self._phase == CLOSED:  # the node ended: nothing to release, no lock to take
            node._borrows -= 1
            return
        if _reentered():
            node._borrows -= 1
            if not node._borrows:
                _defer(self._settle, node)
            return
        try:
            if not _acquire(False):
                _wait()
            node._borrows -= 1
            if node._state == LIVE and not (
                node._refs or node._children or node._borrows or self._phase
            ):
                node._state = RELEASING
                node._releaser = _get_ident()
                target: Optional[_Node] = node
            else:
                target = None
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        error = self._release_chain(target) if target is not None else None
        if _deferred:
            _run_deferred()
        if error is not None:
            try:
                raise error
            finally:
                error = None  # (no frame of ours keeps it: see Registry._release_chain)
