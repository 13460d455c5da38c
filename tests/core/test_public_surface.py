"""The public surface: which names users import from where, and the signatures that must
stay in sync.  A change here is a change of the API (record it in docs/changelog.md)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import exitsafe

PUBLIC = {
    "exitsafe": {
        "CORE",
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
    },
    "exitsafe.cffi": {"borrowing", "call", "callback", "handle_of", "pin", "pinned", "track"},
    "exitsafe.ctypes": {"borrowing", "call", "callback", "handle_of", "pin", "pinned", "track"},
    "exitsafe.policies": {"any_leak", "leak_if_foreign_thread", "leak_in_forked_child"},
    "exitsafe.signals": {"teardown_on_signals"},
}

#: Modules that are neither public API nor private implementation: tools with their
#: own entry points (the command line, the pytest plugin, the native lab).
TOOLS = {"exitsafe.cli", "exitsafe.pytest_plugin", "exitsafe.lab", "exitsafe.testing"}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names(module):
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PUBLIC[module]
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_every_other_module_is_private():
    found = {
        f"exitsafe.{info.name}"
        for info in pkgutil.iter_modules(exitsafe.__path__)
        if not info.name.startswith("_")
    }
    assert found == set(PUBLIC) - {"exitsafe"} | TOOLS


#: The options every way of starting to own something shares, with their defaults.
SHARED = {"depends_on": (), "exit_policy": None, "name": None, "timeout": None}


def _track_likes():
    from exitsafe import cffi as es_cffi
    from exitsafe import ctypes as es_ctypes

    return {
        "exitsafe.track": (exitsafe.track, "handle"),
        "Registry.track": (exitsafe.Registry.track, "handle"),
        "exitsafe.cffi.track": (es_cffi.track, "handle"),
        "exitsafe.ctypes.track": (es_ctypes.track, "handle"),
        "exitsafe.adopt": (exitsafe.adopt, None),  # kind: the object's class name
        "NativeObject.__init__": (exitsafe.NativeObject.__init__, None),  # the class's kind
    }


#: Registry.track (and exitsafe.track, its module-level form) also take their options by
#: position, in this order: CPython makes a cheaper call to a function without
#: keyword-only parameters (the pure-Python core's hot path).
_IN_ORDER = ("kind", "depends_on", "exit_policy", "name", "timeout", "affinity")
POSITIONAL_TOO = {"Registry.track": _IN_ORDER, "exitsafe.track": _IN_ORDER}


@pytest.mark.parametrize("name", sorted(_track_likes()))
def test_track_like_signatures_stay_in_sync(name):
    fn, kind_default = _track_likes()[name]
    params = inspect.signature(fn).parameters
    expected = (
        inspect.Parameter.POSITIONAL_OR_KEYWORD if name in POSITIONAL_TOO
        else inspect.Parameter.KEYWORD_ONLY
    )
    for option, default in {**SHARED, "kind": kind_default}.items():
        param = params[option]
        assert param.kind is expected, (name, option)
        assert param.default == default, (name, option, param.default)
    if name in POSITIONAL_TOO:
        assert tuple(params)[-len(POSITIONAL_TOO[name]) :] == POSITIONAL_TOO[name]


def test_pin_likes_share_close_name_and_timeout():
    from exitsafe import cffi as es_cffi
    from exitsafe import ctypes as es_ctypes

    for fn in (exitsafe.pin, exitsafe.Registry.pin, es_cffi.pin, es_ctypes.pin):
        params = inspect.signature(fn).parameters
        for option in ("close", "name", "timeout"):
            assert params[option].kind is inspect.Parameter.KEYWORD_ONLY, (fn, option)
        assert params["name"].default is None and params["timeout"].default is None
