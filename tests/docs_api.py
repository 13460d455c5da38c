"""What the API reference must cover: the public names and whether each is documented.

The public API is everything importable from the modules in :data:`PUBLIC_MODULES` (their
``__all__``).  Documented means, read with griffe the way mkdocstrings reads it (static analysis
of ``src/``, Google-style docstrings):

- the object has a docstring;
- a function or method documents every parameter in its ``Args:`` section;
- a class documents the parameters of its ``__init__`` (in the class docstring or in
  ``__init__``'s), and every public method, property and attribute of its own or inherited
  from exitsafe's own classes (mixins) has a docstring or is listed in the class's
  ``Attributes:`` section.  A dataclass's generated ``__init__``
  takes exactly its fields, so a field documented as an attribute documents that parameter
  too (one table on the page, not the same text twice).

Used by tests/test_docs_site.py; ``python tests/docs_api.py`` prints the gaps.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_MODULES = (
    "exitsafe",
    "exitsafe.lowlevel",
    "exitsafe.cffi",
    "exitsafe.ctypes",
    "exitsafe.policies",
    "exitsafe.signals",
    "exitsafe.testing",
)


def public_names() -> Iterator[Tuple[str, str, Any]]:
    """``(module, name, object)`` for every public name, dunders (``__version__``) excluded."""
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n in vars(module) if not n.startswith("_")]
        for name in names:
            if name.startswith("__"):
                continue
            yield module_name, name, getattr(module, name)


def _canonical(module_name: str, name: str, obj: Any) -> str:
    owner = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if (inspect.isclass(obj) or inspect.isroutine(obj)) and owner and qualname:
        return f"{owner}.{qualname}"
    return f"{module_name}.{name}"


def public_names_and_paths() -> List[Tuple[str, Tuple[str, ...]]]:
    """Each public name, with the anchors that may show it (where it is used, where defined)."""
    out = []
    for module_name, name, obj in public_names():
        public = f"{module_name}.{name}"
        paths = [public, _canonical(module_name, name, obj)]
        qualname = getattr(obj, "__qualname__", None)
        if inspect.isclass(obj) and qualname:  # an alias (Unraisable = ExceptionReport)
            paths.append(f"{module_name}.{qualname}")
        out.append((public, tuple(dict.fromkeys(paths))))
    return out


@lru_cache(maxsize=1)
def _package() -> Any:
    import griffe

    logging.getLogger("griffe").setLevel(logging.ERROR)
    return griffe.load(
        "exitsafe",
        search_paths=[str(ROOT / "src")],
        docstring_parser="google",
        resolve_aliases=True,
        resolve_external=False,
        allow_inspection=False,  # as mkdocs.yml: the sources, not the compiled core
    )


def _lookup(path: str) -> Any:
    package = _package()
    parts = path.split(".")
    assert parts[0] == "exitsafe", path
    obj = package
    for part in parts[1:]:
        obj = obj.members[part]
        if obj.is_alias:
            obj = obj.final_target
    return obj


def _documented_names(*docstrings: Any, kinds: Tuple[str, ...]) -> Set[str]:
    names: Set[str] = set()
    for docstring in docstrings:
        if docstring is None:
            continue
        for section in docstring.parsed:
            if section.kind.value in kinds:
                names.update(item.name.lstrip("*") for item in section.value)
    return names


def _parameters(function: Any) -> List[str]:
    names = [p.name.lstrip("*") for p in function.parameters]
    if names and names[0] in ("self", "cls") and function.parent is not None and (
        function.parent.is_class
    ):
        names = names[1:]
    return names


def _check_function(path: str, function: Any, problems: List[str], *extra_docs: Any,
                    fields: Set[str] = frozenset()) -> None:  # type: ignore[assignment]
    if not function.docstring and not any(extra_docs):
        problems.append(f"{path}: no docstring")
        return
    documented = _documented_names(function.docstring, *extra_docs,
                                   kinds=("parameters", "other parameters")) | fields
    for name in _parameters(function):
        if name not in documented:
            problems.append(f"{path}: parameter {name!r} is not in the Args: section")


def _check_class(path: str, cls: Any, problems: List[str]) -> None:
    if not cls.docstring:
        problems.append(f"{path}: no docstring")
    attributes = _documented_names(cls.docstring, kinds=("attributes",))
    fields: Set[str] = set()
    if "dataclass" in cls.labels:  # the generated __init__ takes the fields
        fields = {name for name, member in cls.members.items()
                  if member.is_attribute and (member.docstring or name in attributes)}
    init = cls.members.get("__init__")
    if init is not None and not init.is_alias and init.is_function:
        _check_function(f"{path}.__init__", init, problems, cls.docstring, fields=fields)
    # all_members: a class's own members and those it inherits from exitsafe's classes (a
    # registry's methods live in mixins, one per concern), as the reference shows them
    for name, member in cls.all_members.items():
        if name.startswith("_"):
            continue
        if member.is_alias:
            if name in cls.members:  # an import, not a definition
                continue
            member = member.final_target
        where = f"{path}.{name}"
        if member.is_function:
            if "property" in member.labels:
                if not member.docstring and name not in attributes:
                    problems.append(f"{where}: property without a docstring")
            else:
                _check_function(where, member, problems)
        elif member.is_attribute:
            if not member.docstring and name not in attributes:
                problems.append(f"{where}: attribute neither documented nor in Attributes:")
        elif member.is_class:
            _check_class(where, member, problems)


def undocumented() -> List[str]:
    """Every public name or parameter that is not documented, one line each."""
    problems: List[str] = []
    seen: Set[str] = set()
    for module_name, name, obj in public_names():
        path = _canonical(module_name, name, obj)
        if path in seen:
            continue
        seen.add(path)
        try:
            target = _lookup(path)
        except KeyError:
            try:
                target = _lookup(f"{module_name}.{name}")
            except KeyError:
                problems.append(f"{module_name}.{name}: not found in the sources by griffe")
                continue
        label = f"{module_name}.{name}"
        if target.is_class:
            _check_class(label, target, problems)
        elif target.is_function:
            _check_function(label, target, problems)
        elif not target.docstring:
            problems.append(f"{label}: no docstring")
    return problems


if __name__ == "__main__":
    gaps = undocumented()
    print("\n".join(gaps))
    print(f"{len(gaps)} gaps", file=sys.stderr)
