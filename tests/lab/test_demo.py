"""``exitsafe demo``: the table, the JSON, the filters, and the exit status."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from exitsafe.lab import catalog, demo

from .conftest import needs_posix

pytestmark = needs_posix


def test_demo_table_for_two_scenarios(
    lab: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # no wrapping: cells can be searched as text
    status = demo.main(["--only", "S2,s9"])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert "SIGABRT + FATAL: device released after its parent instance was released" in out
    assert "SIGABRT + FATAL: buffer used after release" in out
    assert "exit 0, no leaks" in out
    assert "S1 " not in out and "S10" not in out
    assert "All 2 scenarios behaved as expected" in out
    assert "ordered teardown at exit" in out  # the legend
    # progress on stderr, one line per program
    progress = [line for line in err.splitlines() if line.startswith("[")]
    assert len(progress) == 4 and all(line.endswith("(ok)") for line in progress), err


def test_demo_json(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = demo.main(["--json", "--only", "S1,S7,S10"])
    out, _ = capsys.readouterr()
    assert status == 0
    data = json.loads(out)
    assert data["ok"] is True
    by_id = {s["id"]: s for s in data["scenarios"]}
    assert list(by_id) == ["S1", "S7", "S10"]
    s1 = by_id["S1"]
    assert s1["unprotected"]["signal"] == "SIGSEGV" and s1["unprotected"]["returncode"] == -11
    assert s1["protected"]["returncode"] == 0 and s1["protected"]["ok"] is True
    assert s1["protected"]["leak_reports"][0]["devices"] == "0"
    assert s1["protected"]["ledger"]["released_at_exit"] == 3
    s7 = by_id["S7"]
    assert s7["unprotected"]["timed_out"] is True
    assert s7["unprotected"]["outcome"] == "hang, killed after 3 s"
    assert s7["protected"]["ledger"]["leaked_timeout"] == 1
    s10 = by_id["S10"]
    assert s10["unprotected"]["returncode"] == 23
    assert s10["protected"]["env"]["EXITSAFE_AT_EXIT"] == "release"
    assert s10["expected"]["unprotected"]["kind"] == "leaks"


def test_demo_reports_an_unexpected_outcome_and_exits_1(
    lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = catalog.get("S9")
    wrong = dataclasses.replace(
        real, failure=catalog.Failure("signal", "a crash", signals=("SIGSEGV",))
    )
    monkeypatch.setattr(catalog, "select", lambda ids=None: [wrong])
    status = demo.main(["--only", "S9"])
    out, _ = capsys.readouterr()
    assert status == 1
    assert "UNEXPECTED" in out and "FAIL" in out
    assert "1 of 1 scenarios did NOT behave as expected: S9" in out


def test_render_table_fits_the_width(lab: Path) -> None:
    results = demo.run_demo(catalog.select(["S3", "S6"]))
    assert all(r.ok for r in results)
    for width in (100, 140, 200):
        table = demo.render_table(results, width=width)
        assert max(len(line) for line in table.splitlines()) <= width, table


def test_demo_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--only", "S1,S99"]) == 2
    assert "unknown scenario 'S99'" in capsys.readouterr().err
    assert demo.main(["--bogus"]) == 2
    assert demo.main(["--help"]) == 0
    assert "--only" in capsys.readouterr().out


def test_demo_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("S")] == [
        f"S{n}" for n in range(1, 14)
    ]


def test_demo_without_a_compiler_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXITSAFE_LAB_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    assert demo.main(["--only", "S1"]) == 2
    err = capsys.readouterr().err
    assert "cannot build the lab runtime" in err and "apt-get install gcc" in err


def test_exitsafe_demo_command(lab: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exitsafe", "demo", "--only", "S8", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] and data["scenarios"][0]["id"] == "S8"
    assert "strict mode refused" in json.dumps(data) or data["scenarios"][0]["protected"]["ok"]
