"""Running a program in a fresh process and collecting how it ended."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Literal, Mapping, Optional, Sequence, Union, overload

from . import _children
from ._records import CheckResult
from ._result import ExitResult, ExitResults

StrPath = Union[str, "os.PathLike[str]"]

#: Variables every run gets (before the caller's ``env`` is applied, so a caller can
#: remove one by passing ``None``): faulthandler on for all threads, exitsafe's trace on.
DEFAULT_ENV: Mapping[str, str] = {"PYTHONFAULTHANDLER": "1", "EXITSAFE_TRACE": "1"}

#: Seconds a timed-out program gets to print its thread stacks after ``SIGABRT``
#: (faulthandler's handler) before its process group is killed.
DUMP_GRACE = 2.0

_CREATE_NEW_PROCESS_GROUP = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200)

#: The directory of the start-up hook (a ``sitecustomize`` module) put first on
#: ``PYTHONPATH`` of every run with ``inject=True``.
BOOT_DIR = str(Path(__file__).resolve().parent / "_boot")

Check = Union[str, Sequence[str]]


def child_env(env: Optional[Mapping[str, Optional[str]]] = None) -> dict[str, str]:
    """The environment of a run: ``os.environ``, then `DEFAULT_ENV`, then ``env``
    (where a value of ``None`` removes the variable)."""
    out = dict(os.environ)
    out.update(DEFAULT_ENV)
    for key, value in (env or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = str(value)
    return out


def python_argv(
    code: Optional[str] = None,
    *,
    script: Optional[StrPath] = None,
    module: Optional[str] = None,
    args: Sequence[str] = (),
    python: StrPath = sys.executable,
) -> list[str]:
    """The command line that runs ``code``, ``script`` or ``module`` (exactly one) with
    ``python -X faulthandler``, followed by ``args``."""
    given = [name for name, value in (("code", code), ("script", script), ("module", module))
             if value is not None]
    if len(given) != 1:
        raise TypeError(
            "give exactly one of code, script or module"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if isinstance(args, str):
        raise TypeError("args must be a sequence of strings, not a string")
    if code is not None and not isinstance(code, str):
        raise TypeError(
            f"code must be Python source (a str), not {type(code).__name__}; a command line "
            "is run by run_command(argv), a file by run(script=path)"
        )
    argv = [os.fspath(python), "-X", "faulthandler"]
    if code is not None:
        argv += ["-c", code]
    elif script is not None:
        argv.append(os.fspath(script))
    else:
        assert module is not None
        argv += ["-m", module]
    argv.extend(str(a) for a in args)
    return argv


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` and every process left in its process group (its children too)."""
    pid = proc.pid
    if os.name == "posix":
        # The child was started in a new session, so its group id is its pid.  Never
        # signal our own group (pid 0 from a fake process would mean exactly that).
        if isinstance(pid, int) and pid > 0 and pid not in (os.getpid(), os.getpgrp()):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the whole group is already gone
    elif isinstance(pid, int) and pid > 0:
        # taskkill /T ends the whole tree; best effort, then TerminateProcess below.
        subprocess.run(
            ["taskkill", "/F", "/T", "/PID", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    try:
        proc.kill()
    except OSError:
        pass  # already reaped


def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        proc.send_signal(signum)
    except OSError:
        pass  # it exited meanwhile


def _stop(proc: subprocess.Popen[bytes], dump: bool) -> None:
    """Stop a timed-out program: ask faulthandler for its stacks, then kill its group."""
    if dump and os.name == "posix" and proc.poll() is None:
        _signal(proc, signal.SIGABRT)
        _signal(proc, signal.SIGCONT)  # it may have been stopped while its children dumped
        deadline = time.monotonic() + DUMP_GRACE
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    elif os.name == "posix":
        _signal(proc, signal.SIGCONT)
    _kill_group(proc)


def _decode(data: Union[bytes, str, None]) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")


class _Reader:
    """Read one output stream to its end on a thread, so a big output never blocks the
    program and the timeout is measured on the program, not on the pipe."""

    def __init__(self, stream: Optional[IO[bytes]]) -> None:
        self.stream = stream
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._read, name="exitsafe-reader", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        stream = self.stream
        if stream is None:
            return
        try:
            while True:
                chunk = stream.read(65536)
                if not chunk:
                    break
                self.chunks.append(chunk)
        except (OSError, ValueError):
            pass  # the pipe was closed under us after a kill: keep what was read

    def join(self, timeout: Optional[float]) -> bool:
        """Wait for the end of the stream; whether it was reached."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def text(self) -> str:
        if self.stream is not None:
            try:
                self.stream.close()
            except OSError:
                pass  # closing a broken pipe: nothing left to read anyway
        return _decode(b"".join(self.chunks))


def _inject(env: dict[str, str], run_dir: str, audit: bool) -> None:
    """Add the start-up hook, the run directory and (for an audit) the audit's variables."""
    previous = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOT_DIR + (os.pathsep + previous if previous else "")
    env["EXITSAFE_RUN_DIR"] = run_dir
    env.pop("EXITSAFE_RUN_ROOT", None)
    if audit:
        env["EXITSAFE_AUDIT"] = "1"


def _run_check(
    check: Check, env: dict[str, str], cwd: Optional[StrPath], timeout: Optional[float]
) -> CheckResult:
    shell = isinstance(check, str)
    command: Union[str, tuple[str, ...]] = check if isinstance(check, str) else tuple(check)
    try:
        proc = subprocess.run(
            command,
            shell=shell,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=None if cwd is None else os.fspath(cwd),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return CheckResult(command, -9, _decode(exc.output), timed_out=True)
    except OSError as exc:
        return CheckResult(command, 127, f"cannot run the check: {exc}")
    return CheckResult(command, proc.returncode, _decode(proc.stdout))


def _run_once(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Optional[StrPath],
    timeout: Optional[float],
    dump_on_timeout: bool,
    inject: bool = True,
    checks: Sequence[Check] = (),
    audit: bool = False,
) -> ExitResult:
    run_dir: Optional[str] = None
    if inject:
        env = dict(env)
        run_dir = tempfile.mkdtemp(prefix="exitsafe-run-")
        _inject(env, run_dir, audit)
    try:
        result = _run_process(argv, env, cwd, timeout, dump_on_timeout, run_dir, audit)
        if checks:
            check_env = {k: v for k, v in env.items() if not k.startswith("EXITSAFE_RUN")}
            done = tuple(_run_check(c, check_env, cwd, timeout) for c in checks)
            result = dataclasses.replace(result, checks=done)
        return result
    finally:
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)


def _run_process(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Optional[StrPath],
    timeout: Optional[float],
    dump_on_timeout: bool,
    run_dir: Optional[str],
    audit: bool,
) -> ExitResult:
    started = time.monotonic()
    proc = _start(argv, env, cwd)
    ended = _wait(proc, started, timeout, dump_on_timeout)
    returncode = proc.returncode
    assert returncode is not None
    children = _children.collect(
        None if run_dir is None else Path(run_dir), proc.pid, ended.left_at_timeout
    )
    exit_phase, audit_state = _read_run_files(run_dir, proc.pid, audit)
    return ExitResult.from_output(
        argv,
        returncode,
        ended.readers[0].text(),
        ended.readers[1].text(),
        duration=ended.duration,
        timed_out=ended.timed_out,
        timeout=timeout,
        children=children,
        audited=audit,
        audit_state=audit_state,
        exit_phase=exit_phase,
    )


def _start(
    argv: Sequence[str], env: dict[str, str], cwd: Optional[StrPath]
) -> subprocess.Popen[bytes]:
    """Start the program in a new session (POSIX) or process group (Windows), its output
    captured."""
    kwargs: dict[str, object] = {}
    if os.name == "posix":
        kwargs["start_new_session"] = True
    else:
        kwargs["creationflags"] = _CREATE_NEW_PROCESS_GROUP
    proc: subprocess.Popen[bytes] = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=None if cwd is None else os.fspath(cwd),
        **kwargs,  # type: ignore[call-overload]
    )
    return proc


@dataclasses.dataclass
class _Ended:
    """How the wait for a program ended."""

    readers: tuple[_Reader, _Reader]
    duration: float
    timed_out: bool
    left_at_timeout: list[_children.SeenProcess]


def _wait(
    proc: subprocess.Popen[bytes],
    started: float,
    timeout: Optional[float],
    dump_on_timeout: bool,
) -> _Ended:
    """Wait for the program and for the end of its output, within ``timeout`` seconds from
    ``started``; past it, dump and kill its process group."""
    deadline = None if timeout is None else started + timeout
    timed_out = False
    left_at_timeout: list[_children.SeenProcess] = []
    try:
        readers = (_Reader(proc.stdout), _Reader(proc.stderr))
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            if os.name == "posix":
                # The program's children first: their stacks, before anything is killed.
                # The program is frozen meanwhile, so that it cannot react to a child's
                # end (it is asked for its own stacks, and resumed, right after).
                _signal(proc, signal.SIGSTOP)
                left_at_timeout = _children.dump_and_list(proc.pid, dump_on_timeout)
            _stop(proc, dump_on_timeout)
            proc.wait()
        duration = time.monotonic() - started
        for reader in readers:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not reader.join(left):
                # The program exited but processes it started keep its output open past
                # the timeout: the run as a whole did not finish in time.
                timed_out = True
                if os.name == "posix" and not left_at_timeout:
                    left_at_timeout = _children.dump_and_list(proc.pid, dump_on_timeout)
                _kill_group(proc)
                reader.join(None)
    except BaseException:
        _kill_group(proc)  # interrupted (KeyboardInterrupt ...): leave nothing running
        proc.wait()
        raise
    return _Ended(readers, duration, timed_out, left_at_timeout)


def _read_run_files(run_dir: Optional[str], pid: int, audit: bool) -> tuple[str, str]:
    """What the start-up hook and the audit left in the run directory for the program:
    (its ``exit-<pid>.txt``, its ``audit-<pid>.state`` as ``"<group> <R or D>"``)."""
    exit_phase = ""
    if run_dir is not None:
        try:
            exit_phase = (Path(run_dir) / f"exit-{pid}.txt").read_text("ascii").strip()
        except (OSError, ValueError):
            exit_phase = ""
    audit_state = ""
    if run_dir is not None and audit:
        try:
            raw = (Path(run_dir) / f"audit-{pid}.state").read_bytes()
            audit_state = raw.decode("ascii", "replace")[:-1].strip() + " " + raw[-1:].decode(
                "ascii", "replace")
        except (OSError, IndexError):
            audit_state = ""
    return exit_phase, audit_state


@overload
def run_command(
    argv: Sequence[StrPath],
    *,
    env: Optional[Mapping[str, Optional[str]]] = ...,
    cwd: Optional[StrPath] = ...,
    timeout: Optional[float] = ...,
    repeat: Literal[1] = ...,
    dump_on_timeout: bool = ...,
    checks: Sequence[Check] = ...,
    audit: bool = ...,
    inject: bool = ...,
) -> ExitResult: ...


@overload
def run_command(
    argv: Sequence[StrPath],
    *,
    env: Optional[Mapping[str, Optional[str]]] = ...,
    cwd: Optional[StrPath] = ...,
    timeout: Optional[float] = ...,
    repeat: int,
    dump_on_timeout: bool = ...,
    checks: Sequence[Check] = ...,
    audit: bool = ...,
    inject: bool = ...,
) -> Union[ExitResult, ExitResults]: ...


def run_command(
    argv: Sequence[StrPath],
    *,
    env: Optional[Mapping[str, Optional[str]]] = None,
    cwd: Optional[StrPath] = None,
    timeout: Optional[float] = 30.0,
    repeat: int = 1,
    dump_on_timeout: bool = True,
    checks: Sequence[Check] = (),
    audit: bool = False,
    inject: bool = True,
) -> Union[ExitResult, ExitResults]:
    """Run any command, `repeat` times, and decode how each run ended.

    Each run is a fresh process in a new session (POSIX; a new process group on Windows),
    with stdin from `/dev/null` and stdout and stderr captured in full.  The runs are
    sequential, in the calling thread.

    Args:
        argv: the command and its arguments (a sequence, not a string).
        env: variables to set on top of `os.environ` plus `PYTHONFAULTHANDLER=1` and
            `EXITSAFE_TRACE=1` (always added); a value `None` removes the variable.
        cwd: the working directory of the runs and the checks; `None`: the current one.
        timeout: seconds a run may take (`None`: no limit, default 30).  A run still going
            then is sent `SIGABRT` so that faulthandler prints every thread's stack (see
            `dump_on_timeout`), given 2 seconds, and then its whole process group is killed,
            so processes it started die with it; its result has `timed_out` set.
        repeat: how many times to run it (at least 1); an exit crash is often flaky.
        dump_on_timeout: send `SIGABRT` before the kill on timeout, so the stacks of a hung
            run are in the report (POSIX only).
        checks: commands run after each run, in the same `cwd`, each a shell string or an
            argument list; one that exits non-zero makes the run not clean, with its output
            in the report (data the program should have written at exit is caught this way).
        audit: run with exitsafe's audit (`EXITSAFE_AUDIT=1`; creation sites recorded from
            start-up for the objects that have a native finalizer): every native release
            that runs after exitsafe's exit teardown is a finding, with where its object was
            created ([`ExitResult.audit`][exitsafe.testing.ExitResult.audit]); a finding makes
            the run not clean, and the release running when the process hung or crashed is
            named ([`ExitResult.audit_running`][exitsafe.testing.ExitResult.audit_running]).
        inject: put exitsafe's start-up hook on `PYTHONPATH` (the default), so every Python
            process of the run records its pid and command line, child processes write
            faulthandler's dumps to a file of their own (a crashed or hung child is reported
            with its pid and stack), and the threads alive at exit are listed.  The
            program's own `sitecustomize` still runs after it.  `False` runs the command
            with only the environment variables above.

    Returns:
        An [`ExitResult`][exitsafe.testing.ExitResult] when `repeat` is 1, else an
            [`ExitResults`][exitsafe.testing.ExitResults] with one result per run.

    Raises:
        OSError: the command could not be started (`FileNotFoundError` for a missing
            executable).
        TypeError: `argv` or `checks` is a string.
        ValueError: `argv` is empty, `repeat` is below 1, or `timeout` is not positive.

    Example:
        ```python
        results = run_command([".venv/bin/python", "crash.py"], repeat=10)
        assert results.failures == [], results.report()
        ```
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a sequence of arguments, not a string")
    if isinstance(checks, (str, bytes)):
        raise TypeError("checks must be a sequence of commands (use [command] for one)")
    args = [os.fspath(a) for a in argv]
    if not args:
        raise ValueError("argv is empty")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, not {repeat}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive or None, not {timeout}")
    environment = child_env(env)
    results = [
        _run_once(args, environment, cwd, timeout, dump_on_timeout, inject, checks, audit)
        for _ in range(repeat)
    ]
    return results[0] if repeat == 1 else ExitResults(results)


@overload
def run(
    code: Optional[str] = ...,
    *,
    script: Optional[StrPath] = ...,
    module: Optional[str] = ...,
    args: Sequence[str] = ...,
    env: Optional[Mapping[str, Optional[str]]] = ...,
    cwd: Optional[StrPath] = ...,
    timeout: Optional[float] = ...,
    python: StrPath = ...,
    checks: Sequence[Check] = ...,
    audit: bool = ...,
    repeat: Literal[1] = ...,
) -> ExitResult: ...


@overload
def run(
    code: Optional[str] = ...,
    *,
    script: Optional[StrPath] = ...,
    module: Optional[str] = ...,
    args: Sequence[str] = ...,
    env: Optional[Mapping[str, Optional[str]]] = ...,
    cwd: Optional[StrPath] = ...,
    timeout: Optional[float] = ...,
    python: StrPath = ...,
    checks: Sequence[Check] = ...,
    audit: bool = ...,
    repeat: int,
) -> Union[ExitResult, ExitResults]: ...


def run(
    code: Optional[str] = None,
    *,
    script: Optional[StrPath] = None,
    module: Optional[str] = None,
    args: Sequence[str] = (),
    env: Optional[Mapping[str, Optional[str]]] = None,
    cwd: Optional[StrPath] = None,
    timeout: Optional[float] = 30.0,
    python: StrPath = sys.executable,
    repeat: int = 1,
    checks: Sequence[Check] = (),
    audit: bool = False,
) -> Union[ExitResult, ExitResults]:
    """Run Python `code` (`-c`), a `script` or a `module` (`-m`), exactly one of them, in a
    fresh `python -X faulthandler`, and decode how it exited.

    Everything else is as in [`run_command`][exitsafe.testing.run_command]: new session,
    full capture, `PYTHONFAULTHANDLER=1` and `EXITSAFE_TRACE=1` plus `env`, the whole
    process group killed on timeout, `checks` run afterwards, `audit` for exitsafe's audit
    mode.

    Args:
        code: Python source to run with `-c`.
        script: the path of a script to run.
        module: a module name to run with `-m`.
        args: arguments that follow on the command line (`sys.argv[1:]` of the program).
        env: variables to set on top of `os.environ`; a value `None` removes the variable.
        cwd: the working directory; `None`: the current one.
        timeout: seconds a run may take (`None`: no limit, default 30); see
            [`run_command`][exitsafe.testing.run_command].
        python: the interpreter to run; default: the one running this call.
        repeat: how many times to run it (at least 1).
        checks: commands run after each run; one that fails makes the run not clean.
        audit: run with exitsafe's audit: a native release after exitsafe's exit teardown
            makes the run not clean.

    Returns:
        An [`ExitResult`][exitsafe.testing.ExitResult]; for `repeat > 1` an
            [`ExitResults`][exitsafe.testing.ExitResults].

    Raises:
        TypeError: not exactly one of `code`, `script` and `module` was given, `code` is
            not a string (a command line: use `run_command`), or `args` is a string.
        ValueError: `repeat` is below 1 or `timeout` is not positive.
        OSError: `python` could not be started.

    Example:
        ```python
        from exitsafe.testing import run, assert_clean_exit

        result = run(script="examples/fixed.py", repeat=20)
        assert_clean_exit(result)
        ```
    """
    argv = python_argv(code, script=script, module=module, args=args, python=python)
    return run_command(
        argv, env=env, cwd=cwd, timeout=timeout, repeat=repeat, checks=checks, audit=audit
    )
