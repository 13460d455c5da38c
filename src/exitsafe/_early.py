"""The early phase of an exit: hooks that run before the interpreter joins its threads.

When the main thread finishes, CPython first calls ``threading._shutdown()``, which runs
the callbacks registered with ``threading._register_atexit`` (newest first:
``concurrent.futures`` joins every executor worker there) and then joins every
non-daemon thread; only after that do ``atexit`` callbacks, exitsafe's teardown among
them, run.  A server whose handler never returns, or a busy executor, therefore hangs
the exit before exitsafe can act.

`install` wraps the module attribute ``threading._shutdown`` (which the
interpreter looks up at exit, on every version from 3.9 to 3.15): the wrapper runs
exitsafe's early phase (every registry's early hooks, newest first, then the stop
requests of its declared workers), then the original.  It is installed the first time
an early hook or a worker is declared, never raises, and chains whatever was there
(another library's wrapper included).  Where the attribute does not exist, the early
phase is registered with ``threading._register_atexit`` (it then runs after the
executors registered later than it were joined), and where neither exists it runs at
the beginning of the exit teardown.

What may be used in the early phase: everything (modules are intact, threads still
run); on CPython 3.12.0 to 3.12.2 no new thread can be started there (a hook's time
limit then relies on the standby workers exitsafe starts as soon as a timeout is
configured).  Early hooks also run, once, at the beginning of an explicit teardown.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

#: How the early phase is hooked in: "" (not yet), "threading._shutdown",
#: "threading._register_atexit" or "atexit".
_installed: list[str] = [""]
#: Whether the early phase already ran in this process.
_ran: list[bool] = [False]
#: What runs once the interpreter has joined its threads, before any ``atexit`` callback
#: (the quiescing of the threads left: see exitsafe._quiesce).
_after_joins: list[Callable[[], None]] = []


class _ShutdownWrapper:
    """Stands in for ``threading._shutdown``: the early phase, then the original."""

    __slots__ = ("original", "run")

    def __init__(self, original: Callable[[], Any], run: Callable[[str], None]) -> None:
        self.original = original
        self.run = run

    def __call__(self) -> Any:
        self.run("interpreter shutdown")
        try:
            return self.original()
        finally:  # (joined, or interrupted while joining: the exit goes on either way)
            for fn in list(_after_joins):
                fn()  # (never raises)


def after_joins(fn: Callable[[], None]) -> None:
    """Run ``fn()`` (which never raises) once the interpreter has joined its non-daemon
    threads and before the ``atexit`` callbacks run: at the end of the wrapped
    ``threading._shutdown``.  Where that cannot be hooked, the exit teardown runs what
    it needs of this first (see exitsafe._exit.at_exit)."""
    if fn not in _after_joins:
        _after_joins.append(fn)


def install(run: Callable[[str], None]) -> str:
    """Hook the early phase in (idempotent): ``run(reason)`` (``exitsafe._exit``'s
    ``run_early_phase``) is called before the interpreter joins its threads.  Returns
    how (see `_installed`)."""
    if _installed[0]:
        return _installed[0]
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if callable(shutdown):
        threading._shutdown = _ShutdownWrapper(shutdown, run)  # type: ignore[attr-defined]
        _installed[0] = "threading._shutdown"
        return _installed[0]
    register = getattr(threading, "_register_atexit", None)
    if callable(register):
        try:
            register(run, "interpreter shutdown")
            _installed[0] = "threading._register_atexit"
            return _installed[0]
        except RuntimeError:  # the interpreter is already shutting down
            pass
    _installed[0] = "atexit"  # the exit teardown runs it first
    return _installed[0]


def first_run() -> bool:
    """Whether the early phase runs for the first time in this process (then it is
    marked as run)."""
    from . import _sync

    def mark() -> bool:
        first = not _ran[0]
        _ran[0] = True
        return first

    return _sync.locked_quietly(mark)


def report(exc: BaseException) -> None:
    """Log that the early phase failed (never raises)."""
    try:
        from ._report import log

        log().error("exitsafe: the early phase of the exit failed: %s", repr(exc))
    except BaseException:  # logging itself broken at exit: nothing more to do
        pass


def after_fork_in_child() -> None:
    """A forked child has its own exit: its early phase has not run yet."""
    _ran[0] = False


def ran() -> bool:
    return _ran[0]


def how() -> Optional[str]:
    """How the early phase is hooked in, or ``None`` before anything asked for it."""
    return _installed[0] or None
