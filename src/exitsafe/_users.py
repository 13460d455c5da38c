"""Which other threads' Python code refers to an object: the check that keeps the exit
teardown from closing an adopted object under a thread still using it.

An adopted object (`exitsafe.adopt`) that the program also hands to a thread, without
the borrowing view, a worker or `quiesce()`, is closed by the exit teardown whatever
that thread is doing with it (a write in flight into an HDF5 file, a frame into a video
encoder).  Before such a close, `wait_until_unused` looks at every other thread that
may still run: a thread *uses* the object when a frame of its Python stack refers to it

* as a local or closure variable (or a bound method of it),
* as a module global that the frame's code names, or
* reached from one of those in at most `DEPTH` steps, each an attribute of an object
  that keeps a standard attribute dict (``self.writer``, ``self.recorder.writer``), an
  item of a list, tuple, set or dict (keys and values: ``writers = [a, b]``,
  ``self.sessions["gpu0"]``, a module-global registry of writers) or the object of a
  bound method; nearest first, at most `WALK_LIMIT` values per frame, the first
  `SCAN_LIMIT` items of a list or tuple, a set or dict only up to that size.  A global
  named by library or standard-library code counts as itself only: that state is shared
  by every thread (``threading``'s table of all threads, for one).

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
import os
import sys
from collections import deque as _deque
from time import monotonic, sleep
from types import BuiltinMethodType, MethodType

from . import _quiesce, _stacks, _threads

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


def _locals_type() -> type:
    return type(sys._getframe().f_locals)  # (a function's: 3.13's FrameLocalsProxy)


#: The type of a function frame's ``f_locals`` (``dict`` before CPython 3.13).
_LOCALS_PROXY = _locals_type()


def _roots(frame: FrameType) -> tuple[list[Any], list[Any]]:
    """What ``frame`` refers to directly: (its locals, closure variables included; the
    module globals its code names).  Runs no code of the program's: only exact dicts (and
    3.13's frame-locals proxy) are read."""
    try:
        frame_locals = frame.f_locals
        if type(frame_locals) is not dict and type(frame_locals) is not _LOCALS_PROXY:
            frame_locals = {}  # (exec() with a mapping of the program's own: not read)
        local_values = list(frame_locals.values())
    except Exception:  # a frame's locals that cannot be read: nothing to tell from them
        local_values = []
    module_globals = frame.f_globals
    if type(module_globals) is not dict:
        return local_values, []
    return local_values, [module_globals.get(name) for name in frame.f_code.co_names]


#: How far `_walk` follows references from a frame's locals and the globals its code
#: names: that many steps through items of built-in containers and attributes.
DEPTH = 3
#: Steps `_walk` follows from a frame of a library's code (or the standard library's):
#: its locals' attributes and items only.  A library's locals reach its own state (a
#: framework's whole configuration), not the program's objects in use.
LIBRARY_DEPTH = 1
#: Values `_walk` looks at, at most, from one frame (numbers and strings included, each
#: container's items counted each time it is reached).
WALK_LIMIT = 32768
#: Types whose values refer to nothing and are no object a program adopts: not walked.
_LEAVES = frozenset({int, float, complex, str, bytes, bool, type(None)})


class _FrameReach:
    """What one frame refers to (see `_reach`): the ids of the objects, and the types
    they have by id (a type's id stands for it while the frame's objects are alive)."""

    __slots__ = ("code_library", "ids", "kinds")

    def __init__(self, code_library: Optional[str]) -> None:
        self.code_library = code_library
        self.ids: set[int] = set()
        self.kinds: dict[int, type] = {}

    def add(self, values: list[Any]) -> None:
        # (in C: ids compared as ints, types keyed by id: no __hash__ of the program's)
        self.ids.update(map(id, values))
        kinds = list(map(type, values))
        self.kinds.update(zip(map(id, kinds), kinds))


def _reach(frames: list[FrameType]) -> list[_FrameReach]:
    """What each of ``frames`` (outermost first) refers to: its `_roots`, and what they
    reach in at most `DEPTH` steps (`LIBRARY_DEPTH` from a library's frame, whose named
    globals count as themselves only: a library's or the standard library's globals are
    its own state, shared by every thread, threading's table of all threads for one),
    breadth first (nearest first, so `WALK_LIMIT` per frame cuts off the farthest), a step
    being an item of a built-in container (keys and values; see `_items`), an attribute
    of an object that keeps a standard attribute dict, or the object a bound method is
    bound to.  Each object is expanded once, from the outermost frame that reaches it
    (again from an inner frame that reaches it in fewer steps).  Runs no code of the
    program's: objects are told apart by identity and by their exact type, and an
    attribute dict is read only through the standard slot."""
    found: list[_FrameReach] = []
    nearest: dict[int, int] = {}  # id -> the smallest depth it was expanded at
    for frame in frames:
        reach = _FrameReach(_stacks.code_library(frame.f_code))
        found.append(reach)
        level, named = _roots(frame)
        own = _stacks.kind(frame.f_code) == _stacks.OWN
        steps = DEPTH if own else LIBRARY_DEPTH
        if own:
            level.extend(named)
        else:
            reach.add(named)
        budget = WALK_LIMIT
        for depth in range(steps + 1):
            reach.add(level)
            budget -= len(level)
            if budget < 0 or depth == steps:
                break
            deeper: list[Any] = []
            for value in level:
                kind = type(value)
                if kind in _LEAVES:
                    continue
                key = id(value)
                seen_at = nearest.get(key)
                if seen_at is not None and seen_at <= depth:
                    continue  # (expanded already, as near or nearer)
                nearest[key] = depth
                if kind is MethodType or kind is BuiltinMethodType:
                    deeper.append(value.__self__)
                    continue
                items = _items(value)
                if items is None:
                    attrs = _stacks.instance_dict(value)
                    items = list(attrs.values()) if attrs is not None else None
                if items:
                    deeper.extend(items)
            level = deeper
            if not level:
                break
    return found


def _walk(frames: list[FrameType], target: int, library: Optional[str]) -> Optional[int]:
    """The index of the outermost of ``frames`` that refers to the object whose id is
    ``target`` or, given its ``library``, runs that package's code or refers to any
    object of it (see `_reach`); ``None`` if none does."""
    return _first(_reach(frames), target, library)


def _first(reach: list[_FrameReach], target: int, library: Optional[str]) -> Optional[int]:
    for index, frame in enumerate(reach):
        if target in frame.ids:
            return index
        if library is not None and (frame.code_library == library or any(
            _library_of_type(kind) == library for kind in list(frame.kinds.values())
        )):
            return index
    return None


#: Thread ident -> (its stack's key, its scheduler statistics, its `_reach`), kept while
#: the thread has not run since (`_reach_of`).
_reaches: dict[
    int, tuple[tuple[tuple[int, int, int], ...], tuple[int, int, int], list[_FrameReach]]
] = {}


if hasattr(os, "register_at_fork"):  # (a child's threads are not its parent's)
    os.register_at_fork(after_in_child=_reaches.clear)


def _reach_of(ident: int, frames: list[FrameType]) -> list[_FrameReach]:
    """Thread ``ident``'s `_reach`, walked again unless it was walked with the same
    frames at the same instructions and the thread has not run since (its scheduler
    statistics unchanged, `_threads.schedstat`; without them, always walked): a thread
    blocked in a wait changes nothing of its own.  The exit teardown checks each adopted
    object in turn, and an idle thread holding much is then walked once, not once per
    object (3,000 objects, one idle thread holding 4,000 objects: 31.9 s walked each
    time).  No object is kept: ids, and types (alive as long as an object has them)."""
    stats = _threads.schedstat(ident)
    key = tuple((id(frame), id(frame.f_code), frame.f_lasti) for frame in frames)
    cached = _reaches.get(ident)
    if stats is not None and cached is not None and cached[0] == key and cached[1] == stats:
        return cached[2]
    reach = _reach(frames)
    if stats is None:
        _reaches.pop(ident, None)
    else:
        _reaches[ident] = (key, stats, reach)
    return reach


#: id of a type -> (the type, kept so the id stands for it; the installed package its
#: class is defined in), see `_library_of_type`.  By id: hashing a class could run a
#: metaclass's ``__hash__`` of the program's.
_type_libraries: dict[int, tuple[type, Optional[str]]] = {}
_type_module = type.__dict__["__module__"]


def _library_of_type(kind: type) -> Optional[str]:
    """The installed package ``kind`` comes from (read through ``type``'s own
    ``__module__``: no metaclass of the program's runs), or ``None``."""
    known = _type_libraries.get(id(kind))
    if known is not None and known[0] is kind:
        return known[1]
    try:
        module = _type_module.__get__(kind, type)
    except Exception:  # (a type whose module cannot be read: no library)
        module = None
    found = _stacks.library_of(module if isinstance(module, str) else None)
    _type_libraries[id(kind)] = (kind, found)
    return found


#: Items of one container that `_items` takes, at most (it runs for each frame of each
#: other thread at exit).
SCAN_LIMIT = 4096


def _items(value: Any) -> Optional[list[Any]]:
    """The items of ``value`` if it is a built-in container (a dict: its keys and
    values), a subclass of one included (``defaultdict``, ``OrderedDict``, a class of the
    program's) and a ``deque``, else ``None``; taken by the base type's own C methods, so
    no code of the program's runs (no ``__iter__``, ``__eq__`` or ``__hash__`` of its own),
    and no other thread's change to the container can fail the copy.  The first
    `SCAN_LIMIT` items of a list, tuple or deque; a set or dict only up to that size (a
    bigger one: no items)."""
    kind = type(value)
    if issubclass(kind, list):
        return list.__getitem__(value, slice(0, SCAN_LIMIT))
    if issubclass(kind, tuple):
        return list(tuple.__getitem__(value, slice(0, SCAN_LIMIT)))
    if issubclass(kind, dict):
        if dict.__len__(value) > SCAN_LIMIT:
            return []
        return [*dict.values(value), *dict.keys(value)]
    if issubclass(kind, (set, frozenset)):
        base: Any = set if issubclass(kind, set) else frozenset
        return [] if base.__len__(value) > SCAN_LIMIT else list(base.__iter__(value))
    if kind is _deque:
        return list(value)[:SCAN_LIMIT]
    return None


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
        stack: list[FrameType] = []
        while frame is not None:
            if not _stacks.is_exitsafe_file(frame.f_code.co_filename):
                stack.append(frame)
            frame = frame.f_back
        stack.reverse()  # (outermost first: the thread's own loop, rather than a method)
        # (a program's thread: any object of the package, or its code, counts too)
        try:
            at = _first(_reach_of(ident, stack), id(obj), library if own else None)
        except Exception as exc:  # (what it refers to cannot be told: counted as a use,
            found[ident] = (  # the safe side: parked or waited for, never closed under)
                f"thread {_threads.thread_name(ident)!r} (its stack could not be read: "
                f"{exc!r})", own,
            )
            continue
        if at is not None:
            outermost = stack[at]
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
