"""Each cause `exitsafe.testing` names, reproduced by a real program in a real subprocess.

Every test runs a program that really crashes, hangs or loses data, and checks what a
user reads: the diagnosis's kind, its first line, the thread / step / process it names,
and the exitsafe feature its hint points to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exitsafe.cli import main
from exitsafe.testing import ExitNotClean, ExitResult, assert_clean_exit, run
from exitsafe.testing._hints import HINTS

posix_only = pytest.mark.skipif(os.name != "posix", reason="fork, signals and /proc are POSIX")

SPIN_CPP = r"""
#include <unistd.h>
static int go;
static int called;
// A native worker loop, as an inference runtime's thread pool runs one: it calls back
// into Python when it has work, and it is noexcept, so a forced unwind through it calls
// std::terminate.
extern "C" void spin_calling(void (*tick)(void)) noexcept {
    tick();  // started
    for (;;) {
        if (__atomic_exchange_n(&go, 0, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&called, 1, __ATOMIC_SEQ_CST);
            tick();  // a completion callback
        }
        usleep(1000);
    }
}
// Closing the session hands the worker one last job and waits (the GIL released, as
// ctypes calls run) until its completion callback was made, up to 10 s.
extern "C" void session_close(void) {
    __atomic_store_n(&go, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 10000 && !__atomic_load_n(&called, __ATOMIC_SEQ_CST); i++)
        usleep(1000);
    usleep(100000);
}
"""

THREAD_IN_NATIVE = """
import ctypes, sys, threading, types
lib = ctypes.CDLL(sys.argv[1])
TICK = ctypes.CFUNCTYPE(None)
in_native_code = threading.Event()

@TICK
def tick():
    in_native_code.set()

lib.spin_calling.argtypes = [TICK]

def run_pool():
    lib.spin_calling(tick)

class Session:
    def __del__(self, close=lib.session_close):
        close()  # a native release at finalization: the GIL is let go meanwhile

# The session is a global of the binding's module (not of this one, whose globals the
# worker's frame keeps alive): it is released while the interpreter finalizes modules.
binding = sys.modules["binding"] = types.ModuleType("binding")
binding.session = Session()
del binding
threading.Thread(target=run_pool, name="inference-pool", daemon=True).start()
in_native_code.wait(30)  # the pool is running inside the native loop
print("inference done")
"""


def _one(result: object) -> ExitResult:
    assert isinstance(result, ExitResult)
    return result


@posix_only
def test_daemon_thread_unwound_in_native_code(tmp_path: Path) -> None:
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the native worker loop")
    (tmp_path / "spin.cpp").write_text(SPIN_CPP)
    library = tmp_path / "libspin.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(tmp_path / "spin.cpp")],
        check=True,
    )
    result = _one(run(THREAD_IN_NATIVE, args=[str(library)], timeout=20))
    assert result.stdout == "inference done\n"
    if sys.version_info >= (3, 14):
        # 3.14+ never unwinds the thread (gh-87135): its callback blocks for ever, and on
        # 3.14.10 / 3.15.2 the process then ends with exit 0, nothing to diagnose (a hang
        # of the whole exit is recognised from faulthandler's dump: see the next test).
        assert result.signal is None
        assert "terminate called" not in result.stderr
        return
    assert result.signal == "SIGABRT"
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "thread-in-native"
    assert "'inference-pool'" in diagnosis.headline
    assert any("last Python frame: <string>" in d and "in run_pool" in d for d in diagnosis.details)
    first = result.report().splitlines()[0]
    assert first.startswith(
        "NOT CLEAN [thread-in-native]: a daemon thread 'inference-pool' was unwound inside native"
    )
    assert "`exitsafe.quiesce()`" in (diagnosis.hint or "")
    assert "exitsafe.worker(thread, stop=stop_event, uses=[handle])" in (diagnosis.hint or "")
    assert diagnosis.doc == "threads.md#quiescing-the-threads-left-exitsafequiesce"
    # the program's own stderr line before the fatal error is shown by default
    assert "  terminate called without an active exception" in result.report()


def test_3_14_hang_of_a_thread_in_native_code_is_recognised() -> None:
    # CPython 3.14 parks such a thread forever instead of unwinding it; no 3.14 here, so
    # this is the dump such a run produces (faulthandler on the timeout's SIGABRT).
    stderr = textwrap.dedent(
        """\
        exitsafe: thread ident=0x00007f5b3b7fe6c0 name="inference-pool" daemon=true frame="app.py:14 in run_pool" target="run_pool"
        Fatal Python error: Aborted

        Thread 0x00007f5b3b7fe6c0 [inference-pool] (most recent call first):
          File "app.py", line 14 in run_pool
          File "/usr/lib/python3.14/threading.py", line 1000 in run

        Current thread 0x00007f5b3c9a2b80 (most recent call first):
          <no Python frame>
        """  # noqa: E501
    )
    result = ExitResult.from_output(["python", "app.py"], -9, "", stderr, timed_out=True)
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "thread-in-native"
    assert "hung while finalizing" in diagnosis.headline
    assert diagnosis.details == (
        "thread 'inference-pool' (0x00007f5b3b7fe6c0), last Python frame: run_pool (app.py:14)",
    )


def test_non_daemon_thread_that_never_ends_hangs_before_teardown() -> None:
    code = textwrap.dedent(
        """
        import threading, time
        import exitsafe

        handle = exitsafe.track(1, lambda raw: None, kind="device", name="dev0")

        def serve_forever():
            while True:
                time.sleep(0.05)

        threading.Thread(target=serve_forever, name="grpc-server").start()
        print("main done", flush=True)  # (the process is killed: a buffer is lost)
        """
    )
    result = _one(run(code, timeout=3))
    assert result.timed_out and result.stdout == "main done\n"
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "hang-before-teardown", result.report()
    assert "threading._shutdown" in diagnosis.headline
    assert any("a non-daemon thread" in d and "serve_forever" in d for d in diagnosis.details)
    assert "exitsafe.on_early_exit(stop_event.set)" in (diagnosis.hint or "")
    assert "no per-step timeout applies there" in (diagnosis.hint or "")
    assert diagnosis.doc == "threads.md#the-early-phase"


def test_executor_still_busy_hangs_before_teardown() -> None:
    code = textwrap.dedent(
        """
        import time
        from concurrent.futures import ThreadPoolExecutor

        def stream_forever():
            while True:
                time.sleep(0.05)

        pool = ThreadPoolExecutor(max_workers=1)
        pool.submit(stream_forever)
        print("submitted")
        """
    )
    result = _one(run(code, timeout=3))
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "hang-before-teardown", result.report()
    assert any("executor worker" in d and "stream_forever" in d for d in diagnosis.details)


def test_executor_hang_names_each_worker_thread_and_its_task(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The workers are listed as the exit begins, before concurrent.futures' own exit
    # handler (registered after the start-up hook's lister) joins them for ever.
    (tmp_path / "app.py").write_text(textwrap.dedent(
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(2, thread_name_prefix="jobs")
        never = threading.Event()
        pool.submit(never.wait)
        pool.submit(never.wait)
        print("submitted", flush=True)
        """
    ))
    monkeypatch.chdir(tmp_path)
    status = main(["run", "--timeout", "4", "--", sys.executable, "app.py"])
    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("NOT CLEAN [hang-before-teardown]: "), out
    assert "concurrent.futures joining its workers" in out.splitlines()[0]
    workers = [line.strip() for line in out.splitlines()
               if line.startswith("  an executor worker ")]
    assert sorted(w.split()[3] for w in workers) == ["'jobs_0'", "'jobs_1'"], out
    assert all(" running Event.wait, now in wait (" in w for w in workers), out


def test_shutdown_lister_runs_before_every_later_threading_exit_callback() -> None:
    # threading._shutdown runs its callbacks last registered first: the lister, registered
    # as threading is imported, is kept last whatever is registered after it.
    code = textwrap.dedent(
        """
        import threading
        from exitsafe._audit import _threads

        _threads.list_threads = lambda when: print("lister", when, flush=True)
        _threads.list_at_shutdown(threading)
        _threads.list_at_shutdown(threading)  # (a second call adds nothing)

        def late():
            print("late", flush=True)
            try:
                threading._register_atexit(print, "too late")
            except RuntimeError as exc:
                print("refused:", exc, flush=True)

        threading._register_atexit(late)
        import concurrent.futures.thread  # registers its _python_exit after the lister
        threading._register_atexit(print, "last", flush=True)
        print("main done", flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "main done", "lister shutdown", "last", "late",
        "refused: can't register atexit after shutdown",
    ]


def test_threads_listed_as_the_exit_began_are_not_alive_at_exit_once_every_hook_ran() -> None:
    from exitsafe.testing._evidence import late_threads

    stderr = (
        'exitsafe: thread ident=0x00007f0000000001 name="jobs_0" daemon=false'
        ' frame="thread.py:81 in _worker" target="_worker" when="shutdown"\n'
    )
    began = ExitResult.from_output(["python", "app.py"], 0, "", stderr)
    assert [t.name for t in late_threads(began)] == ["jobs_0"]  # (the exit stopped there)
    ended = ExitResult.from_output(["python", "app.py"], 0, "", stderr,
                                   exit_phase="finalizing 0x00007f0000000002")
    assert late_threads(ended) == []


def test_hang_inside_exitsafe_teardown_names_the_step() -> None:
    code = textwrap.dedent(
        """
        import time
        import exitsafe

        def wait_for_lost_device(raw):
            while True:
                time.sleep(0.05)

        buf = exitsafe.track(1, lambda raw: None, kind="buffer", name="buf0")
        dev = exitsafe.track(2, wait_for_lost_device, kind="device", name="dev0")
        """
    )
    result = _one(run(code, timeout=3, env={"EXITSAFE_STEP_TIMEOUT": None}))
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "hang-in-teardown"
    assert "step" in diagnosis.headline
    assert any("wait_for_lost_device" in d for d in diagnosis.details)
    assert "EXITSAFE_STEP_TIMEOUT" in (diagnosis.hint or "")


def test_crash_inside_exitsafe_teardown_names_the_step() -> None:
    code = textwrap.dedent(
        """
        import ctypes
        import exitsafe

        def release_into_freed_memory(raw):
            ctypes.string_at(0)

        buf = exitsafe.track(1, lambda raw: None, kind="buffer", name="buf0")
        dev = exitsafe.track(2, release_into_freed_memory, kind="device", name="dev0")
        """
    )
    result = _one(run(code))
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "crash-in-teardown"
    assert "crash inside exitsafe's teardown, in step" in result.summary()
    assert any("release_into_freed_memory" in d for d in diagnosis.details)


CRASH_AFTER_TEARDOWN = """
import ctypes, os
import exitsafe

class Codec:  # a third-party object exitsafe was not told about
    def __init__(self):
        self._handle = ctypes.c_void_p(16)

    def __del__(self, write=os.write, string_at=ctypes.string_at):
        write(2, b"FATAL: codec released after its runtime\\n")
        string_at(self._handle.value)  # native code on freed memory

runtime = exitsafe.track(1, lambda raw: None, kind="runtime", name="runtime")
codec = Codec()
print("encoded")
"""


def test_crash_after_the_teardown_finished() -> None:
    result = _one(run(CRASH_AFTER_TEARDOWN))
    assert result.signal == "SIGSEGV" or result.ntstatus is not None
    assert result.registries_finished
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "crash-after-teardown"
    assert result.summary().startswith(
        "NOT CLEAN [crash-after-teardown]: crash after exitsafe's teardown finished"
    )
    hint = diagnosis.hint or ""
    assert "exitsafe.lowlevel.neutralize_at_exit" in hint and "exitsafe.cffi.pin(ffi, lib)" in hint
    report = result.report()
    # the library's own message right before the signal is shown without --show-output
    before = report.split("the program's last stderr lines before the fatal error:\n")[1]
    assert before.startswith("  FATAL: codec released after its runtime\n")


def test_crash_after_teardown_audited_names_the_last_finalizer() -> None:
    result = _one(run(CRASH_AFTER_TEARDOWN, audit=True))
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "crash-after-teardown"
    (finding,) = result.audit
    assert finding.what == "__del__" and finding.type == "__main__.Codec"
    if sys.version_info[:2] != (3, 11):
        # 3.11's tracemalloc cannot find plain instances nor ctypes objects (documented)
        assert finding.site == "<string>:14"  # codec = Codec()
    assert any(
        "the native release running when it crashed (audit): __del__ of __main__.Codec" in d
        for d in diagnosis.details
    )


@posix_only
def test_forked_child_crashes_while_the_parent_waits() -> None:
    code = textwrap.dedent(
        """
        import ctypes, os

        def child_work():
            ctypes.string_at(0)  # the child dies in native code

        pid = os.fork()
        if pid == 0:
            child_work()
            os._exit(0)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        """
    )
    result = _one(run(code))
    child_pid = int(result.stdout.split()[0])
    assert result.returncode == 0 and not result.clean
    (child,) = result.children
    assert (child.pid, child.state, child.signal, child.forked) == (
        child_pid, "crashed", "SIGSEGV", True,
    )  # fmt: skip
    assert child.fatal_error is not None
    assert [f.function for f in child.fatal_error.top_frames][:2] == ["string_at", "child_work"]
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "child-process"
    assert result.summary().startswith(
        f"NOT CLEAN [child-process]: child process {child_pid} crashed with SIGSEGV"
    )
    assert "exitsafe.exit()" in (diagnosis.hint or "")
    assert "EXITSAFE_FORK_EXIT=quiet" in (diagnosis.hint or "")


@posix_only
def test_forked_child_hangs_while_the_parent_waits() -> None:
    code = textwrap.dedent(
        """
        import os, time

        def wait_for_driver():
            while True:
                time.sleep(0.05)

        pid = os.fork()
        if pid == 0:
            wait_for_driver()
        print(pid, flush=True)
        os.waitpid(pid, 0)
        """
    )
    result = _one(run(code, timeout=3))
    child_pid = int(result.stdout.split()[0])
    assert result.timed_out
    (child,) = result.children
    assert (child.pid, child.state) == (child_pid, "hung")
    assert child.fatal_error is not None  # its own stack, dumped before the kill
    assert "wait_for_driver" in [f.function for f in child.fatal_error.top_frames]
    assert result.summary().startswith(f"NOT CLEAN [child-process]: child process {child_pid} hung")
    assert "still running when the run timed out" in result.report()


def test_the_main_thread_of_a_dump_is_not_the_thread_that_took_the_signal() -> None:
    # The runner's SIGABRT (for the stacks of a hung run) may be taken by any thread: the
    # child-process and hang headlines read the *main* thread's wait, not that thread's.
    from exitsafe.testing._evidence import main_stack
    from exitsafe.testing.parsers import parse_fatal_errors

    dump = textwrap.dedent(
        """\
        Fatal Python error: Aborted

        Current thread 0x00007f0000000002 (most recent call first):
          File "/app/prog.py", line 6 in poller
          File "/usr/lib/python3.12/threading.py", line 1010 in run
          File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
          File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

        Thread 0x00007f0000000001 (most recent call first):
          File "/usr/lib/python3.12/subprocess.py", line 2011 in _try_wait
          File "/usr/lib/python3.12/subprocess.py", line 2053 in _wait
          File "/usr/lib/python3.12/subprocess.py", line 1264 in wait
          File "/app/prog.py", line 12 in <module>
        """
    )
    (fatal,) = parse_fatal_errors(dump)
    assert fatal.current_thread is not None
    assert fatal.current_thread.frames[0].function == "poller"
    main = main_stack(fatal)
    assert main is not None and main.frames[0].function == "_try_wait"


_DAEMON = """
import threading, time

def infer():
    while True:
        time.sleep(0.01)  # stands for calls into the library the object belongs to

threading.Thread(target=infer, name="infer", daemon=True).start()
"""


@pytest.mark.parametrize("with_thread", [False, True], ids=["alone", "daemon-thread"])
def test_a_finalizer_raising_at_exit_names_the_daemon_thread_still_running(with_thread) -> None:
    code = textwrap.dedent(
        """
        import atexit

        class Session:
            def __del__(self):
                raise RuntimeError("the runtime was torn down first")

        sessions = [Session()]
        atexit.register(sessions.clear)  # (the library's exit handler lets go of it)
        """
    ) + (_DAEMON if with_thread else "")
    diagnosis = _one(run(code, timeout=30)).diagnosis
    assert diagnosis is not None and diagnosis.kind == "unraisable-at-exit"
    named = [d for d in diagnosis.details if "daemon thread 'infer'" in d]
    if with_thread:
        assert "exitsafe.quiesce()" in diagnosis.hint and named
        assert "in infer" in named[0]
    else:
        assert "quiesce" not in diagnosis.hint and not named


@pytest.mark.parametrize("with_thread", [False, True], ids=["alone", "daemon-thread"])
def test_an_atexit_callback_raising_names_the_daemon_thread_still_running(with_thread) -> None:
    # (pyarrow's daemon writer, tests/real: atexit closes the writer under a write in
    # flight and the close raises; ordering the callback alone would not fix it)
    code = textwrap.dedent(
        """
        import atexit

        class Writer:
            def close(self):
                raise OSError("write in progress")

        atexit.register(Writer().close)
        """
    ) + (_DAEMON if with_thread else "")
    result = _one(run(code, timeout=30))
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "atexit-error", result.report()
    assert result.report().startswith("NOT CLEAN [atexit-error]: ")
    named = [d for d in diagnosis.details if "daemon thread 'infer'" in d]
    variant = "atexit-error-thread" if with_thread else "atexit-error"
    assert (diagnosis.hint, diagnosis.doc) == HINTS[variant]
    if with_thread:
        assert named and "in infer" in named[0]
        assert "exitsafe.quiesce()" in diagnosis.hint
    else:
        assert "quiesce" not in diagnosis.hint and not named


@pytest.mark.parametrize("with_thread", [False, True], ids=["alone", "daemon-thread"])
def test_a_finalizer_hanging_at_exit_names_the_daemon_thread_still_running(with_thread) -> None:
    code = textwrap.dedent(
        """
        import atexit, time

        class Reader:
            def __del__(self):
                time.sleep(600)  # stands for a read-back that waits on the device

        readers = [Reader()]
        atexit.register(readers.clear)  # (the library's exit handler lets go of it)
        """
    ) + (_DAEMON if with_thread else "")
    diagnosis = _one(run(code, timeout=4)).diagnosis
    assert diagnosis is not None and diagnosis.kind == "hang-in-finalizer"
    assert "Reader.__del__" in diagnosis.headline or "__del__" in diagnosis.headline
    named = [d for d in diagnosis.details if "daemon thread 'infer'" in d]
    if with_thread:
        assert "exitsafe.quiesce()" in diagnosis.hint and named
    else:
        assert "quiesce" not in diagnosis.hint and not named


LOSES_OUTPUT = """
import os
out = open("result.txt", "w")
out.write("all 1000 rows\\n")  # buffered
os._exit(0)  # a quick exit: the buffer is never flushed
"""
CHECK = [
    sys.executable, "-c", "import sys; sys.exit(open('result.txt').read() != 'all 1000 rows\\n')"
]


def test_lost_output_is_caught_by_a_check(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(LOSES_OUTPUT)
    result = _one(run(script="app.py", cwd=tmp_path, checks=[CHECK]))
    assert result.returncode == 0 and not result.clean
    (check,) = result.checks
    assert not check.passed and check.returncode == 1
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "lost-output"
    assert result.summary().startswith(
        "NOT CLEAN [lost-output]: the program exited 0 but the check"
    )
    with pytest.raises(ExitNotClean) as raised:
        assert_clean_exit(result)
    assert raised.value.result is result
    assert isinstance(raised.value, AssertionError)


def test_cli_check_runs_in_the_same_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "app.py").write_text(LOSES_OUTPUT)
    monkeypatch.chdir(tmp_path)
    check = "grep -q 'all 1000 rows' result.txt"
    status = main(["run", "--check", check, "--check", "test -f result.txt", "--",
                   sys.executable, "app.py"])
    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("NOT CLEAN [lost-output]: the program exited 0 but the check")
    assert f"check {check!r}: FAILED (exit status 1)" in out
    assert "check 'test -f result.txt': passed" in out
    (tmp_path / "app.py").write_text("open('result.txt', 'w').write('all 1000 rows\\n')\n")
    assert main(["run", "--check", check, "--", sys.executable, "app.py"]) == 0


@posix_only
def test_started_child_crashes_its_pid_and_stack_are_named() -> None:
    code = textwrap.dedent(
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"])
        print(child.pid, flush=True)
        child.wait()
        """
    )
    result = _one(run(code))
    child_pid = int(result.stdout.split()[0])
    assert result.returncode == 0 and not result.clean
    (child,) = result.children
    assert (child.pid, child.state, child.signal, child.forked) == (
        child_pid, "crashed", "SIGSEGV", False,
    )  # fmt: skip
    assert child.argv[-2:] == ("-c", "import ctypes; ctypes.string_at(0)")
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "child-process"
    assert "timeout" in (diagnosis.hint or "")  # not the fork advice: it was not forked


@posix_only
def test_a_forked_child_of_a_watched_program_exits_as_it_would_alone(tmp_path: Path) -> None:
    """The runner's start-up hook follows forked children (their own fault log); the
    child must end as it would without the runner (on CPython 3.9 a file object kept
    for that log made every forked child die by SIGSEGV in its finalization)."""
    code = textwrap.dedent(
        """
        import os, sys
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child status", status)
        sys.exit(0 if status == 0 else 1)
        """
    )
    result = run(code, cwd=tmp_path)
    assert result.stdout.strip() == "child status 0", result.summary()
    assert_clean_exit(result)


def test_a_run_killed_at_its_timeout_is_not_called_a_crash_by_its_signal():
    # exitsafe run sends SIGABRT at the timeout (for the stacks): that signal is not the
    # program's, so it is not reported as one, and a C++ runtime line printed earlier is
    # not taken for what ended the run.
    stderr = (
        "terminate called without an active exception\n"
        "Fatal Python error: Aborted\n\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/tmp/prog.py", line 3 in <module>\n'
    )
    result = ExitResult.from_output(
        ["python", "prog.py"], -6, "", stderr, timed_out=True, timeout=3.0
    )
    assert result.signal is None
    assert result.returncode == -6
    assert result.diagnosis is None or result.diagnosis.kind != "thread-in-native"
    assert "fatal error" not in (result.failure_kind or "")
    assert result.failure_kind.startswith("timeout")
    # The same abort without a timeout is the program's own.
    crashed = ExitResult.from_output(["python", "prog.py"], -6, "", stderr)
    assert crashed.signal == "SIGABRT"
    assert crashed.diagnosis is not None and crashed.diagnosis.kind == "thread-in-native"


def test_a_thread_alive_at_exit_is_shown_down_to_the_programs_own_frame():
    from exitsafe.testing._evidence import LateThread

    stack = (
        "/usr/lib/python3.11/threading.py:327 in wait"
        " <- /usr/lib/python3.11/threading.py:629 in wait"
        " <- /app/render.py:4 in render_worker"
        " <- /usr/lib/python3.11/threading.py:982 in run"
    )
    thread = LateThread("0x1", "render", True, stack.split(" <- ")[0], "render_worker", stack)
    assert thread.where() == " <- ".join(stack.split(" <- ")[:3])
    own_stack = "/app/a.py:3 in f <- /app/a.py:9 in g"
    own = LateThread("0x1", "r", True, "/app/a.py:3 in f", "f", own_stack)
    assert own.where() == "/app/a.py:3 in f"  # the program's own frame on top: just it
    assert LateThread("0x1", "r", True, "/app/a.py:3 in f", "f").where() == "/app/a.py:3 in f"
    assert LateThread("0x1", "r", True, None, None).where() is None


def test_lost_output_names_the_daemon_threads_own_function_not_only_its_wait(tmp_path):
    code = textwrap.dedent(
        """
        import threading
        stop = threading.Event()

        def render_worker():
            stop.wait()  # idle in the standard library at exit

        threading.Thread(target=render_worker, name="render", daemon=True).start()
        open("rows.txt", "w").write("partial")
        """
    )
    result = run(code, cwd=tmp_path, timeout=30, checks=["grep -q done rows.txt"])
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "lost-output"
    (line,) = [d for d in diagnosis.details if "daemon thread 'render'" in d]
    assert "in wait" in line and "in render_worker" in line
    # the thread's variant of the hint (the complete recipe, not "adopt the writer" alone);
    # the kind, and so the report's first line, stay lost-output's
    assert (diagnosis.hint, diagnosis.doc) == HINTS["lost-output-thread"]
    assert result.report().startswith("NOT CLEAN [lost-output]: ")


def test_the_output_tails_of_a_failed_run_are_bounded_and_clean_runs_show_none():
    from exitsafe.testing._report import OUTPUT_LINE_WIDTH, OUTPUT_TAIL_LINES

    code = textwrap.dedent(
        """
        import sys
        for i in range(1000):
            print(f"row {i}")
        for i in range(50):
            print(f"warning {i}", file=sys.stderr)
        print("x" * 5000, file=sys.stderr)  # one very long line, cut
        sys.stdout.flush()
        sys.exit(3)
        """
    )
    report = run(code, timeout=30).report()
    assert f"captured stdout (last {OUTPUT_TAIL_LINES} of 1000 lines):" in report
    assert f"captured stderr (last {OUTPUT_TAIL_LINES} of 51 lines," in report
    assert "  row 999" in report and "  row 979" not in report
    assert "  warning 49" in report
    (long_line,) = [line for line in report.splitlines() if "xxxx" in line]
    assert long_line.endswith("...") and len(long_line) == OUTPUT_LINE_WIDTH + 2
    clean = run("print('fine')", timeout=30)
    assert "captured" not in clean.report()


def test_a_daemon_threads_crash_during_the_teardown_is_the_threads_not_the_steps():
    # exitsafe's teardown is in its second step when another thread crashes: the report
    # names that thread and where it was, not the step (which did not crash).
    code = textwrap.dedent(
        """
        import atexit, ctypes, threading, time
        import exitsafe

        # (the release waits, bounded, while the painter wakes and crashes the process)
        # (kept: a handle dropped here would be released at once, before the exit)
        dev = exitsafe.track(1, lambda raw: threading.Event().wait(20), kind="device", name="dev0")
        go = threading.Event()

        def painter():
            go.wait()
            ctypes.string_at(0)  # stands for a native write into memory the exit freed

        threading.Thread(target=painter, name="painter", daemon=True).start()
        exitsafe.on_teardown(go.set)
        """
    )
    result = run(code, timeout=30, env={"EXITSAFE_TRACE": "1"})
    assert result.signal == "SIGSEGV"
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "thread-crash-at-exit"
    assert "'painter'" in diagnosis.headline and "in painter" in diagnosis.headline
    assert "quiesce()" in diagnosis.hint


def test_a_crash_in_an_exit_handler_while_a_daemon_thread_runs_names_the_thread():
    # soundfile (tests/real's soundfile-daemon-writer), 1 run in 30: the atexit close of
    # the file crashes on the main thread, freeing what the writer's native call in flight
    # corrupted; the writer is the cause, the handler only where the crash showed.
    code = textwrap.dedent(
        """
        import atexit, ctypes, threading

        started = threading.Event()

        def writer():
            started.set()
            threading.Event().wait()  # stands for a native write in flight

        def close():
            ctypes.string_at(0)  # stands for sf_close on a structure the writer corrupted

        threading.Thread(target=writer, name="writer", daemon=True).start()
        started.wait()
        atexit.register(close)
        """
    )
    result = run(code, timeout=30)
    assert result.signal == "SIGSEGV" or result.ntstatus is not None
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "thread-crash-at-exit", result.report()
    assert "in an exit handler" in diagnosis.headline and "'writer'" in diagnosis.headline
    assert "exit handler, close (" in diagnosis.headline
    assert "quiesce()" in (diagnosis.hint or "")


def test_a_crash_in_the_programs_body_with_a_daemon_thread_is_not_an_exit_handlers():
    # (the main thread still in the program's body: not an exit handler; other rules say)
    code = textwrap.dedent(
        """
        import ctypes, threading

        started = threading.Event()

        def writer():
            started.set()
            threading.Event().wait()

        threading.Thread(target=writer, name="writer", daemon=True).start()
        started.wait()
        ctypes.string_at(0)
        """
    )
    result = run(code, timeout=30)
    assert result.signal == "SIGSEGV" or result.ntstatus is not None
    diagnosis = result.diagnosis
    assert diagnosis is None or "exit handler" not in diagnosis.headline, result.report()


# PyAV on CPython 3.12 (tests/real's pyav-daemon-decoder): the daemon thread's demuxer
# aborts on the container that atexit closed under it; the dump shows only the main
# thread, with no Python frame, and no library printed a message.
_BARE_ABORT = (
    'exitsafe: thread ident=0x00007fe54f0106c0 name="player" daemon=true'
    ' frame="/app/play.py:49 in play_forever" target="play_forever"'
    ' stack="/app/play.py:49 in play_forever <- /py/threading.py:1010 in run" when="exit"\n'
    "Fatal Python error: Aborted\n\n"
    "Thread 0x00007fe55ff95b80 (most recent call first):\n"
    "  <no Python frame>\n"
)


def test_a_bare_abort_at_exit_with_a_daemon_thread_running_is_that_threads_crash():
    result = ExitResult.from_output(
        ["python", "play.py"], -6, "playing\n", _BARE_ABORT, exit_phase="finalizing 0x1"
    )
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "thread-crash-at-exit", result.report()
    assert "crash at exit (SIGABRT)" in diagnosis.headline
    assert "'player'" in diagnosis.headline and "play_forever" in diagnosis.headline


def test_an_abort_with_a_library_message_or_an_interpreter_error_keeps_its_own_kind():
    # a library's check (native-fatal names it), and an interpreter's own fatal error
    # (not a daemon thread's native crash): not taken for the thread's crash
    checked = _BARE_ABORT.replace(
        "Fatal Python error: Aborted", "Assertion failed: pfd.revents & POLLIN"
        " (src/signaler.cpp:238)\nFatal Python error: Aborted"
    )
    own = _BARE_ABORT.replace(
        "Fatal Python error: Aborted",
        "Fatal Python error: _enter_buffered_busy: could not acquire lock",
    )
    kinds = []
    for stderr in (checked, own):
        result = ExitResult.from_output(
            ["python", "play.py"], -6, "", stderr, exit_phase="finalizing 0x1"
        )
        kinds.append(result.diagnosis.kind if result.diagnosis is not None else None)
    assert kinds[0] == "native-fatal"
    assert kinds[1] != "thread-crash-at-exit"


@pytest.mark.parametrize(
    "line",
    [
        "malloc_consolidate(): invalid chunk size",  # (PyAV on 3.12: the player's crash)
        "munmap_chunk(): invalid pointer",  # (PyAV on 3.10)
        "free(): invalid pointer",
        "_int_free(): invalid size",
        "corrupted size vs. prev_size",
        "tcache_thread_shutdown(): unaligned tcache chunk detected",
    ],
)
def test_glibcs_heap_checks_are_a_library_check_that_names_the_thread_still_running(line):
    # glibc found its heap damaged (a daemon thread's native code wrote into what the exit
    # freed) and aborted the process on the main thread: named by that check, with the
    # thread that was still running
    stderr = _BARE_ABORT.replace(
        "Fatal Python error: Aborted", f"{line}\nFatal Python error: Aborted"
    )
    result = ExitResult.from_output(
        ["python", "play.py"], -6, "playing\n", stderr, exit_phase="finalizing 0x1"
    )
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "native-fatal", result.report()
    assert line in diagnosis.headline and "(glibc)" in diagnosis.headline
    assert any("player" in detail for detail in diagnosis.details), diagnosis.details


#: PyAV's player crashed at exit (CPython 3.9, `pyav-daemon-decoder`, 1 run in 10); while
#: faulthandler dumped the stacks, glibc's heap check aborted the main thread, its message
#: written into a line of the dump.
_CRASH_THEN_GLIBC = (
    'exitsafe: thread ident=0x00007f77fb2106c0 name="player" daemon=true'
    ' frame="/app/play.py:48 in play_forever" target="play_forever"'
    ' stack="/app/play.py:48 in play_forever <- /py/threading.py:917 in run'
    ' <- /py/threading.py:980 in _bootstrap_inner <- /py/threading.py:937 in _bootstrap"'
    ' when="shutdown"\n'
    "Fatal Python error: Segmentation fault\n\n"
    "Current thread 0x00007f77fb2106c0 (most recent call first):\n"
    '  File "/app/play.py", line 48 in play_forever\n'
    '  File "/py/threading.py", line 917 in run\n'
    '  File "malloc_consolidate(): invalid chunk size\n'
    '/py/threading.py", line 980 in _bootstrap_inner\n'
    '  File "/py/threading.py", line 937 in _bootstrap\n\n'
    "Thread 0x00007f780b9b0b80 (most recent call first):\n"
    '  File "/x/exitsafe/_audit/_threads.py", line 241 in _held_locks\n'
    '  File "/x/exitsafe/_audit/__init__.py", line 128 in _fallback_at_exit'
    "Fatal Python error: Aborted\n\n\n"
)


@pytest.mark.parametrize("where", ["inside a line of the dump", "on a line of its own"])
def test_a_daemon_threads_crash_then_glibcs_abort_is_that_threads_crash(where):
    # the crash came first: the abort that ended the process (glibc's heap check, during
    # the crash's dump) does not hide it, wherever glibc's message landed
    stderr = _CRASH_THEN_GLIBC
    if where == "on a line of its own":
        stderr = stderr.replace(
            '  File "malloc_consolidate(): invalid chunk size\n/py/',
            'malloc_consolidate(): invalid chunk size\n  File "/py/',
        )
        assert [line.line for line in ExitResult.from_output(
            ["python", "play.py"], -6, "", stderr).native_fatal] == [
            "malloc_consolidate(): invalid chunk size"]
    result = ExitResult.from_output(
        ["python", "play.py"], -6, "playing; main thread ends\n", stderr
    )  # (no exit phase: the crash came during the start-up hook's exit handler)
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "thread-crash-at-exit", result.report()
    assert "crash at exit (Segmentation fault, then SIGABRT)" in diagnosis.headline
    assert "'player'" in diagnosis.headline and "play_forever" in diagnosis.headline


def test_a_hang_shows_the_whole_stack_of_the_main_thread():
    # (issue 29: "whole stacks, not only the top frame"; it was cut at 12 frames)
    code = textwrap.dedent(
        """
        import atexit, threading

        def level(n):
            if n:
                return level(n - 1)
            threading.Event().wait()  # an exit handler that never returns

        atexit.register(level, 30)
        """
    )
    result = run(code, timeout=4)
    assert result.timed_out
    report = result.report()
    assert result.diagnosis is not None and result.diagnosis.kind == "hang-in-atexit", report
    shown = [line for line in result.diagnosis.details if "in level" in line or "level (" in line]
    assert len(shown) == 31, report
    assert "more frame" not in "\n".join(result.diagnosis.details), report


# A crash at exit in native code with no Python frame on the main thread (an ffi.gc
# destructor, an extension type's deallocator): the thread rule leaves it to the crash
# rules, whose hint has a variant when a daemon thread was still running at exit.
_DECODER = (
    'exitsafe: thread ident=0x00007f1258edd6c0 name="decoder" daemon={daemon}'
    ' frame="/app/decode.py:21 in decode_forever" target="decode_forever"'
    ' stack="/app/decode.py:21 in decode_forever <- /py/threading.py:982 in run" when="exit"\n'
)
_TEARDOWN_FINISHED = (
    'exitsafe: teardown-begin registry="default" reason="atexit" live=1 hooks=0\n'
    'exitsafe: plan registry="default" steps=1\n'
    'exitsafe: step-begin registry="default" index=1 of=1 kind="runtime" name="runtime"\n'
    'exitsafe: step registry="default" index=1 of=1 action=release kind="runtime"'
    ' name="runtime" outcome=released_at_exit ms=0.031\n'
    'exitsafe: teardown-end registry="default" released=1 leaked=0 failed=0 ms=1.283\n'
)
_NATIVE_SEGV = (
    "Fatal Python error: Segmentation fault\n\n"
    "Current thread 0x00007f1259a8ab80 (most recent call first):\n"
    "  <no Python frame>\n"
)


@pytest.mark.parametrize("thread", ["none", "daemon", "non-daemon"])
@pytest.mark.parametrize(
    ("kind", "teardown"),
    [("crash-at-exit", ""), ("crash-after-teardown", _TEARDOWN_FINISHED)],
    ids=["no-teardown", "after-teardown"],
)
def test_a_native_crash_at_exit_with_a_daemon_thread_running_gets_the_thread_recipe(
    kind: str, teardown: str, thread: str
) -> None:
    lines = "" if thread == "none" else _DECODER.format(
        daemon="true" if thread == "daemon" else "false"
    )
    result = ExitResult.from_output(
        ["python", "decode.py"], -11, "decoded\n", teardown + lines + _NATIVE_SEGV,
        exit_phase="finalizing 0x00007f1259a8ab80",
    )
    assert result.signal == "SIGSEGV"
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == kind, result.report()
    assert result.report().startswith(f"NOT CLEAN [{kind}]: ")  # the kind is unchanged
    named = [d for d in diagnosis.details if "daemon thread 'decoder'" in d]
    if thread == "daemon":
        assert (diagnosis.hint, diagnosis.doc) == HINTS[f"{kind}-thread"]
        assert "exitsafe.quiesce()" in diagnosis.hint and ".borrowing()" in diagnosis.hint
        assert named and "in decode_forever" in named[0]
    else:
        assert (diagnosis.hint, diagnosis.doc) == HINTS[kind]
        assert not named


@pytest.mark.parametrize(
    ("lock_of", "named"),
    [
        ("<_io.BufferedWriter name='<stdout>'>", "<stdout>'s lock"),
        ("<_io.BufferedWriter>", "a buffered stream's lock"),  # (no name printed)
    ],
)
def test_an_interpreter_abort_at_exit_possibly_due_to_daemon_threads_gets_the_thread_recipe(
    lock_of: str, named: str
):
    # the interpreter's own fatal error (not a bare abort: not taken for the thread's
    # crash) with the daemon thread listed at exit: crash-at-exit, and its thread recipe;
    # the headline names the stream whose lock the thread held
    own = _BARE_ABORT.replace(
        "Fatal Python error: Aborted",
        f"Fatal Python error: _enter_buffered_busy: could not acquire lock for {lock_of}"
        " at interpreter shutdown, possibly due to daemon threads",
    )
    result = ExitResult.from_output(
        ["python", "play.py"], -6, "", own, exit_phase="finalizing 0x1"
    )
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "crash-at-exit", result.report()
    assert (diagnosis.hint, diagnosis.doc) == HINTS["crash-at-exit-thread"]
    assert any("daemon thread 'player'" in d for d in diagnosis.details)
    assert f"{named} was held by another thread" in diagnosis.headline


def test_a_child_record_left_half_written_is_not_read(tmp_path: Path) -> None:
    """A pool's worker terminated while it wrote its record (before records were written
    aside and renamed) left a file of one line: the run's report crashed on it."""
    from exitsafe.testing import _children

    (tmp_path / "proc-123.txt").write_text("123\n")
    (tmp_path / "proc-124.txt").write_text("124\n100\nfork\npython\nworker.py\n")
    (tmp_path / "proc-125.txt.part").write_text("125\n")
    children = _children.collect(tmp_path, 100, [])
    assert [(c.pid, c.ppid, c.argv) for c in children] == [(124, 100, ("python", "worker.py"))]
