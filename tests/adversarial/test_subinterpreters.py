"""Subinterpreters do not overwrite each other's ledger file.

Every interpreter that imports exitsafe writes ``EXITSAFE_LEDGER`` at its end: each wrote
the path as given, and the last one to end overwrote the others' outcomes (3.12, 3.13; both
cores; isolated and legacy subinterpreters).  Now the main interpreter writes the path as
given and a subinterpreter ``<stem>.interp-<id><suffix>`` (or the path with ``{interp}``
replaced by its id, when the path has one).  Needs CPython's private ``_interpreters``
(3.13+) or ``_xxsubinterpreters`` (3.8-3.12) module; isolated subinterpreters need 3.12+.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from ..support import assert_clean, run_program

CORES = {"compiled": "0", "python": "1"}


def _api_missing() -> str:
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            __import__(name)
            return ""
        except ImportError:
            continue
    return "no _interpreters / _xxsubinterpreters module in this CPython"


pytestmark = pytest.mark.skipif(bool(_api_missing()), reason=_api_missing() or "-")

BODY = """
    try:
        import _interpreters as api  # 3.13+

        def create(kind):
            return api.create(kind)
    except ImportError:
        import _xxsubinterpreters as api  # 3.8-3.12

        def create(kind):
            try:
                return api.create(isolated=kind == "isolated")  # 3.12
            except TypeError:  # 3.8-3.11: legacy only
                assert kind == "legacy"
                return api.create()

    keep = exitsafe.track("main", record, name="main")
    for i in range(2):
        sub = create(KIND)
        api.run_string(sub, f'''
    import exitsafe
    h = exitsafe.track("sub{i}", lambda raw: None, name="sub{i}")
    ''')
        print("sub", int(sub[0] if isinstance(sub, tuple) else sub), flush=True)
        api.destroy(sub)  # its exit teardown runs, and writes its ledger
"""


def _outcomes(path: Path) -> dict[str, str]:
    data = json.loads(path.read_text())
    return {e["name"]: e["outcome"] for r in data["registries"] for e in r["entries"]}


def _run(tmp_path: Path, core: str, kind: str, ledger: str):  # type: ignore[no-untyped-def]
    if kind == "isolated" and sys.version_info < (3, 12):
        pytest.skip("isolated subinterpreters need CPython 3.12+")
    run = run_program(
        f"KIND = {kind!r}\n" + textwrap.dedent(BODY),
        tmp_path,
        env={"EXITSAFE_PURE_PYTHON": CORES[core], "EXITSAFE_LEDGER": str(tmp_path / ledger)},
    )
    assert_clean(run)
    ids = [int(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("sub ")]
    assert len(ids) == 2 and 0 not in ids, run.describe()
    return ids


@pytest.mark.parametrize("kind", ["isolated", "legacy"])
@pytest.mark.parametrize("core", list(CORES))
def test_each_interpreter_writes_a_ledger_file_of_its_own(tmp_path, core, kind):
    ids = _run(tmp_path, core, kind, "ledger.json")
    files = sorted(p.name for p in tmp_path.glob("ledger*.json"))
    assert files == sorted(["ledger.json", *(f"ledger.interp-{i}.json" for i in ids)])
    assert _outcomes(tmp_path / "ledger.json") == {"main": "released_at_exit"}
    for n, i in enumerate(ids):
        assert _outcomes(tmp_path / f"ledger.interp-{i}.json") == {f"sub{n}": "released_at_exit"}


@pytest.mark.parametrize("core", list(CORES))
def test_an_interp_placeholder_names_every_interpreters_file(tmp_path, core):
    ids = _run(tmp_path, core, "legacy", "ledger-{interp}.json")
    assert sorted(p.name for p in tmp_path.glob("ledger*.json")) == sorted(
        ["ledger-0.json", *(f"ledger-{i}.json" for i in ids)]
    )
    assert _outcomes(tmp_path / "ledger-0.json") == {"main": "released_at_exit"}
    assert _outcomes(tmp_path / f"ledger-{ids[1]}.json") == {"sub1": "released_at_exit"}


@pytest.mark.parametrize("core", list(CORES))
def test_a_subinterpreters_exitsafe_adds_nothing_to_the_main_interpreters_collector(
    tmp_path, core
):
    """CPython 3.9's ``gc`` module is single-phase init: a legacy subinterpreter's
    ``gc.callbacks`` is the main interpreter's list.  exitsafe imported there added its
    collection callback to the main interpreter's list, which then called it at every
    collection of the main interpreter, and after the subinterpreter ended with its module
    globals cleared ("Exception ignored in: <function _on_collection ...>", TypeError)."""
    run = run_program(
        textwrap.dedent(
            """
            try:
                import _interpreters as api  # 3.13+

                sub = api.create("legacy")
            except ImportError:
                import _xxsubinterpreters as api  # 3.8-3.12

                try:
                    sub = api.create(isolated=False)  # 3.12
                except TypeError:  # 3.8-3.11: legacy only
                    sub = api.create()
            before = list(gc.callbacks)
            api.run_string(sub, "import exitsafe")
            print("during", len(gc.callbacks) - len(before), flush=True)
            api.destroy(sub)
            gc.collect()
            print("after", len(gc.callbacks) - len(before), flush=True)
            """
        ),
        tmp_path,
        env={"EXITSAFE_PURE_PYTHON": CORES[core]},
    )
    assert_clean(run)
    assert run.stdout.split() == ["during", "0", "after", "0"], run.describe()
