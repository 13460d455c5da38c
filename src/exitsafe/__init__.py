"""exitsafe: make programs that hold native handles exit cleanly.

Declare each native object with :func:`track` (and the libraries their
release code runs in with :func:`pin`), say what depends on what, and
exitsafe releases them in a safe order whatever way the process ends, or
leaks them on purpose where releasing is unsafe.  See the README and
``docs/`` for the concepts; every name here acts on the process-wide
:func:`default_registry` unless you create a :class:`Registry` of your own.

Importing exitsafe is cheap: it imports no FFI library and nothing beyond
a few builtin modules.
"""

from __future__ import annotations

from ._errors import (
    DependencyCycleError,
    ExitsafeError,
    ForeignHandleError,
    HandleClosedError,
    LiveDependentsError,
    RegistryClosedError,
)
from ._guard import Guarded
from ._ledger import LedgerEntry, Outcome
from .lifetime import Handle, HandleInfo, Registry, default_registry, registries

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional, TypeVar

    from .lifetime import ExitPolicy
    from .objects import (
        AlreadyTrackedError,
        NeutralizeError,
        adopt,
        handle_of,
        neutralize,
        neutralize_at_exit,
    )
    from .wrapper import NativeObject

    T = TypeVar("T")

__version__ = "0.1.0"

__all__ = [
    "AlreadyTrackedError",
    "DependencyCycleError",
    "ExitsafeError",
    "ForeignHandleError",
    "Guarded",
    "Handle",
    "HandleClosedError",
    "HandleInfo",
    "LedgerEntry",
    "LiveDependentsError",
    "NativeObject",
    "NeutralizeError",
    "Outcome",
    "Registry",
    "RegistryClosedError",
    "__version__",
    "adopt",
    "default_registry",
    "guard",
    "handle_of",
    "ledger",
    "neutralize",
    "neutralize_at_exit",
    "on_teardown",
    "pin",
    "registries",
    "teardown",
    "track",
]


#: Names imported from their module on first access (PEP 562), so that importing
#: exitsafe does not load the adapters' code.
_LAZY = {
    "AlreadyTrackedError": "objects",
    "NeutralizeError": "objects",
    "adopt": "objects",
    "handle_of": "objects",
    "neutralize": "objects",
    "neutralize_at_exit": "objects",
    "NativeObject": "wrapper",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'exitsafe' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def track(
    raw: object,
    release: Callable[[Any], object],
    *,
    kind: str = "handle",
    depends_on: Iterable[Handle] = (),
    exit_policy: Optional[ExitPolicy] = None,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Start owning ``raw`` in the default registry; see :meth:`Registry.track`."""
    return default_registry().track(
        raw,
        release,
        kind=kind,
        depends_on=depends_on,
        exit_policy=exit_policy,
        name=name,
        timeout=timeout,
    )


def pin(
    library: object,
    *,
    close: Optional[Callable[[Any], object]] = None,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Pin a loaded library in the default registry; see :meth:`Registry.pin`."""
    return default_registry().pin(library, close=close, name=name, timeout=timeout)


def on_teardown(
    fn: Callable[[], object],
    *,
    before: Iterable[Handle] = (),
    after: Iterable[Handle] = (),
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Register a teardown hook in the default registry; see :meth:`Registry.on_teardown`."""
    return default_registry().on_teardown(
        fn, before=before, after=after, name=name, timeout=timeout
    )


def guard(
    fn: Callable[..., T], *, default: Any = None, registry: Optional[Registry] = None
) -> Guarded:
    """Wrap ``fn`` for native code: it returns ``default`` without calling ``fn`` once
    ``registry``'s (by default the default registry's) teardown has begun.

    See :class:`Guarded` for the thread rules.
    """
    return Guarded(fn, default, registry if registry is not None else default_registry())


def teardown(reason: str = "explicit") -> None:
    """Run the default registry's ordered teardown now; see :meth:`Registry.teardown`.

    Idempotent.  Only the default registry is torn down; other registries
    still tear down at exit (or call their own :meth:`Registry.teardown`).
    """
    default_registry().teardown(reason=reason)


def ledger() -> list[LedgerEntry]:
    """The default registry's ledger; see :meth:`Registry.ledger`."""
    return default_registry().ledger()
