"""A signal whose handler never begins: sent to the main thread again.

A Python-level signal handler runs on the main thread, at its next bytecode after the
C-level handler noted the signal.  If the signal lands just before the main thread
blocks in a native call that does not check for signals before it waits (a
``multiprocessing`` lock's ``sem_wait``, a library's own wait), the call is not
interrupted, and the handler waits for the next signal: for ever, when the sender
sends one (``Pool.terminate()`` sends one SIGTERM, then joins the worker without a
bound).  The same happens when the signal is delivered to another thread of the process.

`watch` closes that window for the signals of
[`teardown_on_signals(mode="immediate")`][exitsafe.signals.teardown_on_signals]: the C-level
handler also writes the signal's number to a pipe (``signal.set_wakeup_fd``), read by a
watcher thread (which blocks those signals itself).  When the handler has not begun
`DELAYS` after the signal arrived, the watcher sends it to the main thread again
(``pthread_kill``), which interrupts the wait; at most ``len(DELAYS)`` times per arrival.
A signal sent again to a handler that did begin meanwhile is dropped by that handler
(the process is already ending by the first one).

Nothing is watched when the program (asyncio's event loop, for one) already uses the
wakeup file descriptor: it stays the program's.  A forked child starts its own watcher
the first time the immediate mode's handlers are installed there, and the parent's pipe
is never written from the child.
"""

from __future__ import annotations

import _thread
import os
import signal
from time import sleep

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["begun", "watch"]

#: Seconds to wait, one after another, for the handler to begin before each new sending.
DELAYS = (0.1, 0.4, 1.5)

#: The signals watched, the process watching them (a forked child has no watcher), and
#: how many times each watched signal's handler has begun.
_signals: set[int] = set()
_watching_pid: list[int] = [0]
_begun: dict[int, int] = {}


def begun(signum: int) -> None:
    """Note that the handler of ``signum`` begins (its first statement): no more sending."""
    _begun[signum] = _begun.get(signum, 0) + 1


def watch(signums: Iterable[int]) -> bool:
    """Watch ``signums`` (from the main thread, after their handlers are installed);
    whether a watcher runs for them.  Never raises."""
    if not (hasattr(signal, "pthread_kill") and hasattr(signal, "set_wakeup_fd")):
        return False  # (not POSIX: no wakeup to miss the same way, nothing to send with)
    _signals.update(signums)
    if _watching_pid[0] == os.getpid():
        return True
    try:
        read, write = os.pipe()
    except OSError:  # out of descriptors: the handlers still work, unwatched
        return False
    os.set_blocking(write, False)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: signal.signal would have refused first
        os.close(read)
        os.close(write)
        return False
    if previous != -1:
        signal.set_wakeup_fd(previous)  # the program's own (asyncio's): left to it
        os.close(read)
        os.close(write)
        return False
    _watching_pid[0] = os.getpid()
    _thread.start_new_thread(_watch, (read, _thread.get_ident()))
    return True


def _watch(read: int, main: int) -> None:
    try:
        # Never the thread a watched signal is delivered to: the main thread must be.
        signal.pthread_sigmask(signal.SIG_BLOCK, set(_signals))
        while True:
            data = os.read(read, 512)
            if not data:
                return
            for signum in set(data):
                if signum in _signals:
                    _send_until_begun(signum, main)
    except Exception:  # (the process is ending, or its descriptors were closed under us:
        return  # the watcher ends; the handlers work as without it)


def _send_until_begun(signum: int, main: int) -> None:
    seen = _begun.get(signum, 0)
    for delay in DELAYS:
        sleep(delay)
        if _begun.get(signum, 0) != seen:
            return
        signal.pthread_kill(main, signum)


def _after_fork_in_child() -> None:
    """The child has no watcher thread: the parent's pipe is not its to write."""
    if _watching_pid[0] and _watching_pid[0] != os.getpid():
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:  # (forked from a thread that is not the main one there)
            pass
        _watching_pid[0] = 0
        _signals.clear()
        _begun.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
