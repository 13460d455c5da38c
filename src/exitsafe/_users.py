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
from types import BuiltinMethodType, MethodType

from . import _quiesce, _stacks, _threads

_get_ident = _thread.get_ident

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Callable, Optional

__all__ = ["InUse", "users_of", "wait_until_unused"]

#: Seconds the exit teardown waits, at most, for other threads to stop referring to an
#: adopted object before it leaks it instead of closing it.
USE_WAIT = 1.0

#: Bound methods: ``writer.write`` in a local uses ``writer``.
_METHODS = (MethodType, BuiltinMethodType)


class InUse(Exception):
    """A release not run: another thread's code still refers to the object (the exit
    teardown records the handle ``leaked_in_use``, with this message as its detail)."""


def _refers_to(frame: FrameType, obj: object, library: Optional[str] = None) -> bool:
    """Whether ``frame`` refers to ``obj`` (see the module's docstring), or, given the
    ``library`` of ``obj``, runs that library's code or refers the same ways to any
    object of it.  Runs no code of the program's: only exact dicts (and 3.13's
    frame-locals proxy) are read, methods are told by their exact type, and an attribute
    dict only through the standard slot."""
    if library is not None:
        if _stacks.code_library(frame.f_code) == library:
            return True
        return _refers_to(frame, _OfLibrary(library))
    try:
        frame_locals = frame.f_locals
        if type(frame_locals) is not dict and type(frame_locals).__name__ != "FrameLocalsProxy":
            frame_locals = {}  # (exec() with a mapping of the program's own: not read)
        local_values = list(frame_locals.values())
    except Exception:  # a frame's locals that cannot be read: nothing to tell from them
        local_values = []
    same: Callable[[object, Any], bool] = (
        _of_library if type(obj) is _OfLibrary else _identical
    )
    for value in local_values:
        kind = type(value)
        if same(value, obj) or ((kind is MethodType or kind is BuiltinMethodType)
                                and value.__self__ is obj):
            return True
    for value in local_values:
        if _holds(value, obj):
            return True
        attrs = _stacks.instance_dict(value)
        if attrs is not None and any(same(v, obj) or _holds(v, obj)
                                     for v in list(attrs.values())):
            return True
    module_globals = frame.f_globals
    if type(module_globals) is not dict:
        return False
    return any(same(module_globals.get(name), obj) for name in frame.f_code.co_names)


def _identical(value: object, obj: object) -> bool:
    return value is obj


class _OfLibrary:
    """Stands for "any object of ``library``" in the identity tests of `_refers_to` and
    `_holds` (`_of_library`)."""

    __slots__ = ("library",)

    def __init__(self, library: str) -> None:
        self.library = library


#: type -> the installed package its class is defined in (see `_library_of_type`).
_type_libraries: dict[type, Optional[str]] = {}
_type_module = type.__dict__["__module__"]


def _library_of_type(kind: type) -> Optional[str]:
    """The installed package ``kind`` comes from (read through ``type``'s own
    ``__module__``: no metaclass of the program's runs), or ``None``."""
    try:
        return _type_libraries[kind]
    except KeyError:
        pass
    try:
        module = _type_module.__get__(kind, type)
    except Exception:  # (a type whose module cannot be read: no library)
        module = None
    found = _stacks.library_of(module if isinstance(module, str) else None)
    _type_libraries[kind] = found
    return found


def _of_library(value: object, obj: _OfLibrary) -> bool:
    """Whether ``value`` is an object of ``obj``'s library (a bound method: its object)."""
    kind = type(value)
    if kind is MethodType or kind is BuiltinMethodType:
        kind = type(value.__self__)  # type: ignore[attr-defined]
    return kind is not _OfLibrary and _library_of_type(kind) == obj.library


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
    if type(obj) is _OfLibrary:
        return any(_of_library(item, obj) for item in items)
    return any(item is obj for item in items)


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
    return {ident: where for ident, (where, _) in _find_users(obj).items()}


def _find_users(obj: object) -> dict[int, tuple[str, bool]]:
    """`users_of`, each with whether the thread is the program's own (`park` can stop
    it).  Such a thread also uses ``obj`` when it runs the code of the installed package
    ``obj`` comes from, or refers to any object of it (an h5py ``Dataset`` of an adopted
    ``File``): the package's own threads are not counted that way."""
    candidates = _threads.running_elsewhere()
    if not candidates:
        return {}
    skip = _skipped()
    main = _threads.main_ident()
    library = _library_of_type(type(obj))
    methods = _stacks.method_codes(type(obj))
    frames = sys._current_frames()
    found: dict[int, tuple[str, bool]] = {}
    for ident in candidates:
        frame: Optional[FrameType] = frames.get(ident)
        if frame is None:
            continue
        if ident in skip:
            if _stacks.runs_any(frame, methods):  # (parked in the middle of one of them)
                found[ident] = (f"thread {_threads.thread_name(ident)!r} (parked inside "
                                f"{type(obj).__name__}'s code)", False)
            continue
        # (never the main thread: a teardown run elsewhere, by a signal watcher, must not
        # stop the program's own flow for good; it is waited for, as a library's thread)
        own = main is not None and ident != main and _stacks.program_thread(frame)
        wide = library if own else None
        outermost: Optional[FrameType] = None  # the thread's own loop, rather than a method
        while frame is not None:
            if not _stacks.is_exitsafe_file(frame.f_code.co_filename) and _refers_to(
                frame, obj, wide
            ):
                outermost = frame
            frame = frame.f_back
        if outermost is not None:
            code = outermost.f_code
            found[ident] = (
                f"thread {_threads.thread_name(ident)!r} "
                f"({code.co_name}() at {code.co_filename}:{outermost.f_lineno})",
                own,
            )
    return found


def wait_until_unused(obj: object, bound: float = USE_WAIT, park: bool = False) -> None:
    """Return once no other thread refers to ``obj`` (at once when none does); raise
    `InUse` if some still do after ``bound`` seconds.

    ``park`` (the exit teardown only: a parked thread never runs again): the program's
    own threads among them are first parked at their next safe point (`_quiesce.park`,
    within the bound), which ends their use; the others are waited for."""
    found = _find_users(obj)
    if not found:
        return
    if set(found) <= _waited_out:
        bound = 0.0  # (those threads already outlasted a wait in this exit)
    deadline = monotonic() + bound
    parkable = [ident for ident, (_, own) in found.items() if own]
    if park and parkable and bound > 0:
        _quiesce.park(parkable, bound, _stacks.method_codes(type(obj)))
        found = _find_users(obj)
    users = {ident: where for ident, (where, _) in found.items()}
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
