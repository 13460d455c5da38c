"""The pytest plugin: ``exit_run``, ``@pytest.mark.exitsafe`` and ``--exitsafe-repeat``.

Each test writes a small test file, runs pytest on it with ``pytester`` and checks what
the user sees: outcomes, the decoded failure report and the failure-rate summary.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CRASHES_EVERY_OTHER_RUN = '''
import os
from pathlib import Path

import pytest
from exitsafe.testing import ExitResults, assert_clean_exit

FLAKY = """
from pathlib import Path
import ctypes
counter = Path("counter")
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))

class Handle:
    def __del__(self):
        if n % 2:
            ctypes.string_at(0)

h = Handle()
"""
'''


def test_fixture_runs_in_tmp_path_and_passes_when_clean(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from exitsafe.testing import ExitResult, assert_clean_exit

        def test_clean(exit_run, tmp_path):
            result = exit_run("import os; print(os.getcwd())")
            assert isinstance(result, ExitResult)
            assert result.stdout.strip() == str(tmp_path.resolve())
            assert exit_run.timeout == 30.0 and exit_run.repeat == 1
            assert_clean_exit(result)
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_failure_shows_the_decoded_result_not_raw_stderr(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from exitsafe.testing import assert_clean_exit

        CODE = (
            "import ctypes\\n"
            "class Device:\\n"
            "    def __del__(self):\\n"
            "        ctypes.string_at(0)\\n"
            "dev = Device()\\n"
        )

        def test_crash(exit_run):
            assert_clean_exit(exit_run(CODE))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "NOT CLEAN [crash-at-exit]: crash at exit (SIGSEGV)" in text
    assert "SIGSEGV (signal 11); Fatal Python error: Segmentation fault" in text
    assert "line 4 in __del__" in text
    assert "exitsafe: decoded exit results" not in text  # the assertion already says it all
    assert "Current thread 0x" not in text  # the raw faulthandler dump is not echoed


def test_plain_assert_on_clean_gets_a_decoded_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_noise(exit_run):
            result = exit_run(
                "class A:\\n    def __del__(self): 1/0\\na = A()\\n"
            )
            assert result.clean
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "<ExitResult NOT CLEAN [unraisable-at-exit]: a __del__ raised while the" in text
    assert "exitsafe: decoded exit results" in text
    assert "ZeroDivisionError: division by zero in <function A.__del__>" in text


def test_marker_repeats_and_reports_the_failure_rate(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        CRASHES_EVERY_OTHER_RUN
        + """
@pytest.mark.exitsafe(repeat=4, timeout=60)
def test_flaky(exit_run):
    results = exit_run(FLAKY)
    assert isinstance(results, ExitResults)
    assert exit_run.timeout == 60
    assert_clean_exit(results)
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "2 of 4 runs failed (50%): SIGSEGV x2" in text
    assert "SIGSEGV: 2 run(s) (run 2, 4)" in text
    assert "exitsafe repeated exit runs" in text


def test_option_overrides_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        CRASHES_EVERY_OTHER_RUN
        + """
@pytest.mark.exitsafe(repeat=4)
def test_once(exit_run):
    assert exit_run.repeat == 1
    assert_clean_exit(exit_run(FLAKY))   # only run 0: it does not crash
"""
    )
    pytester.runpytest("-p", "no:cacheprovider", "--exitsafe-repeat=1").assert_outcomes(passed=1)


def test_option_repeats_unmarked_tests_and_summarizes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_clean(exit_run):
            results = exit_run("pass")
            assert len(results) == 3 and results.clean
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--exitsafe-repeat=3")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*exitsafe repeated exit runs*", "*CLEAN: 3 of 3 runs clean*"])


def test_bad_option_and_marker_are_reported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.exitsafe(repeat=0)
        def test_bad(exit_run):
            pass

        @pytest.mark.exitsafe(retries=3)
        def test_unknown(exit_run):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*repeat must be an int >= 1, not 0*",
            "*unknown @pytest.mark.exitsafe argument(s): retries*",
        ]
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--exitsafe-repeat=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.exitsafe(repeat=1, timeout=30.0, audit=False*"])


def test_command_method_runs_any_program(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_cmd(exit_run):
            result = exit_run.command([sys.executable, "-c", "raise SystemExit(5)"])
            assert result.returncode == 5
            assert result.failure_kind == "exit status 5"
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_importing_the_plugin_is_light() -> None:
    code = (
        "import sys, exitsafe.pytest_plugin\n"
        "heavy = [m for m in ('exitsafe.testing', 'cffi', 'ctypes') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_importing_exitsafe_testing_does_not_import_pytest() -> None:
    code = "import sys, exitsafe.testing; print('pytest' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
