"""Opt-in: turn termination signals into an orderly teardown.

A container stop or ``kill`` sends SIGTERM, whose default action ends the
process at once: no ``atexit``, so no exitsafe teardown, and native
objects are reclaimed in whatever state they were.  Usually that is
harmless, but a runtime that must flush or unregister something (a device
queue, a lock file, a driver session) never gets the chance.

:func:`teardown_on_signals` installs handlers that run the teardown:

``mode="exit"`` (default)
    The handler raises ``SystemExit(128 + signum)`` in the main thread, so
    ``finally`` blocks and context managers unwind, non-daemon threads are
    joined, and the normal exit teardown runs from ``atexit``.  The exit
    status is the shell's convention for "killed by that signal" (143 for
    SIGTERM).  Use it when the main thread reaches Python code regularly.
``mode="immediate"``
    The handler tears down every registry (newest first) right away, writes
    the ledger if ``EXITSAFE_LEDGER`` is set, restores the signal's default
    action and re-sends the signal, so the process dies by that signal (as a
    supervisor expects) without running any further Python finalization.
    Use it when the main thread may sit in a long native call.

SIGINT is only taken over when the program left Python's default handler
(``KeyboardInterrupt``) in place; a program's own handler is never
replaced.  Handlers can only be installed from the main thread, as
:func:`signal.signal` requires.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import FrameType
    from typing import Any, Optional, Union

__all__ = ["teardown_on_signals"]

_MODES = ("exit", "immediate")


def _signal_number(sig: Union[int, str, signal.Signals]) -> int:
    if isinstance(sig, str):
        try:
            return int(getattr(signal, sig.upper()))
        except AttributeError:
            raise ValueError(f"unknown signal name {sig!r} on this platform") from None
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(f"signals must be names or numbers, got {type(sig).__name__}")
    return int(sig)


def teardown_on_signals(
    signals: Iterable[Union[int, str, signal.Signals]] = ("SIGTERM", "SIGINT"),
    *,
    mode: str = "exit",
) -> dict[int, Any]:
    """Install teardown handlers for ``signals``; return ``{signum: previous handler}``.

    See the module documentation for the two modes.  A signal whose current
    handler is the program's own (anything but the default action or, for
    SIGINT, Python's default ``KeyboardInterrupt`` handler) is left alone and
    missing from the result.  Raises ``ValueError`` for an unknown signal or
    mode, and whatever :func:`signal.signal` raises off the main thread.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    numbers = [_signal_number(s) for s in signals]
    installed: dict[int, Any] = {}
    for signum in numbers:
        current = signal.getsignal(signum)
        ours = current in (signal.SIG_DFL, None) or (
            signum == signal.SIGINT and current is signal.default_int_handler
        )
        if not ours:
            continue
        handler = _exit_handler if mode == "exit" else _immediate_handler
        installed[signum] = signal.signal(signum, handler)
    return installed


def _exit_handler(signum: int, frame: Optional[FrameType]) -> None:
    raise SystemExit(128 + signum)


def _immediate_handler(signum: int, frame: Optional[FrameType]) -> None:
    from ._process import teardown_all

    teardown_all(f"signal {signal.Signals(signum).name}")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
