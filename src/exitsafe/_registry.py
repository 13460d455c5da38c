"""The public registry: [`Registry`][exitsafe.Registry], a facade over one registry's state,
and the process-wide [`default_registry`][exitsafe.lowlevel.default_registry].

A `Registry` holds one field, its state (`exitsafe._state.RegistryState`), and checks the
arguments of every public call before it hands the call to the module that carries it
out: registrations to the state, releases to `exitsafe._releases`, hooks to
`exitsafe._hooks`, the teardown to `exitsafe._closing`.  The state refers back to the
facade (``Handle.registry`` returns it), so the two live and die together.
"""

from __future__ import annotations

import _thread

from . import _exit, _hooks, _lookup, _process, _record, _sync, _threads
from ._checks import check_name, check_policy, check_timeout
from ._closing import teardown as _teardown
from ._collected import collected, log_collected_failure
from ._core import speedups
from ._handle import Handle, HandleInfo, OwnedHandle
from ._ledger import LedgerEntry, Outcome
from ._phase import CLOSED, OPEN
from ._record import HANDLE, LIBRARY, RELEASING
from ._releases import (
    drop_owner,
    release_chain,
    release_failed,
    retain,
    run_deferred_after_track,
    run_mine_quietly,
    undo_track,
)
from ._state import RegistryState
from ._usage import explained_track, kind_not_str, not_a_function, release_not_callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional, Union

    ExitPolicy = Union[str, Callable[[HandleInfo], str]]

__all__ = ["Registry", "default_holder", "default_registry", "registries"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_refused = _sync.refused
_deferred = _sync.deferred
_run_deferred = _sync.run_deferred
_affine = _threads.pending
_new_record = _record.new


if TYPE_CHECKING or speedups is None:

    class _Facade:
        """The pure-Python core: the state is an ordinary attribute."""

        __slots__ = ("_state",)

        _state: RegistryState

else:
    # The compiled core's facade base keeps the state in C, for its track().
    _Facade = speedups.RegistryBase


class Registry(_Facade):
    """An independent graph of handles with its own teardown.

    Every registry is torn down at process exit, newest registry first, each in its own
    dependency order.  A registry created once the exit teardown has begun is torn down by
    it too, or, once it has finished, is closed at once.  A registry with teardown hooks is
    kept alive by exitsafe until its teardown.  Most programs use the process-wide
    [`default_registry()`][exitsafe.lowlevel.default_registry] through the module-level functions; a
    registry of your own tears down on its own and can be torn down early.

    Thread rules: every method may be called from any thread.  Release functions, hooks and
    policies run on the thread that caused them (the thread dropping the last owner, or the
    thread running the teardown; with a timeout, a teardown worker thread), never while
    exitsafe holds its lock, and may call back into exitsafe.

    Args:
        name: labels the registry in the ledger and the trace.
        strict: turn misuse that is otherwise absorbed into exceptions:
            [`LiveDependentsError`][exitsafe.LiveDependentsError] for releasing a handle with
            live dependents, [`RegistryClosedError`][exitsafe.RegistryClosedError] for
            registering after teardown.
        exit_policy: the default for handles that name none: `"release"`, `"leak"` or a
            callable taking a [`HandleInfo`][exitsafe.lowlevel.HandleInfo] and returning one of them
            (see [`exitsafe.policies`][exitsafe.policies]).
        step_timeout: seconds one teardown step may take before it is abandoned and leaked;
            `None`: `EXITSAFE_STEP_TIMEOUT`, else no bound.
        teardown_timeout: seconds the whole teardown may take; steps after that are leaked.
            `None`: `EXITSAFE_TEARDOWN_TIMEOUT`, else no bound.
        ledger_limit: how many ledger entries are kept (oldest dropped first;
            [`ledger_counts`][exitsafe.Registry.ledger_counts] stays exact); `None` keeps all.

    Attributes:
        name: the registry's name.
        strict: whether misuse raises.

    Example:
        ```python
        gpu = exitsafe.Registry("gpu", exit_policy="leak", step_timeout=2.0)
        dev = gpu.track(lib.device_create(), lib.device_free, kind="device")
        ```
    """

    __slots__ = ("__weakref__",)

    def __init__(
        self,
        name: str = "registry",
        *,
        strict: bool = False,
        exit_policy: ExitPolicy = "release",
        step_timeout: Optional[float] = None,
        teardown_timeout: Optional[float] = None,
        ledger_limit: Optional[int] = 100_000,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}")
        check_policy(exit_policy, "exit_policy")
        if ledger_limit is not None and (
            isinstance(ledger_limit, bool) or not isinstance(ledger_limit, int) or ledger_limit < 0
        ):
            raise ValueError(
                f"ledger_limit must be a non-negative int or None, got {ledger_limit!r}"
            )
        state = RegistryState(
            self,
            name,
            strict,
            exit_policy,
            check_timeout(step_timeout, "step_timeout"),
            check_timeout(teardown_timeout, "teardown_timeout"),
            ledger_limit,
        )
        self._state = state
        if not _process.register(state):
            state.close_at_once()  # the process's exit teardown already finished

    # ------------------------------------------------------------------ settings

    @property
    def name(self) -> str:
        """The registry's name (labels it in the ledger and the trace)."""
        name: str = self._state.name
        return name

    @property
    def strict(self) -> bool:
        """Whether misuse raises (see the class documentation)."""
        return bool(self._state.strict)

    @property
    def exit_policy(self) -> ExitPolicy:
        """The exit policy of handles that name none."""
        policy: ExitPolicy = self._state.exit_policy
        return policy

    @exit_policy.setter
    def exit_policy(self, value: ExitPolicy) -> None:
        check_policy(value, "exit_policy")
        self._state.exit_policy = value

    @property
    def step_timeout(self) -> Optional[float]:
        """Seconds one teardown step may take before it is abandoned and leaked (or ``None``)."""
        timeout: Optional[float] = self._state.step_timeout
        return timeout

    @step_timeout.setter
    def step_timeout(self, value: Optional[float]) -> None:
        self._state.step_timeout = check_timeout(value, "step_timeout")

    @property
    def teardown_timeout(self) -> Optional[float]:
        """Seconds the whole teardown may take; steps after that are leaked (or ``None``)."""
        timeout: Optional[float] = self._state.teardown_timeout
        return timeout

    @teardown_timeout.setter
    def teardown_timeout(self, value: Optional[float]) -> None:
        self._state.teardown_timeout = check_timeout(value, "teardown_timeout")

    # ------------------------------------------------------------------ registration

    def track(
        self,
        raw: object,
        release: Callable[[Any], object],
        kind: str = "handle",
        depends_on: Iterable[Handle] = (),
        exit_policy: Optional[ExitPolicy] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
        affinity: Optional[str] = None,
    ) -> Handle:
        """Start owning `raw`: `release(raw)` is called exactly once, or never if leaked.

        After teardown began, the new handle is leaked at once (`leaked_after_close`).  For
        cffi and ctypes pointers prefer [`exitsafe.cffi.track`][exitsafe.cffi.track] /
        [`exitsafe.ctypes.track`][exitsafe.ctypes.track], which check the pointer and find the
        library's pin.

        The options after `release` are usually given by keyword, as here; they are
        positional-or-keyword (in this order) because CPython makes a cheaper call to a
        function without keyword-only parameters, which matters on the hot path of the
        pure-Python core.

        Args:
            raw: the native object (a pointer, an integer handle, any object); kept referenced
                by the handle and passed to `release`.
            release: the native release function, called as `release(raw)` when the last owner
                lets go and no dependent is alive, or at teardown in dependency order.  It runs
                on the thread that drops the last owner or on the teardown thread, never while
                exitsafe holds its lock.
            kind: a label (`"device"`, `"buffer"`...) shown in the ledger and the trace, and
                passed to exit policies; `"library"` also makes the handle go last at teardown,
                after everything else.
            depends_on: handles (or pins) of this registry that must outlive this one.
            exit_policy: overrides the registry's default for this handle at teardown; `None`:
                the registry's [`exit_policy`][exitsafe.Registry.exit_policy].
            name: its display name; default `"<kind>#<n>"`.
            timeout: seconds its release step may take at teardown before it is abandoned and
                leaked; `None`: the registry's [`step_timeout`][exitsafe.Registry.step_timeout].
            affinity: `"creator"` or `"main"` makes the release run only on that thread (GL
                contexts, some GPU and GUI objects): a release that becomes due on another
                thread (garbage collection, an owner dropped elsewhere) is queued and run by the
                owning thread at its next exitsafe call or
                [`run_pending()`][exitsafe.lowlevel.run_pending]; see the threads page for the
                teardown's rules.  `None`: any thread.

        Returns:
            The new handle, holding one owner.

        Raises:
            RegistryClosedError: strict mode only, when teardown has begun.
            HandleClosedError: a handle in `depends_on` is no longer usable.
            ForeignHandleError: a handle in `depends_on` belongs to another registry.

        Whenever `track` raises, the caller still owns `raw`: nothing will release it.  That
        includes an error raised after the registration by the work a finalizer queued (see
        the threads page), such as a `KeyboardInterrupt`: the handle is then recorded
        `detached`.  The promise ends where `track` returns: an interrupt delivered as the
        handle is handed over (a debugger's or `coverage`'s trace function acts on Ctrl-C
        at the return itself, and CPython acts on signals right after a call) reaches the
        caller with the handle tracked, as for any function that returns a resource; the
        object is released when that handle is dropped, so an `except KeyboardInterrupt`
        around `track` must not release `raw` itself.
        """
        if not callable(release):
            raise TypeError(release_not_callable(raw, release, "track(raw, release)", "track(): "))
        if type(kind) is not str:
            raise TypeError("track(): " + kind_not_str(kind))
        if name is not None:
            check_name(name)
        if exit_policy is not None:
            check_policy(exit_policy, "exit_policy")
        if timeout is not None:
            timeout = check_timeout(timeout, "timeout")
        owner = _threads.affinity_owner(affinity) if affinity is not None else None
        if _reentered():
            raise _refused("track()")
        state = self._state
        role = LIBRARY if kind == "library" else HANDLE
        if (
            not depends_on
            and exit_policy is None
            and timeout is None
            and owner is None
            and state.phase != CLOSED
        ):
            # No dependency, no option but a name: nothing to validate under the lock.
            node: Handle = _new_record(
                OwnedHandle, state, raw, release, kind, name, (), None, None, role,
                _sync.generation, _get_ident(),
            )
            try:
                if not state.add_simple(node):  # closed meanwhile
                    state.registered_after_close(node)
                elif _deferred:
                    _run_deferred()
                if _affine:
                    run_mine_quietly()
                return node
            except BaseException:  # (an interrupt, or queued work that raised): the
                undo_track(node)  # caller never gets the handle and still owns raw
                raise
        parents = _lookup.parents(depends_on, state, "depends_on") if depends_on else ()
        node = _new_record(
            OwnedHandle, state, raw, release, kind, name, parents, exit_policy, timeout,
            role, _sync.generation, _get_ident(), owner,
        )
        try:
            if state.register(node, ()) and _deferred:
                run_deferred_after_track(node)
            return node
        except BaseException:  # (as above; register refused it: disowned already)
            undo_track(node)
            raise

    def pin(
        self,
        library: object,
        *,
        close: Optional[Callable[[Any], object]] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Hold a loaded library so it is not unloaded while anything depending on it lives.

        At teardown libraries go last.  For cffi and ctypes libraries prefer
        [`exitsafe.cffi.pin`][exitsafe.cffi.pin] / [`exitsafe.ctypes.pin`][exitsafe.ctypes.pin],
        which also keep the library file mapped against other closers.

        Args:
            library: the loaded library object; kept referenced until the pin is released.
            close: called as `close(library)` (for example `ffi.dlclose`) when the pin is
                released, after its last dependent; `None`: the library object stays referenced
                for the rest of the process, so it is never unloaded by exitsafe's doing.
            name: its display name; default `"library#<n>"`.
            timeout: seconds `close` may take at teardown before it is abandoned.

        Returns:
            A handle of kind `"library"`: pass it in `depends_on` of every handle whose release
                runs the library's code.
        """
        if library is None:
            raise TypeError(
                "pin() needs a loaded library object (what ffi.dlopen() or ctypes.CDLL() "
                "returned), got None"
            )
        if close is None:
            release: Callable[[Any], object] = _process.keep_forever
        elif callable(close):
            release = close
        else:
            raise TypeError(
                f"close must be callable or None (the function that unloads the library, "
                f"such as ffi.dlclose), got {type(close).__name__}"
            )
        return self.track(library, release, kind="library", name=name, timeout=timeout)

    def on_teardown(
        self,
        fn: Callable[[], object],
        *,
        before: Iterable[Handle] = (),
        after: Iterable[Handle] = (),
        name: Optional[str] = None,
        timeout: Optional[float] = None,
        in_child: str = "skip",
    ) -> Handle:
        """Register `fn()` to run once during this registry's teardown.

        The hook is a node of the same graph.  Hooks with no `before` / `after` constraint run
        first.  Until it runs or is cancelled, the hook refers to the handles in `before`:
        dropping your last reference to one of them does not release it before the hook
        (garbage collection cannot reach it), while an explicit `release()` on it still
        releases it at once (the edge orders the teardown; it does not defer releases).  The
        hook runs on the teardown thread (or a worker when a timeout applies), outside
        exitsafe's lock; an exception is logged and recorded (`hook_failed`).

        Args:
            fn: the hook, called with no arguments.
            before: handles released only after the hook ran (e.g. "flush the queue" before
                the buffers go).
            after: handles released (or leaked) before the hook runs.
            name: its display name in the ledger and the trace.
            timeout: seconds the hook may run before it is abandoned (`hook_timeout`); the
                handles in `before` are then leaked.
            in_child: what a process forked after this call does with the hook it inherited:
                `"skip"` (the default: it belongs to the parent's objects, and ends
                `leaked_inherited` in the child) or `"run"` (it is pure Python that the child's
                own exit needs too, like the neutralization of
                [`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit]).

        Returns:
            The hook's handle: `release()` on it cancels the hook; dropping it does not.
        """
        if not callable(fn):
            raise TypeError(not_a_function("fn", fn))
        check_name(name)
        if timeout is not None:
            timeout = check_timeout(timeout, "timeout")
        if in_child not in ("skip", "run"):
            raise ValueError(f"in_child must be 'skip' or 'run', got {in_child!r}")
        if _reentered():
            raise _refused("on_teardown()")
        state = self._state
        before_h = _lookup.parents(before, state, "before") if before else ()
        after_h = _lookup.parents(after, state, "after") if after else ()
        hook_name = name if name is not None else getattr(fn, "__qualname__", None)
        if hook_name is not None and type(hook_name) is not str:
            hook_name = None
        return _hooks.add_teardown_hook(
            state, fn, before_h, after_h, hook_name, timeout, in_child == "run"
        )

    def on_early_exit(
        self,
        fn: Callable[[], object],
        *,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Register `fn()` for the *early phase* of the exit: before the interpreter joins
        non-daemon threads and `concurrent.futures` joins its workers.

        The place to stop servers, executors and pools that would otherwise keep the exit
        waiting (`server.stop(None)`, `executor.shutdown(wait=False, cancel_futures=True)`...).
        Early hooks run once, newest first, on the main thread at exit, or at the beginning of
        an explicit [`teardown`][exitsafe.Registry.teardown]; then the declared workers are asked
        to stop.  Everything may still be used there; on CPython 3.12.0 to 3.12.2 no new thread
        can be started.

        Args:
            fn: the hook, called with no arguments; an exception is logged and recorded
                (`hook_failed`).
            name: its display name in the ledger and the trace.
            timeout: seconds the hook may run before it is abandoned (`hook_timeout`).

        Returns:
            The hook's handle; `release()` on it cancels the hook.
        """
        if not callable(fn):
            raise TypeError(not_a_function("fn", fn))
        check_name(name)
        if timeout is not None:
            timeout = check_timeout(timeout, "timeout")
        if _reentered():
            raise _refused("on_early_exit()")
        _exit.install_early_phase()
        return _hooks.add_early_hook(self._state, fn, name, timeout)

    def worker(
        self,
        thread: Any,
        *,
        stop: Any = None,
        uses: Iterable[Handle] = (),
        timeout: Optional[float] = None,
        name: Optional[str] = None,
        wake: Optional[Callable[[], object]] = None,
    ) -> Handle:
        """Declare a thread that uses handles, and how to stop it.

        The worker is a teardown hook that runs before any handle in `uses` is released: it
        asks the thread to stop (`stop`), wakes it (`wake`), and waits for it to end.  A
        thread still running after `timeout` is abandoned (`hook_timeout`), the handles it
        uses are leaked (`leaked_dependent`, never released under it), and the thread is
        parked at its next [`Handle.borrow`][exitsafe.Handle.borrow].  The stop request and
        the wake action are also made in the early phase of the exit (before the
        interpreter joins non-daemon threads), so a non-daemon worker does not keep the exit
        waiting either; each runs once.

        Any kind of thread: a `threading.Thread`, or any object with `join(timeout)` and
        `is_alive()` (a `multiprocessing.Process`), or with `wait(milliseconds)` and
        `isRunning()` (Qt's `QThread`: `stop=thread.quit` or
        `stop=thread.requestInterruption`).

        Args:
            thread: the thread, of any of the kinds above.
            stop: a `threading.Event` (set to ask the thread to stop) or a callable (called
                once to ask it); `None`: only `wake` asks.
            uses: the handles the thread uses.
            timeout: how long to wait for the thread to end once asked; `None`: 5 seconds.
            name: its display name in the ledger and the trace.
            wake: a callable run once, right after the stop request, on the thread making
                it (the early phase's, or the teardown's): what gets a thread blocked in a
                native call out of it (close its socket, cancel its wait, post to its
                queue).  An exception it raises is logged and recorded on the hook; the wait
                for the thread goes on.

        Returns:
            The hook's handle; `release()` on it forgets the worker.
        """
        how = _threads.joinable(thread)
        if how is None:
            raise TypeError(
                "thread must be a threading.Thread, or have join(timeout) and is_alive(), or "
                f"wait(ms) and isRunning() (a QThread); got {type(thread).__name__}"
            )
        if stop is None and wake is None:
            raise TypeError("worker() needs stop= (an Event or a callable) or wake= (a callable)")
        if stop is not None and not (callable(getattr(stop, "set", None)) or callable(stop)):
            raise TypeError(
                f"stop must be a threading.Event or a callable, got {type(stop).__name__}"
            )
        if wake is not None and not callable(wake):
            raise TypeError(f"wake must be a callable, got {type(wake).__name__}")
        check_name(name)
        bound = check_timeout(timeout, "timeout")
        if _reentered():
            raise _refused("worker()")
        _exit.install_early_phase()
        state = self._state
        uses_h = _lookup.parents(uses, state, "uses") if uses else ()  # (errors name `uses`)
        return _hooks.add_teardown_hook(
            state,
            _hooks.worker_stop(thread, stop, bound, wake),
            uses_h,
            (),
            name if name is not None else f"worker {_threads.worker_label(thread)}",
            None,
            False,
        )

    # ------------------------------------------------------------------ teardown

    @property
    def closed(self) -> bool:
        """Whether teardown has completed: every release request is now a no-op."""
        return bool(self._state.phase == CLOSED)

    @property
    def tearing_down(self) -> bool:
        """Whether teardown has begun (guarded callbacks are already no-ops)."""
        return bool(self._state.phase != OPEN)

    def teardown(self, reason: str = "explicit") -> None:
        """Release or leak every live handle in dependency order, run the hooks, then close.

        Order: a step runs only after every handle depending on it is done; among ready steps
        hooks go first, libraries last, newest first otherwise.  Each handle is released or
        leaked by its exit policy, the registry's default, or `EXITSAFE_AT_EXIT`; a borrowed
        handle is leaked (`leaked_in_use`), and whatever a leaked handle depends on is leaked
        too.  A release that raises is logged and recorded and teardown goes on.

        All or recorded: whatever interrupts the teardown (an exception escaping a step,
        KeyboardInterrupt), every handle it claimed ends with exactly one outcome
        (`leaked_interrupted` for those it did not reach), and the registry is closed.  On the
        main thread, SIGINT and exitsafe's own signal handlers are held back while it runs and
        delivered right after (see [`exitsafe.signals`][exitsafe.signals]).

        A release already running on another thread when the teardown reaches it is waited for,
        bounded by the step timeout (`EXITSAFE_STEP_TIMEOUT`) or, without one, 5 seconds, then
        recorded `leaked_in_use`; one running on the teardown's own thread (a teardown started
        from a release function or a signal handler) is never waited for.

        A step that calls [`exitsafe.exit`][exitsafe.exit] on its worker thread (a step
        under a timeout) ends there, `leaked_interrupted`; the teardown goes on with the
        other steps, records every outcome, and then this thread leaves the process as
        `exitsafe.exit` does, with the status the step asked for.

        Idempotent: a second call returns at once; a call from another thread while a teardown
        runs waits for it to finish (bounded by `teardown_timeout`, or 5 seconds without one).
        Called from a finalizer or signal handler that interrupted exitsafe on the same thread,
        it runs right after the interrupted step; called during a garbage collection (by a
        release function of a collected handle, or any finalizer), it runs when that
        collection ends, once every finalizer of the garbage ran.  Runs automatically at
        process exit.

        Args:
            reason: a label recorded in the trace (`reason=...`); the exit teardown uses
                `"atexit"`.
        """
        if not isinstance(reason, str):
            raise TypeError(
                f"reason must be a str (a label for the trace, such as 'shutdown'), "
                f"got {type(reason).__name__}"
            )
        _teardown(self._state, reason)

    # ------------------------------------------------------------------ inspection

    def ledger(self) -> list[LedgerEntry]:
        """The recorded outcomes, oldest first.

        Returns:
            One [`LedgerEntry`][exitsafe.lowlevel.LedgerEntry] per ended handle or hook (at most
                `ledger_limit` of the newest).
        """
        return self._state.entries()

    def ledger_counts(self) -> dict[str, int]:
        """How many handles ended in each outcome.

        Returns:
            `{outcome: count}`, exact, never truncated by `ledger_limit`.
        """
        return self._state.counts()

    @property
    def late_requests(self) -> int:
        """How many release requests arrived after close and were ignored.

        A request is an explicit ``release()`` (or ``close()`` of a wrapper); the garbage
        collection of a handle that already ended is not one.
        """
        return int(self._state.ledger.late_requests)

    def live_handles(self) -> list[HandleInfo]:
        """A snapshot of every handle and hook not yet ended, oldest first.

        Returns:
            One [`HandleInfo`][exitsafe.lowlevel.HandleInfo] per handle.
        """
        import threading

        main = threading.main_thread().ident
        generation = _sync.generation
        nodes = self._state.read(self._state.nodes)
        return [HandleInfo(n, generation, main) for n in nodes if n._state <= RELEASING]

    def __len__(self) -> int:
        return len(self._state.live)

    def __repr__(self) -> str:
        state = self._state
        phase = ("open", "tearing down", "closed")[state.phase]
        return f"<exitsafe.Registry {state.name!r} {phase} live={len(state.live)}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            "an exitsafe.Registry cannot be copied or pickled: it owns native handles of "
            "this process"
        )


def state_of(registry: Registry) -> RegistryState:
    """The state behind ``registry`` (for exitsafe's own modules above this one)."""
    return registry._state


# ---------------------------------------------------------------------- the default registry

#: ``[the default registry]`` once created (a list, read by the compiled core's
#: ``exitsafe.track`` without a Python call).
default_holder: list[Registry] = []


def default_registry() -> Registry:
    """The process-wide registry that the module-level functions act on (created on first use)."""
    if default_holder:
        return default_holder[0]
    created = Registry("default")

    def store() -> Registry:
        if not default_holder:
            default_holder.append(created)
        return default_holder[0]

    if _reentered():  # (a finalizer inside a section on this thread: it holds the lock)
        return store()
    return _sync.locked("default_registry()", store)


def registries() -> list[Registry]:
    """Every registry still alive, oldest first (the exit teardown goes newest first)."""
    return [state.facade for state in _process.states()]


if speedups is not None:
    # The compiled core: its common case of track(), release(), retain() and the garbage
    # collection of a handle in C; every other case handed to the functions above, so
    # both cores keep one semantics.
    Registry._track_py = Registry.track  # type: ignore[attr-defined]
    speedups.set_doc("RegistryBase", "track", Registry.track.__doc__ or "")
    Registry.track = speedups.RegistryBase.track  # type: ignore[method-assign]
    speedups.setup(
        lock=_sync.LOCK,
        handle_type=Handle,
        registry_type=RegistryState,
        facade_type=Registry,
        # (a wrong call reaches the Python function: named as the call the program made)
        track=explained_track(Registry._track_py, default_holder),  # type: ignore[attr-defined]
        drop_owner=drop_owner,
        retain=retain,
        collected=collected,
        release_chain=release_chain,
        release_failed=release_failed,
        collected_failed=log_collected_failure,
        registered_after_close=RegistryState.registered_after_close,
        undo_track=undo_track,
        wait=_sync.wait,
        deferred=_sync.deferred,
        run_deferred=_sync.run_deferred,
        affine=_threads.pending,
        run_mine=run_mine_quietly,
        released=Outcome.RELEASED,
        released_at_exit=Outcome.RELEASED_AT_EXIT,
        default_list=default_holder,
        default_registry=default_registry,
    )
