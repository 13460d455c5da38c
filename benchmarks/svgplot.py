"""A tiny dependency-free SVG plotter (the teardown scaling chart, the hot-path bar chart).

``python -m benchmarks.svgplot results.json out.svg`` redraws the teardown chart from a
saved run, ``python -m benchmarks.svgplot --hot-path results.json out.svg`` the hot-path
chart; :func:`teardown_chart` is what ``python -m benchmarks --plot`` calls.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


@dataclass
class Series:
    label: str
    points: List[Tuple[float, float]]
    color: Optional[str] = None
    dashed: bool = False
    markers: bool = True


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: List[Series] = field(default_factory=list)
    logx: bool = True
    logy: bool = True
    xfmt: str = "count"  # tick labels: "count" (1,000), "seconds" (10 ms) or "plain"
    yfmt: str = "plain"
    legend: str = "top-left"  # or "bottom-right"


def _nice_step(span: float) -> float:
    raw = span / 5.0
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return mult * mag
    return 10 * mag


def _fmt_tick(v: float, style: str) -> str:
    if v == 0:
        return "0"
    if style == "seconds":
        for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
            if abs(v) >= scale * 0.999:
                return f"{v / scale:g} {unit}"
        return f"{v:g} s"
    if style == "count" and abs(v) >= 1:
        return f"{v:,.0f}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


def _ticks(lo: float, hi: float, log: bool) -> Tuple[float, float, List[float]]:
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        if a == b:
            b += 1
        return 10.0**a, 10.0**b, [10.0**e for e in range(a, b + 1)]
    lo = min(lo, 0.0)
    step = _nice_step(hi - lo if hi > lo else 1.0)
    top = math.ceil(hi / step) * step
    ticks = []
    v = lo
    while v <= top + step / 2:
        ticks.append(round(v, 12))
        v += step
    return lo, top, ticks


def _panel_svg(panel: Panel, x0: float, y0: float, w: float, h: float) -> List[str]:
    out: List[str] = []
    ml, mr, mt, mb = 70.0, 40.0, 30.0, 45.0
    pw, ph = w - ml - mr, h - mt - mb
    xs = [x for s in panel.series for x, _ in s.points]
    ys = [y for s in panel.series for _, y in s.points]
    xlo, xhi, xt = _ticks(min(xs), max(xs), panel.logx)
    ylo, yhi, yt = _ticks(min(ys), max(ys), panel.logy)

    def fx(x: float) -> float:
        if panel.logx:
            t = (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo))
        else:
            t = (x - xlo) / (xhi - xlo)
        return x0 + ml + t * pw

    def fy(y: float) -> float:
        if panel.logy:
            t = (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
        else:
            t = (y - ylo) / (yhi - ylo)
        return y0 + mt + (1 - t) * ph

    out.append(
        f'<text x="{x0 + ml + pw / 2:.1f}" y="{y0 + 18:.1f}" text-anchor="middle"'
        f' font-size="14" font-weight="bold">{escape(panel.title)}</text>'
    )
    out.append(
        f'<rect x="{x0 + ml:.1f}" y="{y0 + mt:.1f}" width="{pw:.1f}" height="{ph:.1f}"'
        ' fill="none" stroke="#444"/>'
    )
    for t in xt:
        x = fx(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{y0 + mt:.1f}" x2="{x:.1f}" y2="{y0 + mt + ph:.1f}"'
            ' stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{y0 + mt + ph + 16:.1f}" text-anchor="middle"'
            f' font-size="11">{escape(_fmt_tick(t, panel.xfmt))}</text>'
        )
    for t in yt:
        y = fy(t)
        out.append(
            f'<line x1="{x0 + ml:.1f}" y1="{y:.1f}" x2="{x0 + ml + pw:.1f}" y2="{y:.1f}"'
            ' stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{x0 + ml - 6:.1f}" y="{y + 4:.1f}" text-anchor="end"'
            f' font-size="11">{escape(_fmt_tick(t, panel.yfmt))}</text>'
        )
    out.append(
        f'<text x="{x0 + ml + pw / 2:.1f}" y="{y0 + h - 8:.1f}" text-anchor="middle"'
        f' font-size="12">{escape(panel.xlabel)}</text>'
    )
    cy = y0 + mt + ph / 2
    out.append(
        f'<text x="{x0 + 16:.1f}" y="{cy:.1f}" text-anchor="middle" font-size="12"'
        f' transform="rotate(-90 {x0 + 16:.1f} {cy:.1f})">{escape(panel.ylabel)}</text>'
    )
    for i, s in enumerate(panel.series):
        color = s.color or COLORS[i % len(COLORS)]
        pts = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="5,4"' if s.dashed else ""
        out.append(
            f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
        if s.markers:
            for x, y in s.points:
                out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3.5" fill="{color}"/>')
        if panel.legend == "bottom-right":
            ly = y0 + mt + ph - 10 - (len(panel.series) - 1 - i) * 16
            lx = x0 + ml + pw - 190
        else:
            ly = y0 + mt + 14 + i * 16
            lx = x0 + ml + 10
        out.append(
            f'<line x1="{lx:.1f}" y1="{ly - 4:.1f}" x2="{lx + 18:.1f}" y2="{ly - 4:.1f}"'
            f' stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 24:.1f}" y="{ly:.1f}" font-size="11">{escape(s.label)}</text>')
    return out


def render(panels: Sequence[Panel], width: int = 980, height: int = 380, note: str = "") -> str:
    """An SVG document with ``panels`` side by side."""
    w = width / len(panels)
    body: List[str] = []
    for i, panel in enumerate(panels):
        body.extend(_panel_svg(panel, i * w, 0.0, w, height - (16 if note else 0)))
    if note:
        body.append(
            f'<text x="{width / 2:.1f}" y="{height - 4:.1f}" text-anchor="middle"'
            f' font-size="10" fill="#555">{escape(note)}</text>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
        f'<rect width="{width}" height="{height}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


def teardown_chart(teardown: Dict[str, Any], note: str = "") -> str:
    """The teardown scaling chart from the ``teardown`` section of a results JSON."""
    total: List[Series] = []
    per: List[Series] = []
    for key, label in (
        ("wide", "wide graph"),
        ("deep", "deep chain"),
        ("wide_leak", "wide graph, leak policy"),
    ):
        rows = teardown.get(key) or []
        if not rows:
            continue
        total.append(Series(label, [(r["n"], r["teardown_s"]["median"]) for r in rows]))
        per.append(
            Series(label, [(r["n"], r["teardown_per_handle_s"]["median"] * 1e9) for r in rows])
        )
    wide = teardown.get("wide") or []
    if wide:
        n0, t0 = wide[0]["n"], wide[0]["teardown_s"]["median"]
        total.append(
            Series(
                "linear from the smallest size",
                [(r["n"], t0 * r["n"] / n0) for r in wide],
                color="#888",
                dashed=True,
                markers=False,
            )
        )
    return render(
        [
            Panel(
                "Teardown time (log-log)", "live handles", "teardown time", total, yfmt="seconds"
            ),
            Panel(
                "Teardown time per handle",
                "live handles",
                "nanoseconds per handle",
                per,
                logy=False,
                legend="bottom-right",
            ),
        ],
        note=note,
    )


#: hot-path rows drawn, in the order of the table: (key, label, group)
HOT_PATH_BARS = (
    ("cffi_gc_release", "cffi: ffi.gc + ffi.release", "baseline"),
    ("cffi_gc_drop", "cffi: ffi.gc, drop last reference", "baseline"),
    ("finalize_create_call", "weakref.finalize create + call", "baseline"),
    ("finalize_object_dies", "weakref.finalize, object dies", "baseline"),
    ("floor_minimal", "minimal tracker, no lock", "reference"),
    ("floor_locked", "minimal tracker, 2 locks", "reference"),
    ("exitsafe_track_release", "Registry.track + Handle.release", "exitsafe"),
    ("exitsafe_module_track_release", "exitsafe.track + release", "exitsafe"),
    ("exitsafe_with_block", "with Registry.track(...): pass", "exitsafe"),
    ("exitsafe_track_drop", "track, drop last reference", "exitsafe"),
    ("exitsafe_track_dep_release", "track(depends_on=...) + release", "exitsafe"),
    ("exitsafe_track_dep_drop", "track(depends_on=...), drop", "exitsafe"),
)
HOT_PATH_COLORS = {"baseline": "#888888", "reference": "#2ca02c", "exitsafe": "#1f77b4"}


def bar_legend(out: List[str], entries: Sequence[Tuple[str, str]], x0: float) -> None:
    """A legend row of (name, fill colour) swatches 200 px apart, starting at ``x0``."""
    for i, (name, color) in enumerate(entries):
        lx = x0 + i * 200
        out.append(f'<rect x="{lx:.1f}" y="30" width="14" height="12" fill="{color}"/>')
        out.append(f'<text x="{lx + 20:.1f}" y="40" font-size="11">{escape(name)}</text>')


def bar_grid(
    out: List[str], fx: Callable[[float], float], xmax: float, step: float, top: float,
    bottom: float,
) -> None:
    """Vertical grid lines with their labels every ``step`` from 0 to ``xmax``."""
    tick = 0.0
    while tick <= xmax + 1e-9:
        x = fx(tick)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4:.1f}" x2="{x:.1f}" y2="{bottom:.1f}"'
                   ' stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 16:.1f}" text-anchor="middle"'
                   f' font-size="11">{tick:,.0f}</text>')
        tick += step


def bar_document(out: List[str], width: int, height: int, note: str) -> str:
    """The SVG document of a bar chart's elements, with ``note`` under it."""
    if note:
        out.append(f'<text x="{width / 2:.1f}" y="{height - 4:.1f}" text-anchor="middle"'
                   f' font-size="10" fill="#555">{escape(note)}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
        f'<rect width="{width}" height="{height}" fill="white"/>\n' + "\n".join(out)
        + "\n</svg>\n"
    )


def hot_path_chart(hot_path: Dict[str, Any], note: str = "", width: int = 780) -> str:
    """Horizontal bars: nanoseconds per create + release, median with the p25-p75 range,
    from the ``hot_path`` section of a results JSON."""
    per_op = hot_path["per_op_s"]
    rows = [(label, group, per_op[key]) for key, label, group in HOT_PATH_BARS if key in per_op]
    top, bar, gap, left, right = 56.0, 18.0, 8.0, 230.0, 80.0
    height = int(top + len(rows) * (bar + gap) + 40 + (16 if note else 0))
    hi = max(r[2]["p75"] for r in rows) * 1e9
    step = _nice_step(hi * 5 / 7)  # about seven ticks
    xmax = step * math.ceil(hi / step)
    pw = width - left - right

    def fx(ns: float) -> float:
        return left + pw * ns / xmax

    out = [
        f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14"'
        ' font-weight="bold">Hot path: create + release one handle (ns per operation,'
        " median; whiskers p25-p75)</text>"
    ]
    legend = (("cffi / weakref.finalize", "baseline"), ("pure-Python floor", "reference"),
              ("exitsafe", "exitsafe"))
    bar_legend(out, [(name, HOT_PATH_COLORS[group]) for name, group in legend], left)
    bottom = top + len(rows) * (bar + gap)
    bar_grid(out, fx, xmax, step, top, bottom)
    out.append(f'<text x="{left + pw / 2:.1f}" y="{bottom + 32:.1f}" text-anchor="middle"'
               ' font-size="12">nanoseconds per operation</text>')
    for i, (label, group, stats) in enumerate(rows):
        y = top + i * (bar + gap)
        median, p25, p75 = (stats[k] * 1e9 for k in ("median", "p25", "p75"))
        out.append(f'<text x="{left - 8:.1f}" y="{y + bar - 5:.1f}" text-anchor="end"'
                   f' font-size="12">{escape(label)}</text>')
        out.append(f'<rect x="{left:.1f}" y="{y:.1f}" width="{fx(median) - left:.1f}"'
                   f' height="{bar:.1f}" fill="{HOT_PATH_COLORS[group]}"/>')
        cy = y + bar / 2
        out.append(f'<line x1="{fx(p25):.1f}" y1="{cy:.1f}" x2="{fx(p75):.1f}" y2="{cy:.1f}"'
                   ' stroke="#222" stroke-width="1.5"/>')
        out.append(f'<text x="{fx(max(median, p75)) + 6:.1f}" y="{y + bar - 5:.1f}"'
                   f' font-size="11">{median:,.0f} ns</text>')
    return bar_document(out, width, height, note)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    hot = bool(args) and args[0] == "--hot-path"
    if hot:
        args = args[1:]
    if len(args) != 2:
        print("usage: python -m benchmarks.svgplot [--hot-path] RESULTS.json OUT.svg",
              file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        results = json.load(fh)
    note = results["meta"].get("summary", "")
    if hot:
        svg = hot_path_chart(results["sections"]["hot_path"], note=note)
    else:
        svg = teardown_chart(results["sections"]["teardown"], note=note)
    with open(args[1], "w", encoding="utf-8") as fh:
        fh.write(svg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
