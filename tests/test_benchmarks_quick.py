"""The benchmark suite runs: ``python -m benchmarks --quick`` produces every section.

No timing is asserted here (the machine running the tests may be busy); only that
every section runs, the JSON is well formed, the correctness checks the benchmarks
make along the way hold (ledger counts equal to the operations, no lost update under
threads), and the Markdown and SVG outputs are produced.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("hot_path", "teardown", "memory", "threads", "import", "exit", "calls", "scaling")

pytestmark = pytest.mark.skipif(
    not (ROOT / "benchmarks" / "run.py").exists(), reason="benchmarks/ not in this checkout"
)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_summary(s: Any) -> None:
    assert set(s) >= {"median", "min", "max", "spread_pct", "n", "values"}, s
    assert _is_number(s["median"]) and s["n"] == len(s["values"]) >= 1
    assert s["min"] <= s["median"] <= s["max"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXITSAFE_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--json",
            str(out / "results.json"),
            "--markdown",
            str(out / "results.md"),
            "--plot",
            str(out / "teardown.svg"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return {
        "stdout": proc.stdout,
        "json": json.loads((out / "results.json").read_text(encoding="utf-8")),
        "markdown": (out / "results.md").read_text(encoding="utf-8"),
        "svg": (out / "teardown.svg").read_text(encoding="utf-8"),
    }


def test_every_section_ran(quick_run: dict[str, Any]) -> None:
    results = quick_run["json"]
    assert results["schema"] == 1
    assert results["errors"] == {}
    assert results["meta"]["quick"] is True
    assert tuple(results["sections"]) == SECTIONS
    assert set(results["section_seconds"]) == set(SECTIONS)
    for title in (
        "Hot path", "Teardown", "Memory", "Threads", "Import time", "Process exit",
        "Automatic borrow", "Building a chain", "Creating registries", "Writing the ledger file",
    ):
        assert title in quick_run["stdout"]
    assert "Bars (DESIGN.md)" in quick_run["stdout"]


def test_bars_are_reported(quick_run: dict[str, Any]) -> None:
    bars = quick_run["json"]["bars"]
    names = " ".join(b["name"] for b in bars)
    for needle in ("ffi.gc", "weakref.finalize", "teardown linear", "threads", "import"):
        assert needle in names
    for bar in bars:
        assert isinstance(bar["passed"], bool)
        assert bar["op"] in ("<=", ">=")
        assert _is_number(bar["value"]) and _is_number(bar["limit"])
        assert ("PASS" if bar["passed"] else "FAIL") in quick_run["stdout"]


def test_hot_path_section(quick_run: dict[str, Any]) -> None:
    data = quick_run["json"]["sections"]["hot_path"]
    for name in (
        "cffi_gc_release",
        "finalize_create_call",
        "exitsafe_track_release",
        "exitsafe_track_drop",
        "exitsafe_track_dep_release",
    ):
        _check_summary(data["per_op_s"][name])
    _check_summary(data["ratios"]["exitsafe_track_release"]["cffi_gc_release"])
    _check_summary(data["ratios"]["exitsafe_track_release"]["finalize_create_call"])
    assert data["ledger_check"]["ok"], data["ledger_check"]
    for name in ("lock", "object", "weakref", "dict"):
        _check_summary(data["primitives_per_op_s"][name])
    assert data["profile"]["top"] and all("function" in e for e in data["profile"]["top"])


def test_teardown_section(quick_run: dict[str, Any]) -> None:
    data = quick_run["json"]["sections"]["teardown"]
    for shape in ("wide", "deep"):
        rows = data[shape]
        assert len(rows) >= 2
        assert [r["n"] for r in rows] == sorted(r["n"] for r in rows)
        for row in rows:
            _check_summary(row["teardown_s"])
            _check_summary(row["teardown_per_handle_s"])
            assert row["ledger_ok"], row
    assert data["profile"]["top"]


def test_memory_threads_import_exit_sections(quick_run: dict[str, Any]) -> None:
    sections = quick_run["json"]["sections"]
    for row in sections["memory"]["results"].values():
        assert _is_number(row["live_bytes_per_handle"]) and row["live_bytes_per_handle"] > 0
    assert set(sections["memory"]["results"]) >= {"exitsafe_track", "weakref_finalize"}

    workloads = sections["threads"]["workloads"]
    for name in ("independent", "shared_parent"):
        for row in workloads[name].values():
            assert row["all_ok"] is True, row
            _check_summary(row["ops_per_s"])
            _check_summary(row["ratio_vs_one_thread"])

    imp = sections["import"]
    _check_summary(imp["added_vs_pass_s"]["python -c 'import exitsafe'"])
    assert any(m["module"] == "exitsafe" for m in imp["importtime"])

    modes = sections["exit"]["modes"]
    assert set(modes) == {"plain", "cffi_gc", "exitsafe", "exitsafe_leak"}
    for row in modes.values():
        _check_summary(row["exit_s"])


def test_markdown_and_svg(quick_run: dict[str, Any]) -> None:
    md = quick_run["markdown"]
    assert "| bar | measured | limit | result |" in md
    root = ET.fromstring(quick_run["svg"])
    assert root.tag.endswith("svg")
    assert len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) >= 4


def test_parse_importtime() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.startup import parse_importtime
    finally:
        sys.path.remove(str(ROOT))
    sample = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:       100 |        100 | site",
            "import time:        20 |         20 |     exitsafe._states",
            "import time:        30 |         50 |   exitsafe.lifetime",
            "import time:        40 |         90 | exitsafe",
        ]
    )
    rows = parse_importtime(sample, "exitsafe")
    assert rows == [
        ("exitsafe._states", 20, 20, 2),
        ("exitsafe.lifetime", 30, 50, 1),
        ("exitsafe", 40, 90, 0),
    ]


def test_scaling_section(quick_run: dict[str, Any]) -> None:
    data = quick_run["json"]["sections"]["scaling"]
    (core,) = data["cores"]  # (the quick run measures the core it runs)
    for order in ("with", "forward", "reverse", "random"):
        rows = data["chain"][core][order]
        assert len(rows) >= 2 and all(_is_number(r["per_edge_s"]) for r in rows)
    assert all(_is_number(r["per_registry_s"]) for r in data["registries"][core])
    assert all(
        _is_number(r["ratio_vs_json_dumps"]) and r["bytes"] > 0 for r in data["ledger"][core]
    )
    for row in data["exit"][core].values():
        assert set(row) == {"plain", "cffi_gc", "exitsafe"}
        assert all(_is_number(v["cpu_s"]) for v in row.values())
