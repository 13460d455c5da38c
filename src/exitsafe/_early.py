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

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

#: How the early phase is hooked in: "" (not yet), "threading._shutdown",
#: "threading._register_atexit" or "atexit".
_installed: list[str] = [""]
#: Whether the early phase already ran in this process.
_ran: list[bool] = [False]


class _ShutdownWrapper:
    """Stands in for ``threading._shutdown``: the early phase, then the original."""

    __slots__ = ("original",)

    def __init__(self, original: Callable[[], Any]) -> None:
        self.original = original

    def __call__(self) -> Any:
        run_early_phase("interpreter shutdown")
        return self.original()


def install() -> str:
    """Hook the early phase in (idempotent); return how (see `_installed`)."""
    if _installed[0]:
        return _installed[0]
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if callable(shutdown):
        threading._shutdown = _ShutdownWrapper(shutdown)  # type: ignore[attr-defined]
        _installed[0] = "threading._shutdown"
        return _installed[0]
    register = getattr(threading, "_register_atexit", None)
    if callable(register):
        try:
            register(run_early_phase, "interpreter shutdown")
            _installed[0] = "threading._register_atexit"
            return _installed[0]
        except RuntimeError:  # the interpreter is already shutting down
            pass
    _installed[0] = "atexit"  # the exit teardown runs it first
    return _installed[0]


def run_early_phase(reason: str) -> None:
    """Run every registry's early hooks (newest registry first), once per process.

    Never raises: an exception escaping here would abort ``threading._shutdown``,
    which would then skip the joins of non-daemon threads.
    """
    from . import _sync

    if _sync.reentered():
        return  # never from inside exitsafe's own step (a signal handler): it runs at exit
    try:
        _sync.enter()
        first = not _ran[0]
        _ran[0] = True
    finally:
        try:
            _sync.release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
        else:
            _sync.run_deferred()
    if not first:
        return
    try:
        from ._interrupts import held
        from ._process import registries

        # A signal arriving while an early hook runs is held back, as during the exit
        # teardown, and ends the process once the exit is done (not a hook's failure).
        with held(at_exit=True):
            for registry in reversed(registries()):
                registry._run_early_hooks(reason)
    except BaseException as exc:  # see the docstring: never raise into _shutdown
        _report(exc)
    steps = sys.modules.get("exitsafe._steps")
    if steps is not None:
        # An early hook called exitsafe.exit() on its worker thread (a hook with a
        # timeout): the early phase is over, the exit is carried out here (see _steps).
        steps.leave_if_asked()


def _report(exc: BaseException) -> None:
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
