"""Thread-affine releases waiting for their owning thread (``track(..., affinity=...)``).

A release that became due on a thread other than the handle's owner is queued by
`exitsafe._threads`; the owning thread runs its queue here: at its next exitsafe
call (quietly: errors logged) or at an explicit [`exitsafe.run_pending`][exitsafe.run_pending].
"""

from __future__ import annotations

from . import _sync, _threads
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["run_pending"]

_reentered = _sync.reentered
_release = _sync.release
_deferred = _sync._deferred
_run_deferred = _sync.run_deferred
_affine = _threads.pending


def run_pending() -> None:
    """Run the releases queued for the calling thread, and any queued release requests.

    A thread-affine handle (``track(..., affinity="creator")``) whose release became due
    on another thread waits in a queue for its owning thread; that thread runs it at
    its next exitsafe call, or here.  Call it where the owning thread can safely
    release (between two frames of a render loop, with its GL context current).  An
    exception of a release function propagates here after every queued release ran.
    """
    error = _run_mine()
    if error is not None:
        try:
            raise error
        finally:
            error = None  # (no frame of ours keeps it: see Registry._release_chain)


def _run_mine() -> Optional[BaseException]:
    """Run the calling thread's queued affine releases; the first error, not raised."""
    if _reentered():
        return None  # never inside a section: it runs after it
    try:
        _sync.enter()
        nodes = _threads.take_mine()
    finally:
        try:
            _release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
    first: Optional[BaseException] = None
    for node in nodes:
        error = node._registry._release_chain(node)
        if first is None:
            first = error
        error = None  # (no frame of ours keeps it: see Registry._release_chain)
    if _deferred:
        _run_deferred()
    try:
        return first
    finally:
        del first


def _run_mine_quietly() -> None:
    """`_run_mine` from an unrelated exitsafe call: errors are logged, not raised."""
    import threading

    if threading.current_thread() not in _affine:
        return
    error = _run_mine()
    try:
        if error is not None and _sync.is_interrupt(error):
            raise error  # a Ctrl-C that came meanwhile: the caller's, as for any exitsafe call
        if error is not None:
            log().error("exitsafe: a queued thread-affine release failed: %s", repr(error))
    finally:
        error = None  # (no frame of ours keeps it: see Registry._release_chain)

