"""Garbage collections in progress, and the teardowns asked for inside one.

A cyclic garbage collection first clears every weak reference to the garbage it found,
then runs the garbage's finalizers one by one.  A teardown asked for by one of those
finalizers (a release function of a collected handle that calls ``teardown()``) would
run while the other handles of the same garbage are neither live nor ended: the
pure-Python core's live table refers to its handles weakly and no longer sees them,
while the compiled core's sees them all, so the two would decide differently, and a
parent waiting for such a handle could be left with no outcome at all.  So a teardown
asked for on the thread running a collection waits until that collection ends (its
``"stop"`` callback, `gc.callbacks`): by then every finalizer of the garbage ran, and
the teardown sees what both cores see.

`install` adds the callback once, when exitsafe is imported; it costs one Python call
at the start and at the end of each collection.
"""

from __future__ import annotations

import _thread
import gc
import sys

from . import _config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["after_collection", "collecting", "collecting_here", "install"]

#: The thread running a collection (0: none).
_collecting = [0]
#: What waits for the end of the collection in progress, oldest first.
_waiting: list[tuple[Callable[..., object], tuple[Any, ...]]] = []


def collecting_here() -> bool:
    """Whether the calling thread is running a garbage collection (one of its
    finalizers or weak-reference callbacks calls exitsafe)."""
    return _collecting[0] == _thread.get_ident()


def collecting() -> bool:
    """Whether a garbage collection is running on any thread (its finalizers may still
    be to come for handles whose weak references it already cleared)."""
    return bool(_collecting[0])


def after_collection(fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` when the collection in progress on this thread ends (from its
    ``"stop"`` callback, on this thread: one collection runs at a time)."""
    _waiting.append((fn, args))


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collecting[0] = _thread.get_ident()
        return
    _collecting[0] = 0
    # Every request runs, here, now: one left in the list would run at a later collection,
    # maybe on another thread.  An interrupt one of them raises (a signal held back by its
    # teardown, delivered at its end) is raised again once all have run: CPython hands
    # it to sys.unraisablehook (exitsafe.signals' sends its signal again).
    todo = list(_waiting)
    _waiting.clear()
    interrupt: Optional[BaseException] = None
    for fn, args in todo:
        try:
            fn(*args)
        except Exception as exc:  # a callback of the collector cannot raise: logged
            from ._report import error_from_finalizer

            error_from_finalizer(
                "exitsafe: a teardown asked for during a garbage collection failed: %s",
                repr(exc),
            )
        except BaseException as exc:  # (KeyboardInterrupt, a signal's SystemExit)
            interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt


def install() -> None:
    """Add the collector's callback (once).

    Not in a subinterpreter of CPython 3.9: its ``gc`` module is single-phase init, so a
    subinterpreter's ``gc.callbacks`` is the main interpreter's own list (copied from the
    main interpreter's module dict).  The callback would run for the main interpreter's
    collections, not this interpreter's (it never learns of those), and go on running
    after this interpreter ended, its module globals cleared to ``None`` ("Exception
    ignored in _on_collection" at every later collection).  There `collecting_here`
    stays false."""
    if sys.version_info < (3, 10) and _config.interpreter_id() != 0:
        return
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def after_fork_in_child() -> None:
    """In a forked child: the collection of another thread of the parent does not go on
    here (one of the forking thread does, and ends as usual); what waited for it were
    the parent's requests."""
    if _collecting[0] != _thread.get_ident():
        _collecting[0] = 0
    _waiting.clear()
