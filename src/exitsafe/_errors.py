"""The exception hierarchy of exitsafe.

Every error exitsafe raises on purpose derives from [`ExitsafeError`][exitsafe.ExitsafeError], so a
binding can catch "anything exitsafe refused" in one clause.  Errors that are
also a wrong *kind* of argument additionally derive from the matching builtin
(``TypeError`` / ``ValueError``) so that generic argument checking still works.

The errors are public in two tiers, and ``exitsafe/__init__.py`` gives each the
``__module__`` of its tier, the name a traceback shows: `exitsafe` has the errors a
program catches and handles (a closed handle or registry, a strict release refused, an
object already owned); `exitsafe.lowlevel` has those that report a wrong call, to be fixed
in the code rather than caught (a dependency cycle, a handle of another registry, a call
from a finalizer that interrupted exitsafe, an attribute that cannot be neutralized).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Optional

    from ._handle import Handle


class ExitsafeError(Exception):
    """Base class of every error raised by exitsafe."""


class HandleClosedError(ExitsafeError):
    """The handle was released or leaked; its native object must not be used.

    Raised by [`Handle.raw`][exitsafe.Handle.raw], [`Handle.retain`][exitsafe.Handle.retain],
    [`Handle.borrow`][exitsafe.Handle.borrow] and by ``depends_on=`` when they name a handle that is
    no longer usable.
    """


class RegistryClosedError(ExitsafeError):
    """Strict mode only: a registration arrived after the registry's teardown began.

    Outside strict mode the registration succeeds but the new handle is leaked
    at once (recorded as ``leaked_after_close``) and its release never runs.
    """


class LiveDependentsError(ExitsafeError):
    """Strict mode only: a handle was released while handles depending on it live.

    The release did not happen and the handle's owner count is unchanged.  Outside strict
    mode the native release is deferred until the last dependent is gone instead.

    Args:
        message: the error message.
        dependents: the display names of the live dependents.

    Attributes:
        dependents: the display names of the live dependents, as a tuple.
    """

    def __init__(self, message: str, dependents: Sequence[str]) -> None:
        super().__init__(message)
        self.dependents: tuple[str, ...] = tuple(dependents)


class AlreadyTrackedError(ExitsafeError, ValueError):
    """The object (or native pointer) already has a live exitsafe handle.

    Raised by [`adopt`][exitsafe.adopt] for an object adopted twice and by
    [`exitsafe.cffi.track`][exitsafe.cffi.track] / [`exitsafe.ctypes.track`][exitsafe.ctypes.track]
    for a pointer that is already tracked (releasing it twice would be a double free).  Also
    a `ValueError`.

    Args:
        message: the error message.
        handle: the existing handle, or `None`.

    Attributes:
        handle: the existing handle: call `handle.retain()` to share ownership.  `None` when
            another thread is registering the same object at this moment.
    """

    def __init__(self, message: str, handle: Optional[Handle]) -> None:
        super().__init__(message)
        self.handle = handle


class DependencyCycleError(ExitsafeError, ValueError):
    """A dependency would close a cycle in the handle graph.

    Raised by `track(..., depends_on=...)`,
    [`Handle.add_dependency`][exitsafe.Handle.add_dependency] and hook edges; the graph is left
    unchanged.  Also a `ValueError`.

    Args:
        message: the error message.
        cycle: the display names of the handles on the cycle.

    Attributes:
        cycle: the display names of the handles on the cycle, starting and ending with the
            same handle (`("a", "b", "a")`).
    """

    def __init__(self, message: str, cycle: Sequence[str]) -> None:
        super().__init__(message)
        self.cycle: tuple[str, ...] = tuple(cycle)


class ForeignHandleError(ExitsafeError, ValueError):
    """A handle of another registry was used where this registry's was needed.

    Dependencies never cross registries: each registry tears down on its own,
    so an edge between two of them could not be honoured.
    """


class ReentrancyError(ExitsafeError, RuntimeError):
    """An exitsafe call that must answer at once arrived while exitsafe itself was
    interrupted on the same thread.

    Python may run a finalizer (a ``__del__``, a weakref callback, a garbage
    collection) or a signal handler in the middle of one of exitsafe's own short
    bookkeeping steps.  If that code calls exitsafe, waiting for the interrupted step
    would mean waiting for itself.  Release requests (``Handle.release()``, the
    garbage collection of a handle, the end of a borrow, cancelling a hook,
    ``teardown()``) are therefore queued and run right after the interrupted step;
    calls that must return a result (``track``, ``retain``, ``detach`` ...) raise
    this error instead of hanging.  Move such calls out of ``__del__`` methods and
    signal handlers.
    """


class NeutralizeError(ExitsafeError, AttributeError):
    """An attribute cannot be neutralized on this object.

    Raised when [`neutralize`][exitsafe.lowlevel.neutralize] or
    [`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit] is called (never later, at
    exit): the attribute is missing, is a read-only property or descriptor, or the object
    refuses assignment (a frozen dataclass or attrs class, a custom ``__setattr__`` that
    raises).  Also an `AttributeError`.
    """


class ReleaseError(ExitsafeError):
    """A release function made with [`exitsafe.checked`][exitsafe.checked] returned a failure.

    Raised by the explicit [`Handle.release()`][exitsafe.Handle.release] whose native release
    failed; at teardown or on garbage collection the handle is recorded as ``release_failed``
    instead, with this error as the entry's detail.

    Args:
        message: the error message, naming the function and its result.
        result: what the release function returned.

    Attributes:
        result: what the release function returned.
    """

    def __init__(self, message: str, *, result: object = None) -> None:
        super().__init__(message)
        self.result = result
