"""Which other threads' Python code refers to an object: the check that keeps the exit
teardown from closing an adopted object under a thread still using it.

An adopted object (`exitsafe.adopt`) that the program also hands to a thread, without
the borrowing view, a worker or `quiesce()`, is closed by the exit teardown whatever
that thread is doing with it (a write in flight into an HDF5 file, a frame into a video
encoder).  Before such a close, `wait_until_unused` looks at every other thread that
may still run: a thread *uses* the object when a frame of its Python stack refers to it

* as a local or closure variable (or a bound method of it),
* as a module global that the frame's code names,
* as an attribute of a local (``self.writer``), one level deep, or
* as an item of a list, tuple, set or dict (its values) held in either of the first and
  third ways (``writers = [a, b]``, ``self.sessions["gpu0"]``); the first
  `SCAN_LIMIT` items of a list or tuple, a set or dict only up to that size.

The close then waits (bounded) for those references to go, and otherwise does not
happen: the handle ends ``leaked_in_use``, its detail naming the thread and the frame.
It is a conservative test: a thread that holds the object without calling it (idle in
a ``queue.get()`` with it in a local) counts, since it may wake and call it; native
code that kept the object's pointer, with no Python frame referring to it, is not seen.

Threads that never run the object's code again are not counted: the calling thread,
threads parked for good (a refused borrow, `quiesce()`), the threads `quiesce()` covers
(their next call parks them), the threads running a teardown and exitsafe's idle step
workers; exitsafe's own frames are never read.  A thread that already outlasted one
wait in this exit is not waited for again: what else it refers to is leaked at once.
With no such other thread, the check costs one ``sys._current_frames()``.  No code of
the program's runs: see `_refers_to`.
"""

from __future__ import annotations

import _thread
import sys
from time import monotonic, sleep
from types import BuiltinMethodType, MethodType, ModuleType

from . import _quiesce, _threads

_get_ident = _thread.get_ident

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Optional

__all__ = ["InUse", "users_of", "wait_until_unused"]

#: Seconds the exit teardown waits, at most, for other threads to stop referring to an
#: adopted object before it leaks it instead of closing it.
USE_WAIT = 1.0

#: Bound methods: ``writer.write`` in a local uses ``writer``.
_METHODS = (MethodType, BuiltinMethodType)


class InUse(Exception):
    """A release not run: another thread's code still refers to the object (the exit
    teardown records the handle ``leaked_in_use``, with this message as its detail)."""


def _refers_to(frame: FrameType, obj: object) -> bool:
    """Whether ``frame`` refers to ``obj`` (see the module's docstring).  Runs no code of
    the program's: only exact dicts (and 3.13's frame-locals proxy) are read, methods are
    told by their exact type, and an attribute dict only through the standard slot."""
    try:
        frame_locals = frame.f_locals
        if type(frame_locals) is not dict and type(frame_locals).__name__ != "FrameLocalsProxy":
            frame_locals = {}  # (exec() with a mapping of the program's own: not read)
        local_values = list(frame_locals.values())
    except Exception:  # a frame's locals that cannot be read: nothing to tell from them
        local_values = []
    for value in local_values:
        kind = type(value)
        if value is obj or ((kind is MethodType or kind is BuiltinMethodType)
                            and value.__self__ is obj):
            return True
    for value in local_values:
        if _holds(value, obj):
            return True
        attrs = _instance_dict(value)
        if attrs is not None and any(v is obj or _holds(v, obj) for v in list(attrs.values())):
            return True
    module_globals = frame.f_globals
    if type(module_globals) is not dict:
        return False
    return any(module_globals.get(name) is obj for name in frame.f_code.co_names)


#: Items of one container that `_holds` looks at, at most (it runs for each frame of
#: each other thread at exit).
SCAN_LIMIT = 4096


def _holds(value: Any, obj: object) -> bool:
    """Whether ``value``, a built-in container of exact type, holds ``obj`` as an item (a
    dict: as a value).  Compared by identity on a copy taken in one C call: no code of
    the program's runs (no ``__eq__``, no ``__hash__``), and no other thread's change to
    the container can fail the scan."""
    kind = type(value)
    if kind is list or kind is tuple:
        items = value[:SCAN_LIMIT]
    elif kind is dict:
        if len(value) > SCAN_LIMIT:
            return False
        items = list(value.values())
    elif kind is set or kind is frozenset:
        if len(value) > SCAN_LIMIT:
            return False
        items = list(value)
    else:
        return False
    return any(item is obj for item in items)


def _instance_dict(value: object) -> Optional[dict[str, object]]:
    """``value``'s own attribute dict, when its type keeps one the standard way (no
    ``__dict__`` property of the program's, no class or module), else ``None``."""
    kind = type(value)
    if issubclass(kind, (type, ModuleType)):
        return None
    for klass in kind.__mro__:
        slot = klass.__dict__.get("__dict__")
        if slot is not None:
            if type(slot).__name__ != "getset_descriptor":
                return None  # (a __dict__ of the program's own making: not called)
            break
    else:
        return None
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except Exception:  # (a standard slot that still failed: nothing one level down)
        return None
    return attrs if type(attrs) is dict else None


#: The threads running an exit teardown now (`_teardown.run` adds and removes its own).
tearing_down: set[int] = set()
#: The threads a wait already ran out for in this exit: objects they refer to are leaked
#: at once, so one thread holding many objects costs one bound, not one per object.
_waited_out: set[int] = set()


def in_a_teardown() -> bool:
    """Whether the calling thread runs a teardown, or one of its timed steps."""
    if _get_ident() in tearing_down:
        return True
    steps = sys.modules.get("exitsafe._steps")
    running_here = getattr(steps, "running_here", None)
    return running_here is not None and running_here() is not None


def _skipped() -> set[int]:
    """The threads that never run the object's code again (see the module's docstring)."""
    skip = set(_quiesce.covered()) | tearing_down
    steps = sys.modules.get("exitsafe._steps")
    idle_workers = getattr(steps, "idle_worker_idents", None)
    if idle_workers is not None:
        skip |= idle_workers()  # (a busy one may run an abandoned hook using the object)
    return skip


def users_of(obj: object) -> dict[int, str]:
    """The other threads whose Python stack refers to ``obj``: ident -> where (the
    thread's name and the outermost frame that refers to it: the thread's own loop
    rather than the object's method it is in)."""
    candidates = _threads.running_elsewhere()
    if not candidates:
        return {}
    skip = _skipped()
    frames = sys._current_frames()
    found: dict[int, str] = {}
    for ident in candidates:
        frame: Optional[FrameType] = frames.get(ident)
        if ident in skip or frame is None:
            continue
        outermost: Optional[FrameType] = None  # the thread's own loop, rather than a method
        while frame is not None:
            if not _quiesce.is_exitsafe_file(frame.f_code.co_filename) and _refers_to(frame, obj):
                outermost = frame
            frame = frame.f_back
        if outermost is not None:
            code = outermost.f_code
            found[ident] = (
                f"thread {_threads.thread_name(ident)!r} "
                f"({code.co_name}() at {code.co_filename}:{outermost.f_lineno})"
            )
    return found


def wait_until_unused(obj: object, bound: float = USE_WAIT) -> None:
    """Return once no other thread refers to ``obj`` (at once when none does); raise
    `InUse` if some still do after ``bound`` seconds."""
    users = users_of(obj)
    if not users:
        return
    if set(users) <= _waited_out:
        bound = 0.0  # (those threads already outlasted a wait in this exit)
    deadline = monotonic() + bound
    pause = 0.001
    while users and monotonic() < deadline:
        sleep(pause)
        pause = min(pause * 2, 0.05)
        users = users_of(obj)
    if users:
        _waited_out.update(users)
        raise InUse(
            "still used by " + ", ".join(sorted(users.values()))
            + f" after {bound:.3g} s; not closed under it (borrow it through "
            "handle.borrowing(), or declare the thread with exitsafe.worker() or quiesce())"
        )
