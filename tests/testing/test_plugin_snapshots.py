"""Snapshots of what pytest shows for exit failures through the plugin.

The outputs are normalised (addresses, pids, durations, paths, line numbers inside the
standard library) and compared with ``tests/testing/snapshots/*.txt``.  After an
intended change, regenerate them with ``EXITSAFE_UPDATE_SNAPSHOTS=1`` and review the diff.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

SNAPSHOTS = Path(__file__).parent / "snapshots"

TESTS = '''
import sys
import pytest
from exitsafe.testing import assert_clean_exit

CRASH = (
    "import ctypes\\n"
    "class Device:\\n"
    "    def __del__(self):\\n"
    "        ctypes.string_at(0)\\n"
    "dev = Device()\\n"
)
LOSES_OUTPUT = (
    "import os\\n"
    "out = open('result.txt', 'w')\\n"
    "out.write('all rows\\\\n')\\n"
    "os._exit(0)\\n"
)
CHECK = "grep -q 'all rows' result.txt"


def test_crash_at_exit(exit_run):
    assert_clean_exit(exit_run(CRASH))


@pytest.mark.exitsafe(checks=[CHECK])
def test_lost_output(exit_run):
    assert_clean_exit(exit_run(LOSES_OUTPUT))


def test_plain_assert(exit_run):
    result = exit_run(CRASH)
    assert result.clean
'''

_RULES = [
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x?"),
    # faulthandler names the thread from CPython 3.14.x on ("thread 0x... [python]")
    (re.compile(r"(thread 0x\?) \[[^\]]*\]"), r"\1"),
    (re.compile(r"\d+\.\d+ s\b"), "?.?? s"),
    (re.compile(r"\d+\.\d+s\b"), "?.??s"),
    (re.compile(r'File "[^"]*/lib/python3\.\d+/([^"]*)", line \d+'), r'File "<stdlib>/\1", line ?'),
    (re.compile(r"[^\s(]*/lib/python3\.\d+/(\S+?):\d+"), r"<stdlib>/\1:?"),
]


def _normalise(text: str, tmp: Path) -> str:
    # a long command is cut at a width that depends on the interpreter's path
    text = re.sub(r"command: .*", "command: <the command>", text)
    text = text.replace(sys.executable, "PYTHON").replace(str(tmp), "TMP")
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


def _shown(stdout: str) -> str:
    """The lines a user reads: the assertion blocks ("E  ...") and the short summary."""
    keep = []
    summary = section = False
    for line in stdout.splitlines():
        if section and (line.startswith(("_", "=")) or not line.strip()):
            section = False
        if section:
            keep.append(line.rstrip())
            continue
        if line.startswith("----") and "exitsafe: decoded exit results" in line:
            section = True
            keep.append("--- section: exitsafe: decoded exit results ---")
            continue
        if "short test summary info" in line:
            summary = True
            keep.append("--- short test summary ---")
            continue
        if summary and line.startswith("="):
            summary = False
        if line.startswith("E ") or summary:
            keep.append(line.rstrip())
        elif line.startswith("_") and line.strip("_ ").startswith("test_"):
            keep.append(line.strip("_ ").join(["### ", ""]))
    return "\n".join(keep) + "\n"


@pytest.mark.skipif(os.name != "posix", reason="the snapshot is of POSIX signals")
def test_plugin_output_snapshot(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # pytest's short summary is cut at the width
    # ... except on CI machines: pytest shows it whole when CI or BUILD_NUMBER is set
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    monkeypatch.delenv("EXITSAFE_DOCS_URL", raising=False)  # the hints' links: the default
    pytester.makepyfile(test_snap=TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rf", "--tb=short", "-W", "ignore")
    result.assert_outcomes(failed=3)
    shown = _normalise(_shown(result.stdout.str()), pytester.path)
    expected_file = SNAPSHOTS / "plugin_failures.txt"
    if os.environ.get("EXITSAFE_UPDATE_SNAPSHOTS"):
        expected_file.parent.mkdir(exist_ok=True)
        expected_file.write_text(shown)
    assert shown == expected_file.read_text()
    # pytest's one-line summary carries the decoded cause, not a generic sentence
    lines = shown.split("--- short test summary ---\n")[1].splitlines()
    assert lines[0].startswith(
        "FAILED test_snap.py::test_crash_at_exit"
        " - exitsafe.testing.ExitNotClean: NOT CLEAN [crash-at-exit]: crash at exit (SIGSEGV)"
    )
    assert "NOT CLEAN [lost-output]: the program exited 0 but the check" in lines[1]
