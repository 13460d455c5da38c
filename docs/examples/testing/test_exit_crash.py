"""Crash-regression tests for the toy binding: run the programs in fresh interpreters
and assert on how they ended. Run with: .venv/bin/python -m pytest
docs/examples/testing"""

from pathlib import Path

import pytest

from exitsafe.testing import assert_clean_exit, run

HERE = Path(__file__).resolve().parent
CRASH = HERE / "crash.py"  # the binding as it was
FIXED = HERE / "fixed.py"  # the binding with exitsafe


def test_unprotected_binding_crashes_at_exit():
    result = run(script=CRASH)
    assert result.stdout == "work done\n"  # the program itself worked...
    assert not result.clean  # ...and then crashed at exit
    assert (result.signal == "SIGSEGV"
            or result.ntstatus.name == "STATUS_ACCESS_VIOLATION")
    frames = [frame.function for frame in result.fatal_error.top_frames]
    assert frames[:3] == ["string_at", "device_release", "__del__"]


def test_protected_binding_exits_cleanly():
    results = run(script=FIXED, repeat=10)  # ten fresh interpreters
    assert_clean_exit(results)  # each exits 0: no fatal error, no "Exception ignored"
    (teardown,) = results[0].registries  # exitsafe's trace, parsed
    assert [(step.name, step.outcome) for step in teardown.steps] == [
        ("dev0", "released_at_exit"),
        ("runtime", "released_at_exit"),
    ]


# The same through the pytest plugin: the exit_run fixture and the exitsafe marker.
@pytest.mark.exitsafe(repeat=20)
def test_binding_exits_cleanly(exit_run):
    assert_clean_exit(exit_run(script=FIXED))


def test_with_the_leak_override(exit_run):
    result = exit_run(script=FIXED, env={"EXITSAFE_AT_EXIT": "leak"})
    assert_clean_exit(result)
    (teardown,) = result.registries
    assert (teardown.released, teardown.leaked) == (0, 2)  # leaked on purpose, as asked
