"""Guarded callbacks: Python callables handed to native code that go quiet at teardown."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ._registry import Registry


class Guarded:
    """A callable that forwards to `fn` until its registry's teardown begins.

    Made by [`exitsafe.guard`][exitsafe.guard] (and used by the adapters' `callback`).  From
    the moment teardown begins (at exit, or an explicit [`exitsafe.teardown`][exitsafe.teardown])
    every call returns `default` without calling `fn`, on whatever thread the native code
    calls from, so a native thread that calls back late finds a harmless no-op.  Exceptions
    raised by `fn` before that propagate unchanged.  The check reads one property of the
    registry and no module global, so it stays safe while the interpreter finalizes modules.

    Keeping the native side's function pointer alive is the FFI adapter's job
    ([`exitsafe.cffi.callback`][exitsafe.cffi.callback]); a `Guarded` only decides whether to
    call.  The wrapped callable is `__wrapped__`.

    Args:
        fn: the callable to forward to.
        default: what a call returns once teardown has begun.
        registry: the registry whose teardown silences it.

    Attributes:
        default: what a call returns once teardown has begun.

    Raises:
        TypeError: `fn` is not callable, or `registry` is not a [`Registry`][exitsafe.Registry].
    """

    __slots__ = ("__wrapped__", "_registry", "default")

    def __init__(self, fn: Callable[..., Any], default: Any, registry: Registry) -> None:
        from ._registry import Registry

        if not callable(fn):
            raise TypeError(
                f"guard() needs a callable, got {type(fn).__name__}: pass the function itself "
                f"(guard(on_log), not guard(on_log(...)))"
            )
        if not isinstance(registry, Registry):
            raise TypeError(
                f"registry must be an exitsafe.Registry, got {type(registry).__name__}"
            )
        self.__wrapped__ = fn
        self.default = default
        self._registry = registry

    @property
    def active(self) -> bool:
        """``True`` until teardown begins; then calls return ``default``."""
        return not self._registry.tearing_down

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._registry.tearing_down:
            return self.default
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        state = "active" if self.active else "silenced"
        return f"<exitsafe.lowlevel.Guarded {self.__wrapped__!r} {state}>"
