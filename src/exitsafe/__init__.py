"""exitsafe: make programs that hold native handles exit cleanly.

Declare each native object with [`track`][exitsafe.track] (and the libraries their
release code runs in with [`pin`][exitsafe.pin]), say what depends on what, and
exitsafe releases them in a safe order whatever way the process ends, or
leaks them on purpose where releasing is unsafe.  See the README and
``docs/`` for the concepts; every name here acts on the process-wide
[`default_registry`][exitsafe.default_registry] unless you create a [`Registry`][exitsafe.Registry]
of your own.

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
    ReentrancyError,
    RegistryClosedError,
)
from ._guard import Guarded
from ._handle import Handle, HandleInfo
from ._ledger import LedgerEntry, Outcome
from ._process import default_registry, registries
from ._registry import Registry, run_pending

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, NoReturn, Optional, TypeVar

    from ._adopt import (
        AlreadyTrackedError,
        NeutralizeError,
        adopt,
        handle_of,
        neutralize,
        neutralize_at_exit,
    )
    from ._registry import ExitPolicy
    from ._wrapper import NativeObject

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
    "ReentrancyError",
    "Registry",
    "RegistryClosedError",
    "__version__",
    "adopt",
    "default_registry",
    "exit",
    "guard",
    "handle_of",
    "ledger",
    "neutralize",
    "neutralize_at_exit",
    "on_early_exit",
    "on_teardown",
    "pin",
    "registries",
    "run_pending",
    "set_fork_exit",
    "teardown",
    "track",
    "worker",
]


#: Names imported from their module on first access (PEP 562), so that importing
#: exitsafe does not load the adapters' code.
_LAZY = {
    "AlreadyTrackedError": "_adopt",
    "NeutralizeError": "_adopt",
    "adopt": "_adopt",
    "handle_of": "_adopt",
    "neutralize": "_adopt",
    "neutralize_at_exit": "_adopt",
    "NativeObject": "_wrapper",
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
    affinity: Optional[str] = None,
) -> Handle:
    """Start owning ``raw`` in the default registry; see
    [`Registry.track`][exitsafe.Registry.track]."""
    return default_registry().track(
        raw,
        release,
        kind=kind,
        depends_on=depends_on,
        exit_policy=exit_policy,
        name=name,
        timeout=timeout,
        affinity=affinity,
    )


def pin(
    library: object,
    *,
    close: Optional[Callable[[Any], object]] = None,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Pin a loaded library in the default registry; see [`Registry.pin`][exitsafe.Registry.pin]."""
    return default_registry().pin(library, close=close, name=name, timeout=timeout)


def on_teardown(
    fn: Callable[[], object],
    *,
    before: Iterable[Handle] = (),
    after: Iterable[Handle] = (),
    name: Optional[str] = None,
    timeout: Optional[float] = None,
    in_child: str = "skip",
) -> Handle:
    """Register a teardown hook in the default registry; see
    [`Registry.on_teardown`][exitsafe.Registry.on_teardown]."""
    return default_registry().on_teardown(
        fn, before=before, after=after, name=name, timeout=timeout, in_child=in_child
    )


def on_early_exit(
    fn: Callable[[], object], *, name: Optional[str] = None, timeout: Optional[float] = None
) -> Handle:
    """Run ``fn()`` in the early phase of the exit, before the interpreter joins its
    threads (stop servers, executors, pools there); see
    [`Registry.on_early_exit`][exitsafe.Registry.on_early_exit]."""
    return default_registry().on_early_exit(fn, name=name, timeout=timeout)


def worker(
    thread: Any,
    *,
    stop: Any,
    uses: Iterable[Handle] = (),
    timeout: Optional[float] = None,
    name: Optional[str] = None,
) -> Handle:
    """Declare a thread that uses handles and how to stop it; see
    [`Registry.worker`][exitsafe.Registry.worker].

    At exit the thread is asked to stop and joined (bounded) before any handle in
    ``uses`` is released; if it does not end, those handles are leaked and the thread
    is parked at its next borrow.
    """
    return default_registry().worker(thread, stop=stop, uses=uses, timeout=timeout, name=name)


def exit(code: Optional[int] = 0) -> NoReturn:
    """Leave this process quietly: tear down what it owns, flush ``sys.stdout`` and
    ``sys.stderr``, and end with ``os._exit(code)``.

    Like Rust's ``process::exit``: nothing else runs, neither module finalization (so
    no ``__del__`` of an object inherited from a parent process) nor the C-level
    ``atexit`` handlers of native libraries, which in a forked child may hang or crash
    on the parent's driver state.  Every registry is torn down first (handles this
    process created are released in order; inherited ones end ``leaked_inherited``),
    and the ledger is written if ``EXITSAFE_LEDGER`` asks for it.  ``code``: 0-255,
    or ``None`` for 0.  Meant for forked children (see ``docs/fork.md``); in any
    other process it skips what a normal exit would do, ``finally`` blocks of other
    frames included.  Never returns.
    """
    from ._children import leave

    leave(code)


def set_fork_exit(mode: str) -> None:
    """How forked children of this process end when they end normally.

    ``"quiet"``: a child created by ``os.fork()`` after this call that ends normally
    (the end of the main program, ``sys.exit(n)``, an uncaught exception) leaves the
    way [`exit`][exitsafe.exit] does, with its exit status, once its exit teardown ran.
    ``"normal"`` (the default): the usual interpreter exit.  The environment variable
    ``EXITSAFE_FORK_EXIT=quiet|normal`` sets the same for programs you do not edit;
    this function takes precedence.  Multiprocessing workers are not affected (they
    end with ``os._exit`` anyway, after their own teardown).
    """
    from ._children import set_fork_exit as set_mode

    set_mode(mode)


def guard(
    fn: Callable[..., T], *, default: Any = None, registry: Optional[Registry] = None
) -> Guarded:
    """Wrap ``fn`` for native code: it returns ``default`` without calling ``fn`` once
    ``registry``'s (by default the default registry's) teardown has begun.

    See [`Guarded`][exitsafe.Guarded] for the thread rules.  Raises ``TypeError`` when ``fn`` is not
    callable or ``registry`` is not a [`Registry`][exitsafe.Registry].
    """
    return Guarded(fn, default, registry if registry is not None else default_registry())


def teardown(reason: str = "explicit") -> None:
    """Run the default registry's ordered teardown now; see
    [`Registry.teardown`][exitsafe.Registry.teardown].

    Idempotent.  Only the default registry is torn down; other registries
    still tear down at exit (or call their own [`Registry.teardown`][exitsafe.Registry.teardown]).
    """
    default_registry().teardown(reason=reason)


def ledger() -> list[LedgerEntry]:
    """The default registry's ledger; see [`Registry.ledger`][exitsafe.Registry.ledger]."""
    return default_registry().ledger()
