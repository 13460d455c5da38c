"""The ``exitsafe`` command: ``run``, ``demo``, ``--version``; exit status 0 / 1 / 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import exitsafe
from exitsafe.cli import main

SEGFAULT = "import ctypes; ctypes.string_at(0)"


def test_run_clean_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--", sys.executable, "-c", "print('hello')"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("CLEAN: exit status 0")
    assert "\nhello\n" not in out  # the program's output is not shown unless asked


def test_run_crashing_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--", sys.executable, "-c", SEGFAULT]) == 1
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("NOT CLEAN: ")  # a crash in the main code: not an exit crash
    if os.name == "posix":
        assert "SIGSEGV (signal 11)" in first
    assert "Fatal Python error: Segmentation fault" in out
    assert "in string_at" in out


def test_run_shows_unraisable_and_teardown(capsys: pytest.CaptureFixture[str]) -> None:
    code = textwrap.dedent(
        """
        import exitsafe
        dev = exitsafe.track(1, lambda raw: None, kind="device", name="dev0")

        class Old:
            def __del__(self):
                raise RuntimeError("late")

        old = Old()
        """
    )
    assert main(["run", "--", sys.executable, "-c", code]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT CLEAN [unraisable-at-exit]: a __del__ raised while the interpreter")
    assert "1 unraisable exception at exit" in out.splitlines()[0]
    assert "RuntimeError: late in <function Old.__del__>" in out
    assert "registry 'default' (atexit): 1 steps, released 1, leaked 0, failed 0" in out
    assert "ledger: released_at_exit 1" in out


def test_run_without_separator(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", sys.executable, "-c", "pass"]) == 0
    assert capsys.readouterr().out.startswith("CLEAN")


def test_a_separator_inside_the_command_belongs_to_it(capsys: pytest.CaptureFixture[str]) -> None:
    code = "import sys; print(sys.argv[1:])"
    argv = ["run", "--show-output", sys.executable, "-c", code, "--", "x"]
    assert main(argv) == 0
    assert "['--', 'x']" in capsys.readouterr().out
    argv = ["run", "--repeat", "1", "--", sys.executable, "-c", code, "--", "y"]
    assert main([*argv[:1], "--show-output", *argv[1:]]) == 0
    assert "['--', 'y']" in capsys.readouterr().out


def test_run_repeat_reports_failure_kinds(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(str(tmp_path))
    code = (
        "from pathlib import Path\n"
        "p = Path('n'); n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1))\n"
        "import sys, os\n"
        "if n == 1: os.abort()\n"
        "if n == 2: sys.exit(7)\n"
    )
    assert main(["run", "--repeat", "4", "--", sys.executable, "-c", code]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("NOT CLEAN: 2 of 4 runs failed (50%)")
    assert "exit status 7: 1 run(s) (run 3)" in out
    if os.name == "posix":
        assert "SIGABRT: 1 run(s) (run 2)" in out


def test_run_repeat_names_the_diagnosed_kinds_first(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(str(tmp_path))
    code = (
        "from pathlib import Path\n"
        "p = Path('n'); n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1))\n"
        "import sys, threading\n"
        "def fail(): raise ValueError('lost')\n"
        "if n in (0, 2): threading.Thread(target=fail).start()\n"
        "if n == 1: sys.exit(7)\n"
    )
    assert main(["run", "--repeat", "3", "--", sys.executable, "-c", code]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("NOT CLEAN [thread-exception x2]: 3 of 3 runs failed (100%)"), first


def test_run_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    code = "import time; time.sleep(600)"
    assert main(["run", "--timeout", "1", "--", sys.executable, "-c", code]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT CLEAN [hang-in-main]: the program was still running its main code")
    assert "timed out after 1 s" in out.splitlines()[0]


def test_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["clean"] is False
    assert data["returncode"] == 3
    assert data["failure_kind"] == "exit status 3"
    assert main(["run", "--json", "--repeat", "2", "--", sys.executable, "-c", "pass"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 2 and data["failure_rate"] == 0.0


def test_run_show_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = "import sys; print('to out'); print('to err', file=sys.stderr)"
    assert main(["run", "--show-output", "--", sys.executable, "-c", code]) == 0
    out = capsys.readouterr().out
    assert "--- stdout ---\nto out\n" in out
    assert "--- stderr ---\nto err\n" in out


DEL_RAISES = textwrap.dedent(
    """
    class Old:
        def __del__(self):
            raise RuntimeError("late")

    old = Old()
    """
)


def test_run_docs_url_sets_the_base_of_the_hint_links(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--docs-url`` is the base of the report's ``see:`` link, over ``EXITSAFE_DOCS_URL``
    (the documented precedence: the flag, else the variable, else the project's site), and
    the variable is as it was after the run."""
    from exitsafe.testing._hints import HINTS, docs_url

    base = "https://example.test/exitsafe/"
    expected = docs_url(HINTS["unraisable-at-exit"][1], base)
    assert expected.startswith(base + "adapters/#")
    monkeypatch.setenv("EXITSAFE_DOCS_URL", "https://mirror.test/other/")
    assert main(["run", "--docs-url", base, "--", sys.executable, "-c", DEL_RAISES]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT CLEAN [unraisable-at-exit]")
    assert f"  see: {expected}" in out.splitlines()
    assert "mirror.test" not in out
    assert os.environ["EXITSAFE_DOCS_URL"] == "https://mirror.test/other/"  # restored
    argv = ["run", "--json", "--docs-url", base.rstrip("/"), "--", sys.executable, "-c"]
    assert main([*argv, DEL_RAISES]) == 1
    assert json.loads(capsys.readouterr().out)["diagnosis"]["url"] == expected
    # without the flag, the variable's site
    assert main(["run", "--", sys.executable, "-c", DEL_RAISES]) == 1
    mirror = docs_url(HINTS["unraisable-at-exit"][1], "https://mirror.test/other/")
    assert f"  see: {mirror}" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "no command given"),
        (["run", "--"], "no command given"),
        (["run", "--", "exitsafe-no-such-program-xyz"], "cannot start"),
        (["run", "--repeat", "0", "--", "x"], "must be at least 1"),
        (["run", "--timeout", "soon", "--", "x"], "not a number of seconds"),
        (["run", "--bogus", "--", "x"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice"),
        ([], "usage: exitsafe"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"exitsafe {exitsafe.__version__}"


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    assert "--repeat N" in capsys.readouterr().out


def test_demo_delegates_to_the_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    calls: list[list[str]] = []
    fake = types.ModuleType("exitsafe.lab.demo")
    fake.main = lambda argv: calls.append(list(argv)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "exitsafe.lab", types.ModuleType("exitsafe.lab"))
    monkeypatch.setitem(sys.modules, "exitsafe.lab.demo", fake)
    assert main(["demo", "--scenario", "S1", "--", "x"]) == 0
    assert calls == [["--scenario", "S1", "--", "x"]]


def test_demo_without_the_lab_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "exitsafe.lab.demo", None)  # import fails
    assert main(["demo"]) == 2
    assert "exitsafe demo: the scenario lab is not available" in capsys.readouterr().err


def test_python_m_exitsafe_run_end_to_end() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exitsafe", "run", "--", sys.executable, "-c", SEGFAULT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout.startswith("NOT CLEAN: ")
    assert "Fatal Python error: Segmentation fault" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "exitsafe", "run", "--", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("CLEAN: exit status 0")


QUIESCED = """
import threading, time
import exitsafe

def loop():
    while True:
        time.sleep(0.001)

threading.Thread(target=loop, daemon=True).start()
time.sleep(0.05)
print("done", flush=True)
"""


@pytest.mark.parametrize(("outside", "bound"), [(None, "5.0"), ("1.5", "1.5"), ("0", "5.0")])
def test_run_quiesce_parks_the_threads_with_no_line_of_code(
    outside: str | None, bound: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --quiesce alone: the 5 s default; a bound the caller's EXITSAFE_QUIESCE gives is kept
    # (one that does not quiesce, "0", is not: the flag asks for it)
    if outside is None:
        monkeypatch.delenv("EXITSAFE_QUIESCE", raising=False)
    else:
        monkeypatch.setenv("EXITSAFE_QUIESCE", outside)
    code = QUIESCED + "print('bound', exitsafe._config.quiesce_bound(), flush=True)\n"
    argv = ["run", "--quiesce", "--show-output", "--", sys.executable, "-c", code]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"bound {bound}" in out
    assert "exitsafe: quiesce threads=1 parked=1 running=0" in out


def test_run_without_quiesce_parks_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--show-output", "--", sys.executable, "-c", QUIESCED]) == 0
    assert "exitsafe: quiesce" not in capsys.readouterr().out
