"""The hot path in steady state, in CPU instructions: ``python -m benchmarks.steady``.

`benchmarks.instructions` measures the first 12,000 operations of a fresh registry;
a long-running program is past that: its ledger has been trimmed many times.  Here
each contender first runs ``WARMUP`` operations (10^6) with valgrind's instrumentation
off, then the instructions of ``n1`` and of ``n2`` further operations are counted, in
two runs: the difference divided by ``n2 - n1`` is the cost per operation.  The window
``n2 - n1`` is a whole number of the ledger's trim periods (every operation adds one
ledger record), so the cost of trimming is amortized exactly, whatever the alignment.

Two ledger settings are measured: the default ``ledger_limit`` (100,000) and
``ledger_limit=0`` (counts only: the registry keeps no entry, so it trims most often).
The baselines (cffi's ``ffi.gc`` + ``ffi.release``, and ``ffi.gc`` dropped) are
measured in the same run, after the same warm-up; every exitsafe contender runs under
each core (``EXITSAFE_PURE_PYTHON=0`` and ``=1``).

The instrumentation is switched on by a client request from a tiny C helper built with
the system's C compiler; without one, the warm-up is instrumented too (the same numbers,
but several times slower).  Needs valgrind; prints why and exits 2 without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from typing import Dict, List, Optional, Tuple

from .instructions import CONTENDERS

#: Operations run before the counted window.
WARMUP = 1_000_000
#: Operations counted in the shorter run (the longer one adds the window).
FIRST = 2_000
#: The window is at least this many operations (rounded up to whole trim periods).
MIN_WINDOW = 10_000

#: name -> ledger_limit (None: the Registry default).
LEDGERS: Dict[str, Optional[int]] = {"default": None, "limit0": 0}

#: The contenders measured, each against its baseline, and its bar for the compiled core.
BARS: Dict[str, Tuple[str, float]] = {
    "track_release": ("cffi_gc_release", 0.8),
    "track_dep_release": ("cffi_gc_release", 1.0),
    "track_drop": ("cffi_gc_drop", 1.2),
    "module_track_release": ("cffi_gc_release", 0.8),  # (track + release, default registry)
    "cffi_track_release": ("cffi_gc_release", 1.5),
}
BASELINES = ("cffi_gc_release", "cffi_gc_drop")
#: The pure-Python core's bar, for every contender.
PURE_BAR = 6.0

PROGRAM = textwrap.dedent(
    """
    import ctypes, sys, cffi, exitsafe, exitsafe.cffi, exitsafe._registry
    ffi = cffi.FFI()
    ptr = ffi.cast("void *", 0x1234)
    LIMIT = LIMIT_VALUE
    toggle = ctypes.CDLL(sys.argv[3]) if sys.argv[3] else None
    def release(raw):
        pass
    def main(warm, n):
        options = {} if LIMIT is None else {"ledger_limit": LIMIT}
        if options:  # the default registry (exitsafe.track, exitsafe.cffi.track) too
            exitsafe._registry.default_holder.append(exitsafe.Registry("default", **options))
        reg = exitsafe.Registry("bench", **options)
        dep = (reg.track(ptr, release, kind="parent"),)
        gc, rel = ffi.gc, ffi.release
        track, mtrack, ctrack = reg.track, exitsafe.track, exitsafe.cffi.track
        for _ in range(warm):
            BODY
        if toggle is not None:
            toggle.exitsafe_bench_start()
        for _ in range(n):
            BODY
        if toggle is not None:
            toggle.exitsafe_bench_stop()
    main(int(sys.argv[1]), int(sys.argv[2]))
    """
)

HELPER = textwrap.dedent(
    """
    #include <valgrind/callgrind.h>
    void exitsafe_bench_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
    void exitsafe_bench_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
    """
)


def build_helper(directory: str) -> str:
    """Build the instrumentation switch; its path, or ``""`` when it cannot be built."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return ""
    source = os.path.join(directory, "toggle.c")
    target = os.path.join(directory, "toggle.so")
    with open(source, "w", encoding="utf-8") as fh:
        fh.write(HELPER)
    proc = subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", source, "-o", target],
        capture_output=True, text=True,
    )
    return target if proc.returncode == 0 else ""


def period(limit: Optional[int]) -> int:
    """Operations between two trims of a ledger with this ``ledger_limit``, in steady state."""
    from exitsafe._ledger import Ledger

    ledger = Ledger(100_000 if limit is None else limit)
    assert ledger.limit is not None
    return ledger.cap + 1 - ledger.limit


def window(limit: Optional[int]) -> int:
    every = period(limit)
    return every * max(1, -(-MIN_WINDOW // every))


def instructions(
    body: str, limit: Optional[int], warm: int, n: int, pure: bool, helper: str
) -> int:
    """Instructions callgrind counts in ``n`` operations after ``warm`` (all of the run
    without a helper)."""
    env = dict(os.environ, EXITSAFE_PURE_PYTHON="1" if pure else "0")
    env.pop("EXITSAFE_LEDGER", None)
    program = PROGRAM.replace("LIMIT_VALUE", repr(limit)).replace("BODY", body)
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    if helper:
        command.append("--instr-atstart=no")
    command += [sys.executable, "-c", program, str(warm), str(n), helper]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return int(found.group(1))


def per_operation(
    body: str, limit: Optional[int], warm: int, pure: bool, helper: str
) -> float:
    width = window(limit)
    first = instructions(body, limit, warm, FIRST, pure, helper)
    second = instructions(body, limit, warm, FIRST + width, pure, helper)
    return (second - first) / width


def measure(
    names: List[str], ledgers: List[str], warm: int, cores: List[str], helper: str
) -> Dict[str, Dict[str, Dict[str, float]]]:
    """ledger -> name -> {"compiled": n, "python": n} (a baseline's under "baseline")."""
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    for ledger in ledgers:
        limit = LEDGERS[ledger]
        rows: Dict[str, Dict[str, float]] = {}
        for name in names:
            body = CONTENDERS[name][1]
            print(f"steady: {ledger} {name}", file=sys.stderr, flush=True)
            if name in BASELINES:
                rows[name] = {"baseline": per_operation(body, limit, warm, True, helper)}
                continue
            rows[name] = {
                core: per_operation(body, limit, warm, core == "python", helper)
                for core in cores
            }
        results[ledger] = rows
    return results


def table(results: Dict[str, Dict[str, Dict[str, float]]]) -> str:
    lines = [
        "| per operation, after the warm-up | ledger | compiled core | pure Python | bar |",
        "| --- | --- | --- | --- | --- |",
    ]
    for ledger, rows in results.items():
        for name, row in rows.items():
            label = CONTENDERS[name][0]
            if "baseline" in row:
                lines.append(f"| {label} | {ledger} | | | {row['baseline']:,.0f} |")
                continue
            against = rows[BARS[name][0]]["baseline"]
            cells = []
            for core in ("compiled", "python"):
                value = row.get(core)
                cells.append(f"{value:,.0f} ({value / against:.2f}x)" if value else "-")
            bar = f"compiled <= {BARS[name][1]:g}x, pure <= {PURE_BAR:g}x"
            lines.append(f"| {label} | {ledger} | {cells[0]} | {cells[1]} | {bar} |")
    return "\n".join(lines)


def verdicts(results: Dict[str, Dict[str, Dict[str, float]]]) -> List[Tuple[str, float, float]]:
    """(what, ratio, bar) for every measured contender and core."""
    out = []
    for ledger, rows in results.items():
        for name, row in rows.items():
            if name in BASELINES:
                continue
            against = rows[BARS[name][0]]["baseline"]
            for core, value in row.items():
                bar = BARS[name][1] if core == "compiled" else PURE_BAR
                out.append((f"{name} {core} ({ledger})", value / against, bar))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--only", help="comma-separated contender names")
    parser.add_argument(
        "--ledger", default=",".join(LEDGERS), help=f"comma-separated: {', '.join(LEDGERS)}"
    )
    parser.add_argument("--core", default="compiled,python", help="compiled, python or both")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="operations before counting")
    parser.add_argument("--note", default="", help="a line saved with the numbers")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("benchmarks.steady: valgrind is not installed (apt-get install valgrind)")
        return 2
    import importlib.util

    cores = [c for c in args.core.split(",") if c]
    if importlib.util.find_spec("exitsafe._speedups") is None:
        cores = [c for c in cores if c != "compiled"]
    names = args.only.split(",") if args.only else list(BARS)
    unknown = [n for n in names if n not in BARS and n not in BASELINES]
    ledgers = [x for x in args.ledger.split(",") if x]
    if unknown or any(x not in LEDGERS for x in ledgers):
        parser.error(f"known contenders: {', '.join(BARS)}; ledgers: {', '.join(LEDGERS)}")
    for name in reversed(BASELINES):
        if name not in names:
            names.insert(0, name)
    with tempfile.TemporaryDirectory(prefix="exitsafe-steady-") as tmp:
        helper = build_helper(tmp)
        if not helper:
            print("steady: no C compiler: the warm-up is instrumented too", file=sys.stderr)
        results = measure(names, ledgers, args.warmup, cores, helper)
    print(table(results))
    failed = [v for v in verdicts(results) if v[1] > v[2]]
    for what, ratio, bar in verdicts(results):
        print(f"{'PASS' if ratio <= bar else 'FAIL'} {what}: {ratio:.2f}x (bar {bar:g}x)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            saved = {
                "warmup": args.warmup, "first": FIRST,
                "windows": {x: window(LEDGERS[x]) for x in ledgers},
                "note": args.note, "results": results,
            }
            json.dump(saved, fh, indent=2)
            fh.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
