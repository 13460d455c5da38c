"""Run the exitsafe benchmark suite: ``python -m benchmarks [--quick] [--json PATH]``.

Every number is measured in this run, against baselines measured in the same run
(cffi's ``ffi.gc``, ``weakref.finalize``, plain objects, ``python -c pass``); the
tables go to stdout, progress to stderr, everything to a JSON file.  Bars from
DESIGN.md are reported PASS/FAIL; a failing bar does not fail the run (the exit
status is non-zero only when a section crashes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

if __package__ in (None, ""):  # run as a script: python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

import cffi

import exitsafe
from benchmarks import calls, hot_path, memory, scaling, startup, svgplot, teardown, threads
from benchmarks._util import Bar, Config, Section, Table, progress

HERE = Path(__file__).resolve().parent
SECTIONS: Dict[str, Callable[[Config], Section]] = {
    "hot_path": hot_path.run,
    "teardown": teardown.run,
    "memory": memory.run,
    "threads": threads.run,
    "import": startup.run_import,
    "exit": startup.run_exit,
    "calls": calls.run,
    "scaling": scaling.run,
}
SCHEMA = 1


def _loadavg() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def meta(cfg: Config) -> Dict[str, Any]:
    return {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": cfg.quick,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": _loadavg(),
        "exitsafe": exitsafe.__version__,
        "cffi": cffi.__version__,
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "exitsafe_env": {k: v for k, v in os.environ.items() if k.startswith("EXITSAFE_")},
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def bars_table(bars: Sequence[Bar]) -> Table:
    table = Table("Bars (DESIGN.md)", ["bar", "measured", "limit", "result"])
    for bar in bars:
        unit = bar.unit
        table.add(
            bar.name,
            f"{bar.value:.2f}{unit}" if unit else ("yes" if bar.passed else "no"),
            f"{bar.op} {bar.limit:g}{unit}" if unit else "-",
            "PASS" if bar.passed else "FAIL",
        )
    return table


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: checks it works")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="where to write the results (default: benchmarks/results/latest[-quick].json)",
    )
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown")
    parser.add_argument("--plot", metavar="PATH", help="write the teardown chart (SVG) here")
    parser.add_argument(
        "--only",
        metavar="SECTIONS",
        help=f"comma-separated subset of: {', '.join(SECTIONS)}",
    )
    args = parser.parse_args(argv)

    cfg = Config.make(args.quick)
    names = list(SECTIONS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SECTIONS]
        if unknown:
            parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    if any(k.startswith("EXITSAFE_") for k in os.environ):
        progress("warning: EXITSAFE_* variables are set; in-process sections see them")

    info = meta(cfg)
    started = time.perf_counter()
    sections: Dict[str, Section] = {}
    errors: Dict[str, str] = {}
    for name in names:
        progress(f"section {name} ...")
        t0 = time.perf_counter()
        try:
            section = SECTIONS[name](cfg)
        except Exception:
            errors[name] = traceback.format_exc()
            progress(f"section {name} FAILED:\n{errors[name]}")
            continue
        section.seconds = time.perf_counter() - t0
        sections[name] = section
        progress(f"section {name} done in {section.seconds:.1f} s")
        for table in section.tables:
            print(table.render(), end="\n\n", flush=True)
    info["duration_s"] = time.perf_counter() - started
    info["loadavg_after"] = _loadavg()

    bars = [bar for s in sections.values() for bar in s.bars]
    btable = bars_table(bars)
    btable.notes.append(
        f"{'quick' if cfg.quick else 'full'} run, {info['duration_s']:.0f} s,"
        f" Python {info['python']} on {info['machine']} x{info['cpu_count']},"
        f" load {info['loadavg_before']} -> {info['loadavg_after']}"
    )
    print(btable.render(), flush=True)
    info["summary"] = (
        f"exitsafe {info['exitsafe']}, Python {info['python']}, {info['processor']}"
        f" x{info['cpu_count']}, {info['started_utc']}"
    )

    results = {
        "schema": SCHEMA,
        "meta": info,
        "sections": {name: s.data for name, s in sections.items()},
        "section_seconds": {name: s.seconds for name, s in sections.items()},
        "bars": [b.as_dict() for b in bars],
        "errors": errors,
    }
    out = (
        Path(args.json)
        if args.json
        else HERE / "results" / ("latest-quick.json" if cfg.quick else "latest.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    progress(f"results written to {out}")
    if args.markdown:
        parts = [t.markdown() for s in sections.values() for t in s.tables]
        parts.append(btable.markdown())
        Path(args.markdown).write_text("\n\n".join(parts) + "\n", encoding="utf-8")
        progress(f"markdown tables written to {args.markdown}")
    if args.plot and "teardown" in sections:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        Path(args.plot).write_text(
            svgplot.teardown_chart(sections["teardown"].data, note=info["summary"]),
            encoding="utf-8",
        )
        progress(f"teardown chart written to {args.plot}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
