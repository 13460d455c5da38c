"""Which other threads' Python code refers to an object: the check that keeps the exit
teardown from closing an adopted object under a thread still using it.

An adopted object (`exitsafe.adopt`) that the program also hands to a thread, without
the borrowing view, a worker or `quiesce()`, is closed by the exit teardown whatever
that thread is doing with it (a write in flight into an HDF5 file, a frame into a video
encoder).  Before such a close, `wait_until_unused` looks at every other thread that
may still run: a thread *uses* the object when a frame of its Python stack refers to it

* as a local or closure variable (or a bound method of it),
* as a module global that the frame's code names, or
* as an attribute of a local (``self.writer``), one level deep.

The close then waits (bounded) for those references to go, and otherwise does not
happen: the handle ends ``leaked_in_use``, its detail naming the thread and the frame.
It is a conservative test: a thread that holds the object without calling it (idle in
a ``queue.get()`` with it in a local) counts, since it may wake and call it; native
code that kept the object's pointer, with no Python frame referring to it, is not seen.

Threads that never run the object's code again are not counted: the calling thread,
threads parked for good (a refused borrow, `quiesce()`), the threads `quiesce()` covers
(their next call parks them), exitsafe's own step workers, and threads whose innermost
frame is inside exitsafe (the teardown's thread waiting for a step, a thread at the
borrow gate).  With no such other thread, the check costs one ``sys._current_frames()``.
"""

from __future__ import annotations

import sys
from os.path import dirname
from time import monotonic, sleep
from types import BuiltinMethodType, MethodType, ModuleType

from . import _quiesce, _threads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Optional

__all__ = ["InUse", "users_of", "wait_until_unused"]

#: Seconds the exit teardown waits, at most, for other threads to stop referring to an
#: adopted object before it leaks it instead of closing it.
USE_WAIT = 1.0

_PACKAGE_DIR = dirname(__file__)

#: Bound methods: ``writer.write`` in a local uses ``writer``.
_METHODS = (MethodType, BuiltinMethodType)


class InUse(Exception):
    """A release not run: another thread's code still refers to the object (the exit
    teardown records the handle ``leaked_in_use``, with this message as its detail)."""


def _exitsafe_code(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return filename.startswith(_PACKAGE_DIR) and not filename.startswith(
        _PACKAGE_DIR + "/lab/scenarios/"
    )


def _refers_to(frame: FrameType, obj: object) -> bool:
    """Whether ``frame`` refers to ``obj`` (see the module's docstring)."""
    try:
        local_values = list(frame.f_locals.values())
    except Exception:  # a frame's locals that cannot be read: nothing to tell from them
        local_values = []
    for value in local_values:
        if value is obj or (type(value) in _METHODS and value.__self__ is obj):
            return True
    for value in local_values:
        if isinstance(value, (type, ModuleType)):
            continue
        try:
            attrs = object.__getattribute__(value, "__dict__")
            if type(attrs) is not dict:
                continue
            if any(v is obj for v in list(attrs.values())):
                return True
        except Exception:  # no __dict__, or a class's own __dict__ descriptor failed:
            continue  # nothing to tell one level down (no user code is called otherwise)
    module_globals = frame.f_globals
    return any(module_globals.get(name) is obj for name in frame.f_code.co_names)


def _skipped() -> set[int]:
    """The threads that never run the object's code again (see the module's docstring)."""
    skip = set(_quiesce.covered())
    steps = sys.modules.get("exitsafe._steps")
    worker_idents = getattr(steps, "worker_idents", None)
    if worker_idents is not None:
        skip |= worker_idents()
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
        if ident in skip or frame is None or _exitsafe_code(frame):
            continue
        outermost: Optional[FrameType] = None  # the thread's own loop, rather than a method
        while frame is not None:
            if _refers_to(frame, obj):
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
    deadline = monotonic() + bound
    pause = 0.001
    while users and monotonic() < deadline:
        sleep(pause)
        pause = min(pause * 2, 0.05)
        users = users_of(obj)
    if users:
        raise InUse(
            "still used by " + ", ".join(sorted(users.values()))
            + f" after {bound:.3g} s; not closed under it (borrow it through "
            "handle.borrowing(), or declare the thread with exitsafe.worker() or quiesce())"
        )
