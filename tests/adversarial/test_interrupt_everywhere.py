"""A Ctrl-C at every line and every instruction of each section of exitsafe keeps its promises.

Each test sweeps one section with :mod:`tests.adversarial.interrupt_harness`: the section's
action runs again and again, with SIGINT delivered at the 1st, 2nd, 3rd ... event of
exitsafe's code, until a run completes without a delivery.  After each interrupted run:
the lock is free (not held by the interrupted thread, and another thread takes it within
a second), no handle is left claimed or borrowed with nothing running, SIGINT and
exitsafe's hold of it are as they were, an explicit ``teardown()`` raises nothing and
waits for no release or borrow nobody runs (no ``leaked_in_use``), every handle the
program tracked ends with exactly one ledger outcome, no release function or hook ran
twice or without its outcome, and a ``track()`` that raised released nothing.

Modes (see the harness): ``line`` is Ctrl-C under a debugger, ``coverage`` or a profiler
on any CPython; ``opcode`` is Ctrl-C on CPython 3.9 with no tracer (and any instruction
anywhere); ``calls`` is Ctrl-C on CPython 3.10+ with no tracer.  Both cores: compiled and
pure Python.

The default run delivers at every N in the ``line`` and ``calls`` modes and samples N with a
stride in the ``opcode`` mode (about 40 runs per sweep); ``EXITSAFE_EVERY_LINE=1`` runs every
N there too.  A failure lists each place an interrupt broke a promise: function, file and
line, event, and the N of those runs.

One kind of place is reported as a warning (``CompilerGap``), not a failure: CPython
3.14's compiler leaves many ``NOT_TAKEN`` instructions (after a conditional jump) out of
the exception table of the ``try`` around them (python/cpython#137681; 3.15 covers them),
so that an exception raised there by a tracer of instructions (``f_trace_opcodes``, a
``sys.monitoring`` INSTRUCTION tool: the ``opcode`` mode) leaves the frame past every
handler of the source.  (No signal is acted on there without such a tracer, and a
BRANCH_LEFT callback's exception is raised at the jump, which is covered.)

These tests guard the redesign of the core's state changes (one owner for every state
change): the failures they report today are fixed there, not here.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from .interrupt_harness import CORES, MODES, SECTIONS, Sweep, sweep

BUILT = importlib.util.find_spec("exitsafe._speedups") is not None

#: Every (section, mode) but the release chain without a tracer, which has a test of its own.
GENERIC = [(s, m) for s in SECTIONS for m in MODES if (s, m) != ("release_chain", "calls")]


def _sweep(section: str, mode: str, core: str) -> Sweep:
    if core == "compiled" and not BUILT:
        pytest.skip("exitsafe._speedups is not built")
    result = sweep(section, mode, core, every=True if mode != "opcode" else None)
    assert result.finished, result.describe()
    if not result.events:
        pytest.skip(
            f"the {core} core runs section {section!r} without any Python code of exitsafe: "
            f"no place for an interrupt"
        )
    assert result.runs > 0, result.describe()
    if result.gaps:
        warnings.warn(CompilerGap(result.describe(gaps=True)), stacklevel=2)
    return result


class CompilerGap(UserWarning):
    """Runs whose interrupt landed at an instruction that the compiler left out of the
    ``try`` around it (CPython 3.14's ``NOT_TAKEN``, see the harness): no Python code can
    handle an exception there, so these runs are shown as this warning, not failed."""


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize(("section", "mode"), GENERIC)
def test_a_ctrl_c_anywhere_in_a_section_keeps_every_promise(section, mode, core):
    result = _sweep(section, mode, core)
    if result.failing:
        pytest.fail(result.describe(), pytrace=False)


@pytest.mark.parametrize("core", list(CORES))
def test_a_ctrl_c_after_any_call_of_a_release_chain_strands_no_claimed_handle(core):
    """No tracer, CPython 3.10+: a Ctrl-C acted on at a function's entry or right after a
    call, at each of those points of a release chain in turn (a child released, then each
    parent it was the last dependent of: plain handles, thread-affine ones, a parent tainted
    by a failed release).  A parent the chain claimed must end released with one outcome or
    be back to live, never stranded "releasing" (never released natively, ``retain()``
    refused, the exit teardown waiting 5 s for it and recording ``leaked_in_use``)."""
    result = _sweep("release_chain", "calls", core)
    if result.failing:
        pytest.fail(result.describe(), pytrace=False)
