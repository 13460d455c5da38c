"""The threads alive at exit: one ``thread`` trace line each, with its whole stack and the
locks its frames hold, so that a thread unwound or stopped later can be named.

They are listed when the exit begins (``threading._shutdown``, registered by
`list_at_shutdown` once ``threading`` is imported: `when_imported`) and after the exit
hooks (`list_threads`).
"""

from __future__ import annotations

import sys

from ._emit import Bare, emit
from ._state import state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Callable, Optional

#: Frames of a thread's stack written in its ``thread`` line.
THREAD_FRAMES = 16
#: Lock types whose state a thread line reports: (module, type name).
_LOCKS = frozenset({
    ("_thread", "lock"), ("_thread", "RLock"), ("threading", "_RLock"),
    ("fastrlock.rlock", "FastRLock"), ("h5py._objects", "FastRLock"),
    ("_multiprocessing", "SemLock"),
})
#: Reentrant locks with no ``locked()`` and no owner another thread can read (fastrlock's,
#: and h5py's copy of it, its global ``phil``): told by a try to take them without
#: waiting, at once given back.
_TRY_LOCKS = frozenset({("fastrlock.rlock", "FastRLock"), ("h5py._objects", "FastRLock")})


class _AfterImport:
    """A ``sys.meta_path`` entry that runs ``callback(module)`` once ``name`` is imported
    (and then leaves ``sys.meta_path``): nothing is imported early for it."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenLoader(spec.loader, self.callback)  # type: ignore[assignment]
        return spec


class _ThenLoader:
    """A loader that runs the real one, then a callback; anything else is the real one's."""

    def __init__(self, loader: Any, callback: Callable[[Any], None]) -> None:
        self._loader = loader
        self._callback = callback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            module.__loader__ = self._loader
            module.__spec__.loader = self._loader
        except AttributeError:
            pass
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception:
            pass


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def list_at_shutdown(threading: Any) -> None:
    """List the threads when the exit begins too (``threading._shutdown``, before the
    interpreter joins the non-daemon threads): a hang in an exit handler comes before the
    list at the end of the exit hooks.

    ``threading._shutdown`` calls the ``threading._register_atexit`` callbacks in reverse
    order of registration, before it joins the non-daemon threads, and one may never return
    (``concurrent.futures``' ``_python_exit`` joining a busy worker).  So the lister is
    kept the last one registered, which runs first: ``threading._register_atexit`` is
    wrapped so that after each later registration the lister's entry is moved back to the
    end of ``threading._threading_atexits`` (CPython 3.9+; on an interpreter without that
    list the lister is registered once, in plain order).  Called once per process (a
    second call does nothing)."""
    register = getattr(threading, "_register_atexit", None)
    if register is None or getattr(register, "_exitsafe_keeps_lister_last", False):
        return
    calls = getattr(threading, "_threading_atexits", None)
    before = len(calls) if isinstance(calls, list) else -1
    register(_list_at_shutdown)
    if not isinstance(calls, list) or len(calls) != before + 1:
        return  # not CPython's list: the lister stays where it was registered
    ours = calls[-1]  # (3.9-3.12 wrap it in a functools.partial, 3.13+ in a lambda)
    import _thread

    lock = _thread.allocate_lock()

    def keep_lister_last(func: Any, *arg: Any, **kwargs: Any) -> None:
        register(func, *arg, **kwargs)  # raises as before once the shutdown has begun
        with lock:
            if getattr(threading, "_SHUTTING_DOWN", False):
                return  # (a registration racing the shutdown: never reorder the list)
            if calls and calls[-1] is not ours and ours in calls:
                calls.remove(ours)
                calls.append(ours)

    keep_lister_last.__doc__ = register.__doc__
    keep_lister_last.__wrapped__ = register  # type: ignore[attr-defined]
    keep_lister_last._exitsafe_keeps_lister_last = True  # type: ignore[attr-defined]
    threading._register_atexit = keep_lister_last


def _list_at_shutdown() -> None:
    """The ``threading._register_atexit`` callback: `list_threads` as the exit begins.
    Never raises into ``threading._shutdown`` (an exception there would skip the other
    callbacks and the join of the non-daemon threads)."""
    try:
        list_threads("shutdown")
    except Exception:  # (list_threads catches its own; a failure here only loses the list)
        pass


def list_threads(when: str = "exit") -> None:
    """Write one ``thread`` trace line per thread still alive besides this one (once per
    ``when``: ``"shutdown"`` as the exit begins, ``"exit"`` after the exit hooks), with its
    whole stack, the locks its frames hold and, for a ``concurrent.futures`` worker, the
    callable it runs (``task``)."""
    if state.threads_listed or (when == "shutdown" and state.phase_written):
        return
    if when == "exit":
        state.threads_listed = True
    threading = sys.modules.get("threading")
    if threading is None:
        return
    try:
        frames = sys._current_frames()
        me = threading.get_ident()
        for thread in threading.enumerate():
            ident = thread.ident
            if ident is None or ident == me or not thread.is_alive():
                continue
            frame = frames.get(ident)
            emit(
                "thread",
                ident=Bare(f"0x{ident:016x}"),
                name=thread.name,
                daemon=bool(thread.daemon),
                frame=None if frame is None else _frame_text(frame),
                target=_target_text(thread),
                task=None if frame is None else _executor_task(frame),
                stack=None if frame is None else _stack_text(frame),
                holds=None if frame is None else _held_locks(frame, ident),
                when=when,
            )
    except Exception:
        pass


def _frame_text(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


def _stack_text(frame: FrameType) -> str:
    parts: list[str] = []
    current: Optional[FrameType] = frame
    while current is not None and len(parts) < THREAD_FRAMES:
        parts.append(_frame_text(current))
        current = current.f_back
    if current is not None:
        parts.append("...")
    return " <- ".join(parts)


def _lock_state(obj: object, ident: int) -> Optional[str]:
    """How ``obj``, a lock, is held: ``"locked"``, ``"held by this thread"``, or ``None``."""
    cls = type(obj)
    key = (getattr(cls, "__module__", ""), cls.__name__)
    if key not in _LOCKS:
        inner = getattr(obj, "__dict__", {}).get("_lock") if key == (
            "threading", "Condition") else None
        return None if inner is None else _lock_state(inner, ident)
    if key == ("_thread", "RLock") or key == ("threading", "_RLock"):
        text = repr(obj)
        if "owner=" in text:
            try:
                owner = int(text.split("owner=", 1)[1].split()[0])
            except ValueError:
                return None
            return "held by this thread" if owner == ident else None
        return None
    if key in _TRY_LOCKS:
        # Taken without waiting (then given back at once): free, or held by the thread
        # writing the list (reentrant), is not a lock another thread holds.  Its owner
        # cannot be read, so "locked" says nothing of which thread holds it.
        try:
            taken = obj.acquire(False)  # type: ignore[attr-defined]
        except Exception:
            return None
        if taken:
            obj.release()  # type: ignore[attr-defined]
            return None
        return "locked"
    try:
        return "locked" if obj.locked() else None  # type: ignore[attr-defined]
    except Exception:
        return None


def _held_locks(frame: FrameType, ident: int) -> Optional[str]:
    """The locks the names of ``frame`` and the frames below it refer to that are held
    (by this thread, when the lock type tells; else locked by someone)."""
    found: list[str] = []
    seen: set[int] = set()
    current: Optional[FrameType] = frame
    depth = 0
    while current is not None and depth < 32:
        code = current.f_code
        try:
            local = dict(current.f_locals)
        except Exception:
            local = {}
        scopes = (local, current.f_globals)
        for name in (*code.co_varnames, *code.co_names, *code.co_freevars, *code.co_cellvars):
            for scope in scopes:
                value = scope.get(name)
                if value is None or id(value) in seen:
                    continue
                candidates = [(name, value)]
                owned = getattr(value, "__dict__", None)
                if isinstance(owned, dict):  # self._lock, module.lock
                    candidates += [(f"{name}.{attr}", owned[attr]) for attr in code.co_names
                                   if attr in owned]
                for label, candidate in candidates:
                    if id(candidate) in seen:
                        continue
                    seen.add(id(candidate))
                    held = _lock_state(candidate, ident)
                    if held is not None:
                        kind = f"{type(candidate).__module__}.{type(candidate).__name__}"
                        found.append(f"{label} ({kind}, {held})")
        # A module's global lock that its code takes in a compiled wrapper, which no name
        # of the frame's code shows (h5py's ``@with_phil`` methods take ``phil``).
        for label, candidate in list(current.f_globals.items()):
            kind_key = (getattr(type(candidate), "__module__", ""), type(candidate).__name__)
            if kind_key in _TRY_LOCKS and id(candidate) not in seen:
                seen.add(id(candidate))
                held = _lock_state(candidate, ident)
                if held is not None:
                    found.append(f"{label} ({kind_key[0]}.{kind_key[1]}, {held})")
        current = current.f_back
        depth += 1
    return "; ".join(found) if found else None


def _target_text(thread: Any) -> Optional[str]:
    target = getattr(thread, "_target", None)
    return None if target is None else _callable_name(target)


def _callable_name(obj: object, depth: int = 0) -> Optional[str]:
    """The qualified name of a function, method, builtin, class or ``functools.partial``
    (of what it wraps), read without running the object's own code (no ``__getattr__``,
    no property); ``None`` for anything else."""
    import functools
    import types

    if depth > 4:
        return None
    kind = type(obj)  # (not isinstance: it would read the object's own __class__)
    if issubclass(kind, types.MethodType):
        return _callable_name(obj.__func__, depth + 1)  # type: ignore[attr-defined]
    if issubclass(kind, functools.partial):
        return _callable_name(obj.func, depth + 1)  # type: ignore[attr-defined]
    if issubclass(kind, (types.FunctionType, types.BuiltinFunctionType, type)):
        name = obj.__qualname__  # type: ignore[attr-defined]
        return name if isinstance(name, str) else None
    return None


#: How many frames from the top of a thread's stack `_executor_task` looks at.
_TASK_DEPTH = 64


def _executor_task(frame: FrameType) -> Optional[str]:
    """The callable a ``concurrent.futures`` thread-pool worker runs now: the ``fn`` of the
    ``_WorkItem`` whose ``run`` frame is on the stack (3.14+: the first item of its
    ``task``); ``None`` on another thread or a worker waiting for work.  Reads the ``run``
    frame's ``self`` and that object's ``__dict__``, nothing else."""
    current: Optional[FrameType] = frame
    depth = 0
    while current is not None and depth < _TASK_DEPTH:
        code = current.f_code
        if code.co_name == "run" and code.co_filename.replace("\\", "/").endswith(
            "concurrent/futures/thread.py"
        ):
            try:
                item = current.f_locals.get("self")
            except Exception:  # (a frame whose locals cannot be read: no task to name)
                return None
            cls = type(item)
            if cls.__name__ != "_WorkItem" or cls.__module__ != "concurrent.futures.thread":
                # (3.14+: the WorkerContext's own run(task) comes first: look further down)
                current = current.f_back
                depth += 1
                continue
            fields = item.__dict__
            fn = fields.get("fn")
            task = fields.get("task")
            if fn is None and isinstance(task, tuple) and task:
                fn = task[0]
            return None if fn is None else _callable_name(fn)
        current = current.f_back
        depth += 1
    return None
