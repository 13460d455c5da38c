"""The core's structure, checked from its sources: who may write a handle's state, which
module may import which, and what a module may reach into.

These are the rules ``docs/architecture.md`` draws; a change that breaks one fails here
with the place that breaks it, before a reviewer has to notice.
"""

from __future__ import annotations

import ast
from pathlib import Path

from exitsafe._record import FIELDS

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "exitsafe"

#: The record classes (and their bases): a ``self._state`` anywhere else is a class's own
#: field of the same name (the `Registry` facade's `RegistryState`), not a record's.
RECORD_CLASSES = {"Record", "Handle", "OwnedHandle", "HookHandle", "Node"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _is_compiled(name: str) -> bool:
    """Whether ``name`` is a compiled module of the package (``exitsafe._speedups``)."""
    return any(PACKAGE.parent.glob(name.replace(".", "/") + ".*.so")) or any(
        PACKAGE.parent.glob(name.replace(".", "/") + ".*.pyd")
    )


class _Imports(ast.NodeVisitor):
    """The exitsafe modules a module imports, at any level (in functions too), except
    under ``if TYPE_CHECKING:`` (never run)."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.orelse:
                self.visit(statement)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names if a.name.split(".")[0] == "exitsafe")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = parts[: len(parts) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source.split(".")[0] != "exitsafe":
            return
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if submodule in MODULES:
                self.found.add(submodule)
            elif not _is_compiled(submodule):
                self.found.add(source)


def _import_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        graph[name] = {m for m in visitor.found if m in MODULES and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for other in edges:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph[other]))))
                    break
                if other in on_stack:
                    low[node] = min(low[node], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle():
    """Function-level imports included: a cycle through a lazy import still means that
    neither module can be read, tested or replaced without the other."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _enclosing_classes(tree: ast.AST) -> dict[ast.AST, bool]:
    """Each node inside a class body -> whether its innermost class is a record class."""
    owner: dict[ast.AST, bool] = {}
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            names = {cls.name} | {ast.unparse(b).rpartition(".")[2] for b in cls.bases}
            for node in ast.walk(cls):
                if node is not cls:  # (inner classes are walked later: they win)
                    owner[node] = bool(names & RECORD_CLASSES)
    return owner


def test_only_the_record_module_writes_a_record_field():
    """Every transition of a handle is a function of ``exitsafe._record`` (the compiled
    core mirrors some in C): no other module assigns or deletes a record field."""
    fields = set(FIELDS)
    problems = []
    for name, path in MODULES.items():
        if name == "exitsafe._record":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owner = _enclosing_classes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in fields
            ):
                problems.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
                continue
            else:
                continue
            for target in targets:
                for part in ast.walk(target):
                    if not (isinstance(part, ast.Attribute) and part.attr in fields):
                        continue
                    if not isinstance(part.ctx, (ast.Store, ast.Del)):
                        continue
                    own = isinstance(part.value, ast.Name) and part.value.id == "self"
                    if own and owner.get(node) is False:
                        continue  # (a class's own field of the same name)
                    problems.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
    assert not problems, "record fields written outside exitsafe._record:\n" + "\n".join(
        problems
    )


def _module_aliases(tree: ast.AST, path: Path) -> set[str]:
    """The local names bound to exitsafe modules (``from . import _sync``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").split(".")[0] == "exitsafe"
        ):
            for alias in node.names:
                here = path.parent
                if (here / f"{alias.name}.py").exists() or (here / alias.name).is_dir():
                    names.add(alias.asname or alias.name)
    return names


def test_no_module_reaches_into_another_modules_private_names():
    """``module._name`` of another exitsafe module, or ``from .module import _name``: the
    narrow interfaces the architecture promises (a name a module shares is public in the
    package, without an underscore)."""
    problems = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = _module_aliases(tree, path)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                problems.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.level:
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    is_module = (path.parent / f"{alias.name}.py").exists()
                    if private and not is_module:
                        problems.append(
                            f"{path.name}:{node.lineno}: from .{node.module} import {alias.name}"
                        )
    assert not problems, "private names used across modules:\n" + "\n".join(sorted(problems))
