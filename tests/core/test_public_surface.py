"""The public surface: which names users import from where, and the signatures that must
stay in sync.  A change here is a change of the API (record it in docs/changelog.md)."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import exitsafe
import exitsafe.lowlevel

from ..support import child_env

PUBLIC = {
    # what a binding needs (docs/changelog.md, "Public tiers", says why each is here)
    "exitsafe": {
        "AlreadyTrackedError",
        "ExitsafeError",
        "Handle",
        "HandleClosedError",
        "LiveDependentsError",
        "NativeObject",
        "Outcome",
        "Registry",
        "RegistryClosedError",
        "ReleaseError",
        "__version__",
        "adopt",
        "checked",
        "exit",
        "guard",
        "ledger",
        "native",
        "on_early_exit",
        "on_teardown",
        "pin",
        "quiesce",
        "teardown",
        "track",
        "worker",
    },
    # the expert tier
    "exitsafe.lowlevel": {
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
    },
    "exitsafe.cffi": {"borrowing", "call", "callback", "handle_of", "pin", "pinned", "track"},
    "exitsafe.ctypes": {"borrowing", "call", "callback", "handle_of", "pin", "pinned", "track"},
    "exitsafe.policies": {"any_leak", "leak_if_foreign_thread", "leak_in_forked_child"},
    "exitsafe.signals": {"deferred", "pool_initializer", "teardown_on_signals"},
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


#: ``exitsafe.__all__`` before the tiers (0.1.0 development snapshots): every name is still
#: public, in exactly one tier.
BEFORE_TIERS = {
    "CORE", "AlreadyTrackedError", "DependencyCycleError", "ExitsafeError",
    "ForeignHandleError", "Guarded", "Handle", "HandleClosedError", "HandleInfo", "LedgerEntry",
    "LiveDependentsError", "NativeObject", "NeutralizeError", "Outcome", "ReentrancyError",
    "Registry", "RegistryClosedError", "__version__", "adopt", "default_registry", "exit",
    "guard", "handle_of", "ledger", "neutralize", "neutralize_at_exit", "on_early_exit",
    "on_teardown", "pin", "registries", "run_pending", "set_fork_exit", "teardown", "track",
    "worker",
}
MOVED = sorted(PUBLIC["exitsafe.lowlevel"])


def test_every_name_of_the_old_surface_is_in_exactly_one_tier():
    top, low = PUBLIC["exitsafe"], PUBLIC["exitsafe.lowlevel"]
    assert not top & low
    added_since = {"quiesce", "native", "checked", "ReleaseError"}  # (each in the changelog)
    assert top | low == BEFORE_TIERS | added_since
    assert exitsafe._MOVED == set(exitsafe.lowlevel.__all__)  # what the old spelling finds


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_warns_once_names_its_new_home_and_is_the_same_object(name):
    with pytest.warns(DeprecationWarning) as record:
        value = getattr(exitsafe, name)
    assert len(record) == 1
    message = str(record[0].message)
    assert message.startswith(f"exitsafe.{name} is deprecated: use exitsafe.lowlevel.{name} ")
    assert "0.2.0" in message
    assert record[0].filename == __file__  # the warning points at the caller's line
    assert value is getattr(exitsafe.lowlevel, name)
    # `from exitsafe import X` warns once too (the import system asks twice), at that line
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning) as record:
        exec(compile(f"from exitsafe import {name}", "<old spelling>", "exec"), namespace)
    assert [w.filename for w in record] == ["<old spelling>"]
    assert namespace[name] is value
    # every use warns (Python's filters then show each place once): nothing is cached
    assert name not in vars(exitsafe) and name not in dir(exitsafe)
    with pytest.warns(DeprecationWarning):
        getattr(exitsafe, name)


def test_the_tiers_warn_about_nothing_else():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module in (exitsafe, exitsafe.lowlevel):
            for name in module.__all__:
                getattr(module, name)
            for name in dir(module):
                getattr(module, name)
        for module in ("exitsafe", "exitsafe.lowlevel"):
            exec(f"from {module} import *", {})


def test_the_old_spelling_works_in_a_fresh_process():
    # the first use loads exitsafe.lowlevel (never loaded by `import exitsafe` alone)
    code = textwrap.dedent(
        """
        import sys, warnings
        warnings.simplefilter("always")
        import exitsafe
        assert "exitsafe.lowlevel" not in sys.modules
        from exitsafe import handle_of, CORE
        assert exitsafe.default_registry() is exitsafe.lowlevel.default_registry()
        print(handle_of.__module__, CORE in ("compiled", "python"))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exitsafe.lowlevel", "True"]
    found = re.findall(r"<string>:(\d+): DeprecationWarning: exitsafe\.(\w+) is", done.stderr)
    assert found == [("6", "handle_of"), ("6", "CORE"), ("7", "default_registry")]


def test_the_lowlevel_module_is_reachable_as_an_attribute():
    done = subprocess.run(
        [sys.executable, "-c", "import exitsafe; print(exitsafe.lowlevel.__name__)"],
        env=child_env(), capture_output=True, text=True, timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "exitsafe.lowlevel"), done.stderr


# ---------------------------------------------------------------- public modules


@pytest.mark.parametrize("module", ["exitsafe", "exitsafe.lowlevel"])
def test_public_classes_and_functions_show_their_public_module(module):
    mod = importlib.import_module(module)
    for name in mod.__all__:
        value = getattr(mod, name)
        if inspect.isclass(value) or callable(value):
            assert value.__module__ == module, name
            assert value.__qualname__ == name, name
            if inspect.isclass(value):
                assert repr(value) == f"<class '{module}.{name}'>"


def test_instances_show_their_public_module():
    registry = exitsafe.Registry("surface")
    handle = registry.track("raw", lambda raw: None, name="h")
    assert repr(registry).startswith("<exitsafe.Registry 'surface' open")
    assert repr(handle).startswith("<exitsafe.Handle handle 'h' live")
    assert repr(exitsafe.guard(print, registry=registry)).startswith("<exitsafe.lowlevel.Guarded")
    (info,) = registry.live_handles()
    assert repr(info) == "<exitsafe.lowlevel.HandleInfo handle 'h' registry='surface'>"
    handle.release()
    (entry,) = registry.ledger()
    assert repr(entry) == "<exitsafe.lowlevel.LedgerEntry surface:h released>"
    registry.teardown()


ERRORS = [
    (exitsafe.HandleClosedError, "exitsafe"),
    (exitsafe.RegistryClosedError, "exitsafe"),
    (exitsafe.ExitsafeError, "exitsafe"),
    (exitsafe.lowlevel.ForeignHandleError, "exitsafe.lowlevel"),
    (exitsafe.lowlevel.ReentrancyError, "exitsafe.lowlevel"),
    (exitsafe.lowlevel.NeutralizeError, "exitsafe.lowlevel"),
]


@pytest.mark.parametrize(("error", "module"), ERRORS, ids=lambda e: getattr(e, "__name__", e))
def test_errors_pickle_by_their_public_name(error, module):
    # pickle finds a class by __module__ and __qualname__: the public spelling must resolve
    assert error.__module__ == module
    copy = pickle.loads(pickle.dumps(error("message")))
    assert type(copy) is error and copy.args == ("message",)


def test_every_error_derives_from_exitsafe_error():
    for module in (exitsafe, exitsafe.lowlevel):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseException):
                assert issubclass(value, exitsafe.ExitsafeError), name


TRACEBACKS = {
    # a program that never imports exitsafe.lowlevel still sees the lowlevel spelling
    "exitsafe.HandleClosedError": """
        h = exitsafe.track(1, lambda raw: None, name="h")
        h.release()
        h.raw
        """,
    "exitsafe.lowlevel.ForeignHandleError": """
        other = exitsafe.Registry("other")
        o = other.track(1, lambda raw: None, name="o")
        exitsafe.track(2, lambda raw: None, depends_on=[o])
        """,
    "exitsafe.lowlevel.DependencyCycleError": """
        a = exitsafe.track(1, lambda raw: None, name="a")
        b = exitsafe.track(2, lambda raw: None, name="b", depends_on=[a])
        a.add_dependency(b)
        """,
}


@pytest.mark.parametrize("shown", sorted(TRACEBACKS))
def test_a_traceback_names_the_error_by_its_public_module(shown):
    code = "import sys\nimport exitsafe\n" + textwrap.dedent(TRACEBACKS[shown])
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{shown}: "), done.stderr


# ---------------------------------------------------------------- Registry and Handle


#: Every public attribute of a Registry and a Handle, each documented API (its docstring
#: is on the API page).  A new public attribute is an API change: add it here and to the
#: changelog.
REGISTRY_API = {
    "closed", "exit_policy", "late_requests", "ledger", "ledger_counts", "live_handles",
    "name", "on_early_exit", "on_teardown", "pin", "step_timeout", "strict", "teardown",
    "teardown_timeout", "tearing_down", "track", "worker",
}
HANDLE_API = {
    "add_dependency", "borrow", "borrowed", "borrowing", "created_on_main_thread", "depends_on",
    "detach", "inherited", "kind", "name", "owners", "raw", "registry", "release", "retain",
    "state", "thread_id",
}


@pytest.mark.parametrize(
    ("cls", "api"), [(exitsafe.Registry, REGISTRY_API), (exitsafe.Handle, HANDLE_API)],
    ids=["Registry", "Handle"],
)
def test_every_public_attribute_is_documented_api(cls, api):
    registry = exitsafe.Registry("attributes")
    instance = registry if cls is exitsafe.Registry else registry.track(1, lambda raw: None)
    for obj in (cls, instance):
        assert {n for n in dir(obj) if not n.startswith("_")} == api
    for name in api:
        doc = inspect.getattr_static(cls, name).__doc__ or ""
        assert len(doc.split()) >= 5, f"{cls.__name__}.{name} has no docstring worth the name"
    registry.teardown()


#: Files whose text users read or copy: no deprecated spelling in them.
ROOT = Path(__file__).resolve().parents[2]
READ = ["README.md", "docs", "src/exitsafe", "tests", "benchmarks"]
#: Where an old spelling is the point: the changelog says what moved, this file tests it.
#: src/exitsafe/_sync.py: three cross-references to exitsafe.ReentrancyError in private
#: docstrings (rendered nowhere), left to the interrupt-safety work that owns that file.
SPELLING_EXEMPT = {"docs/changelog.md", "tests/core/test_public_surface.py"}


def _old_spellings(text):
    names = "|".join(MOVED)
    found = [m.group(0) for m in re.finditer(rf"\bexitsafe\.({names})\b", text)]
    for m in re.finditer(r"\bfrom exitsafe import (\([^)]*\)|[^\n]*)", text):
        imported = re.findall(r"\w+", re.sub(r"#[^\n]*", "", m.group(1)))
        found += [f"from exitsafe import {n}" for n in imported if n in MOVED]
    return found


def test_docs_examples_and_tests_use_no_deprecated_spelling():
    problems = []
    for top in READ:
        base = ROOT / top
        files = [base] if base.is_file() else sorted(base.rglob("*"))
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix not in (".py", ".md", ".pyi", ".c") or rel in SPELLING_EXEMPT:
                continue
            problems += [f"{rel}: {s}" for s in _old_spellings(path.read_text("utf-8"))]
    assert not problems, "deprecated spellings (use exitsafe.lowlevel):\n" + "\n".join(
        problems
    )


def test_the_spelling_check_finds_both_forms():
    assert _old_spellings("exitsafe.CORE, exitsafe.lowlevel.CORE, exitsafe.cffi.handle_of") == [
        "exitsafe.CORE"
    ]
    assert _old_spellings("from exitsafe import (\n    adopt,\n    handle_of,\n)") == [
        "from exitsafe import handle_of"
    ]


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
