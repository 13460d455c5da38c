"""The other processes of a run: what the start-up hook recorded, and what was left at a timeout.

Every Python process of a run (the program, and what it starts or forks, as long as it
inherits the environment) writes ``proc-<pid>.txt`` into the run directory at start-up;
processes other than the first send faulthandler's output to ``fault-<pid>.log`` there.
At a timeout the runner lists the processes left in the run's session (Linux ``/proc``),
asks each of them for its stacks (``SIGABRT``, children before parents) and only then
kills the group.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .parsers import FatalError, parse_fatal_errors

#: faulthandler's message for each fatal signal, and the signal's name.
FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}

#: Seconds a child asked for its stacks gets to write them before the next one is asked.
CHILD_DUMP_GRACE = 1.0


@dataclass(frozen=True)
class ChildProcess:
    """A process of the run other than the program itself.

    Attributes:
        pid: its process id.
        ppid: its parent's pid (``None`` when unknown).
        argv: its command line.
        state: ``"crashed"`` (died by a fatal signal, its stack dumped), ``"hung"`` (still running
            at the timeout; its stack, if it is a Python process, was dumped then), ``"zombie"``
            (ended, never waited for, at the timeout) or ``"exited"`` (nothing wrong seen).
        signal: the fatal signal for a crashed or zombie process (``"SIGSEGV"``).
        forked: whether it was forked from a Python process (no ``exec``).
        fatal_error: faulthandler's dump of it (crash, or the stacks at the timeout).
    """

    pid: int
    ppid: Optional[int] = None
    argv: tuple[str, ...] = ()
    state: str = "exited"
    signal: Optional[str] = None
    forked: bool = False
    fatal_error: Optional[FatalError] = field(default=None, compare=False)

    @property
    def failed(self) -> bool:
        """Whether it crashed or was still running when the run timed out."""
        return self.state in ("crashed", "hung") or self.signal is not None

    def describe(self) -> str:
        """One line: ``pid 4242 (forked from 4241): crashed with SIGSEGV``."""
        how = "forked from" if self.forked else "child of"
        parent = f" ({how} {self.ppid})" if self.ppid is not None else ""
        if self.state == "crashed":
            what = f"crashed with {self.signal or 'a fatal error'}"
        elif self.state == "hung":
            what = "still running when the run timed out"
        elif self.state == "zombie":
            what = "ended" + (f" by {self.signal}" if self.signal else "") + ", never waited for"
        else:
            what = "exited"
        return f"pid {self.pid}{parent}: {what}"

    def to_dict(self) -> dict[str, Any]:
        """The process as a JSON-ready dict, as
        `exitsafe run --json` gives (schema version 2, see the testing page).

        Returns:
            One key per attribute (`fatal_error` as its own dict).
        """
        fatal = self.fatal_error
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "argv": list(self.argv),
            "state": self.state,
            "signal": self.signal,
            "forked": self.forked,
            "fatal_error": None if fatal is None else fatal.to_dict(),
        }


@dataclass
class SeenProcess:
    """A process of the run's session as ``/proc`` showed it."""

    pid: int
    ppid: Optional[int]
    argv: tuple[str, ...]
    state: str  # /proc state letter
    exit_signal: Optional[str] = None


def _proc_stat(pid: int) -> Optional[tuple[str, int, int, Optional[int]]]:
    """(state, ppid, session, exit_code) from ``/proc/<pid>/stat``, or ``None``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    try:
        exit_code = int(rest[49]) if len(rest) > 49 else None
        return rest[0], int(rest[1]), int(rest[3]), exit_code
    except (ValueError, IndexError):
        return None


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p)


def session_processes(session: int) -> list[SeenProcess]:
    """The processes of ``session`` other than its leader (Linux; elsewhere empty)."""
    found: list[SeenProcess] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == session:
            continue
        stat = _proc_stat(int(entry))
        if stat is None or stat[2] != session:
            continue
        state, ppid, _sid, exit_code = stat
        exit_signal = None
        if state == "Z" and exit_code:
            number = exit_code & 0x7F
            if number:
                try:
                    exit_signal = signal.Signals(number).name
                except ValueError:
                    exit_signal = f"SIG{number}"
        found.append(SeenProcess(int(entry), ppid, _cmdline(int(entry)), state, exit_signal))
    return found


def _depth(seen: SeenProcess, by_pid: dict[int, SeenProcess]) -> int:
    depth, ppid, guard = 0, seen.ppid, 0
    while ppid in by_pid and guard < 64:
        depth, ppid, guard = depth + 1, by_pid[ppid].ppid, guard + 1
    return depth


def dump_and_list(session: int, dump: bool) -> list[SeenProcess]:
    """At a timeout: list the session's other processes and, with ``dump``, send each one
    still running ``SIGABRT`` (deepest first) so faulthandler writes its stacks, waiting
    up to `CHILD_DUMP_GRACE` for each to end."""
    seen = session_processes(session)
    if not dump:
        return seen
    by_pid = {s.pid: s for s in seen}
    for one in sorted(seen, key=lambda s: -_depth(s, by_pid)):
        if one.state in ("Z", "X"):
            continue
        try:
            os.kill(one.pid, signal.SIGABRT)
        except OSError:
            continue
        deadline = time.monotonic() + CHILD_DUMP_GRACE
        while time.monotonic() < deadline:
            stat = _proc_stat(one.pid)
            if stat is None or stat[0] in ("Z", "X"):
                break
            time.sleep(0.01)
    return seen


def collect(
    run_dir: Optional[Path], root_pid: int, seen_at_timeout: Sequence[SeenProcess]
) -> list[ChildProcess]:
    """The run's other processes: every one the start-up hook recorded and every one
    found in the session at a timeout, each with what happened to it."""
    records: dict[int, dict[str, Any]] = {}
    faults: dict[int, str] = {}
    if run_dir is not None and run_dir.is_dir():
        for path in run_dir.iterdir():
            name = path.name
            try:
                if name.startswith("proc-") and name.endswith(".txt"):
                    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
                    records[int(lines[0])] = {
                        "ppid": int(lines[1]), "how": lines[2], "argv": lines[3:]
                    }
                elif name.startswith("fault-") and name.endswith(".log"):
                    faults[int(name[6:-4])] = path.read_text(encoding="utf-8", errors="replace")
            except (OSError, ValueError, KeyError, TypeError, IndexError):
                continue  # (a record its process could not finish writing: not read)
    at_timeout = {s.pid: s for s in seen_at_timeout}
    pids = sorted((set(records) | set(at_timeout) | set(faults)) - {root_pid})
    children = []
    for pid in pids:
        record = records.get(pid, {})
        alive = at_timeout.get(pid)
        fatal_list = parse_fatal_errors(faults.get(pid, ""))
        fatal = fatal_list[0] if fatal_list else None
        sig: Optional[str] = None
        if alive is not None and alive.state not in ("Z", "X"):
            state = "hung"
        elif alive is not None and alive.state == "Z" and alive.exit_signal:
            state, sig = "crashed", alive.exit_signal
        elif alive is not None and alive.state == "Z":
            state = "zombie"
        elif fatal is not None:
            state = "crashed"
            sig = FATAL_SIGNALS.get(fatal.message)
        else:
            state = "exited"
        ppid = record.get("ppid", alive.ppid if alive is not None else None)
        argv = record.get("argv") or (alive.argv if alive is not None else ())
        children.append(
            ChildProcess(
                pid=pid,
                ppid=ppid if isinstance(ppid, int) else None,
                argv=tuple(str(a) for a in argv),
                state=state,
                signal=sig,
                forked=record.get("how") == "fork",
                fatal_error=fatal,
            )
        )
    return children
