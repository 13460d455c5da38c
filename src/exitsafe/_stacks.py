"""What a thread's Python stack is made of, read without running the program's code.

*Kinds of code* (`kind`): the program's own, an installed package's (under a
``site-packages`` or ``dist-packages`` directory), the standard library's, the few frames
of the standard library that only start a thread's target, and exitsafe's (told apart by
`is_exitsafe_file`; the lab's scenario programs stand for a program).  From them: which
package a class or a code object belongs to (`library_of`, `code_library`), and whether a
thread runs the program's code at its base (`program_thread`).  And what a thread's frames
hold: an object's own attribute dict read the standard way (`instance_dict`), and whether
the calling thread may hold a lock its own frames refer to (`holds_a_lock`).

For `exitsafe._quiesce` (where a thread may park) and `exitsafe._users` (which threads use
an adopted object).  Nothing here runs a property, an ``__eq__``, a metaclass or a mapping
of the program's.
"""

from __future__ import annotations

import _thread
import sys
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, FrameType
    from typing import Optional

__all__ = [
    "OWN", "PACKAGE", "STARTER", "STDLIB", "code_library", "holds_a_lock", "instance_dict",
    "is_exitsafe_file", "kind", "kind_of_file", "library_of", "method_codes", "module_kind",
    "prepare", "program_thread", "runs_any",
]

#: Kinds of code (see `kind`).
OWN, STDLIB, PACKAGE, STARTER = 0, 1, 2, 3

#: The frames of the standard library that only start a thread's target: a thread
#: whose stack holds nothing else of the standard library may park.
_STARTERS = {
    ("threading", "_bootstrap"),
    ("threading", "_bootstrap_inner"),
    ("threading", "run"),
    ("thread", "_worker"),  # concurrent.futures.thread
    ("thread", "run"),
}

#: The standalone programs of ``exitsafe demo`` (``exitsafe.lab.scenarios``), relative to
#: exitsafe's directory: the program's own code when they run, not exitsafe's (nor, once
#: installed, a package's).
_LAB_PROGRAMS = "lab/scenarios/"

_kinds: dict[CodeType, int] = {}
_paths: list[tuple[tuple[str, ...], str]] = []


def prepare() -> None:
    """Compute now, on the calling thread, the directories the kinds are told by (a
    first import of ``sysconfig`` inside a profile function could deadlock on the
    import lock: see ``exitsafe._quiesce``)."""
    if not _paths:
        _paths.append(_library_paths())


def kind(code: CodeType) -> int:
    """The kind of ``code`` (`OWN`, `STDLIB`, `PACKAGE` or `STARTER`), remembered per
    code object."""
    found = _kinds.get(code)
    if found is None:
        found = _kinds[code] = kind_of_file(code.co_filename, code.co_name)
    return found


def kind_of_file(filename: str, function: str = "") -> int:
    """The kind of the code of ``filename`` (``function``: its function's name, which
    tells a thread's starters from the rest of the standard library)."""
    if not _paths:
        _paths.append(_library_paths())
    if filename.startswith("<frozen "):
        return STDLIB
    if filename.startswith("<"):  # <string>, <stdin>: the program's
        return OWN
    normalized = filename.replace("\\", "/")
    stdlib, exitsafe_dir = _paths[0]
    if normalized.startswith(exitsafe_dir + _LAB_PROGRAMS):
        return OWN  # (the lab's scenario programs are programs, wherever exitsafe is)
    if "/site-packages/" in normalized or "/dist-packages/" in normalized:
        return PACKAGE
    if normalized.startswith(exitsafe_dir):
        return STDLIB  # (exitsafe's own code: never a place to park)
    if any(normalized.startswith(p) for p in stdlib):
        stem = normalized.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        return STARTER if (stem, function) in _STARTERS else STDLIB
    return OWN


def is_exitsafe_file(filename: str) -> bool:
    """Whether code of ``filename`` is exitsafe's own (the lab's scenario programs are not:
    they stand for a program).  Such code is never a place to park a thread, and never a
    thread's use of an object (``_users``)."""
    if not _paths:
        _paths.append(_library_paths())
    normalized = filename.replace("\\", "/")
    exitsafe_dir = _paths[0][1]
    return normalized.startswith(exitsafe_dir) and not normalized.startswith(
        exitsafe_dir + _LAB_PROGRAMS
    )


def library_of(module_name: Optional[str]) -> Optional[str]:
    """The installed package (its top-level name) that module ``module_name`` belongs
    to, or ``None``: the standard library, exitsafe, the program's own code."""
    if not module_name or module_kind(module_name) != PACKAGE:
        return None
    top = module_name.split(".")[0]
    return None if top in ("ctypes", "_ctypes") else top


def code_library(code: CodeType) -> Optional[str]:
    """The installed package (its top-level name) whose file ``code`` comes from, or
    ``None``."""
    if kind(code) != PACKAGE:
        return None
    normalized = code.co_filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        at = normalized.rfind(marker)
        if at >= 0:
            rest = normalized[at + len(marker):]
            return rest.split("/", 1)[0].split(".", 1)[0]
    return None


def program_thread(frame: Optional[FrameType]) -> bool:
    """Whether a thread whose innermost frame is ``frame`` runs the program's own code
    at its base (its target, past the frames that only start a thread, is the
    program's): a thread `park` can stop, rather than a library's own."""
    base = None
    while frame is not None:
        if kind(frame.f_code) != STARTER:
            base = frame
        frame = frame.f_back
    return base is not None and kind(base.f_code) == OWN


def _library_paths() -> tuple[tuple[str, ...], str]:
    import os
    import sysconfig

    paths = sysconfig.get_paths()
    stdlib = {paths.get("stdlib", ""), paths.get("platstdlib", "")}
    stdlib.add(os.path.dirname(os.__file__))
    here = os.path.dirname(os.path.abspath(__file__)).replace("\\", "/") + "/"
    return tuple(p.replace("\\", "/") + "/" for p in stdlib if p), here


def module_kind(module_name: Optional[str]) -> int:
    """The kind of the code of module ``module_name`` (a built-in one: the standard
    library's)."""
    if not module_name:
        return OWN
    top = module_name.split(".")[0]
    if top in ("ctypes", "_ctypes"):
        return PACKAGE  # (a gateway to foreign code: a call through it is not idle)
    if top in sys.builtin_module_names or module_name in sys.builtin_module_names:
        return STDLIB
    module = sys.modules.get(module_name) or sys.modules.get(top)
    filename = getattr(module, "__file__", None)
    if not filename:  # (frozen, or __main__, whose __file__ is gone once the script ended)
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        return STDLIB if origin in ("frozen", "built-in") else OWN
    kind = kind_of_file(filename)
    return STDLIB if kind == STARTER else kind


_LOCK = _thread.LockType
_RLOCK = type(_thread.RLock())


def holds_a_lock(frame: Optional[FrameType]) -> bool:
    """Whether the calling thread, at ``frame``, may hold a lock: one that the program's
    own frames from ``frame`` outward refer to (a local, a module global the code names,
    an attribute of a local one level deep; a ``threading.Condition``'s lock too) and
    that is held: an ``RLock`` by this thread, a ``Lock`` by anyone (its owner is not
    known: taken as this thread's).  Runs no code of the program's (exact types and
    instance dicts only); a ``threading.Thread``'s own attributes are not read (its
    ``_tstate_lock`` is held while it runs)."""
    threading = sys.modules["threading"]  # (no import in a profile function: see _prepare)
    thread_type = threading.Thread
    condition_type = threading.Condition

    def held(value: object, depth: int) -> bool:
        kind = type(value)
        if kind is _LOCK:
            return bool(value.locked())  # type: ignore[attr-defined]
        if kind is _RLOCK:
            return bool(value._is_owned())  # type: ignore[attr-defined]
        if kind is condition_type and depth:
            inner = value.__dict__.get("_lock")
            return inner is not None and held(inner, 0)
        return False

    while frame is not None:
        code = frame.f_code
        if kind(code) == OWN:
            try:
                values = list(frame.f_locals.values())
            except Exception:  # (locals that cannot be read: nothing to tell from them)
                values = []
            module_globals = frame.f_globals
            if type(module_globals) is dict:
                values += [module_globals.get(name) for name in code.co_names]
            for value in values:
                if held(value, 1):
                    return True
                if issubclass(type(value), thread_type):
                    continue
                attrs = instance_dict(value)
                if attrs and any(held(v, 1) for v in list(attrs.values())):
                    return True
        frame = frame.f_back
    return False


_type_mro = type.__dict__["__mro__"]
_type_dict = type.__dict__["__dict__"]


def instance_dict(value: object) -> Optional[dict[str, object]]:
    """``value``'s own attribute dict, when its type keeps one the standard way (no
    ``__dict__`` property of the program's, no class or module), else ``None``."""
    kind = type(value)
    if issubclass(kind, (type, ModuleType)):
        return None
    # (the MRO and the classes' dicts read through type's own descriptors: a metaclass's
    # __getattribute__ of the program's never runs)
    for klass in _type_mro.__get__(kind, type):
        slot = _type_dict.__get__(klass, type).get("__dict__")
        if slot is not None:
            if type(slot).__name__ != "getset_descriptor":
                return None  # (a __dict__ of the program's own making: not called)
            break
    else:
        return None
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except Exception:  # (a standard slot that still failed: nothing one level down)
        return None
    return attrs if type(attrs) is dict else None


def method_codes(cls: type) -> frozenset[CodeType]:
    """The code of every function defined in ``cls`` and its bases (methods, static and
    class methods, properties' accessors), read from the classes' own dicts: a frame
    running one is inside a method of an instance of ``cls``."""
    found: set[CodeType] = set()
    for klass in _type_mro.__get__(cls, type):  # (no metaclass __getattribute__ runs)
        if klass is object:
            continue
        for value in list(_type_dict.__get__(klass, type).values()):
            kind = type(value)
            if kind is property:
                functions: tuple[object, ...] = (value.fget, value.fset, value.fdel)
            elif kind is staticmethod or kind is classmethod:
                functions = (value.__func__,)
            else:  # (anything else of the program's: not asked for an attribute)
                functions = (value,)
            for function in functions:
                code = getattr(function, "__code__", None) if type(function).__name__ == (
                    "function"
                ) else None
                if code is not None:
                    found.add(code)
    return frozenset(found)


def runs_any(frame: Optional[FrameType], codes: frozenset[CodeType]) -> bool:
    """Whether a frame from ``frame`` outward runs one of ``codes``."""
    if not codes:
        return False
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False
