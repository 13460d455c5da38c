"""No call and no loop jump of a guarded ``try`` escapes its handler (CPython 3.11+).

exitsafe's sections have one shape (see ``exitsafe._sync.locked``): the lock is taken inside
a ``try`` whose ``except BaseException`` handler gives it back; a borrow (``call``), a
teardown and a loaded library end in a ``finally``.  A signal is acted on at a call (the
callee's start, or after a C function returns) and at a loop's backward jump; its exception
(Ctrl-C's ``KeyboardInterrupt``, or whatever a program's own handler raises) at an
instruction the compiler left out of the exception table escapes the handler: the lock
stays held (the next exitsafe call on any thread waits for ever), a borrow never ends.
CPython leaves some out:

* a loop's backward jump when the loop's body ends with a conditional (``if ...: ...;
  break``, ``if ...: return``, ``if trace: ...``): 3.12, 3.13 and 3.14;
* the jump of ``while cond:`` (its test repeated at the bottom): 3.12 and 3.13;
* on 3.14 every ``NOT_TAKEN`` after a conditional jump (python/cpython#137681), where no
  signal is acted on: only an instruction tracer raises there (the interrupt-everywhere
  sweep's ``CompilerGap`` warning), so this test does not count them.

``track(depends_on=...)``'s parent check left the lock held that way (found by the
interrupt-everywhere sweep run at every instruction on 3.14; CI samples the instructions),
and ``exitsafe.cffi.call`` / ``exitsafe.ctypes.call`` left a handle borrowed for ever (found
by this test, confirmed on 3.13: most Ctrl-Cs sent during a loop of calls left a borrow).
The loops are written so that their body ends with an unconditional step (``if not
wanted: continue``, ``while True: if done: break``).  This test compiles every source file
of the package and reads the exception table of every function's guarded ``try`` (methods,
nested and decorated functions included), so that a loop of those shapes is found on the
first run of each interpreter.  ``dis._parse_exception_table`` is CPython's own reader of
the table (private, present in 3.11-3.15).
"""

from __future__ import annotations

import ast
import dis
import sys
import types
from pathlib import Path
from typing import Iterator, Optional

import pytest

import exitsafe

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="exception tables are new in CPython 3.11"
)


def acts_on_signals(opname: str) -> bool:
    """Whether CPython may act on a pending signal at this instruction (run a Python
    handler, raise ``KeyboardInterrupt``): a call (the callee's start, or after a C
    function returns) or a loop's backward jump.  Elsewhere (``NOP``, ``JUMP_FORWARD``, a
    ``return``'s instructions, which 3.11+ leave out of the table, and the ``NOT_TAKEN``
    of 3.14) only an instruction tracer can raise."""
    return opname.startswith("CALL") or opname == "JUMP_BACKWARD"


#: Loops in a guarded ``try`` whose backward jump CPython leaves uncovered and where that is
#: harmless, each with the reason: (file, function) -> why.
ACCEPTED: dict[tuple[str, str], str] = {
    ("_watcher.py", "_watch"): "the watcher thread's loop: CPython raises a signal's "
    "exception on the main thread only, and this never runs there",
}


def _sources() -> list[Path]:
    """exitsafe's Python sources (the lab's scenarios and the test harness aside)."""
    root = Path(exitsafe.__file__).parent
    return sorted(
        path for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] not in ("lab", "testing")
    )


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _guarded_try_bodies(tree: ast.AST) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(function name, line of its ``def`` or first decorator) -> the line ranges of the
    bodies of its guarded ``try`` statements: those with an ``except BaseException``
    handler (a section's shape) or a ``finally`` (a borrow's end, a lock's release; its
    ``except`` and ``else`` blocks too), not counting the ``try`` of functions nested in it
    (they have code objects of their own)."""
    found: dict[tuple[str, int], list[tuple[int, int]]] = {}

    def visit(node: ast.AST, key: Optional[tuple[str, int]]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                inner = (child.name, first)
                found.setdefault(inner, [])
                visit(child, inner)
                continue
            if isinstance(child, (ast.Lambda, ast.ClassDef)):
                visit(child, None if isinstance(child, ast.Lambda) else key)
                continue
            if isinstance(child, ast.Try) and key is not None and (
                child.finalbody or any(
                    isinstance(h.type, ast.Name) and h.type.id == "BaseException"
                    for h in child.handlers
                )
            ):
                end = (child.handlers[0].lineno if child.handlers
                       else child.finalbody[0].lineno) - 1
                found[key].append((child.body[0].lineno, end))
                if child.finalbody:  # (its except and else blocks are guarded by it too)
                    for block in [h.body for h in child.handlers] + [child.orelse]:
                        if block:
                            found[key].append((block[0].lineno, _last_line(block)))
            visit(child, key)

    visit(tree, None)
    return found


def _last_line(block: list[ast.stmt]) -> int:
    last = block[-1]
    return last.end_lineno if last.end_lineno is not None else last.lineno


def _uncovered(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    tries = _guarded_try_bodies(ast.parse(text))
    out = []
    for code in _code_objects(compile(text, str(path), "exec")):
        ranges = tries.get((code.co_name, code.co_firstlineno))
        if not ranges:
            continue
        entries = list(dis._parse_exception_table(code))  # type: ignore[attr-defined]
        instructions = list(dis.get_instructions(code))
        line_at = {i.offset: i.positions.lineno if i.positions else None for i in instructions}
        for start, end in ranges:
            for ins in instructions:
                line = line_at[ins.offset]
                if line is None or not start <= line <= end or not acts_on_signals(ins.opname):
                    continue
                if ins.opname == "JUMP_BACKWARD" and not (
                    start <= (line_at.get(ins.argval) or 0) <= end
                ):
                    continue  # (the jump of a loop around the try, not in it)
                if any(e.start <= ins.offset < e.end for e in entries):
                    continue
                if (path.name, code.co_name) in ACCEPTED:
                    continue
                out.append(f"{path.name}:{line} {code.co_name}: {ins.opname}")
    return out


def test_the_walk_finds_the_sections():
    names = set()
    for path in _sources():
        for (name, _line), ranges in _guarded_try_bodies(
            ast.parse(path.read_text(encoding="utf-8"))
        ).items():
            if ranges:
                names.add(name)
    # sections of a module function, methods (of a class whose module is rewritten, too), a
    # decorated function, a nested one, and a borrow's try/finally
    assert {"add_simple", "_add_dependent", "drop_owner", "collected", "claim", "forget",
            "track", "adopt", "end_detached", "call"} <= names


def test_no_call_or_loop_jump_of_a_guarded_try_escapes_its_handler():
    found = [place for path in _sources() for place in _uncovered(path)]
    assert not found, "\n".join(found)
