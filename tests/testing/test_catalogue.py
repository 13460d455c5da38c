"""The catalogue: for each kind of bad exit, a real program in a real subprocess whose
report's first line names that kind (``NOT CLEAN [kind]: ...``), the same through
``exitsafe run`` and through the pytest plugin.

The programs are in ``programs/`` and listed in ``catalogue.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from exitsafe.cli import main
from exitsafe.testing import ExitResult, run_command
from exitsafe.testing._hints import HINTS

from .catalogue import CASES, PROGRAMS, Case, build_lab, build_spin, missing


@pytest.fixture(scope="module")
def spin_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_spin(tmp_path_factory.mktemp("spin"))


def _prepare(case: Case, request: pytest.FixtureRequest) -> list[str]:
    why = missing(case)
    if why is not None:
        pytest.skip(why)
    if case.needs == "lab":
        why = build_lab()
        if why is not None:
            pytest.skip(why)
    library = request.getfixturevalue("spin_library") if case.needs == "c++" else None
    return case.argv(library)


def test_every_kind_has_a_program() -> None:
    kinds = {case.kind for case in CASES}
    # (the other keys are hints of a kind's variants: "native-fatal-qthread", and
    # "...-thread" where a daemon thread was still running; test_diagnosis has their programs)
    named = {key for key in HINTS if not key.startswith(("native-fatal-", "lost-output-",
                                                          "child-process-"))
             and not key.endswith("-thread")}
    assert named == kinds, f"kinds without a program: {named - kinds}; unknown: {kinds - named}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_first_line_names_the_kind(
    case: Case, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    argv = _prepare(case, request)
    result = run_command(
        argv, timeout=case.timeout, cwd=tmp_path, audit=case.audit, checks=case.checks
    )
    assert isinstance(result, ExitResult)
    first = result.report().splitlines()[0]
    assert first.startswith(f"NOT CLEAN [{case.kind}]: "), result.report()
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == case.kind
    assert diagnosis.url is not None and diagnosis.url in result.report()


# What each kind's report must also say: the thread, the handler, the object it names.
EXPECTED = {
    "hang-in-atexit": ["_terminate (", "zmqlike.py"],
    "hang-in-finalizer": ["__del__ (", "hang_in_finalizer.py"],
    "hang-in-finalizer-native-audited": [
        "ffi.gc of cdata 'rt_device *' created at", "hang_in_native_finalizer.py:12",
        "<no Python frame>",
    ],
    "hang-in-finalizer-del-audited": [
        "hang in a finalizer: __main__.Readback.__del__ (",
        "the audit saw this release begin and never end: __del__ of __main__.Readback"
        " created at", "hang_in_del_audited.py:21",
    ],
    "deadlock-at-exit": ["daemon thread 'writer'", "holding lock (_thread.lock, locked)",
                         "in write_chunks", "the main thread"],
    "thread-exception": ["thread 'report-query'", "RuntimeError: Connection already closed!"],
    "native-fatal": ["FATAL: runtime used after it was torn down"],
    "hang-before-teardown": ["grpc-server"],
    "hang-in-main": ["still running its main code"],
}


@pytest.mark.parametrize("case", [c for c in CASES if c.id in EXPECTED],
                         ids=[c.id for c in CASES if c.id in EXPECTED])
def test_exitsafe_run_names_the_cause(
    case: Case, request: pytest.FixtureRequest, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = _prepare(case, request)
    monkeypatch.chdir(tmp_path)
    options = ["--timeout", str(case.timeout)] + (["--audit"] if case.audit else [])
    assert main(["run", *options, "--", *argv]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"NOT CLEAN [{case.kind}]: "), out
    for text in EXPECTED[case.id]:
        assert text in out, f"{text!r} not in the report:\n{out}"
    assert "captured stdout" in out  # the program's own output, on failure


PLUGIN_TESTS = '''
import json
import sys
from pathlib import Path

import pytest
from exitsafe.testing import assert_clean_exit

CASES = json.loads(Path({cases!r}).read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_kind(case, exit_run, tmp_path):
    result = exit_run.command(
        case["argv"], timeout=case["timeout"], audit=case["audit"], checks=case["checks"]
    )
    Path({out!r}, case["id"] + ".txt").write_text(result.summary())
    assert_clean_exit(result)
'''


def test_the_plugin_shows_the_same_first_line(
    pytester: pytest.Pytester, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    import json

    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.delenv("CI", raising=False)
    runnable = []
    for case in CASES:
        if missing(case) is not None or (case.needs == "lab" and build_lab() is not None):
            continue
        library = request.getfixturevalue("spin_library") if case.needs == "c++" else None
        runnable.append({"id": case.id, "kind": case.kind, "argv": case.argv(library),
                         "timeout": case.timeout, "audit": case.audit,
                         "checks": list(case.checks)})
    if not runnable:
        pytest.skip("no program of the catalogue can run here")
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(runnable))
    out = tmp_path / "summaries"
    out.mkdir()
    pytester.makepyfile(test_cat=PLUGIN_TESTS.format(cases=str(cases), out=str(out)))
    result = pytester.runpytest("-p", "no:cacheprovider", "-rf", "--tb=short", "-W", "ignore")
    result.assert_outcomes(failed=len(runnable))
    lines = result.stdout.str().splitlines()
    for case in runnable:
        summary = (out / f"{case['id']}.txt").read_text()
        assert summary.startswith(f"NOT CLEAN [{case['kind']}]: ")
        expected = f"FAILED test_cat.py::test_kind[{case['id']}] - exitsafe.testing.ExitNotClean: "
        shown = [line for line in lines if line.startswith(expected)]
        assert shown, f"no short-summary line for {case['id']}"
        # pytest's line is the report's first line, the addresses aside
        strip = re.compile(r"0x[0-9a-f]+")
        assert strip.sub("0x?", shown[0][len(expected):]) == strip.sub("0x?", summary)


def test_programs_are_listed() -> None:
    used = {c.program for c in CASES if c.program} | {"zmqlike.py"}
    files = {p.name for p in PROGRAMS.glob("*.py")}
    assert files == used, f"programs not in the catalogue: {files - used}"
    assert sys.executable  # the programs run with this interpreter
