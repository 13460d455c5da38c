"""Exit status decoding, through fake processes (pytest-subprocess's ``fp``).

Each test fakes a process that ends the way a real crash would, runs it through
``exitsafe.testing.run`` and checks what a user reads off the result.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pytest_subprocess import FakeProcess
from pytest_subprocess.process_recorder import ProcessRecorder

from exitsafe.testing import (
    ExitResult,
    ExitResults,
    NtStatus,
    _decode,
    _runner,
    assert_clean_exit,
    run,
    run_command,
)
from exitsafe.testing.parsers import decode_ntstatus, decode_signal

SEGV_STDERR = """\
Fatal Python error: Segmentation fault

Current thread 0x00007f215a5f1b80 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "app.py", line 6 in close
  File "app.py", line 9 in __del__
"""

WINDOWS_STDERR = """\
Windows fatal exception: access violation

Current thread 0x00001a2c (most recent call first):
  File "C:\\app\\binding.py", line 42 in release
  File "C:\\app\\binding.py", line 50 in __del__
"""


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode as on Windows (where abort() exits with 3 and no signal kills a process)."""
    monkeypatch.setattr(_decode, "PLATFORM", "win32")


def fake(fp: FakeProcess, code: str = "pass", **kwargs: Any) -> ProcessRecorder:
    """Register a fake ``python -X faulthandler -c code`` that ends as ``kwargs`` say."""
    return fp.register([sys.executable, "-X", "faulthandler", "-c", code], **kwargs)


def _failure_message(result: ExitResult | ExitResults) -> str:
    with pytest.raises(AssertionError) as info:
        assert_clean_exit(result)
    return str(info.value)


# ----------------------------------------------------------------- POSIX signals


@pytest.mark.parametrize(
    ("returncode", "name"),
    [
        (-signal.SIGSEGV, "SIGSEGV"),
        (-signal.SIGABRT, "SIGABRT"),
        (-signal.SIGKILL, "SIGKILL"),
        (-signal.SIGTERM, "SIGTERM"),
        (-signal.SIGFPE, "SIGFPE"),
        (-signal.SIGILL, "SIGILL"),
    ],
)
def test_death_by_signal_is_named(fp: FakeProcess, returncode: int, name: str) -> None:
    fake(fp, returncode=returncode)
    result = run("pass")
    assert result.returncode == returncode
    assert result.signal == name
    assert result.ntstatus is None
    assert not result.clean
    assert result.failure_kind == name
    assert result.summary().startswith("NOT CLEAN")
    assert f"{name} (signal {-returncode})" in result.summary()


def test_sigsegv_with_faulthandler_dump(fp: FakeProcess) -> None:
    fake(fp, returncode=-11, stderr=SEGV_STDERR)
    result = run("pass")
    assert result.signal == "SIGSEGV"
    assert result.fatal_error is not None
    assert result.fatal_error.message == "Segmentation fault"
    top = result.fatal_error.top_frames
    assert [(f.file, f.line, f.function) for f in top] == [
        ("/usr/lib/python3.11/ctypes/__init__.py", 519, "string_at"),
        ("app.py", 6, "close"),
        ("app.py", 9, "__del__"),
    ]
    message = _failure_message(result)
    assert "SIGSEGV (signal 11)" in message
    assert 'File "app.py", line 9 in __del__' in message


def test_signal_number_without_a_name(fp: FakeProcess) -> None:
    unnamed = next(n for n in range(1, 65) if n not in {s.value for s in signal.Signals})
    fake(fp, returncode=-unnamed)
    assert run("pass").signal == f"SIG{unnamed}"


def test_positive_exit_status_is_not_a_signal(fp: FakeProcess) -> None:
    fake(fp, returncode=139)  # a shell's 128 + 11: ambiguous, left as an exit status
    result = run("pass")
    assert result.signal is None
    assert result.ntstatus is None
    assert result.failure_kind == "exit status 139"


# ----------------------------------------------------------------- Windows statuses


@pytest.mark.parametrize(
    ("returncode", "name", "hex_"),
    [
        (3221225477, "STATUS_ACCESS_VIOLATION", "0xC0000005"),
        (-1073741819, "STATUS_ACCESS_VIOLATION", "0xC0000005"),
        (0xC00000FD, "STATUS_STACK_OVERFLOW", "0xC00000FD"),
        (-1073741571, "STATUS_STACK_OVERFLOW", "0xC00000FD"),
        (0xC0000374, "STATUS_HEAP_CORRUPTION", "0xC0000374"),
        (0xC0000409, "STATUS_STACK_BUFFER_OVERRUN", "0xC0000409"),
        (0xC0000142, "STATUS_DLL_INIT_FAILED", "0xC0000142"),
        (0xC000013A, "STATUS_CONTROL_C_EXIT", "0xC000013A"),
    ],
)
def test_ntstatus_is_named(fp: FakeProcess, returncode: int, name: str, hex_: str) -> None:
    fake(fp, returncode=returncode, stderr=WINDOWS_STDERR)
    result = run("pass")
    assert result.ntstatus is not None
    assert (result.ntstatus.name, result.ntstatus.hex) == (name, hex_)
    assert str(result.ntstatus) == f"{name} {hex_}"
    assert result.signal is None
    assert result.failure_kind == name
    assert f"{name} {hex_}" in result.summary()


def test_ntstatus_decodes_the_same_on_windows(fp: FakeProcess, windows: None) -> None:
    fake(fp, returncode=-1073741819, stderr=WINDOWS_STDERR)
    result = run("pass")
    assert result.signal is None
    assert isinstance(result.ntstatus, NtStatus)
    assert result.ntstatus.code == 0xC0000005
    assert result.ntstatus.name == "STATUS_ACCESS_VIOLATION"
    assert result.fatal_error is not None and result.fatal_error.windows
    assert result.fatal_error.message == "access violation"
    assert result.fatal_error.top_frames[0].function == "release"
    assert "Windows fatal exception: access violation" in _failure_message(result)


def test_unknown_error_status_still_decodes(fp: FakeProcess) -> None:
    fake(fp, returncode=0xC0001234)
    result = run("pass")
    assert result.ntstatus is not None
    assert result.ntstatus.name == "NTSTATUS_0xC0001234"
    assert result.ntstatus.hex == "0xC0001234"


def test_windows_abort_exit_code_3(fp: FakeProcess, windows: None) -> None:
    stderr = (
        "Fatal Python error: Aborted\n\n"
        "Current thread 0x00001a2c (most recent call first):\n"
        '  File "a.py", line 1 in <module>\n'
    )
    fake(fp, returncode=3, stderr=stderr)
    result = run("pass")
    assert result.ntstatus is not None
    assert result.ntstatus.code == 3
    assert result.ntstatus.name == "ABORT_EXIT_CODE"
    assert "abort()" in result.ntstatus.description
    assert result.fatal_error is not None and result.fatal_error.message == "Aborted"


def test_exit_code_3_is_plain_on_posix(fp: FakeProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_decode, "PLATFORM", "linux")
    fake(fp, returncode=3)
    result = run("pass")
    assert result.ntstatus is None
    assert result.failure_kind == "exit status 3"


def test_negative_code_on_windows_is_not_a_signal(windows: None) -> None:
    assert decode_signal(-11) is None
    assert decode_signal(-1073741819) is None


def test_decoders_on_plain_statuses() -> None:
    assert decode_signal(0) is None
    assert decode_signal(None) is None
    assert decode_ntstatus(0) is None
    assert decode_ntstatus(1) is None
    assert decode_ntstatus(None) is None


# ----------------------------------------------------------------- clean, unraisable, timeout


def test_clean_exit(fp: FakeProcess) -> None:
    fake(fp, returncode=0, stdout="hello\n")
    result = run("pass")
    assert result.clean
    assert result.failure_kind is None
    assert result.stdout == "hello\n"
    assert result.summary().startswith("CLEAN")
    assert_clean_exit(result)  # does not raise


def test_exit_0_with_unraisable_is_not_clean(fp: FakeProcess) -> None:
    stderr = (
        "Exception ignored in: <function Device.__del__ at 0x7f3f5eec0820>\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 12, in __del__\n'
        "    lib.device_release(self._ptr)\n"
        "AttributeError: 'NoneType' object has no attribute 'device_release'\n"
    )
    fake(fp, returncode=0, stderr=stderr)
    result = run("pass")
    assert result.returncode == 0
    assert not result.clean
    assert result.failure_kind == "unraisable AttributeError in <function Device.__del__>"
    message = _failure_message(result)
    assert "AttributeError: 'NoneType' object has no attribute 'device_release'" in message
    assert "<function Device.__del__>" in message
    assert 'File "app.py", line 12, in __del__' in message


def test_fatal_error_with_exit_0_is_not_clean(fp: FakeProcess) -> None:
    fake(fp, returncode=0, stderr="Fatal Python error: oops\n")
    result = run("pass")
    assert not result.clean
    assert result.failure_kind == "fatal error 'oops'"


def test_timeout_kills_and_marks(fp: FakeProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_runner, "DUMP_GRACE", 0.0)
    fake(fp, returncode=-9, wait=0.5)
    result = run("pass", timeout=0.05)
    assert result.timed_out
    assert not result.clean
    assert result.failure_kind == "timeout"
    assert result.summary().startswith("NOT CLEAN [timeout]: timed out after 0.05 s")


def test_timeout_asks_faulthandler_for_stacks_first(
    fp: FakeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runner, "DUMP_GRACE", 0.0)
    received: list[int] = []
    fake(fp, returncode=-9, wait=0.5, signal_callback=lambda _proc, sig: received.append(sig))
    run("pass", timeout=0.05)
    if sys.platform != "win32":
        # frozen while its children dump their stacks, then asked for its own, resumed
        assert received[:3] == [signal.SIGSTOP, signal.SIGABRT, signal.SIGCONT]
    assert received[-1] == (signal.SIGTERM if sys.platform == "win32" else signal.SIGKILL)


def test_popen_gets_a_new_session_env_and_cwd(
    fp: FakeProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXITSAFE_TEST_PARENT", "inherited")
    monkeypatch.setenv("EXITSAFE_TEST_GONE", "x")
    recorder = fake(fp)
    run("pass", cwd=tmp_path, env={"EXTRA": "1", "EXITSAFE_TEST_GONE": None})
    assert recorder.last_call is not None
    kwargs = recorder.last_call.kwargs
    assert kwargs is not None
    env = kwargs["env"]
    assert env["PYTHONFAULTHANDLER"] == "1"
    assert env["EXITSAFE_TRACE"] == "1"
    assert env["EXTRA"] == "1"
    assert env["EXITSAFE_TEST_PARENT"] == "inherited"
    assert "EXITSAFE_TEST_GONE" not in env
    assert kwargs["cwd"] == str(tmp_path)
    assert kwargs["stdout"] == subprocess.PIPE
    assert kwargs["stderr"] == subprocess.PIPE
    if sys.platform != "win32":
        assert kwargs["start_new_session"] is True


def test_env_can_turn_the_trace_off(fp: FakeProcess) -> None:
    recorder = fake(fp)
    run("pass", env={"EXITSAFE_TRACE": None})
    assert recorder.last_call is not None and recorder.last_call.kwargs is not None
    assert "EXITSAFE_TRACE" not in recorder.last_call.kwargs["env"]


def test_script_module_and_args_build_the_command(fp: FakeProcess, tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    fp.register([sys.executable, "-X", "faulthandler", str(script), "--flag"])
    fp.register([sys.executable, "-X", "faulthandler", "-m", "app", "x"])
    assert run(script=script, args=["--flag"]).clean
    assert run(module="app", args=["x"]).clean


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"code": "pass", "module": "m"}, {"script": "a.py", "module": "m"}],
)
def test_exactly_one_of_code_script_module(kwargs: dict[str, str]) -> None:
    with pytest.raises(TypeError, match="exactly one of code, script or module"):
        run(**kwargs)  # type: ignore[call-overload]


def test_a_command_line_given_as_code_is_refused_with_what_to_call() -> None:
    with pytest.raises(TypeError, match=r"code must be Python source.*run_command\(argv\)"):
        run([sys.executable, "app.py"])  # type: ignore[call-overload]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="repeat"):
        run_command(["x"], repeat=0)
    with pytest.raises(ValueError, match="timeout"):
        run_command(["x"], timeout=0)
    with pytest.raises(TypeError, match="sequence"):
        run_command("python -c pass")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="empty"):
        run_command([])


# ----------------------------------------------------------------- repeated runs


def test_repeat_aggregates_failure_rate_and_kinds(fp: FakeProcess) -> None:
    unraisable = (
        "Exception ignored in: <function Buffer.__del__ at 0x7f00000000{n}>\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 3, in __del__\n'
        "RuntimeError: runtime torn down\n"
    )
    fake(fp, returncode=0)
    fake(fp, returncode=-11, stderr=SEGV_STDERR)
    fake(fp, returncode=0, stderr=unraisable.format(n=10))
    fake(fp, returncode=-11, stderr=SEGV_STDERR)
    fake(fp, returncode=0, stderr=unraisable.format(n=20))
    results = run("pass", repeat=5)
    assert isinstance(results, ExitResults)
    assert len(results) == 5
    assert [r.clean for r in results] == [True, False, False, False, False]
    assert len(results.failures) == 4
    assert results.failure_rate == 0.8
    # Memory addresses differ from run to run; the kinds do not.
    assert results.kinds == {
        "SIGSEGV": 2,
        "unraisable RuntimeError in <function Buffer.__del__>": 2,
    }
    assert not results.clean
    message = _failure_message(results)
    assert "4 of 5 runs failed (80%)" in message
    assert "SIGSEGV: 2 run(s) (run 2, 4)" in message
    assert "RuntimeError: runtime torn down" in message


def test_repeat_all_clean(fp: FakeProcess) -> None:
    fake(fp, returncode=0, occurrences=3)
    results = run("pass", repeat=3)
    assert isinstance(results, ExitResults)
    assert results.clean
    assert results.failure_rate == 0.0
    assert results.kinds == {}
    assert results.summary().startswith("CLEAN: 3 of 3 runs clean")
    assert_clean_exit(results)


def test_assert_clean_exit_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="ExitResult"):
        assert_clean_exit(0)  # type: ignore[arg-type]


def test_repr_is_short_and_decoded(fp: FakeProcess) -> None:
    fake(fp, returncode=-11, stderr=SEGV_STDERR + "x" * 10_000)
    result = run("pass")
    assert repr(result).startswith("<ExitResult NOT CLEAN [crash-at-exit]: crash at exit (SIGSEGV)")
    assert len(repr(result)) < 200
