"""The signal watcher of ``teardown_on_signals(..., watch=True)``: a signal whose Python
handler is held up by a native wait of the main thread is not left waiting for the next
signal.

Python runs a signal's handler on the main thread, at its next check for signals.  The
C-level handler only notes the signal; a main thread blocked in a native wait notices
only when a signal interrupts that wait (``EINTR``).  So a signal that lands just before
the main thread blocks in a wait that does not check for signals first (a
``multiprocessing`` lock: an idle pool worker waiting for its next task), or that the
kernel hands to another thread, leaves the handler waiting until a *further* signal
comes, for ever when none does (``Pool.terminate()`` sends one SIGTERM, then joins the
worker without a bound).

The watcher closes that window.  It is a thread of exitsafe's own, blocked reading a pipe
that the interpreter's C-level handler writes the signal's number into
(``signal.set_wakeup_fd``).  For a signal that exitsafe handles, it waits
`WAKE_EVERY` seconds; if the handler has not begun since (an entry of the handler that
an earlier signal's byte already accounted for does not count), it sends `WAKE_SIGNAL`
(SIGURG, ignored by default; exitsafe installs a handler that does nothing) to the main
thread, which interrupts its wait, so Python checks its signals and runs the handler.  It
goes on every `WAKE_EVERY` seconds, at most `WAKE_TRIES` times, until the handler has
begun, or the signal's handler is no longer exitsafe's (the program installed its own).
The wake signal itself does nothing: a wake sent for nothing (two signals that Python ran
one handler for; a byte written by a forked child's handler before the child took a pipe
of its own) costs interrupted, retried waits (PEP 475), at most `WAKE_TRIES` of them;
only a native call made through ``ctypes`` or a library that does not retry sees them.

Rules:

* **Thread.**  The watcher never runs the program's code, holds no lock of exitsafe's, and
  blocks the watched signals itself (so the kernel gives them to a thread that acts).  It
  is never quiesced, and the in-use check does not count it.
* **fork().**  A child starts with the parent's handlers but not its threads: it gets a
  pipe and a watcher of its own (`after_fork_in_child`), or none (the wakeup fd reset)
  where one cannot be started.  A process with a watcher has two threads: CPython 3.12+
  warns (``DeprecationWarning``) when it forks.
* **Exec.**  The pipe is not inherited (close-on-exec).
* **Refusals.**  A program that set a wakeup fd itself (``asyncio``'s signal handlers) or
  its own SIGURG handler is not changed: `start` says why it cannot watch.
* **Taken over.**  A program that sets a wakeup fd later (``loop.add_signal_handler``;
  ``asyncio`` sets it back to none when the loop closes) takes the watcher's place: the
  watcher then sees no signal, as without ``watch=True``.  The pipe's descriptors are
  moved above `HIGH_FD`, out of the way of a program that closes and reopens low
  descriptors (a daemonizing one); a fork's child closes them only if they are still the
  pipe.
"""

from __future__ import annotations

import _thread
import os
import signal
import time

from . import _threads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Iterable, Optional

__all__ = ["after_fork_in_child", "entered", "start"]

#: The signal sent to wake the main thread: its default action is to ignore it, so a
#: wake that outlives exitsafe's handler (a program replaced it) does nothing.
WAKE_SIGNAL: Optional[int] = getattr(signal, "SIGURG", None)
#: Seconds the watcher waits for the handler before each wake.
WAKE_EVERY = 0.05
#: Wakes sent at most for one signal (``WAKE_EVERY * WAKE_TRIES`` seconds in all).
WAKE_TRIES = 100
#: The pipe's descriptors are moved to this number or above (`_open_pipe`).
HIGH_FD = 200

#: The watched signal numbers.
_watched: set[int] = set()
#: signal number -> how many times exitsafe's handler for it began.
_entered: dict[int, int] = {}
#: [read end, write end] of the pipe, empty while no watcher runs.
_pipe: list[int] = []
#: The pipe's identity, ``(st_dev, st_ino)`` (a descriptor of that number may be another
#: file once the program closed ours).
_pipe_id: list[tuple[int, int]] = []


def entered(signum: int) -> None:
    """Note that exitsafe's handler for ``signum`` began (called first thing in it)."""
    _entered[signum] = _entered.get(signum, 0) + 1  # (main thread only: no lost update)


def _woken(signum: int, frame: Optional[FrameType]) -> None:
    """The wake signal's handler: nothing to do; the signal only interrupted a wait."""


def start(signals: Iterable[int]) -> Optional[str]:
    """Watch ``signals`` (from the main thread); return why it cannot (None: it does)."""
    if WAKE_SIGNAL is None or not hasattr(signal, "pthread_kill"):
        return "it needs signal.pthread_kill and SIGURG (POSIX)"
    if _pipe:
        _watched.update(signals)
        return None
    current = signal.getsignal(WAKE_SIGNAL)
    if current not in (signal.SIG_DFL, signal.SIG_IGN, None, _woken):
        return f"the program handles {signal.Signals(WAKE_SIGNAL).name} itself"
    reason = _open_pipe()
    if reason is not None:
        return reason
    signal.signal(WAKE_SIGNAL, _woken)
    _watched.update(signals)
    _start_thread()
    return None


def _open_pipe() -> Optional[str]:
    read_end, write_end = (_high(fd) for fd in os.pipe())  # (close-on-exec: not inherited)
    os.set_blocking(write_end, False)  # (the C-level handler must never block on it)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)  # (the program's, asyncio's: put back as it was)
        os.close(read_end)
        os.close(write_end)
        return f"the program set a wakeup fd itself (fd {previous}, asyncio's signal handling?)"
    _pipe[:] = [read_end, write_end]
    stat = os.fstat(read_end)
    _pipe_id[:] = [(stat.st_dev, stat.st_ino)]
    return None


def _high(fd: int) -> int:
    """``fd`` moved to `HIGH_FD` or above (close-on-exec), where the system allows it."""
    try:
        import fcntl

        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    except (ImportError, OSError, AttributeError):  # (a low descriptor limit: keep it)
        return fd
    os.close(fd)
    return int(moved)


def _still_ours(fd: int) -> bool:
    try:
        stat = os.fstat(fd)
    except OSError:
        return False
    return [(stat.st_dev, stat.st_ino)] == _pipe_id


def _start_thread() -> None:
    _thread.start_new_thread(_watch, (_pipe[0], _thread.get_ident()))


def _watch(read_end: int, main: int) -> None:
    me = _thread.get_ident()
    _threads.own.add(me)
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, set(_watched))
        #: signal number -> the handler entries the bytes read so far accounted for
        accounted: dict[int, int] = {}
        while True:
            try:
                data = os.read(read_end, 512)
            except OSError:  # (the pipe was closed: a fork's child took a new one)
                return
            if not data:
                return
            for signum in dict.fromkeys(data):
                if signum in _watched:
                    accounted[signum] = _wake_until_handled(
                        signum, accounted.get(signum, 0), main
                    )
    finally:
        _threads.own.discard(me)


def _wake_until_handled(signum: int, accounted: int, main: int) -> int:
    """Wake the main thread until exitsafe's handler for ``signum`` has begun more than
    ``accounted`` times (or is no longer the signal's handler); return its entries then."""
    assert WAKE_SIGNAL is not None
    for _ in range(WAKE_TRIES):
        time.sleep(WAKE_EVERY)  # (the main thread's own chance first)
        entries = _entered.get(signum, 0)
        if entries > accounted:
            return entries
        if not _exitsafes(signal.getsignal(signum)):
            break  # (the program's own handler now: it does not need exitsafe's wakes)
        if signal.getsignal(WAKE_SIGNAL) is not _woken:
            break  # (the program took the wake signal over: a wake would reach its code)
        try:
            signal.pthread_kill(main, WAKE_SIGNAL)
        except (OSError, ValueError):  # the main thread is gone: the process is ending
            break
    return _entered.get(signum, 0)


def _exitsafes(handler: object) -> bool:
    """Whether ``handler`` is one of exitsafe's: its teardown handlers, or the handler
    that holds signals back during a teardown."""
    return getattr(handler, "__module__", None) in ("exitsafe.signals", "exitsafe._interrupts")


def after_fork_in_child() -> None:
    """In a forked child: a pipe and a watcher of its own (its parent's thread is not
    here), or the wakeup fd reset where that cannot be (the child's signals must never
    be written into the parent's pipe)."""
    if not _pipe:
        return
    for fd in _pipe:
        if _still_ours(fd):  # (else the program closed it, and the number is another file)
            os.close(fd)
    _pipe.clear()
    try:
        signal.set_wakeup_fd(-1)
        if _open_pipe() is None:
            _start_thread()
    except (OSError, ValueError, RuntimeError) as exc:
        # (no thread can be started, or this is not the main thread): the child goes on
        # without a watcher, as a program without watch=True would.
        from . import _report

        _report.log().debug("exitsafe: no signal watcher in this child: %r", exc)
