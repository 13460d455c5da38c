"""What a failing crash-regression test reports: this test fails on purpose (the
program it runs crashes at exit every time). Run with: .venv/bin/python -m pytest
docs/examples/testing/test_crash_report.py"""

from pathlib import Path

import pytest

from exitsafe.testing import assert_clean_exit

CRASH = Path(__file__).resolve().parent / "crash.py"


@pytest.mark.exitsafe(repeat=5)
def test_binding_exits_cleanly(exit_run):
    assert_clean_exit(exit_run(script=CRASH))
