"""Guarded callbacks: Python callables handed to native code that go quiet at teardown."""

from __future__ import annotations

import _thread

from ._phase import TEARING as _TEARING
from ._threads import borrowing_in

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ._registry import Registry


class Guarded:
    """A callable that forwards to `fn` until its registry's teardown begins.

    Made by [`exitsafe.guard`][exitsafe.guard] (and used by the adapters' `callback`).  From
    the moment teardown begins (at exit, or an explicit [`exitsafe.teardown`][exitsafe.teardown])
    every call returns `default` without calling `fn`, on whatever thread the native code
    calls from, so a native thread that calls back late finds a harmless no-op; that includes
    a release the teardown runs that logs through the callback.  Two kinds of call still
    reach `fn` while the teardown runs (the interpreter is whole then): a call made on a
    thread inside a [`borrow`][exitsafe.Handle.borrow] of one of the registry's handles
    (the teardown waits for that call to end: its callbacks are part of it, a comparison
    function called by `qsort`, a read callback called by a decoder), and, with
    `from_releases=True`, a call made on the teardown's own thread (or on the worker thread
    running one of its steps): a release calling back on purpose (SQLite's `xDestroy` when
    the connection closes, freeing what the program attached).  Once the teardown is over
    every call returns `default`.
    Exceptions raised by `fn` propagate unchanged.  The check reads the registry's state and
    no module global, so it stays safe while the interpreter finalizes modules.

    Keeping the native side's function pointer alive is the FFI adapter's job
    ([`exitsafe.cffi.callback`][exitsafe.cffi.callback]); a `Guarded` only decides whether to
    call.  The wrapped callable is `__wrapped__`.

    Args:
        fn: the callable to forward to.
        default: what a call returns once teardown has begun.
        registry: the registry whose teardown silences it.
        from_releases: let through, while the teardown runs, the calls made on its own
            thread (by the releases it runs); default `False`.

    Attributes:
        default: what a call returns once teardown has begun.

    Raises:
        TypeError: `fn` is not callable, or `registry` is not a [`Registry`][exitsafe.Registry].
    """

    __slots__ = ("__wrapped__", "_from_releases", "_state", "default")

    #: Read through the instance: no module global is needed while the interpreter finalizes.
    _get_ident = staticmethod(_thread.get_ident)
    _borrowing_in = staticmethod(borrowing_in)
    _tearing = _TEARING

    def __init__(
        self,
        fn: Callable[..., Any],
        default: Any,
        registry: Registry,
        *,
        from_releases: bool = False,
    ) -> None:
        from ._registry import Registry, state_of

        if not callable(fn):
            raise TypeError(
                f"guard() needs a callable, got {type(fn).__name__}: pass the function itself "
                f"(guard(on_log), not guard(on_log(...)))"
            )
        if not isinstance(registry, Registry):
            raise TypeError(
                f"registry must be an exitsafe.Registry, got {type(registry).__name__}"
            )
        if not isinstance(from_releases, bool):
            raise TypeError(
                f"from_releases must be True or False, got {type(from_releases).__name__}"
            )
        self.__wrapped__ = fn
        self.default = default
        self._from_releases = from_releases
        self._state = state_of(registry)

    @property
    def active(self) -> bool:
        """``True`` until teardown begins; then calls return ``default``."""
        return not self._state.phase

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self._state
        phase = state.phase
        if phase and not (phase == self._tearing and self._lets_through(state)):
            return self.default
        return self.__wrapped__(*args, **kwargs)

    def _lets_through(self, state: Any) -> bool:
        """While the teardown runs: whether this call is part of what it waits for."""
        if self._from_releases and self._get_ident() in state.gate.allowed:
            return True
        return self._borrowing_in(state)

    def __repr__(self) -> str:
        state = "active" if self.active else "silenced"
        return f"<exitsafe.lowlevel.Guarded {self.__wrapped__!r} {state}>"
