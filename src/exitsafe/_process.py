"""Process-level state: the registries, the default registry, the exit and fork hooks.

The exit teardown is one :mod:`atexit` callback, registered when exitsafe is imported:
it runs after the interpreter joined the non-daemon threads and before it finalizes
modules, tears down every registry newest first, then writes the ledger when
``EXITSAFE_LEDGER`` asks for it.  After ``os.fork()`` the child bumps the fork
generation (so inherited handles are never released there) and replaces the locks
that another thread of the parent may have held.
"""

from __future__ import annotations

import _thread
import atexit
import os
import sys
from _weakref import ref as _weakref

from . import _config, _states
from ._report import log
from ._states import CLOSED, TEARING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from .lifetime import Registry


_registries: list[Any] = []  # weak references, oldest first
_registries_lock = _thread.allocate_lock()
_default: Optional[Registry] = None


def register(registry: Registry) -> None:
    """Remember ``registry`` (weakly) for the exit teardown."""
    with _registries_lock:
        _registries[:] = [r for r in _registries if r() is not None]
        _registries.append(_weakref(registry))


def registries() -> list[Registry]:
    """Every registry still alive, oldest first (the exit teardown goes newest first)."""
    with _registries_lock:
        found = [r() for r in _registries]
    return [r for r in found if r is not None]


def default_registry() -> Registry:
    """The process-wide registry that the module-level functions act on (created on first use)."""
    global _default
    registry = _default
    if registry is None:
        with _registries_lock:
            registry = _default
        if registry is None:
            from .lifetime import Registry

            created = Registry("default")
            with _registries_lock:
                if _default is None:
                    _default = created
                registry = _default
    return registry


def teardown_all(reason: str) -> None:
    """Tear down every registry, newest first, then write the ledger if asked to.

    One registry failing does not stop the others.  Used by the exit hook and by the
    signal handlers of :mod:`exitsafe.signals`.
    """
    for registry in reversed(registries()):
        try:
            registry.teardown(reason=reason)
        except BaseException as exc:  # keep tearing down the other registries
            log().error("exitsafe: teardown of registry %r failed: %s", registry.name, repr(exc))
    path = _config.ledger_path()
    if path:
        write_ledger(path)


def at_exit() -> None:
    """The :mod:`atexit` callback."""
    teardown_all("atexit")


def write_ledger(path: str) -> None:
    import json

    data = {
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "registries": [r._as_json() for r in registries()],
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        log().error("exitsafe: could not write the ledger to %r: %s", path, exc)


def _after_fork_in_child() -> None:
    global _registries_lock
    _states.fork_generation += 1
    _registries_lock = _thread.allocate_lock()
    for registry in registries():
        # Another thread of the parent may have held these at fork time.
        registry._lock = _thread.allocate_lock()
        if registry._phase == TEARING:
            registry._phase = CLOSED
        registry._teardown_lock = _thread.allocate_lock()
        registry._teardown_thread = None
    steps = sys.modules.get("exitsafe._steps")
    if steps is not None:  # not imported: no worker was ever started
        steps.after_fork_in_child()


atexit.register(at_exit)
if os.environ.get("EXITSAFE_STEP_TIMEOUT") or os.environ.get("EXITSAFE_TEARDOWN_TIMEOUT"):
    from . import _steps

    _steps.prepare()  # the exit teardown will need a worker thread (see exitsafe._steps)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
