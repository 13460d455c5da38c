"""Hot-path cost in CPU instructions, for both cores: ``python -m benchmarks.instructions``.

Wall-clock ratios move with the machine's load; instruction counts do not.  Each
contender runs in its own process under valgrind's callgrind twice, for ``SMALL`` and
``LARGE`` operations, and the difference divided by ``LARGE - SMALL`` is its cost per
operation, start-up excluded.  The baseline (cffi's ``ffi.gc`` + ``ffi.release``) is
measured in the same run, and every exitsafe contender is measured under each core:
``EXITSAFE_PURE_PYTHON=0`` (the compiled core, when built) and ``=1``.

Needs valgrind (``apt-get install valgrind``); prints why and exits 2 without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from typing import Dict, List, Optional, Tuple

SMALL, LARGE = 2_000, 12_000

#: name -> (label, loop body; ``ptr``, ``release``, ``reg``, ``dep``, ``ffi`` are bound)
CONTENDERS: Dict[str, Tuple[str, str]] = {
    "cffi_gc_release": ("cffi: ffi.gc + ffi.release", "rel(gc(ptr, release))"),
    "cffi_gc_drop": ("cffi: ffi.gc, object dropped", "gc(ptr, release)"),
    "finalize_create_call": ("weakref.finalize create + call", "fin(target, release, ptr)()"),
    "track_release": ("Registry.track + Handle.release", "track(ptr, release).release()"),
    "track_kind_release": (
        "Registry.track(kind=...) + release",
        "track(ptr, release, kind='buffer').release()",
    ),
    "track_dep_release": (
        "Registry.track(depends_on=...) + release",
        "track(ptr, release, depends_on=dep).release()",
    ),
    "track_drop": ("Registry.track, handle dropped (GC path)", "track(ptr, release)"),
    "module_track_release": ("exitsafe.track + release", "mtrack(ptr, release).release()"),
    "cffi_track_release": (
        "exitsafe.cffi.track + release",
        "ctrack(ffi, ptr, release).release()",
    ),
    "ctypes_track_release": (
        "exitsafe.ctypes.track + release",
        "cttrack(address, release).release()",
    ),
    # With the library pinned (the recommended binding): a malloc'd pointer and the pinned
    # library's own free, against the same calls without exitsafe.
    "cffi_malloc_gc_release": (
        "cffi: ffi.gc + ffi.release of malloc(16)",
        "rel(gc(malloc(16), free))",
    ),
    "cffi_track_pinned_release": (
        "exitsafe.cffi.track + release, libc pinned",
        "ctrack(ffi, malloc(16), free).release()",
    ),
    "ctypes_malloc_free": ("ctypes: free(malloc(16))", "cfree(cmalloc(16))"),
    "ctypes_track_pinned_release": (
        "exitsafe.ctypes.track + release, libc pinned",
        "cttrack(cmalloc(16), cfree).release()",
    ),
}
BASELINE = "cffi_gc_release"
DROP_BASELINE = "cffi_gc_drop"
#: The baseline each contender is divided by, when it is not BASELINE (each one measured
#: in the same run as its contender).
AGAINST: Dict[str, str] = {
    "track_drop": DROP_BASELINE,
    "cffi_track_pinned_release": "cffi_malloc_gc_release",
    "ctypes_track_pinned_release": "ctypes_malloc_free",
}
#: Lines run before the loop of a contender (``main``'s locals are bound).
SETUP: Dict[str, str] = {
    "cffi_track_pinned_release": "exitsafe.cffi.pin(ffi, clib, close=False)",
    "ctypes_track_pinned_release": "exitsafe.ctypes.pin(libc, close=False)",
}

PROGRAM = textwrap.dedent(
    """
    import ctypes, sys, weakref, cffi, exitsafe, exitsafe.cffi, exitsafe.ctypes
    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    clib = ffi.dlopen(None)
    ptr = ffi.cast("void *", 0x1234)
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    def release(raw):
        pass
    class Target:
        __slots__ = ("__weakref__",)
    def main(n):
        reg = exitsafe.Registry("bench")
        dep = (reg.track(ptr, release, kind="parent"),)
        target = Target()
        gc, rel, fin = ffi.gc, ffi.release, weakref.finalize
        track, mtrack, ctrack = reg.track, exitsafe.track, exitsafe.cffi.track
        cttrack, address = exitsafe.ctypes.track, 0x1234
        malloc, free, cmalloc, cfree = clib.malloc, clib.free, libc.malloc, libc.free
        SETUP
        for _ in range(n):
            BODY
    main(int(sys.argv[1]))
    """
)


def instructions(body: str, n: int, pure: bool, setup: str = "pass") -> int:
    """Instructions callgrind counts for a whole run of ``body`` ``n`` times (after
    ``setup``)."""
    env = dict(os.environ, EXITSAFE_PURE_PYTHON="1" if pure else "0")
    program = PROGRAM.replace("SETUP", setup).replace("BODY", body)
    proc = subprocess.run(
        [
            "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-c", program, str(n),
        ],
        env=env, capture_output=True, text=True, timeout=600,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return int(found.group(1))


def per_operation(body: str, pure: bool, setup: str = "pass") -> float:
    large = instructions(body, LARGE, pure, setup)
    return (large - instructions(body, SMALL, pure, setup)) / (LARGE - SMALL)


def measure(names: List[str]) -> Dict[str, Dict[str, float]]:
    """name -> {"compiled": n, "python": n} (the baselines under "baseline")."""
    import importlib.util

    compiled = importlib.util.find_spec("exitsafe._speedups") is not None
    results: Dict[str, Dict[str, float]] = {}
    for name in names:
        _, body = CONTENDERS[name]
        print(f"instructions: {name}", file=sys.stderr, flush=True)
        if not name.startswith(("track", "module", "cffi_track", "ctypes_track")):
            results[name] = {"baseline": per_operation(body, pure=True)}
            continue
        setup = SETUP.get(name, "pass")
        row = {"python": per_operation(body, pure=True, setup=setup)}
        if compiled:
            row["compiled"] = per_operation(body, pure=False, setup=setup)
        results[name] = row
    return results


def baseline_of(name: str, results: Dict[str, Dict[str, float]]) -> float:
    """The baseline contender ``name`` is divided by (BASELINE when its own was not run)."""
    own = results.get(AGAINST.get(name, BASELINE), {}).get("baseline")
    return own if own else results[BASELINE]["baseline"]


def table(results: Dict[str, Dict[str, float]]) -> str:
    lines = [
        "| per operation | compiled core | pure Python | baseline |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in results.items():
        label = CONTENDERS[name][0]
        if "baseline" in row:
            lines.append(f"| {label} | | | {row['baseline']:,.0f} |")
            continue
        against = baseline_of(name, results)
        cells = []
        for core in ("compiled", "python"):
            value: Optional[float] = row.get(core)
            cells.append(f"{value:,.0f} ({value / against:.2f}x)" if value else "not built")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | |")
    return "\n".join(lines)


def chart(results: Dict[str, Dict[str, float]], note: str = "", width: int = 820) -> str:
    """Horizontal bars: instructions per operation, one bar per core (and the baselines),
    with the ffi.gc + ffi.release baseline drawn across as a line."""
    from html import escape

    from . import svgplot

    colors = {"baseline": "#888888", "compiled": "#1f77b4", "python": "#9ecae1"}
    # (label, core, value, the value its ratio is against)
    rows: List[Tuple[str, str, float, float]] = []
    for name, row in results.items():
        label = CONTENDERS[name][0]
        against = baseline_of(name, results)
        for core in ("baseline", "compiled", "python"):
            if core in row:
                suffix = "" if core == "baseline" else f" ({core})"
                rows.append((label + suffix, core, row[core], against))
    top, bar, gap, left, right = 56.0, 16.0, 6.0, 350.0, 90.0
    height = int(top + len(rows) * (bar + gap) + 40 + (16 if note else 0))
    hi = max(r[2] for r in rows)
    step = 10 ** (len(str(int(hi / 5))) - 1) * 5
    xmax = step * (int(hi / step) + 1)
    pw = width - left - right

    def fx(value: float) -> float:
        return left + pw * value / xmax

    out = [
        f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14"'
        ' font-weight="bold">Hot path: CPU instructions per operation (callgrind)</text>'
    ]
    legend = (("cffi / weakref.finalize", "baseline"), ("compiled core", "compiled"),
              ("pure-Python core", "python"))
    svgplot.bar_legend(out, [(name, colors[key]) for name, key in legend], left - 200)
    bottom = top + len(rows) * (bar + gap)
    svgplot.bar_grid(out, fx, xmax, step, top, bottom)
    base = results[BASELINE]["baseline"]
    out.append(f'<line x1="{fx(base):.1f}" y1="{top - 4:.1f}" x2="{fx(base):.1f}"'
               f' y2="{bottom:.1f}" stroke="#d62728" stroke-dasharray="4 3"/>')
    for i, (label, key, value, against) in enumerate(rows):
        y = top + i * (bar + gap)
        out.append(f'<text x="{left - 8:.1f}" y="{y + bar - 4:.1f}" text-anchor="end"'
                   f' font-size="11">{escape(label)}</text>')
        out.append(f'<rect x="{left:.1f}" y="{y:.1f}" width="{fx(value) - left:.1f}"'
                   f' height="{bar:.1f}" fill="{colors[key]}"/>')
        out.append(f'<text x="{fx(value) + 6:.1f}" y="{y + bar - 4:.1f}" font-size="11">'
                   f'{value:,.0f} ({value / against:.2f}x)</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{bottom + 32:.1f}" text-anchor="middle"'
               ' font-size="12">instructions per operation (dashed: ffi.gc + ffi.release)</text>')
    return svgplot.bar_document(out, width, height, note)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--only", help="comma-separated contender names")
    parser.add_argument("--plot", help="also draw the bars as an SVG to this file")
    parser.add_argument("--note", default="", help="a line under the chart (machine, date)")
    parser.add_argument(
        "--replot", nargs=2, metavar=("JSON", "SVG"),
        help="only redraw the chart of a saved run (no measurement)",
    )
    args = parser.parse_args(argv)
    if args.replot:
        with open(args.replot[0], encoding="utf-8") as f:
            saved = json.load(f)
        with open(args.replot[1], "w", encoding="utf-8") as f:
            f.write(chart(saved["results"], note=saved.get("note", "")))
        return 0
    if shutil.which("valgrind") is None:
        print("benchmarks.instructions: valgrind is not installed (apt-get install valgrind)")
        return 2
    names = args.only.split(",") if args.only else list(CONTENDERS)
    for required in (BASELINE, DROP_BASELINE, *(AGAINST[n] for n in names if n in AGAINST)):
        if required not in names:
            names.insert(0, required)
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        parser.error(f"unknown contenders: {', '.join(unknown)} (known: {', '.join(CONTENDERS)})")
    results = measure(names)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            saved = {"small": SMALL, "large": LARGE, "note": args.note, "results": results}
            json.dump(saved, f, indent=2)
            f.write("\n")
    if args.plot:
        with open(args.plot, "w", encoding="utf-8") as f:
            f.write(chart(results, note=args.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
