"""exitsafe: make programs that hold native handles exit cleanly.

Declare each native object with [`track`][exitsafe.track] (and the libraries their
release code runs in with [`pin`][exitsafe.pin]), say what depends on what, and
exitsafe releases them in a safe order whatever way the process ends, or
leaks them on purpose where releasing is unsafe.  See the README and
``docs/`` for the concepts; every function here acts on the process-wide
default registry ([`exitsafe.lowlevel.default_registry`][exitsafe.lowlevel.default_registry])
unless you create a [`Registry`][exitsafe.Registry] of your own.

The names are in tiers, as in trio: this module has what a binding needs (the module-level
functions, [`Registry`][exitsafe.Registry], [`Handle`][exitsafe.Handle],
[`NativeObject`][exitsafe.NativeObject], [`Outcome`][exitsafe.Outcome] and the errors a
program catches); [`exitsafe.lowlevel`][exitsafe.lowlevel] has the expert ones (the default
registry itself, the core in use, neutralization, the types of what exitsafe hands out, the
errors that report a wrong call); [`exitsafe.testing`][exitsafe.testing] the crash-regression
harness.  Each public class and function shows the module it is imported from
(`exitsafe.HandleClosedError` in a traceback, not its private defining module).

Importing exitsafe is cheap: it imports no FFI library and nothing beyond
a few builtin modules.
"""

from __future__ import annotations

from . import _config, _core, _errors, _guard, _handle, _ledger, _registry, _releases
from ._errors import (
    AlreadyTrackedError,
    ExitsafeError,
    HandleClosedError,
    LiveDependentsError,
    RegistryClosedError,
    ReleaseError,
)
from ._guard import Guarded as _Guarded
from ._handle import Handle
from ._ledger import Outcome
from ._registry import Registry
from ._registry import default_registry as _default_registry
from ._usage import explained as _explained

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, NoReturn, Optional, TypeVar, Union

    from . import lowlevel
    from ._adopt import adopt
    from ._checked import checked
    from ._registry import ExitPolicy
    from ._section import native
    from ._wrapper import NativeObject

    T = TypeVar("T")

__version__ = "0.1.0"

__all__ = [
    "AlreadyTrackedError",
    "ExitsafeError",
    "Handle",
    "HandleClosedError",
    "LiveDependentsError",
    "NativeObject",
    "Outcome",
    "Registry",
    "RegistryClosedError",
    "ReleaseError",
    "__version__",
    "adopt",
    "checked",
    "exit",
    "guard",
    "ledger",
    "native",
    "on_early_exit",
    "on_teardown",
    "pin",
    "quiesce",
    "teardown",
    "track",
    "worker",
]

#: The names of [`exitsafe.lowlevel`][exitsafe.lowlevel], all formerly importable from
#: exitsafe itself: the old spelling still works, with a `DeprecationWarning` naming the new
#: home, until 0.2.0.  (tests/core/test_public_surface.py checks it is `lowlevel.__all__`.)
_MOVED = frozenset(
    {
        "CORE",
        "DependencyCycleError",
        "ForeignHandleError",
        "Guarded",
        "HandleInfo",
        "LedgerEntry",
        "NeutralizeError",
        "ReentrancyError",
        "default_registry",
        "handle_of",
        "neutralize",
        "neutralize_at_exit",
        "registries",
        "run_pending",
        "set_fork_exit",
    }
)

#: Names imported from their module on first access (PEP 562), so that importing
#: exitsafe does not load the adapters' code.
_LAZY = {
    "adopt": "_adopt",
    "checked": "_checked",
    "native": "_section",
    "NativeObject": "_wrapper",
}


def _show_in(module: str, *objects: object) -> None:
    """Make each of `objects` (classes and functions) show `module`, where users import it
    from, as its `__module__`: in tracebacks (`exitsafe.HandleClosedError: ...`), reprs,
    `help()` and pickles, instead of the private module that defines it (as trio does)."""
    for obj in objects:
        try:
            obj.__module__ = module
        except (AttributeError, TypeError):  # (read-only: none of the public objects)
            pass


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module

        value = getattr(import_module(f"{__name__}.{module}"), name)
        _show_in(__name__, value)
        globals()[name] = value
        return value
    if name == "lowlevel":
        from importlib import import_module

        return import_module(f"{__name__}.lowlevel")
    if name in _MOVED:
        import sys
        from importlib import import_module

        value = getattr(import_module(f"{__name__}.lowlevel"), name)
        # `from exitsafe import X` asks twice: the import system's hasattr() first (not
        # a use: no warning), then the import itself, which warns.
        if sys._getframe(1).f_code.co_name != "_handle_fromlist":
            import warnings

            warnings.warn(
                f"exitsafe.{name} is deprecated: use exitsafe.lowlevel.{name} (it moved to"
                f" the expert tier); the old name will be removed in exitsafe 0.2.0",
                DeprecationWarning,
                stacklevel=2,
            )
        return value
    raise AttributeError(f"module 'exitsafe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "lowlevel"})


@_explained(
    "exitsafe.track",
    "exitsafe.track(raw, release, depends_on=[...])",
    rename=False,  # (Registry.track's messages say "track()", from either call)
    # (the pure-Python core's hot path: the wrapper calls the default registry's track)
    forward=(Registry.track, _registry.default_holder, _default_registry),
    needs={
        "raw": "the native object",
        "release": "the function that frees it, called as release(raw)",
    },
)
def track(
    raw: object,
    release: Callable[[Any], object],
    kind: str = "handle",
    depends_on: Iterable[Handle] = (),
    exit_policy: Optional[ExitPolicy] = None,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
    affinity: Optional[str] = None,
) -> Handle:
    """Start owning `raw` in the default registry: `release(raw)` runs exactly once, or never.

    The module-level form of [`Registry.track`][exitsafe.Registry.track] on
    [`default_registry()`][exitsafe.lowlevel.default_registry], with the same options (by
    keyword, or by position in this order); for cffi and ctypes pointers prefer
    [`exitsafe.cffi.track`][exitsafe.cffi.track] / [`exitsafe.ctypes.track`][exitsafe.ctypes.track],
    which also check the pointer and find the library's pin.

    Args:
        raw: the native object (a pointer, an integer handle, any object); kept referenced
            by the handle and passed to `release`.  [`Handle.raw`][exitsafe.Handle.raw] gives
            it back while the handle is usable.
        release: the native release function, called as `release(raw)` when the last owner
            lets go and no dependent is alive, or at teardown in dependency order.  It runs
            on the thread dropping the last owner or on the teardown thread (a worker thread
            when a timeout applies), never while exitsafe holds its lock; it may call
            exitsafe.
        kind: a label (`"device"`, `"buffer"`...) shown in the ledger and the trace and
            passed to exit policies.  `"library"` also makes the handle go last at teardown.
        depends_on: handles (or pins) of the same registry that must outlive this one: this
            handle is released before any of them, and a dependency is not released while
            this handle lives.
        exit_policy: what teardown does with this handle if it is still alive: `"release"`,
            `"leak"`, or a callable taking a [`HandleInfo`][exitsafe.lowlevel.HandleInfo] and
            returning one of them (see [`exitsafe.policies`][exitsafe.policies]).  `None`:
            the registry's default.  `EXITSAFE_AT_EXIT` overrides it.
        name: the display name in the ledger and the trace; default `"<kind>#<n>"`.
        timeout: seconds the release may take at teardown before it is abandoned and the
            handle leaked (`leaked_timeout`); `None` uses the registry's `step_timeout` or
            `EXITSAFE_STEP_TIMEOUT`, else no bound.
        affinity: `"creator"` or `"main"` runs the release only on that thread (GL contexts,
            some GPU and GUI objects): a release due elsewhere is queued for that thread's
            next exitsafe call or [`run_pending()`][exitsafe.lowlevel.run_pending].  `None`: any
            thread.

    Returns:
        The new handle, holding one owner: `release()` it, use it as a context manager, or
            let it be garbage collected to drop that owner.

    Raises:
        RegistryClosedError: strict registries only, when teardown has begun (otherwise the
            handle is leaked at once, `leaked_after_close`).
        HandleClosedError: a handle in `depends_on` is no longer usable.
        ForeignHandleError: a handle in `depends_on` belongs to another registry.

    Example:
        ```python
        import exitsafe

        ctx = exitsafe.track(lib.ctx_create(), lib.ctx_free, kind="context")
        buf = exitsafe.track(lib.buf_create(ctx.raw), lib.buf_free, kind="buffer",
                             depends_on=[ctx])  # buf is freed before ctx
        ```
    """
    return _default_registry().track(
        raw,
        release,
        kind=kind,
        depends_on=depends_on,
        exit_policy=exit_policy,
        name=name,
        timeout=timeout,
        affinity=affinity,
    )


if _core.speedups is not None:
    # The compiled core's: the default registry's track without a Python frame (the same
    # steps as above: default_registry(), then its Registry.track).
    _core.speedups.set_doc("module", "track", track.__doc__ or "")
    _show_in(__name__, _core.speedups.track)  # (a builtin function of exitsafe._speedups)
    track = _core.speedups.track


@_explained(
    "exitsafe.pin",
    "exitsafe.pin(library, close=...)",
    needs={"library": "the loaded library: what ffi.dlopen() or ctypes.CDLL() returned"},
)
def pin(
    library: object,
    *,
    close: Optional[Callable[[Any], object]] = None,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Hold a loaded library in the default registry so it stays loaded while anything
    depending on it lives.

    The module-level form of [`Registry.pin`][exitsafe.Registry.pin].  For cffi and ctypes
    libraries prefer [`exitsafe.cffi.pin`][exitsafe.cffi.pin] /
    [`exitsafe.ctypes.pin`][exitsafe.ctypes.pin], which also keep the library file mapped
    against other closers and are found automatically by their `track`.

    Args:
        library: the loaded library object; kept referenced until the pin is released.
        close: called as `close(library)` (for example `ffi.dlclose`) when the pin is
            released, after every handle depending on it; `None` (the default): the library
            stays referenced for the rest of the process and exitsafe never unloads it.
        name: the display name in the ledger and the trace; default `"library#<n>"`.
        timeout: seconds `close` may take at teardown before it is abandoned and the pin
            leaked; `None` uses the registry's step timeout, else no bound.

    Returns:
        The pin, a handle of kind `"library"`: pass it in `depends_on` of every handle whose
            release runs the library's code.  At teardown libraries go last.
    """
    return _default_registry().pin(library, close=close, name=name, timeout=timeout)


@_explained(
    "exitsafe.on_teardown",
    "exitsafe.on_teardown(fn, before=[...])",
    needs={"fn": "the function to run at teardown, called with no argument"},
)
def on_teardown(
    fn: Callable[[], object],
    *,
    before: Iterable[Handle] = (),
    after: Iterable[Handle] = (),
    name: Optional[str] = None,
    timeout: Optional[float] = None,
    in_child: str = "skip",
) -> Handle:
    """Register `fn()` to run once during the default registry's teardown.

    The module-level form of [`Registry.on_teardown`][exitsafe.Registry.on_teardown].  The
    hook is a node of the handle graph: it runs before the handles in `before` are released
    and after those in `after`; hooks with no such constraint run first.  It runs on the
    teardown thread (or a worker when a timeout applies), outside exitsafe's lock; an
    exception is logged and recorded (`hook_failed`).

    Args:
        fn: the hook, called with no arguments.
        before: handles that must still be alive when the hook runs ("flush the queue before
            the buffers go").  Until the hook has run, garbage collection cannot release
            them; an explicit `release()` still does.
        after: handles that must be released (or leaked) before the hook runs.
        name: the display name in the ledger and the trace.
        timeout: seconds the hook may run before it is abandoned (`hook_timeout`); the
            handles in `before` are then leaked.  `None`: the registry's step timeout.
        in_child: what a process forked after this call does with the inherited hook:
            `"skip"` (the default; recorded `leaked_inherited`) or `"run"` (pure Python the
            child's exit needs too).

    Returns:
        The hook's handle: `release()` on it cancels the hook; dropping it does not.

    Example:
        ```python
        exitsafe.on_teardown(queue.flush, before=[queue_handle, *buffers], name="flush")
        ```
    """
    return _default_registry().on_teardown(
        fn, before=before, after=after, name=name, timeout=timeout, in_child=in_child
    )


@_explained(
    "exitsafe.on_early_exit",
    "exitsafe.on_early_exit(fn)",
    needs={"fn": "the function to run, called with no argument"},
)
def on_early_exit(
    fn: Callable[[], object], *, name: Optional[str] = None, timeout: Optional[float] = None
) -> Handle:
    """Run `fn()` in the early phase of the exit, before the interpreter joins its threads.

    The module-level form of [`Registry.on_early_exit`][exitsafe.Registry.on_early_exit]:
    the place to stop servers, executors and pools that would otherwise keep the exit
    waiting (`server.stop(None)`, `executor.shutdown(wait=False, cancel_futures=True)`).
    Early hooks run once, newest first, on the main thread at exit, or at the beginning of
    an explicit [`teardown()`][exitsafe.teardown]; everything may still be used there.

    Args:
        fn: the hook, called with no arguments.  An exception is logged and recorded
            (`hook_failed`).
        name: the display name in the ledger and the trace.
        timeout: seconds the hook may run before it is abandoned (`hook_timeout`); `None`:
            the registry's step timeout.

    Returns:
        The hook's handle; `release()` on it cancels the hook.
    """
    return _default_registry().on_early_exit(fn, name=name, timeout=timeout)


@_explained(
    "exitsafe.worker",
    "exitsafe.worker(thread, stop=event, uses=[...])",
    needs={"thread": "the thread", "stop": "a threading.Event or a callable asking it to stop"},
)
def worker(
    thread: Any,
    *,
    stop: Any = None,
    uses: Iterable[Handle] = (),
    timeout: Optional[float] = None,
    name: Optional[str] = None,
    wake: Optional[Callable[[], object]] = None,
) -> Handle:
    """Declare a thread that uses handles, and how to stop it, in the default registry.

    The module-level form of [`Registry.worker`][exitsafe.Registry.worker].  At exit the
    thread is asked to stop and woken (already in the early phase, so a non-daemon thread
    does not keep the exit waiting), then waited for, bounded by `timeout`, before any
    handle in `uses` is released.  If it does not end in time, those handles are leaked
    (`leaked_dependent`, never released under the running thread) and the thread is parked
    at its next [`Handle.borrow`][exitsafe.Handle.borrow].

    Args:
        thread: a `threading.Thread`; or any object with `join(timeout)` and `is_alive()`;
            or with `wait(milliseconds)` and `isRunning()` (Qt's `QThread`).
        stop: a `threading.Event` (set to ask the thread to stop) or a callable (called
            once, with no arguments, to ask it, e.g. `qthread.quit`); `None`: only `wake`.
        uses: the handles the thread uses; none of them is released before the thread ended.
        timeout: seconds to wait for the thread to end once asked; `None`: 5 seconds
            (`exitsafe._teardown.IN_FLIGHT_WAIT`).
        name: the display name in the ledger and the trace.
        wake: a callable run once right after the stop request, on the thread making it:
            what gets a thread blocked in a native call out of it (close its socket or
            context, post to its queue).

    Returns:
        The worker's hook handle; `release()` on it forgets the worker.

    Example:
        ```python
        stop = threading.Event()
        t = threading.Thread(target=infer_loop, args=(stop, session), daemon=True)
        t.start()
        exitsafe.worker(t, stop=stop, uses=[session])
        ```
    """
    return _default_registry().worker(
        thread, stop=stop, uses=uses, timeout=timeout, name=name, wake=wake
    )


@_explained("exitsafe.quiesce", "exitsafe.quiesce() or exitsafe.quiesce(thread, ..., timeout=5.0)")
def quiesce(
    *threads: Any,
    timeout: float = 5.0,
    wake: Union[Callable[[], object], Iterable[Callable[[], object]], None] = None,
) -> None:
    """At exit, stop other threads for good, each at its next safe point, before anything
    is released: one line, no code in those threads.

    When the main thread finishes, once the interpreter has joined its non-daemon threads
    and before any `atexit` callback runs (a library's own exit cleanup included), every
    thread still running Python code (daemon threads, threads a library started) is
    parked at its next call or return from a C function made from the
    program's own code: never inside a native call, never inside a library's Python code
    (where the library may hold its own lock), and it never runs Python code again. Its
    borrows end as it parks. Threads idle in the standard library (a `queue.get()`, an
    `Event.wait()`, a `time.sleep()`) stay where they are: they park if they ever wake.

    A thread that is still inside a library's code after `timeout` seconds may be using
    anything: the exit teardown then releases nothing (every handle ends `leaked_in_use`,
    the detail naming the thread and where it was), since it cannot release under it.
    The teardown's own hooks still run, and so do the other exit handlers (an `atexit`
    close the program registered itself included). A `QThread` is declared with
    [`worker()`][exitsafe.worker] instead: Qt counts a parked one as still running.

    A thread blocked in a native call (a query, a `recv()`) is woken by `wake`: callables
    run once, on the exiting thread, right after the threads are set to park and before
    the wait (`con.interrupt` for a DuckDB query, closing the peer of a socket). The woken
    call returns, or raises, into the program's own code, and the thread parks there,
    before its code sees the result or the exception (no traceback of an interrupted
    thread). An exception raised by a wake action is logged; the others and the wait
    still run.

    Calls add up: `quiesce(t1)` then `quiesce(t2)` quiesces both; `quiesce()` with no
    thread quiesces every thread but the exiting one. The last `timeout` given applies.
    An explicit `teardown()` quiesces nothing (the program goes on).

    Args:
        *threads: the `threading.Thread` objects (or thread idents) to quiesce; none: all.
        timeout: seconds to wait for the threads to park or be idle.
        wake: a callable taking no argument, or an iterable of them, added to those
            given before; checked now (`TypeError` if one is not callable).

    Example:
        ```python
        import exitsafe

        exitsafe.quiesce()  # daemon threads stop between two native calls at exit
        exitsafe.quiesce(wake=con.interrupt)  # and one inside a DuckDB query is woken
        ```
    """
    from . import _exit, _quiesce

    _quiesce.request(threads, timeout, wake)
    _exit.install_quiesce()


@_explained("exitsafe.exit", "exitsafe.exit(code)")
def exit(code: Optional[int] = 0) -> NoReturn:
    """Leave this process quietly: tear down what it owns, flush `sys.stdout` and
    `sys.stderr`, and end with `os._exit(code)`.

    Like Rust's `process::exit`: nothing else runs, neither module finalization (so no
    `__del__` of an object inherited from a parent process) nor the C-level `atexit`
    handlers of native libraries, which in a forked child may hang or crash on the parent's
    driver state.  Every registry is torn down first (handles this process created are
    released in order; inherited ones end `leaked_inherited`), and the ledger is written if
    `EXITSAFE_LEDGER` asks for it.  Meant for forked children (see the fork page); in any
    other process it skips what a normal exit would do, `finally` blocks of other frames
    included.  Never returns.  Called on the main thread, a signal arriving during the
    teardown (SIGINT, or one of [`exitsafe.signals`][exitsafe.signals]) is held back until
    it is done, ledger included, and the process then ends by that signal rather than with
    ``code``, as a supervisor that sent it expects (also a signal held back by an
    enclosing [`deferred()`][exitsafe.signals.deferred] block or teardown).  On another
    thread, the main thread handles the signal as usual meanwhile.

    Called by a step of a teardown (a release function, a hook, an exit policy):

    * on the teardown's own thread (no timeout applies to the step), it never returns to
      that teardown: what it decided so far is recorded, and every handle it had not
      finished ends `leaked_interrupted`, the one whose step called it included;
    * on a worker thread (the step has a timeout: `track(..., timeout=...)`,
      `Registry(step_timeout=...)`, `EXITSAFE_STEP_TIMEOUT`), the exit is handed to the
      thread running the teardown: the step ends there (`leaked_interrupted`, and what it
      depends on `leaked_dependent`; the worker stays parked in it, a daemon thread), the
      teardown goes on with its other steps and records every outcome, then that thread
      leaves the process as this function does (the other registries, the ledger, stdio,
      `os._exit(code)`).  A timed early hook ([`on_early_exit`][exitsafe.on_early_exit])
      likewise hands the exit over to the end of the early phase.  The status is that of
      the first step that asked, even in a teardown an `exit()` began; a step already
      abandoned for its timeout (recorded `leaked_timeout`) exits the usual way, from its
      own thread.

    Either way there is one teardown, every handle has one outcome in the ledger, and the
    process ends with `code`.

    Args:
        code: the exit status, 0-255; `None` means 0.
    """
    from ._exit import leave

    leave(code)


@_explained(
    "exitsafe.guard",
    "exitsafe.guard(fn, default=...)",
    needs={"fn": "the callable native code calls"},
)
def guard(
    fn: Callable[..., T],
    *,
    default: Any = None,
    registry: Optional[Registry] = None,
    from_releases: bool = False,
) -> lowlevel.Guarded:
    """Wrap `fn` for native code: the wrapper returns `default` without calling `fn` once the
    registry's teardown has begun, except for the calls made inside a borrowed native call
    that the teardown waits for (they are part of that call).

    See [`Guarded`][exitsafe.lowlevel.Guarded] for the thread rules.  For cffi and ctypes callbacks
    [`exitsafe.cffi.callback`][exitsafe.cffi.callback] /
    [`exitsafe.ctypes.callback`][exitsafe.ctypes.callback] also keep the function pointer
    alive; use `guard` inside `@ffi.def_extern()` functions and other callbacks you create
    yourself.

    Args:
        fn: the callable native code calls.
        default: what a call returns, without calling `fn`, from the moment teardown begins.
        registry: the registry whose teardown silences the wrapper; `None`: the default
            registry.
        from_releases: while the teardown runs, let through the calls made on its own
            thread, by the releases it runs (a destructor callback such as SQLite's
            `xDestroy`, which frees what the program attached); default `False`: a release
            that logs through the callback finds it silent.

    Returns:
        The wrapper, a [`Guarded`][exitsafe.lowlevel.Guarded]; it forwards every call (arguments,
            result and exceptions) to `fn` until teardown begins.

    Raises:
        TypeError: `fn` is not callable or `registry` is not a
            [`Registry`][exitsafe.Registry].

    Example:
        ```python
        log_line = exitsafe.guard(lambda level, msg: log.info(ffi.string(msg)))

        @ffi.def_extern()
        def on_log(level, msg):
            log_line(level, msg)  # a no-op once teardown began
        ```
    """
    return _Guarded(
        fn,
        default,
        registry if registry is not None else _default_registry(),
        from_releases=from_releases,
    )


@_explained("exitsafe.teardown", "exitsafe.teardown() or exitsafe.teardown(reason)")
def teardown(reason: str = "explicit") -> None:
    """Run the default registry's ordered teardown now; see
    [`Registry.teardown`][exitsafe.Registry.teardown].

    Every live handle is released or leaked in dependency order, the hooks run, and the
    registry is closed: later registrations are leaked at once.  Idempotent.  Only the
    default registry is torn down; other registries still tear down at exit (or call their
    own [`Registry.teardown`][exitsafe.Registry.teardown]).

    Args:
        reason: a label recorded in the trace (`reason=...`); the exit teardown uses
            `"atexit"`.
    """
    _default_registry().teardown(reason=reason)


@_explained("exitsafe.ledger", "exitsafe.ledger()")
def ledger() -> list[lowlevel.LedgerEntry]:
    """The default registry's ledger; see [`Registry.ledger`][exitsafe.Registry.ledger].

    Returns:
        The recorded outcomes, oldest first: one [`LedgerEntry`][exitsafe.lowlevel.LedgerEntry] per
            handle released, leaked or detached and per hook run (at most the registry's
            `ledger_limit` of the newest).
    """
    return _default_registry().ledger()


_show_in(
    __name__,
    AlreadyTrackedError,
    ExitsafeError,
    Handle,
    HandleClosedError,
    LiveDependentsError,
    Outcome,
    Registry,
    RegistryClosedError,
    ReleaseError,
)
# Shown in exitsafe.lowlevel from the start, whether or not a program imports it: a
# ReentrancyError's traceback reads exitsafe.lowlevel.ReentrancyError either way.
_show_in(
    f"{__name__}.lowlevel",
    _errors.DependencyCycleError,
    _errors.ForeignHandleError,
    _errors.NeutralizeError,
    _errors.ReentrancyError,
    _guard.Guarded,
    _handle.HandleInfo,
    _ledger.LedgerEntry,
    _registry.default_registry,
    _registry.registries,
    _releases.run_pending,
)


def _quiesce_if_asked() -> None:
    """``EXITSAFE_QUIESCE`` (see exitsafe._config): quiesce every thread with no line of
    code (``exitsafe run`` and any program importing exitsafe)."""
    bound = _config.quiesce_bound()
    if bound is not None:
        quiesce(timeout=bound)


_quiesce_if_asked()
