"""Quiescing other threads at exit: each is stopped for good at its next safe point,
before anything is released, with no code of exitsafe's in those threads.

[`exitsafe.quiesce`][exitsafe.quiesce] asks for it (`request`).  When the main thread
finishes, once the interpreter has joined its non-daemon threads and before any
``atexit`` callback runs (the end of ``threading._shutdown``, hooked by
`exitsafe._early`), `run` installs a profile function on every thread (CPython 3.12+:
``threading.setprofile_all_threads``; 3.9-3.11: ``_PyEval_SetProfile`` on each thread
state, through ``ctypes``).  A thread to quiesce that reaches a *safe point* parks there:
it blocks for good, every signal masked, and never runs Python code again.  A safe point
is a function call (Python or C) or the return from a C function made from a frame
whose whole stack is the program's own code: no frame of an installed package (a
library may hold its own lock there, h5py's ``phil`` for one) and no frame of the
standard library but the ones that only start a thread's target), and no finalizer
(``__del__``, which may run inside a garbage collection).  So a thread parks *between* two
calls into a native library, never inside one and never inside a library.

A thread parks holding whatever it holds in the program's own code: a lock it took with
``with lock:`` stays taken for good, so a hook or a release function that takes the same
lock would wait for ever (give it a ``timeout``).  A thread that an ``atexit`` callback
joins must not be quiesced: name the threads to quiesce, or stop that one in an
``on_early_exit`` hook.

`run` then waits, at most the bound given, until every thread to quiesce is parked,
gone, or *idle*: its innermost frame in the standard library (a ``queue.get``, an
``Event.wait``), or the program's code blocked in a standard-library C function
(``time.sleep``, ``select``, a socket's ``recv``), found by reading the call in flight
from the frame's code, and (on Linux) using no CPU meanwhile: a long hash in C is not
a wait, and its next step may reach a library through no call.  An idle thread is
harmless: whatever it does next goes through a call, where it parks.  A thread that is
none of these when the bound is hit is still *running* (inside a native library, or
somewhere exitsafe cannot tell): the exit teardown then releases nothing (every handle
ends ``leaked_in_use``, the detail naming the thread), since it may be using any of it.

Borrows held by a thread that parks end as it parks: it never resumes, so what it
borrowed may be released under its frozen frames.  A thread holding exitsafe's lock is
never parked (it leaves the section first).  The teardown's own step workers are never
quiesced.
"""

from __future__ import annotations

import _thread
import sys

from . import _process, _report, _stacks, _sync, _threads
from ._stacks import OWN, PACKAGE, STARTER, STDLIB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, FrameType
    from typing import Any, Callable, Iterable, Optional, Sequence

__all__ = [
    "covered", "park", "request", "requested", "run", "still_running",
]

_kind = _stacks.kind
_module_kind = _stacks.module_kind
_holds_a_lock = _stacks.holds_a_lock

#: ``c_exception``: a C function called from the program's own code raised (a query
#: interrupted by its library, a socket whose context was terminated): the thread parks
#: before the exception reaches its code, as at a return.
_PARK_EVENTS = {"call", "c_call", "c_return", "c_exception"}

#: ``None``: not asked for; else the idents to quiesce (empty: every other thread) and
#: the bound in seconds.
_request: list[Optional[tuple[frozenset[int], float]]] = [None]
#: Per thread quiesced, the outermost C call in flight: (the calling frame, its
#: instruction), see `_inside_native_call`.
_in_native: dict[int, tuple[FrameType, int]] = {}
#: The wake actions to run once the threads are set to park (``quiesce(wake=...)``).
_wakes: list[Callable[[], object]] = []
#: The threads quiesced in this exit: ident -> True once parked.
_targets: dict[int, bool] = {}
#: ``[True]`` once `run` ran in this exit.
_ran: list[bool] = []
#: The threads `park` quiesces: they never park holding a lock, nor inside a function of
#: `_outside` (see `park`).
_lock_free_only: set[int] = set()
_outside: list[frozenset[CodeType]] = [frozenset()]
#: The threads still running when the bound was hit: ident -> where (for the ledger).
_running: dict[int, str] = {}
#: The call instructions of this interpreter (CALL, CALL_FUNCTION_EX... ; see _prepare).
_CALL_OPS: set[int] = set()
_code_bytes: dict[CodeType, bytes] = {}
#: The inline cache's opcode (3.11+), -1 before.
_CACHE = -1
#: The C trampoline of the profile function on CPython 3.9-3.11 (kept alive).
_trampoline: list[Any] = []
#: The CPU time of the threads `_wait` finds idle by their stacks (see `_harmless`).
_cpu: list[_threads.CpuWatch] = [_threads.CpuWatch()]


def request(threads: Iterable[Any], timeout: float, wake: Any = None) -> None:
    """Quiesce ``threads`` (``threading.Thread`` objects or idents; none: every thread
    but the exiting one) at exit, as well as those asked for before, waiting at most
    ``timeout`` seconds; ``wake``: a callable (or callables) run once the threads are set
    to park, added to those given before."""
    wakes = _wake_actions(wake)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    bound = float(timeout)
    if not 0 < bound < float("inf"):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    idents = set()
    for thread in threads:
        if isinstance(thread, int) and not isinstance(thread, bool):
            idents.add(thread)
            continue
        ident = getattr(thread, "ident", None)
        if not isinstance(ident, int):
            raise TypeError(
                "quiesce() takes threading.Thread objects (started) or thread idents, got "
                f"{type(thread).__name__}" + (" (not started)" if ident is None
                                              and hasattr(thread, "start") else "")
                + "; write quiesce() for every thread, or quiesce(thread, ...)"
            )
        idents.add(ident)
    before = _request[0]
    if before is not None and (not before[0] or not idents):
        chosen: frozenset[int] = frozenset()  # (every thread was or is asked for)
    else:
        chosen = frozenset(idents | (before[0] if before is not None else set()))
    _request[0] = (chosen, bound)
    _wakes.extend(wakes)


def _wake_actions(wake: Any) -> list[Callable[[], object]]:
    """``wake`` as a list of callables (checked now, so a wrong one fails at the call)."""
    if wake is None:
        return []
    actions = [wake] if callable(wake) else wake
    try:
        actions = list(actions)
    except TypeError:
        actions = [wake]
    for action in actions:
        if not callable(action):
            raise TypeError(
                f"wake must be a callable taking no argument (or a list of them), got "
                f"{type(action).__name__}: write quiesce(wake=con.interrupt), for example"
            )
    return actions


#: Seconds after the first wake at which the wake actions run again while a thread to
#: quiesce is still running: a wake that came before the call it was meant to end (a
#: query not started yet when ``con.interrupt()`` ran) is repeated.
WAKE_AGAIN = (0.25, 1.0, 2.5)


def _run_wakes(actions: list[Callable[[], object]], bound: float) -> None:
    """Run the wake ``actions``, once each and in order, on a thread of their own, waiting
    for them at most ``bound`` seconds (a wake that blocks does not hold the exit); an
    error, an interrupt included, is logged and the next action runs.  Where no thread can
    be started (CPython 3.12.0-3.12.2 at shutdown) they run on the calling thread."""
    if not actions:
        return
    done = _thread.allocate_lock()
    done.acquire()

    def run_all() -> None:
        try:
            for action in actions:
                try:
                    action()
                except BaseException as exc:  # logged: the other actions and the wait run
                    _report.log().error(
                        "exitsafe: quiesce wake action %r failed: %r", action, exc
                    )
        finally:
            done.release()

    try:
        _thread.start_new_thread(run_all, ())
    except RuntimeError:  # CPython 3.12.0-3.12.2 start no thread at shutdown: run them here,
        run_all()  # with no bound (a wake that blocks then holds the exit, as its call would)
    if not done.acquire(timeout=bound):
        _report.log().warning(
            "exitsafe: quiesce wake actions still running after %.3g s; going on", bound
        )


def requested() -> bool:
    return _request[0] is not None


def still_running() -> dict[int, str]:
    """The threads that were neither parked, gone nor idle when the bound was hit:
    ident -> a description (name, and where it was)."""
    return dict(_running)


def covered() -> list[int]:
    """The threads this exit quiesces (parked, or parking at their next call) but those
    still running when their bound was hit (see `still_running`): they never run the
    program's code again."""
    return [ident for ident in list(_targets) if ident not in _running]


def run(exclude: Iterable[int] = ()) -> None:
    """Quiesce the requested threads (once per exit; never raises)."""
    asked = _request[0]
    if asked is None or _ran:
        return
    _ran.append(True)
    idents, timeout = asked
    me = _thread.get_ident()
    try:
        alive = set(sys._current_frames())
        wanted = (idents & alive) if idents else alive
        for ident in wanted - {me} - set(exclude) - set(_targets):
            _targets[ident] = False
        if not _targets:
            return
        from time import perf_counter

        started = perf_counter()
        _prepare()
        _install()
        _note_calls_in_flight()
        actions = list(_wakes)
        _wakes.clear()
        _run_wakes(actions, timeout)  # (after the install: a woken thread parks as it returns)
        _wait(timeout, actions)
        if _running:
            _process.set_threads_running(
                "still running after quiescing the threads: " + "; ".join(_running.values())
            )
        _log_result((perf_counter() - started) * 1000)
    except Exception as exc:  # never into threading._shutdown: see _exit.run_early_phase
        _report.log().error("exitsafe: quiescing the threads failed: %s", repr(exc))


def park(idents: Iterable[int], timeout: float, outside: frozenset[CodeType] = frozenset()) -> None:
    """Quiesce ``idents`` now, from the exit teardown, and wait at most ``timeout``
    seconds until each is parked or gone, not merely idle (never raises).

    For `exitsafe._users`: the threads of the program's own seen using an adopted object
    that the teardown is about to close.  They park as `run` parks its threads, at their
    next safe point (never inside a library); one still running when the bound is hit is
    kept in `still_running` (the caller then does not close the object under it).
    Threads quiesced already are left as they are.

    Unlike `run`'s, these threads never park where they hold a lock their code refers to
    (`_holds_a_lock`): the close that follows may take it (a wrapper of the program's
    whose ``write`` and ``close`` both take ``self._lock``), and would wait for ever on a
    thread parked holding it.  Nor inside a function of ``outside`` (the methods of the
    object to close, when its class is the program's own: a close in the middle of one of
    them would see it half done).  Such a thread parks at its next safe point outside,
    or is still running at the bound."""
    me = _thread.get_ident()
    try:
        # (first: a thread parking for an earlier object must not park inside this one's)
        _outside[0] = _outside[0] | outside
        alive = set(sys._current_frames())
        new = {ident for ident in idents if ident in alive and ident != me} - set(_targets)
        if not new:
            return
        from time import perf_counter

        started = perf_counter()
        _prepare()
        for ident in new:
            _lock_free_only.add(ident)
            _targets[ident] = False
        _install()
        _note_calls_in_flight()
        _wait(timeout, among=new)
        _log_result((perf_counter() - started) * 1000, "park")
    except Exception as exc:  # (the teardown goes on: the caller looks at the threads again)
        _report.log().error("exitsafe: parking the threads failed: %s", repr(exc))


# ---------------------------------------------------------------------- in each thread


def _on_event(frame: FrameType, event: str, arg: object) -> None:
    if event not in _PARK_EVENTS:
        return
    me = _thread.get_ident()
    if _targets.get(me) is not False or _sync.reentered():
        return
    if _inside_native_call(me, frame, event):
        return
    if event == "call":
        # Never at the entry of a library's function: a library's native code (a Cython
        # wrapper such as h5py's with_phil) may have called it holding the library's lock,
        # with no Python frame of its own in between.  Nor at the entry of a function the
        # caller did not call itself (a deallocation's weakref callback, a subscript or an
        # attribute's native code): only a call instruction of the program's own frame.
        caller = frame.f_back
        if _kind(frame.f_code) == PACKAGE or caller is None or not _at_a_call(caller):
            return
        if not _own_stack(caller):
            return
    elif not _own_stack(frame):
        return
    if me in _lock_free_only:  # (parked by the teardown for a close: see park)
        inner = frame.f_back if event == "call" else frame  # (a call: at its entry, outside)
        if _holds_a_lock(inner) or _stacks.runs_any(inner, _outside[0]):
            return
    _in_native.pop(me, None)
    _targets[me] = True
    _end_borrows()
    _threads.park()


_ON_EVENT_CODE = _on_event.__code__


def _inside_native_call(me: int, frame: FrameType, event: str) -> bool:
    """Whether this event happens inside a C function that a frame of the thread called
    and that has not returned: Python code the C function runs (a callback, an
    ``isinstance`` of a binding's argument check) is inside it, where the library may hold
    its own lock, so never a place to park.  The outermost such call of each thread is
    kept as (its calling frame, that frame's instruction); it ends at the next event of
    that frame itself (its ``c_return`` or ``c_exception``, or its next ``c_call`` when the
    return came unseen: a call in flight at install, `_note_calls_in_flight`), or once that
    frame has moved on."""
    call = _in_native.get(me)
    if call is not None:
        caller, at = call
        if caller is frame:
            # The calling frame runs again: the call returned (its c_return is seen only
            # for a call made once the profile function was installed).
            del _in_native[me]
        elif caller.f_lasti == at and _in_stack(caller, frame.f_back):
            return True
        else:
            del _in_native[me]  # (stale: the call returned unseen, and its frame moved on)
    if event == "c_call":
        _in_native[me] = (frame, frame.f_lasti)  # (dropped below if the thread parks here)
    return False


def _in_stack(target: FrameType, frame: Optional[FrameType]) -> bool:
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


def _note_calls_in_flight() -> None:
    """After the install: each thread to quiesce whose innermost frame is at a call
    instruction is inside a C function (a Python callee would have a frame of its own)."""
    frames = sys._current_frames()
    for ident in list(_targets):
        frame = frames.get(ident)
        if frame is not None and ident not in _in_native and _at_a_call(frame):
            _in_native[ident] = (frame, frame.f_lasti)


def _at_a_call(frame: FrameType) -> bool:
    """Whether ``frame`` is executing a call instruction (its callee was called by it, not
    by native code running on its behalf)."""
    code = frame.f_code
    raw = _code_bytes.get(code)
    if raw is None:
        raw = _code_bytes[code] = code.co_code  # (a copy on 3.11+: read once per code)
    at = frame.f_lasti
    if not 0 <= at < len(raw):
        return False
    while at > 0 and raw[at] == _CACHE:  # (3.11-3.12: the call's inline cache entries)
        at -= 2
    return raw[at] in _CALL_OPS


def _prepare() -> None:
    """Import and compute now, on the exiting thread, everything the profile function and
    the wait use: a first import inside the profile function, in whichever thread gets
    there first, could deadlock on the import lock with this thread's own (seen on
    CPython 3.13.0 with ``sysconfig``)."""
    import ast  # noqa: F401  (_calling_stdlib)
    import dis
    import linecache  # noqa: F401  (_call_source)

    global _CACHE
    _CACHE = dis.opmap.get("CACHE", -1)
    if not _CALL_OPS:
        _CALL_OPS.update(
            op for name, op in dis.opmap.items()
            if name.startswith("CALL") and "INTRINSIC" not in name
        )

    from . import _gate  # noqa: F401  (_end_borrows)

    _stacks.prepare()


def _end_borrows() -> None:
    """End the borrows this thread holds: it never resumes."""
    from ._gate import borrow_exit  # (imported by _prepare before any thread gets here)

    held = _threads.held()
    while held:
        try:
            borrow_exit(held[-1])
        except Exception as exc:  # (a release it let go of failed: logged, not raised here)
            _report.log().error("exitsafe: ending a parked thread's borrow: %s", repr(exc))
            if held:
                held.pop()


def _own_stack(frame: Optional[FrameType]) -> bool:
    """Whether a thread at ``frame`` may park: every frame is the program's own (or only
    starts the thread), and none is a finalizer (a ``__del__`` may run inside a garbage
    collection, which a parked thread would never finish)."""
    while frame is not None:
        code = frame.f_code
        kind = _kind(code)
        if kind == PACKAGE or kind == STDLIB or code.co_name == "__del__":
            return False
        frame = frame.f_back
    return True


# ---------------------------------------------------------------------- installing


def _install() -> None:
    import threading

    set_all = getattr(threading, "setprofile_all_threads", None)  # CPython 3.12+
    if set_all is not None:
        hook = threading.getprofile()
        mine = sys.getprofile()
        set_all(_on_event)
        threading.setprofile(hook)  # (threads started from now on: as they were)
        sys.setprofile(mine)  # (this thread: as it was)
        return
    _install_with_ctypes()


def _install_with_ctypes() -> None:
    """CPython 3.9-3.11: what ``threading.setprofile_all_threads`` does on 3.12, through
    the C API (``_PyEval_SetProfile`` on each thread state of this interpreter)."""
    import ctypes

    api = ctypes.pythonapi
    # The event's argument is a pointer, not an object: a "return" by an exception passes
    # NULL, which ctypes cannot make an object of (the callback would fail, and the
    # thread with "SystemError: error return without exception set").
    trace_func = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.py_object, ctypes.py_object, ctypes.c_int, ctypes.c_void_p
    )
    events = ("call", "exception", "line", "return", "c_call", "c_exception", "c_return")

    def trampoline(obj: object, frame: Any, what: int, arg: object) -> int:
        try:
            _on_event(frame, events[what], None)
        except BaseException:  # (a profile function's error would be printed per call)
            pass  # parking cannot fail but for an interrupt: the thread goes on
        return 0

    callback = trace_func(trampoline)
    _trampoline.append(callback)
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Get.restype = ctypes.c_void_p
    api._PyEval_SetProfile.argtypes = [ctypes.c_void_p, trace_func, ctypes.py_object]
    api._PyEval_SetProfile.restype = ctypes.c_int
    current = api.PyThreadState_Get()
    state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while state:
        if state != current:
            api._PyEval_SetProfile(state, callback, None)
        state = api.PyThreadState_Next(state)


# ---------------------------------------------------------------------- waiting


def _wait(
    timeout: float,
    actions: Sequence[Callable[[], object]] = (),
    among: Optional[set[int]] = None,
) -> None:
    """Wait until every thread to quiesce (of ``among``, if given) is parked, gone or
    idle, at most ``timeout`` seconds; while one is still running, the wake ``actions``
    run again at `WAKE_AGAIN`."""
    from time import monotonic

    started = monotonic()
    again = list(WAKE_AGAIN) if actions else []

    def busy() -> dict[int, FrameType]:
        frames = sys._current_frames()
        found = {
            ident: frames[ident]
            for ident, parked in list(_targets.items())
            if not parked and ident in frames and (among is None or ident in among)
            and not _harmless(ident, frames[ident])
        }
        elapsed = monotonic() - started
        if found and again and elapsed >= again[0]:
            again.pop(0)
            _run_wakes(list(actions), max(timeout - elapsed, 0.01))
        return found

    still: dict[int, FrameType] = _threads.poll(busy, timeout)
    for ident in [i for i, frame in still.items() if _harmless(i, frame, final=True)]:
        del still[ident]  # (idle by its stack, and no look long enough says it computes)
    for ident, frame in still.items():
        _running[ident] = f"{_threads.thread_name(ident)} at {_where(frame)}"
    still.clear()  # (the other threads' frames: not kept)


def _harmless(ident: int, frame: FrameType, final: bool = False) -> bool:
    """Whether thread ``ident`` (to quiesce, not parked) at ``frame`` needs no more
    waiting: idle (see `_idle`) and not computing (`_threads.CpuWatch`: a long hash in
    C looks like a wait from its stack, and its next step may reach a library through no
    call, a subscript; ``final``, at the bound, on whatever look there is), unless
    `park` quiesces it: the object it uses is closed next, so it must be parked (or
    gone), not only idle, whose next step may reach the library through no call or hold
    a lock where it wakes."""
    if ident in _lock_free_only or not _idle(frame):
        return False
    return _cpu[0].computing(ident, final) is not True


def _idle(frame: FrameType) -> bool:
    """Whether a thread whose innermost frame is ``frame`` is outside every library's
    code (native or not) and can only leave its wait through a call (where it parks)."""
    inner = _kind(frame.f_code)
    below: Optional[FrameType] = frame
    while below is not None:
        if _kind(below.f_code) == PACKAGE or below.f_code is _ON_EVENT_CODE:
            # (a thread inside the profile function is deciding whether to park: it may
            # go on into a library's native code; the next look tells)
            return False
        below = below.f_back
    if inner == STDLIB:
        return True
    if inner == STARTER:
        return False  # (about to call the target: it parks there)
    return _calling_stdlib(frame)


def _calling_stdlib(frame: FrameType) -> bool:
    """Whether the call in flight in ``frame`` (of the program's code) is to the standard
    library: read from the source of the instruction running, its callee resolved
    through modules only (nothing of the program's is called or read but names)."""
    source = _call_source(frame)
    if source is None:
        return False
    import ast

    tree: ast.AST
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        try:
            tree = ast.parse(source.strip())
        except SyntaxError:
            return False
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return bool(calls) and all(_callee_kind(call.func, frame) == STDLIB for call in calls)


def _call_source(frame: FrameType) -> Optional[str]:
    import linecache

    code = frame.f_code
    positions = getattr(code, "co_positions", None)  # CPython 3.11+
    if positions is not None:
        try:
            line, end, col, end_col = list(positions())[frame.f_lasti // 2]
        except (IndexError, ValueError):
            return None
        if None in (line, end, col, end_col):
            return None
        lines = [linecache.getline(code.co_filename, n) for n in range(line, end + 1)]
        if not lines or not lines[0]:
            return None
        if line == end:
            return lines[0][col:end_col]
        return lines[0][col:] + "".join(lines[1:-1]) + lines[-1][:end_col]
    return linecache.getline(code.co_filename, frame.f_lineno) or None


def _callee_kind(node: Any, frame: FrameType) -> int:
    """The kind of the code a call's callee expression names: resolved through names
    and modules; at the first object that is not a module, the module of its type."""
    import ast

    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return OWN
    found, obj = _lookup(node.id, frame)
    if not found:
        return OWN
    # The last module the name goes through: an extension's function may say nothing of
    # its own module (cv2.GaussianBlur.__module__ is None), and its type's is builtins.
    through: Optional[str] = None
    for name in reversed(names):
        if type(obj).__name__ != "module":
            break
        through = getattr(obj, "__name__", None)
        obj = getattr(obj, name, None)
    if type(obj).__name__ == "module":
        return _module_kind(getattr(obj, "__name__", None))
    if not callable(obj):
        return _module_kind(getattr(type(obj), "__module__", None))
    module = getattr(obj, "__module__", None)
    if isinstance(module, str):
        return _module_kind(module)
    owner = getattr(obj, "__self__", None)  # (a C method: its object; a C function: its module)
    if type(owner).__name__ == "module":
        return _module_kind(getattr(owner, "__name__", None))
    if owner is not None:
        return _module_kind(getattr(type(owner), "__module__", None))
    if through is not None:
        return _module_kind(through)
    return PACKAGE  # (a C function that says nothing of its module: not the stdlib's)


def _lookup(name: str, frame: FrameType) -> tuple[bool, object]:
    for namespace in (frame.f_locals, frame.f_globals):
        try:
            return True, namespace[name]
        except KeyError:
            continue
    import builtins

    if hasattr(builtins, name):
        return True, getattr(builtins, name)
    return False, None


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({code.co_filename}:{frame.f_lineno})"


def _log_result(ms: float, what: str = "quiesce") -> None:
    parked = sum(1 for p in _targets.values() if p)
    if _running and what == "quiesce":  # (park: its caller says what it did not close)
        _report.log().warning(
            "exitsafe: %d thread(s) still running at exit after quiescing (%s): nothing "
            "is released (every handle leaked_in_use)",
            len(_running),
            "; ".join(_running.values()),
        )
    from . import _config

    if _config.trace_enabled():
        from ._ledger import trace_line

        _report.emit(
            trace_line(
                what, threads=len(_targets), parked=parked, running=len(_running),
                ms=f"{ms:.3f}",
            )
        )


def after_fork_in_child() -> None:
    """A forked child has its own exit; its parent's threads do not exist there (nor do
    the waits their wake actions would end)."""
    _targets.clear()
    _ran.clear()
    _lock_free_only.clear()
    _outside[0] = frozenset()
    _wakes.clear()
    _in_native.clear()
    _running.clear()
    _cpu[0] = _threads.CpuWatch()
    _process.set_threads_running(None)
