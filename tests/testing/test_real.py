"""End-to-end: real programs that crash, abort, hang or leave noise at exit.

These run real interpreters, so they confirm that the decoding the fake-process tests
check matches what CPython actually prints on this platform.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from exitsafe.testing import ExitResult, ExitResults, assert_clean_exit, run, run_command

POSIX = os.name == "posix"


def failure_message(result: ExitResult) -> str:
    with pytest.raises(AssertionError) as info:
        assert_clean_exit(result)
    return str(info.value)


def test_real_segfault_in_del_at_exit() -> None:
    code = textwrap.dedent(
        """
        import ctypes

        class Wrapper:
            def __del__(self):
                ctypes.string_at(0)  # reads address 0: a real segfault

        keep = Wrapper()
        """
    )
    result = run(code)
    assert not result.clean
    if POSIX:
        assert result.signal == "SIGSEGV"
    else:
        assert result.ntstatus is not None and result.ntstatus.name == "STATUS_ACCESS_VIOLATION"
    assert result.fatal_error is not None
    functions = [frame.function for frame in result.fatal_error.top_frames]
    assert functions[:2] == ["string_at", "__del__"]
    message = failure_message(result)
    assert "SIGSEGV" in message or "STATUS_ACCESS_VIOLATION" in message
    assert "in __del__" in message


def test_real_abort() -> None:
    result = run("import os; os.abort()")
    if POSIX:
        assert result.signal == "SIGABRT"
    else:
        assert result.ntstatus is not None
    assert result.fatal_error is not None
    assert result.fatal_error.message == "Aborted"
    assert result.fatal_error.top_frames[0].function == "<module>"


def test_real_fatal_python_error() -> None:
    result = run("import faulthandler; faulthandler._fatal_error_c_thread()")
    assert not result.clean
    fatal = result.fatal_error
    assert fatal is not None
    assert fatal.message == "faulthandler_fatal_error_thread: in new thread"
    assert fatal.runtime_state == "initialized"
    assert fatal.threads and fatal.threads[0].frames[0].function == "<module>"


def test_real_crash_on_a_background_thread_names_that_thread() -> None:
    code = textwrap.dedent(
        """
        import faulthandler, threading, time

        def worker():
            faulthandler._sigsegv()

        threading.Thread(target=worker).start()
        time.sleep(30)
        """
    )
    result = run(code)
    assert result.fatal_error is not None
    assert result.fatal_error.message == "Segmentation fault"
    crashed = result.fatal_error.current_thread
    assert crashed is not None and crashed.current
    assert "worker" in [frame.function for frame in crashed.frames]
    others = [t for t in result.fatal_error.threads if not t.current]
    assert any(f.function == "<module>" for t in others for f in t.frames)


def test_real_unraisable_exception_from_del_at_exit() -> None:
    code = textwrap.dedent(
        """
        class Session:
            def __del__(self):
                raise RuntimeError("runtime already torn down")

        session = Session()
        print("done")
        """
    )
    result = run(code)
    assert result.returncode == 0
    assert result.stdout == "done\n"
    assert not result.clean
    (report,) = result.unraisable
    assert report.where == "<function Session.__del__>"
    assert (report.exc_type, report.message) == ("RuntimeError", "runtime already torn down")
    assert result.failure_kind == "unraisable RuntimeError in <function Session.__del__>"
    message = failure_message(result)
    assert "RuntimeError: runtime already torn down in <function Session.__del__>" in message


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting to be reaped is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc here: it answered the signal


@pytest.mark.skipif(not POSIX, reason="process groups and SIGKILL are POSIX")
def test_real_hang_is_killed_with_its_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open({str(pidfile)!r}, "w") as fh:
            fh.write(str(child.pid))
        print("started", flush=True)

        def wait_forever():
            time.sleep(600)

        wait_forever()
        """
    )
    result = run(code, timeout=3)
    assert result.timed_out
    assert not result.clean
    assert result.failure_kind == "timeout (child-process)"  # the child still sleeping
    assert result.stdout == "started\n"
    # faulthandler's stacks, asked for before the kill, show where it hung.
    assert result.fatal_error is not None
    assert "wait_forever" in [frame.function for frame in result.fatal_error.top_frames]
    message = failure_message(result)
    assert "timed out after 3 s" in message
    assert "Where it hung" in message
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 30  # SIGKILL is asynchronous: allow it to land
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


@pytest.mark.skipif(not POSIX, reason="process groups are POSIX")
def test_real_orphan_holding_the_output_counts_as_a_timeout(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    )
    result = run(code, timeout=2)
    assert result.returncode == 0
    assert result.timed_out
    assert "kept its stdout or stderr open" in result.report()


def test_real_big_output_does_not_deadlock() -> None:
    code = "import sys; sys.stdout.write('x' * 3_000_000); sys.stderr.write('y' * 3_000_000)"
    result = run(code)
    assert result.clean
    assert len(result.stdout) == 3_000_000
    assert len(result.stderr) == 3_000_000


def test_real_environment_and_working_directory(tmp_path: Path) -> None:
    code = (
        "import os, sys, faulthandler\n"
        "print(os.environ.get('EXITSAFE_TRACE'), os.environ.get('PYTHONFAULTHANDLER'),"
        " os.environ.get('MY_VAR'), faulthandler.is_enabled(), os.getcwd())\n"
    )
    result = run(code, cwd=tmp_path, env={"MY_VAR": "42"})
    assert result.stdout.split() == ["1", "1", "42", "True", str(tmp_path.resolve())]
    result = run(code, env={"EXITSAFE_TRACE": None})
    assert result.stdout.split()[0] == "None"


def test_real_script_module_and_args(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import sys; print(sys.argv[1:])\n")
    assert run(script=script, args=["a", "b"]).stdout == "['a', 'b']\n"
    result = run(module="prog", args=["c"], cwd=tmp_path)
    assert result.stdout == "['c']\n"


def test_real_run_command_with_any_program() -> None:
    result = run_command([sys.executable, "-c", "import sys; sys.exit(4)"])
    assert result.returncode == 4
    assert result.failure_kind == "exit status 4"
    with pytest.raises(FileNotFoundError):
        run_command(["exitsafe-no-such-program-xyz"])


def test_real_exitsafe_teardown_is_traced_and_clean() -> None:
    code = textwrap.dedent(
        """
        import exitsafe
        closed = []
        inst = exitsafe.track("inst", closed.append, kind="instance", name="inst0")
        dev = exitsafe.track("dev", closed.append, kind="device", name="dev0", depends_on=[inst])
        """
    )
    result = run(code)
    assert_clean_exit(result)
    (registry,) = result.registries
    assert registry.finished
    assert registry.reason == "atexit"
    assert [(s.kind, s.name, s.outcome) for s in registry.steps] == [
        ("device", "dev0", "released_at_exit"),
        ("instance", "inst0", "released_at_exit"),
    ]
    assert (registry.released, registry.leaked, registry.failed) == (2, 0, 0)


def test_real_crash_during_exitsafe_teardown_shows_the_last_steps() -> None:
    code = textwrap.dedent(
        """
        import ctypes, exitsafe
        inst = exitsafe.track(1, lambda raw: None, kind="instance", name="inst0")
        dev = exitsafe.track(2, lambda raw: ctypes.string_at(0), kind="device", name="dev0",
                             depends_on=[inst])
        buf = exitsafe.track(3, lambda raw: None, kind="buffer", name="buf0", depends_on=[dev])
        """
    )
    result = run(code)
    assert not result.clean
    (registry,) = result.registries
    assert not registry.finished
    assert [s.name for s in registry.steps] == ["buf0"]
    message = failure_message(result)
    assert "teardown did NOT finish: 1 of 3 steps completed" in message
    assert "step 1/3 release buffer 'buf0' -> released_at_exit" in message
    assert "the process ended during step 2/3" in message


def test_real_repeat_reports_every_run() -> None:
    results = run("pass", repeat=3)
    assert isinstance(results, ExitResults)
    assert len(results) == 3
    assert results.clean and results.failure_rate == 0.0
