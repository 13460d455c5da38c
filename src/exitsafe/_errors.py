"""The exception hierarchy of exitsafe.

Every error exitsafe raises on purpose derives from [`ExitsafeError`][exitsafe.ExitsafeError], so a
binding can catch "anything exitsafe refused" in one clause.  Errors that are
also a wrong *kind* of argument additionally derive from the matching builtin
(``TypeError`` / ``ValueError``) so that generic argument checking still works.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


class ExitsafeError(Exception):
    """Base class of every error raised by exitsafe."""


class HandleClosedError(ExitsafeError):
    """The handle was released or leaked; its native object must not be used.

    Raised by [`Handle.raw`][exitsafe.Handle.raw], [`Handle.retain`][exitsafe.Handle.retain],
    [`Handle.borrow`][exitsafe.Handle.borrow] and by ``depends_on=`` when they name a handle that is
    no longer usable.
    """


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
