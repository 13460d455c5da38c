"""exitsafe.lowlevel: the expert tier, for what a binding rarely needs.

[`exitsafe`][exitsafe] has what a binding uses every day (`track`, `pin`, `adopt`, the hooks,
`Registry`, `Handle`, the errors a program catches).  This module has the rest, as
`trio.lowlevel` does for trio:

- the process itself: [`default_registry`][exitsafe.lowlevel.default_registry] (the registry
  the module-level functions act on), [`registries`][exitsafe.lowlevel.registries],
  [`CORE`][exitsafe.lowlevel.CORE] (which core runs),
  [`set_fork_exit`][exitsafe.lowlevel.set_fork_exit] (how forked children end) and
  [`run_pending`][exitsafe.lowlevel.run_pending] (queued thread-affine releases);
- escape hatches for objects exitsafe does not own:
  [`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit],
  [`neutralize`][exitsafe.lowlevel.neutralize] and
  [`handle_of`][exitsafe.lowlevel.handle_of];
- the types of what exitsafe hands out, which a program reads but never constructs, for
  annotations: [`HandleInfo`][exitsafe.lowlevel.HandleInfo] (what an exit policy sees),
  [`LedgerEntry`][exitsafe.lowlevel.LedgerEntry] (what `ledger()` returns) and
  [`Guarded`][exitsafe.lowlevel.Guarded] (what `guard()` returns);
- the errors that report a wrong call, to be fixed in the code rather than caught:
  [`DependencyCycleError`][exitsafe.lowlevel.DependencyCycleError],
  [`ForeignHandleError`][exitsafe.lowlevel.ForeignHandleError],
  [`ReentrancyError`][exitsafe.lowlevel.ReentrancyError] and
  [`NeutralizeError`][exitsafe.lowlevel.NeutralizeError].  Like every exitsafe error they
  derive from [`exitsafe.ExitsafeError`][exitsafe.ExitsafeError].

Every name here used to be importable from `exitsafe` itself; that spelling still
works until 0.2.0, with a `DeprecationWarning` naming this module.  Importing this module
is as cheap as importing exitsafe: it loads nothing more until a neutralization function
is first used.
"""

from __future__ import annotations

from ._core import CORE
from ._errors import DependencyCycleError, ForeignHandleError, NeutralizeError, ReentrancyError
from ._guard import Guarded
from ._handle import HandleInfo
from ._ledger import LedgerEntry
from ._registry import default_registry, registries
from ._releases import run_pending

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._adopt import handle_of, neutralize, neutralize_at_exit

__all__ = [
    "CORE",
    "DependencyCycleError",
    "ForeignHandleError",
    "Guarded",
    "HandleInfo",
    "LedgerEntry",
    "NeutralizeError",
    "ReentrancyError",
    "default_registry",
    "handle_of",
    "neutralize",
    "neutralize_at_exit",
    "registries",
    "run_pending",
    "set_fork_exit",
]

#: Names imported from their module on first access (PEP 562): the neutralization code
#: loads only when a program uses it.
_LAZY = {
    "handle_of": "_adopt",
    "neutralize": "_adopt",
    "neutralize_at_exit": "_adopt",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'exitsafe.lowlevel' has no attribute {name!r}")
    from importlib import import_module

    from . import _show_in

    value = getattr(import_module(f"exitsafe.{module}"), name)
    _show_in(__name__, value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def set_fork_exit(mode: str) -> None:
    """Choose how forked children of this process end when they end normally.

    The environment variable `EXITSAFE_FORK_EXIT=quiet|normal` sets the same for programs
    you do not edit; this function takes precedence.  Multiprocessing workers are not
    affected (they end with `os._exit` anyway, after their own teardown).

    Args:
        mode: `"quiet"`: a child created by `os.fork()` after this call that ends normally
            (the end of the main program, `sys.exit(n)`, an uncaught exception) leaves the
            way [`exit()`][exitsafe.exit] does, with its exit status, once its exit teardown
            ran.  `"normal"` (the default before any call): the usual interpreter exit.

    Raises:
        ValueError: `mode` is neither `"quiet"` nor `"normal"`.
    """
    from ._children import set_fork_exit as set_mode

    set_mode(mode)
