"""Signals during a teardown: held back on the main thread, delivered right after.

Python runs a signal handler on the main thread between two bytecodes, so SIGINT's
``KeyboardInterrupt`` (or the ``SystemExit`` of
[`exitsafe.signals.teardown_on_signals`][exitsafe.signals.teardown_on_signals]) could land in the
middle of a teardown and cut it short. While `held` is active on the main thread, SIGINT (when it
still has Python's default handler) and the signals handled by exitsafe's own handlers only *record*
their arrival; when the outermost `held` ends, the original handlers are back and each recorded
signal is delivered once:

* after the exit teardown (``at_exit=True``): the signal's default action is restored
  at once (a further one ends the process on the spot) and the process ends by that
  signal, as a supervisor expects, *after* the rest of the exit: the ``atexit``
  callbacks registered before exitsafe's (``logging``'s flush among them) still run,
  stdio is flushed, and the signal is re-sent during the interpreter's module
  cleanup (see `_EndBySignal`);
* after an explicit teardown: the signal is raised again, so its handler runs in the
  caller right after the teardown returns;
* with ``drop=True`` (the immediate mode of [`exitsafe.signals`][exitsafe.signals], which ends the
  process by its own signal right after): not at all.

A child forked by another thread while a teardown holds signals back starts with the
program's handlers back in place (the teardown does not go on in the child); a child
forked by the teardown's own thread (in a hook) goes on with that teardown, and its
signals are held back until it ends, as in the parent.

Handlers a program installed itself are never touched.  Off the main thread this
does nothing (Python delivers signals to the main thread only).
"""

from __future__ import annotations

import _thread
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Any, Optional

#: Signal numbers whose handler exitsafe.signals installed.
installed: set[int] = set()

#: Signals exitsafe's handlers found the main thread inside a section and sent again
#: (see ``exitsafe.signals._send_again``), not acted on yet.  The exit teardown takes
#: them over, so that one still in flight when the program ends is not lost.
resent: list[int] = []

#: depth: holds open on ``thread``; deferred: how many of them are `exitsafe.signals.deferred`
#: blocks (a forked child keeps only a teardown's hold: see `after_fork_in_child`)
_state: dict[str, Any] = {
    "depth": 0, "deferred": 0, "at_exit": False, "drop": False, "thread": 0
}
_pending: list[int] = []
_saved: dict[int, Any] = {}


def note_entered(signum: int) -> None:
    """A handler of exitsafe's began for ``signum``: tell the watcher, if one runs
    (``teardown_on_signals(watch=True)``), that this signal needs no wake-up."""
    watcher = sys.modules.get(f"{__package__}._watcher")
    if watcher is not None:  # (loaded by teardown_on_signals(watch=True) only)
        watcher.entered(signum)


def _record(signum: int, frame: Optional[FrameType]) -> None:
    _pending.append(signum)
    note_entered(signum)  # (held back is acted on: no wake needed)


def _main_thread_ident() -> Optional[int]:
    get = getattr(_thread, "_get_main_thread_ident", None)  # CPython 3.12+
    if get is not None:
        return int(get())
    import threading  # (about 5 ms when nothing imported it yet: only where needed)

    return threading.main_thread().ident


class held:
    """Context manager: hold back SIGINT and exitsafe's signals (see the module docs)."""

    __slots__ = ("active", "at_exit", "deferred", "drop")

    def __init__(self, at_exit: bool = False, drop: bool = False, deferred: bool = False) -> None:
        self.at_exit = at_exit
        self.drop = drop
        self.deferred = deferred  # (a block of the program's: exitsafe.signals.deferred)
        self.active = False

    def __enter__(self) -> held:
        # An interrupt can land at any line (a tracer's, or CPython 3.9's at any
        # instruction): the handler ends the hold this call began, since ``with`` calls
        # no __exit__ for an __enter__ that raised.
        before = None
        try:
            if _thread.get_ident() != _main_thread_ident():
                return self
            before = _state["depth"]
            if self.at_exit:
                _state["at_exit"] = True
                while True:  # (not "while resent:", whose last jump CPython 3.12 and
                    if not resent:  # 3.13 leave out of the try: see test_try_coverage)
                        break
                    _pending.append(resent.pop())
            if self.drop:
                _state["drop"] = True
            _state["depth"] = before + 1
            if self.deferred:
                _state["deferred"] += 1
            self.active = True
            if not before:
                _state["thread"] = _thread.get_ident()
                _swap()
        except BaseException:
            if before is not None and _state["depth"] == before + 1:
                self.active = True
                self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self.active or not _state["depth"]:  # (not active: reset in a forked child)
            return
        self.active = False
        _state["depth"] -= 1
        if self.deferred:
            _state["deferred"] = max(0, _state["deferred"] - 1)
        if _state["depth"]:
            return
        at_exit, drop = _state["at_exit"], _state["drop"]
        try:
            _state["at_exit"] = _state["drop"] = False
            if at_exit and not drop:
                # the process ends by these once its exit is done: their default action
                # from now on (not the handlers put back below, whose teardown is over)
                _end_by_arrived()
            _restore()
            arrived = list(dict.fromkeys(_pending))
            _pending.clear()
        except BaseException:  # (interrupted: the program's handlers back all the same)
            _restore()
            raise
        if drop:
            return
        for index, signum in enumerate(arrived):
            try:
                _deliver(signum, at_exit)
            except BaseException:  # its handler raised (SystemExit, KeyboardInterrupt):
                _send_later(arrived[index + 1:])  # the others are acted on all the same
                raise


def after_fork_in_child() -> None:
    """In a forked child: the program's handlers back, unless the forking thread is the
    one holding signals back for a teardown (which goes on in the child and ends the
    hold).  A `deferred` block is never kept: a child that never leaves it (a
    multiprocessing child ends by ``os._exit``) would hold its signals for its whole life."""
    mine = _state["thread"] == _thread.get_ident()
    if _state["depth"] and (not mine or _state["depth"] == _state["deferred"]):
        _restore()
        _state.update(depth=0, deferred=0, at_exit=False, drop=False, thread=0)
    _pending.clear()  # signals sent to the parent
    resent.clear()
    global _end_by
    if _end_by is not None:  # the parent's exit is to end by a signal; not this child's
        _end_by.armed = False
        _end_by = None


def _swap() -> None:
    # _signal, not signal: the same functions, without importing enum at every exit
    try:
        import _signal  # type: ignore[import-not-found]

        candidates = {int(_signal.SIGINT), *installed}
        for signum in candidates:
            current = _signal.getsignal(signum)
            ours = getattr(current, "__exitsafe_signal_handler__", False)
            if ours or (signum == _signal.SIGINT and current is _signal.default_int_handler):
                _saved[signum] = current
                _signal.signal(signum, _record)
    except (ValueError, OSError):  # not the main interpreter, or a platform refusal:
        pass  # nothing is held, signals keep their usual behaviour


def _restore() -> None:
    """Put the program's handlers back; safe to call again after an interrupt (each
    saved handler is forgotten only once it is back)."""
    import _signal

    for signum, handler in list(_saved.items()):
        try:
            if _signal.getsignal(signum) is _record:  # unless the program changed it since
                _signal.signal(signum, handler)
        except (ValueError, OSError):  # see _swap
            pass
        _saved.pop(signum, None)


def _end_by_arrived() -> None:
    """Make the signals recorded so far end the process once its exit is done (each gets
    its default action now; the first one arms `_EndBySignal`)."""
    for signum in dict.fromkeys(_pending):
        _deliver(signum, True)


def _send_later(signals: list[int]) -> None:
    """Send ``signals`` to this process: each handler runs at the main thread's next
    check for signals (a handler before them raised, ending the delivery)."""
    import os

    for signum in signals:
        os.kill(os.getpid(), signum)


def install(signum: int, handler: Any) -> Any:
    """``signal.signal(signum, handler)``; while a hold is open on this thread, the handler
    is what the hold puts back when it ends, and the hold records ``signum`` meanwhile.
    Returns the handler in effect before (see `handler_in_effect`)."""
    import signal

    previous = handler_in_effect(signum)
    if _state["depth"] and _state["thread"] == _thread.get_ident():
        if signal.getsignal(signum) is not _record:
            signal.signal(signum, _record)
        _saved[signum] = handler
    else:
        signal.signal(signum, handler)
    return previous


def handler_in_effect(signum: int) -> Any:
    """The handler of ``signum``, or, while a hold records it, the one the hold puts back."""
    import signal

    current = signal.getsignal(signum)
    if current is _record and signum in _saved:
        return _saved[signum]
    return current


def _deliver(signum: int, at_exit: bool) -> None:
    import signal

    if not at_exit:
        signal.raise_signal(signum)
        return
    global _end_by
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (ValueError, OSError):  # see _swap
        pass
    if _end_by is None:
        _end_by = _EndBySignal(signum)


def end_by_uncaught_keyboard_interrupt() -> None:
    """At exit, after a ``KeyboardInterrupt`` nobody caught: make sure the process ends by
    SIGINT, as CPython promises (bpo-1054041: a shell must see the user's ^C).

    CPython decides that from a flag which, on 3.9, 3.10 and 3.12, any module imported
    during the exit resets, so an ``atexit`` callback that imports (exitsafe's teardown
    may, a user's callback may) turned the death by SIGINT into ``exit 1``.  The end is
    armed the way a held signal's is (see `_EndBySignal`): the rest of the exit still
    runs.  Not in an interactive session, where every error sets ``sys.last_type``.
    """
    import sys

    if sys.flags.interactive or hasattr(sys, "ps1"):
        return
    last = getattr(sys, "last_type", None)
    if isinstance(last, type) and issubclass(last, KeyboardInterrupt):
        import signal

        _deliver(int(signal.SIGINT), True)


def end_signal() -> Optional[int]:
    """The signal the process is to end by once its exit is done, if any."""
    return None if _end_by is None else _end_by.signum


class _EndBySignal:
    """Ends the process by ``signum`` when the interpreter clears this module.

    Held only by the module global ``_end_by``, it is collected when interpreter
    finalization clears the modules' globals: after every ``atexit`` callback and the
    flush of ``sys.stdout`` / ``sys.stderr``, the latest moment Python code runs.  This
    module is imported on first use (at exit, or by an explicit teardown), never with
    exitsafe: CPython clears the modules imported last first, and a module imported at
    start-up is cleared after the import system, too late to send a signal that ends
    the process.
    That is where CPython itself ends a program killed by an uncaught
    ``KeyboardInterrupt``.  Everything it needs is bound here: module globals may be
    gone by then.
    """

    __slots__ = ("_flush", "_getpid", "_kill", "armed", "signum")

    def __init__(self, signum: int) -> None:
        import os
        import sys

        self.signum = signum
        self.armed = True
        self._kill = os.kill
        self._getpid = os.getpid
        self._flush = [s.flush for s in (sys.stdout, sys.stderr) if s is not None]

    def __del__(self) -> None:
        if self.armed:
            self.fire()

    def fire(self) -> None:
        """Flush stdio and send the signal to this process."""
        self.armed = False
        for flush in self._flush:
            try:
                flush()
            except Exception:  # closed or broken: nothing more can be saved
                pass
        self._kill(self._getpid(), self.signum)


_end_by: Optional[_EndBySignal] = None


def end_by_signal_now() -> None:
    """End the process now by the signal it is to end by (`end_signal`), if any.

    For an end that leaves by ``os._exit`` once its teardown is done (a multiprocessing
    worker's, `exitsafe.exit`): no module cleanup follows there to send it.  The signal
    is unblocked in this thread first, so that it ends the process whatever the thread
    blocks.  Returns if there is no such signal, or if the process outlives it.
    """
    if _pending:  # recorded by a hold this end runs inside of, which will never end
        _end_by_arrived()
        _pending.clear()
    end = _end_by
    if end is None or not end.armed:
        return
    import signal

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {end.signum})
    end.fire()


def signals_to_take_over() -> bool:
    """Whether signals sent again by exitsafe's handlers wait for the exit (see `resent`)."""
    return bool(resent)
