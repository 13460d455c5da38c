"""The structure bar of the code under src/exitsafe, checked on every module.

* A module is at most :data:`MAX_MODULE_LINES` lines.
* A function or method is at most :data:`MAX_FUNCTION_LINES` lines, its docstring not
  counted (a nested function counts in the function around it too).
* So is a function of the compiled core (``_speedups.c``), from the line naming it to its
  closing brace.  (The file itself is over the module bar: issue 30 leaves it open.)

Each check walks the whole package, so a new module is held to the same bar.  Generated
code (a module with :data:`GENERATED` in its first lines) is left out, and so are the
functions of :data:`WAIVED`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, Union

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "exitsafe"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
#: The marker of a generated module, in one of its first lines.
GENERATED = "@generated"
#: Functions over the bar that are being split elsewhere (``module:function``); an entry
#: whose function is short (or gone) fails `test_every_waiver_is_still_needed`.
WAIVED: set[str] = set()

Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]
#: The compiled core's source, and the line naming a function in it: the return type
#: goes on the line before, so the name starts the line (``state_track(RegistryObject``).
C_SOURCE = PACKAGE / "_speedups.c"
C_FUNCTION = re.compile(r"^(\w+)\(")


def modules() -> list[Path]:
    """Every Python module of the package that is not generated."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        head = path.read_text(encoding="utf-8").splitlines()[:5]
        if not any(GENERATED in line for line in head):
            found.append(path)
    return found


def functions(tree: ast.AST) -> Iterator[Function]:
    """Every function and method of a module, nested ones included."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def function_lines(node: Function) -> int:
    """The lines of a function from its ``def`` to its end, less its docstring's."""
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def name(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_the_walk_finds_the_package() -> None:
    found = {name(p) for p in modules()}
    assert "exitsafe/__init__.py" in found and "exitsafe/testing/__init__.py" in found


@pytest.mark.parametrize("path", modules(), ids=name)
def test_module_is_short(path: Path) -> None:
    count = len(path.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_MODULE_LINES, f"{name(path)} has {count} lines"


@pytest.mark.parametrize("path", modules(), ids=name)
def test_functions_are_short(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [
        f"{node.name} (line {node.lineno}): {function_lines(node)} lines"
        for node in functions(tree)
        if function_lines(node) > MAX_FUNCTION_LINES
        and f"{name(path)}:{node.name}" not in WAIVED
    ]
    assert not long, f"{name(path)}: " + "; ".join(long)


def test_every_waiver_is_still_needed() -> None:
    over = set()
    for path in modules():
        for node in functions(ast.parse(path.read_text(encoding="utf-8"))):
            if function_lines(node) > MAX_FUNCTION_LINES:
                over.add(f"{name(path)}:{node.name}")
    assert not WAIVED - over, f"short (or gone) now, remove from WAIVED: {WAIVED - over}"


def c_functions(text: str) -> Iterator[tuple[str, int, int]]:
    """``(name, first line, lines)`` of every function defined in C source ``text`` written
    as the compiled core is: the name at the start of a line, the body's closing brace
    alone on a line."""
    found: Union[tuple[str, int], None] = None
    for number, line in enumerate(text.splitlines(), 1):
        named = C_FUNCTION.match(line)
        if named:
            found = (named.group(1), number)
        elif line == "}" and found is not None:
            yield found[0], found[1], number - found[1] + 1
            found = None


def test_the_c_walk_finds_the_compiled_functions() -> None:
    names = {fn for fn, _, _ in c_functions(C_SOURCE.read_text(encoding="utf-8"))}
    assert {"state_track", "cffi_track", "release_one", "PyInit__speedups"} <= names
    sample = "static int\nshort_one(void)\n{\n    return 0;\n}\n"
    assert list(c_functions(sample)) == [("short_one", 2, 4)]


def test_compiled_core_functions_are_short() -> None:
    long = [
        f"{fn} (line {first}): {lines} lines"
        for fn, first, lines in c_functions(C_SOURCE.read_text(encoding="utf-8"))
        if lines > MAX_FUNCTION_LINES
    ]
    assert not long, f"{name(C_SOURCE)}: " + "; ".join(long)
