"""Forked children and multiprocessing workers: their own teardown, and a quiet way out.

* **Multiprocessing workers.**  A worker that ends normally never reaches the
  ``atexit`` callbacks it inherited (fork children end with ``os._exit()``; since 3.13
  they first run only their *own* callbacks, after ``atexit._clear()``), so exitsafe's
  exit teardown would not run there.  The one hook that runs at the normal end of a
  worker with every start method (fork, forkserver, spawn) and every pool (``Process``,
  ``Pool`` closed and joined, ``ProcessPoolExecutor``) on 3.9 to 3.15 is a
  ``multiprocessing.util.Finalize`` registered *in the worker* after the worker's
  start cleared the finalizer registry.  `in_worker` arranges for that: it asks
  multiprocessing to call it back right after that clearing
  (``util.register_after_fork``) and registers the Finalize directly too (for a worker
  that imports exitsafe only after its start).  The teardown is idempotent, so
  whichever runs first does the work.  Priority `WORKER_EXIT_PRIORITY`: after a
  ``Pool`` the worker created was terminated (15), before multiprocessing's queues are
  closed (10).
* **Leaving quietly.**  ``exitsafe._exit.leave`` tears down what this process owns,
  flushes stdio and ends with ``os._exit``: no module finalization, no C-level ``atexit``
  handler, no finalizer of an inherited object.  With the forked-child setting
  (``EXITSAFE_FORK_EXIT=quiet`` or ``exitsafe.lowlevel.set_fork_exit("quiet")``) a forked child
  that ends normally does the same, with its exit status.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NoReturn

#: The ``exitpriority`` of the worker teardown's ``multiprocessing.util.Finalize``.
WORKER_EXIT_PRIORITY = 12

FORK_EXIT_CHOICES = ("normal", "quiet")

_state: dict[str, Any] = {
    "fork_exit": None,  # set_fork_exit(); None: read EXITSAFE_FORK_EXIT
    "finalize_pid": 0,  # the process a Finalize was registered in
    "after_fork_pid": 0,  # the process that asked multiprocessing for _register_finalize
    "status": None,  # the exit status a quiet child will end with (see _watch_exit)
    "worker_teardown": None,  # what a worker runs at its end (see set_worker_teardown)
}


# ---------------------------------------------------------------------- workers


def set_worker_teardown(fn: Callable[[], None]) -> None:
    """What a multiprocessing worker runs at its end: every registry's teardown (set by
    ``exitsafe._exit``, which owns it)."""
    _state["worker_teardown"] = fn


def _teardown_worker() -> None:
    fn = _state["worker_teardown"]
    if fn is not None:
        fn()


def _register_finalize(*_unused: object) -> None:
    """Register the worker teardown with multiprocessing's exit function, once per process."""
    pid = os.getpid()
    if _state["finalize_pid"] == pid:
        return
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    _state["finalize_pid"] = pid
    util.Finalize(None, _teardown_worker, exitpriority=WORKER_EXIT_PRIORITY)


class _AfterFork:
    """An object multiprocessing can keep a weak reference to (``register_after_fork``)."""


_after_fork_token = _AfterFork()


def in_worker() -> None:
    """Make sure multiprocessing processes started from here (and this one, if it is a
    worker) tear down at their normal end.

    Asks multiprocessing to run `_register_finalize` in every process it starts,
    right after the start cleared the process's finalizers (``register_after_fork``:
    inherited by fork children, and made again at import in forkserver and spawn
    children, which import exitsafe before their start); and, in a worker that imports
    exitsafe only after its start, registers the Finalize directly.  Called at import and
    before every ``fork()``; does nothing where multiprocessing is not imported.
    """
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    pid = os.getpid()
    if _state["after_fork_pid"] != pid:
        _state["after_fork_pid"] = pid
        util.register_after_fork(_after_fork_token, _register_finalize)
    process = sys.modules.get("multiprocessing.process")
    current = process.current_process() if process is not None else None
    if current is not None and getattr(current, "_parent_pid", None) is not None:
        _register_finalize()


# ---------------------------------------------------------------------- leaving quietly


def status_of(code: object) -> int:
    """The exit status ``code`` stands for (``None``: 0), or the error naming it."""
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int):
        raise TypeError(
            f"code must be an int or None (the exit status, as for sys.exit), "
            f"got {type(code).__name__}"
        )
    if not 0 <= code <= 255:
        raise ValueError(f"code must be between 0 and 255, got {code}")
    return code


def flush_stdio() -> None:
    """Flush every standard stream that can still be flushed."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can be saved
            pass


# ---------------------------------------------------------------------- the fork-exit setting


def set_fork_exit(mode: str) -> None:
    """``"quiet"`` or ``"normal"``: how forked children of this process end (see
    [`exitsafe.lowlevel.set_fork_exit`][exitsafe.lowlevel.set_fork_exit])."""
    if mode not in FORK_EXIT_CHOICES:
        raise ValueError(f"mode must be one of {FORK_EXIT_CHOICES}, got {mode!r}")
    _state["fork_exit"] = mode


def fork_exit() -> str:
    """The forked-child setting in effect: the function's, else ``EXITSAFE_FORK_EXIT``."""
    mode = _state["fork_exit"]
    if mode is not None:
        return str(mode)
    raw = os.environ.get("EXITSAFE_FORK_EXIT")
    if raw is None or not raw.strip():
        return "normal"
    value = raw.strip().lower()
    if value in FORK_EXIT_CHOICES:
        return value
    from ._config import warn_once

    warn_once("EXITSAFE_FORK_EXIT", raw, "expected quiet or normal; using normal")
    return "normal"


def before_fork() -> None:
    """Before ``fork()``: a worker it starts must find the teardown registration."""
    in_worker()


def after_fork_in_child() -> None:
    """In a forked child: a quiet end if asked for."""
    if fork_exit() == "quiet":
        _watch_exit()


def _watch_exit() -> None:
    """Remember the status a forked child ends with, for `quiet_end`.

    ``sys.exit(n)`` is seen on every version, and a ``SystemExit`` raised directly from
    CPython 3.12 on (through ``sys.monitoring``; before 3.12 such a child ends with 0);
    an uncaught exception means status 1, as CPython's own; the end of main means 0.
    Nothing changes how the program unwinds: ``finally`` blocks and ``with`` blocks run.
    """
    _state["status"] = 0
    original_exit = sys.exit
    original_hook = sys.excepthook

    def exit(status: Any = None) -> NoReturn:
        _state["status"] = status
        original_exit(status)
        raise AssertionError("unreachable")  # pragma: no cover - sys.exit raised

    def excepthook(kind: Any, value: Any, tb: Any) -> None:
        _state["status"] = 1
        original_hook(kind, value, tb)

    sys.exit = exit
    sys.excepthook = excepthook
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        _watch_raises(monitoring)


def _watch_raises(monitoring: Any) -> None:
    """3.12+: see every ``SystemExit`` raised, whoever raises it."""

    def on_raise(code: object, offset: int, exception: BaseException) -> object:
        if isinstance(exception, SystemExit):
            _state["status"] = exception.code
        return None

    for tool in (3, 4):  # the ids CPython leaves free (debugger, coverage, profiler,
        try:  # optimizer are 0, 1, 2 and 5)
            monitoring.use_tool_id(tool, "exitsafe")
        except ValueError:  # taken by another tool
            continue
        monitoring.register_callback(tool, monitoring.events.RAISE, on_raise)
        monitoring.set_events(tool, monitoring.events.RAISE)
        return


def quiet_end() -> None:
    """At the exit of a forked child in quiet mode: end now, with its status.

    Called by the exit hook after the teardown and the ledger: flushes stdio and ends
    with ``os._exit``, so nothing the parent left (module finalization of inherited
    objects, C-level ``atexit`` handlers of native libraries) runs in the child.
    """
    from . import _sync

    if not _sync.generation or fork_exit() != "quiet":
        return
    status = _state["status"]
    if status is None:
        code = 0
    elif isinstance(status, int) and not isinstance(status, bool):
        code = status & 0xFF
    else:
        # As CPython does for sys.exit("message"): print it, status 1.
        try:
            print(status, file=sys.stderr)
        except (OSError, ValueError):  # stderr closed: the status still says it
            pass
        code = 1
    flush_stdio()
    from ._interrupts import end_signal

    signum = end_signal()  # a signal held back during this exit: end by it, as planned
    if signum is not None:
        os.kill(os.getpid(), signum)
    os._exit(code)
