"""Every instruction of a section's ``try`` body is covered by its handler (CPython 3.11+).

exitsafe's sections have one shape (see ``exitsafe._sync.locked``): the lock is taken inside
a ``try`` whose ``except BaseException`` handler gives it back.  An interrupt (Ctrl-C: a
signal is acted on at a call, at a loop's backward jump, at a function's start) at an
instruction the compiler left out of the exception table would escape the handler with the
lock held, and the next exitsafe call on any thread would wait for ever.  CPython leaves
some out: on 3.14 every ``NOT_TAKEN`` after a conditional jump (python/cpython#137681: no
signal is acted on there, only an instruction tracer raises there; see
``test_interrupt_everywhere``), and a loop's backward jump, where a signal is acted on, when
the loop's body ends with a conditional jump: ``if ...: ...; break`` or ``if ...: return``
on 3.14 (``RegistryState._add_dependent`` and ``_sync.wait`` had one: the first was found by
the interrupt-everywhere sweep run at every instruction), the jump of ``while cond:`` on
3.12 and 3.13 (``held.__enter__`` had one).  The loops are written so that their body ends with an
unconditional step (``if ok: continue``, ``while True: if done: break``).  This test reads
the exception table of every ``try`` with an ``except BaseException`` handler in the
package, so that a loop of those shapes is found on the first run of each interpreter, not
when a sampled sweep happens to land on it.  (``dis._parse_exception_table``: CPython's
own reader of the table, private but present in 3.11-3.15.)
"""

from __future__ import annotations

import ast
import dis
import importlib
import inspect
import pkgutil
import sys
import types

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


def _package_functions() -> list[types.FunctionType]:
    functions: list[types.FunctionType] = []
    for info in pkgutil.walk_packages(exitsafe.__path__, "exitsafe."):
        if info.name.startswith(("exitsafe.lab", "exitsafe.testing")) or info.name.endswith(
            "__main__"
        ):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            candidates = [value]
            if isinstance(value, type) and value.__module__ == module.__name__:
                candidates = [
                    getattr(member, "__func__", member) for member in vars(value).values()
                ]
            for candidate in candidates:
                if (
                    isinstance(candidate, types.FunctionType)
                    and candidate.__module__ == module.__name__
                ):
                    functions.append(candidate)
    return functions


def _section_try_bodies(fn: types.FunctionType) -> list[tuple[int, int]]:
    """The line ranges of the ``try`` bodies of ``fn`` that have an ``except
    BaseException`` handler (a section's shape), absolute line numbers."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return []
    tree = ast.parse(inspect.cleandoc("\n" + "".join(lines)) if lines[0].startswith(" ")
                     else "".join(lines))
    offset = first - 1
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id == "BaseException" for h in node.handlers
        ):
            ranges.append((node.body[0].lineno + offset, node.handlers[0].lineno - 1 + offset))
    return ranges


def _uncovered(fn: types.FunctionType) -> list[str]:
    code = fn.__code__
    entries = list(dis._parse_exception_table(code))  # type: ignore[attr-defined]
    instructions = list(dis.get_instructions(code))
    line_at = {ins.offset: ins.positions.lineno if ins.positions else None for ins in instructions}
    out = []
    for start, end in _section_try_bodies(fn):
        for ins in instructions:
            line = line_at[ins.offset]
            if line is None or not start <= line <= end or not acts_on_signals(ins.opname):
                continue
            if ins.opname == "JUMP_BACKWARD" and not start <= (line_at.get(ins.argval) or 0) <= end:
                continue  # (the jump of a loop around the try, not in it)
            if not any(e.start <= ins.offset < e.end for e in entries):
                out.append(f"{fn.__qualname__} line {line}: {ins.opname}")
    return out


def test_the_walk_finds_the_sections():
    names = {fn.__qualname__ for fn in _package_functions() if _section_try_bodies(fn)}
    assert {"RegistryState.add_simple", "RegistryState._add_dependent", "drop_owner",
            "collected", "ClaimTable.claim", "ClaimTable.forget"} <= names


def test_no_instruction_of_a_section_try_escapes_its_handler():
    found = [place for fn in _package_functions() for place in _uncovered(fn)]
    assert not found, "\n".join(found)
