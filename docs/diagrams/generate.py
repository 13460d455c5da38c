"""Draw the documentation's diagrams as static SVG files (standard library only, no network).

    python docs/diagrams/generate.py            # rewrite docs/img/<name>.svg
    python docs/diagrams/generate.py --check    # exit 1 if a committed file differs

Every picture is laid out here by hand, in coordinates, so the output is byte-for-byte the same
on every machine and every Python from 3.9: the tests regenerate the files and compare them
with the committed ones (tests/test_docs_site.py).  The pictures have an opaque light
background, so they read the same in the site's light and dark colour schemes, use only the
reader's system fonts, and carry a <title> and <desc> for screen readers.

Text may use two inline marks: **bold** and `code` (drawn in a monospace font).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

IMG = Path(__file__).resolve().parent.parent / "img"

SANS = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
MONO = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'Liberation Mono', monospace"

INK = "#1f2328"  # text
MUTED = "#57606a"  # secondary text
LINE = "#8c959f"  # neutral strokes
PAPER = "#ffffff"
NEUTRAL = ("#f3f5f8", "#8c959f")  # (fill, stroke)
GREEN = ("#dcf3e3", "#1a7f37")
AMBER = ("#fff1d6", "#9a6700")
RED = ("#ffe1de", "#cf222e")
BLUE = ("#e3edfd", "#3451b2")
PURPLE = ("#efe7fc", "#6e40c9")


def _num(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


class Svg:
    """A small SVG writer: shapes and text in user units, written out deterministically."""

    def __init__(self, width: int, height: int, title: str, desc: str) -> None:
        self.width, self.height = width, height
        self.title, self.desc = title, desc
        self.items: List[str] = []

    # -- shapes --------------------------------------------------------------------------
    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        colors: Tuple[str, str] = NEUTRAL,
        *,
        rx: float = 6,
        width: float = 1.2,
        dash: Optional[str] = None,
    ) -> None:
        fill, stroke = colors
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(
            f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" '
            f'rx="{_num(rx)}" fill="{fill}" stroke="{stroke}" stroke-width="{_num(width)}"{extra}/>'
        )

    def line(
        self,
        x1: float,
        y1: float,
        x2: float,
        y2: float,
        *,
        color: str = LINE,
        width: float = 1.5,
        dash: Optional[str] = None,
        arrow: bool = False,
    ) -> None:
        self.path(
            f"M{_num(x1)} {_num(y1)} L{_num(x2)} {_num(y2)}",
            color=color,
            width=width,
            dash=dash,
            arrow=arrow,
        )

    def path(
        self,
        d: str,
        *,
        color: str = LINE,
        width: float = 1.5,
        dash: Optional[str] = None,
        arrow: bool = False,
        fill: str = "none",
    ) -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        if arrow:
            extra += f' marker-end="url(#{self._marker(color)})"'
        self.items.append(
            f'<path d="{d}" fill="{fill}" stroke="{color}" stroke-width="{_num(width)}"'
            f' stroke-linecap="round" stroke-linejoin="round"{extra}/>'
        )

    def circle(self, cx: float, cy: float, r: float, colors: Tuple[str, str]) -> None:
        fill, stroke = colors
        self.items.append(
            f'<circle cx="{_num(cx)}" cy="{_num(cy)}" r="{_num(r)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.2"/>'
        )

    def _marker(self, color: str) -> str:
        return "arrow-" + color.lstrip("#")

    # -- text ----------------------------------------------------------------------------
    def text(
        self,
        x: float,
        y: float,
        content: str,
        *,
        size: float = 13,
        anchor: str = "start",
        color: str = INK,
        bold: bool = False,
        italic: bool = False,
    ) -> None:
        attrs = f'x="{_num(x)}" y="{_num(y)}" font-size="{_num(size)}" fill="{color}"'
        if anchor != "start":
            attrs += f' text-anchor="{anchor}"'
        if bold:
            attrs += ' font-weight="bold"'
        if italic:
            attrs += ' font-style="italic"'
        self.items.append(f"<text {attrs}>{_markup(content)}</text>")

    def lines(
        self,
        x: float,
        y: float,
        content: Sequence[str],
        *,
        size: float = 13,
        leading: float = 17,
        **kwargs: object,
    ) -> None:
        for i, line in enumerate(content):
            self.text(x, y + i * leading, line, size=size, **kwargs)  # type: ignore[arg-type]

    # -- output --------------------------------------------------------------------------
    def render(self) -> str:
        body = "".join(self.items)
        colors = sorted({m.group(1) for m in re.finditer(r"url\(#arrow-([0-9a-f]+)\)", body)})
        defs = "".join(
            f'<marker id="arrow-{c}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0 0 L10 5 L0 10 z" '
            f'fill="#{c}"/></marker>'
            for c in colors
        )
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}" role="img" aria-labelledby="title desc" '
            f'font-family="{SANS}">\n'
            f'<title id="title">{escape(self.title)}</title>\n'
            f'<desc id="desc">{escape(self.desc)}</desc>\n'
        )
        if defs:
            head += f"<defs>{defs}</defs>\n"
        background = (
            f'<rect x="0.5" y="0.5" width="{self.width - 1}" height="{self.height - 1}" rx="8" '
            f'fill="{PAPER}" stroke="#d0d7de"/>\n'
        )
        return head + background + "\n".join(self.items) + "\n</svg>\n"


_NARROW = set("ijlt.,:;'!|()[] ")
_SEMI = set("frI1-")
_WIDE = set("mwMW@%")


def text_width(content: str, size: float) -> float:
    """An estimate of the width of sans-serif text, sized for wide fonts (DejaVu Sans, the usual
    system-ui font on Linux); narrower fonts leave a little more room."""
    total = 0.0
    for ch in content:
        if ch in _NARROW:
            total += 0.34
        elif ch in _SEMI:
            total += 0.45
        elif ch in _WIDE:
            total += 0.95
        elif ch.isupper() or ch.isdigit():
            total += 0.7
        else:
            total += 0.62
    return total * size


_MARK = re.compile(r"(\*\*.+?\*\*|`.+?`)")


def _markup(content: str) -> str:
    """Text with **bold** and `code` spans as <tspan> elements."""
    out = []
    for part in _MARK.split(content):
        if not part:
            continue
        if part.startswith("**") and part.endswith("**") and len(part) > 4:
            out.append(f'<tspan font-weight="bold">{escape(part[2:-2])}</tspan>')
        elif part.startswith("`") and part.endswith("`") and len(part) > 2:
            out.append(f'<tspan font-family="{MONO}">{escape(part[1:-1])}</tspan>')
        else:
            out.append(escape(part))
    return "".join(out)


# --------------------------------------------------------------------------------------------
# why.md: CPython's shutdown sequence, one timeline per version
# --------------------------------------------------------------------------------------------


def shutdown_timeline() -> Svg:
    versions = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
    # (step as numbered on the "why" page, header lines, column width)
    phases = [
        ("0", ["main", "module", "ends"], 66),
        ("1", ["non-daemon", "threads and", "executor", "workers joined"], 112),
        ("2", ["`atexit`", "callbacks"], 124),
        ("3", ["runtime", "marked", "finalizing"], 118),
        ("4", ["garbage", "collection"], 92),
        ("5", ["module", "finalization"], 104),
        ("6-7", ["C `exit()`,", "static", "destructors"], 106),
    ]
    left, top, head_h = 62, 50, 92
    width = left + sum(p[2] for p in phases) + 16
    lane_h, lanes_top = 50, top + head_h + 26
    height = lanes_top + lane_h * len(versions) + 104
    svg = Svg(
        width,
        height,
        "CPython's shutdown sequence, per version (3.9 to 3.15)",
        "One timeline per CPython version from 3.9 to 3.15. Each goes through the same steps: the "
        "main module ends; threading._shutdown() runs the threading._register_atexit callbacks "
        "(concurrent.futures workers) and joins non-daemon threads; atexit callbacks run, "
        "exitsafe's teardown among them; the runtime is marked finalizing; gc.collect(); module "
        "finalization; the interpreter is freed and the C runtime exits. Daemon threads keep "
        "running until step 3; a daemon or native thread that takes the GIL after that is ended "
        "with pthread_exit on 3.9 to 3.12 and 3.13.0 to 3.13.7, and parked forever (a hang) on "
        "3.13.8 and later, 3.14 and 3.15. On 3.12 starting a thread or forking in an atexit "
        "callback raises RuntimeError. From 3.13 the world is stopped before other threads are "
        "removed.",
    )
    svg.text(16, 30, "CPython's shutdown sequence, one timeline per version", size=17, bold=True)

    xs = []
    x = left
    for _, _, w in phases:
        xs.append(x)
        x += w
    ax, aw = xs[2], phases[2][2]
    # the column where exitsafe runs, behind everything
    svg.rect(ax + 2, top, aw - 4, lanes_top - top + lane_h * len(versions) + 2,
             ("#ecf8f0", GREEN[1]), rx=8, width=1.5)
    for (step, title, w), x in zip(phases, xs):
        if step != "2":
            svg.rect(x + 2, top, w - 4, head_h, NEUTRAL, rx=6, width=1)
        svg.text(x + w / 2, top + 18, step, size=13, anchor="middle", color=MUTED, bold=True)
        svg.lines(x + w / 2, top + 36, title, size=12.5, leading=15, anchor="middle")
    svg.lines(ax + aw / 2, lanes_top - 22, ["**exitsafe's**", "**teardown**"], size=12.5,
              leading=14, anchor="middle", color=GREEN[1])

    end = xs[-1] + phases[-1][2] - 2
    step3 = xs[3] + 2
    for i, version in enumerate(versions):
        y = lanes_top + i * lane_h
        svg.text(16, y + 21, version, size=15, bold=True)
        for (step, _, w), x in zip(phases, xs):
            svg.rect(x + 2, y + 8, w - 4, 18, GREEN if step == "2" else NEUTRAL, rx=4, width=1)
        dy = y + 39
        svg.line(xs[0] + 4, dy, step3, dy, color=GREEN[1], width=3)
        if version in ("3.9", "3.10", "3.11", "3.12"):
            _cross(svg, step3 + 7, dy)
            svg.text(step3 + 20, dy + 4.5, "ended by `pthread_exit` when it next takes the GIL",
                     size=12.5, color=RED[1])
        elif version == "3.13":
            _cross(svg, step3 + 7, dy)
            svg.text(step3 + 20, dy + 4.5, "`pthread_exit` up to 3.13.7; parked from 3.13.8",
                     size=12.5, color=RED[1])
        else:
            message = "parked forever: a hang, not a crash"
            _pause(svg, step3 + 7, dy)
            svg.text(step3 + 20, dy + 4.5, message, size=12.5, color=AMBER[1])
            svg.line(step3 + 28 + text_width(message, 12.5), dy, end, dy, color=AMBER[1], width=2.5,
                     dash="2 5")
        if version == "3.12":
            svg.rect(ax + 6, y + 5, aw - 12, 24, AMBER, rx=4, width=1)
            svg.text(ax + aw / 2, y + 21.5, "no new thread", size=12, anchor="middle",
                     color=AMBER[1])
        if version in ("3.13", "3.14", "3.15"):
            svg.text(xs[3] + phases[3][2] / 2, y + 21.5, "world stopped", size=12,
                     anchor="middle", color=BLUE[1])

    ly = lanes_top + lane_h * len(versions) + 26
    svg.rect(16, ly - 11, 26, 15, NEUTRAL, rx=3, width=1)
    svg.text(50, ly + 1, "main thread", size=12.5)
    svg.line(150, ly - 3.5, 180, ly - 3.5, color=GREEN[1], width=3)
    svg.text(188, ly + 1, "daemon threads still running", size=12.5)
    _cross(svg, 390, ly - 3.5)
    svg.text(403, ly + 1, "thread ended", size=12.5)
    _pause(svg, 506, ly - 3.5)
    svg.text(519, ly + 1, "thread parked (hang)", size=12.5)
    svg.lines(
        16,
        ly + 26,
        [
            "Steps numbered as on this page. 3.12: an `atexit` callback cannot start a thread or "
            "fork.",
            "Observed on 3.9.18 to 3.13.0; late threads on 3.13.8+, 3.14 and 3.15 from CPython's "
            "sources (gh-87135).",
            "A native thread calling back into Python after step 3 is treated like a daemon "
            "thread.",
        ],
        size=12,
        leading=17,
        color=MUTED,
    )
    return svg


def _cross(svg: Svg, x: float, y: float) -> None:
    svg.line(x - 5, y - 5, x + 5, y + 5, color=RED[1], width=2.5)
    svg.line(x - 5, y + 5, x + 5, y - 5, color=RED[1], width=2.5)


def _pause(svg: Svg, x: float, y: float) -> None:
    svg.rect(x - 5, y - 6, 4, 12, (AMBER[1], AMBER[1]), rx=1, width=0.5)
    svg.rect(x + 1, y - 6, 4, 12, (AMBER[1], AMBER[1]), rx=1, width=0.5)


# --------------------------------------------------------------------------------------------
# concepts.md: a graph and its teardown order
# --------------------------------------------------------------------------------------------


def teardown_graph() -> Svg:
    width, height = 800, 330
    svg = Svg(
        width,
        height,
        "A graph of handles and its teardown order",
        "A teardown hook 'flush queue' must run before the buffer. The buffer depends on the "
        "device; the device depends on the instance and on the pinned library libcompiler; the "
        "instance depends on the pinned library libruntime. The teardown runs the hook first (1), "
        "then releases the buffer (2), the device (3), the instance (4), and the two libraries "
        "last (5), in either order.",
    )
    svg.text(16, 30, "A graph of handles, and its teardown order", size=17, bold=True)
    w, h, gap = 124, 56, 36
    cols = [30 + i * (w + gap) for i in range(5)]
    row1, row2 = 70, 176
    nodes: Dict[str, Tuple[float, float]] = {}

    def node(key: str, x: float, y: float, order: str, title: str, sub: str,
             colors: Tuple[str, str], shape: str = "box") -> None:
        nodes[key] = (x, y)
        if shape == "hook":
            svg.rect(x, y, w, h, colors, rx=h / 2, width=1.5, dash="5 3")
        elif shape == "library":
            svg.rect(x, y, w, h, colors, rx=10, width=1.5)
            svg.rect(x + 4, y + 4, w - 8, h - 8, ("none", colors[1]), rx=7, width=0.8)
        else:
            svg.rect(x, y, w, h, colors, rx=8, width=1.5)
        svg.text(x + w / 2, y + 25, title, size=14.5, bold=True, anchor="middle")
        svg.text(x + w / 2, y + 43, sub, size=12, anchor="middle", color=MUTED)
        svg.circle(x + 4, y + 2, 12, (colors[1], PAPER))
        svg.text(x + 4, y + 6.5, order, size=13, bold=True, anchor="middle", color=PAPER)

    node("hook", cols[0], row1, "1", "flush queue", "a hook", PURPLE, "hook")
    node("buffer", cols[1], row1, "2", "buffer", "a handle", BLUE)
    node("device", cols[2], row1, "3", "device", "a handle", BLUE)
    node("instance", cols[3], row1, "4", "instance", "a handle", BLUE)
    node("libruntime", cols[4], row1, "5", "libruntime", "a pin", GREEN, "library")
    node("libcompiler", cols[4], row2, "5", "libcompiler", "a pin", GREEN, "library")

    def edge(a: str, b: str, dash: Optional[str] = None, color: str = INK) -> None:
        (xa, ya), (xb, _) = nodes[a], nodes[b]
        y = ya + h / 2
        svg.line(xa + w + 3, y, xb - 4, y, color=color, width=1.8, dash=dash, arrow=True)

    edge("hook", "buffer", dash="5 3", color=PURPLE[1])
    edge("buffer", "device")
    edge("device", "instance")
    edge("instance", "libruntime")
    dx, dy = nodes["device"]
    cx, cy = nodes["libcompiler"]
    cy += h / 2
    mid = dx + w / 2
    svg.path(
        f"M{_num(mid)} {_num(dy + h + 3)} L{_num(mid)} {_num(cy - 12)} "
        f"Q{_num(mid)} {_num(cy)} {_num(mid + 12)} {_num(cy)} L{_num(cx - 4)} {_num(cy)}",
        color=INK,
        width=1.8,
        arrow=True,
    )
    svg.text(mid + 14, cy - 8, "its release calls into libcompiler", size=12, color=MUTED)
    svg.line(30, row2 + 4, 62, row2 + 4, color=INK, width=1.8, arrow=True)
    svg.text(70, row2 + 8.5, "depends on: must outlive", size=12.5)
    svg.line(30, row2 + 30, 62, row2 + 30, color=PURPLE[1], width=1.8, dash="5 3", arrow=True)
    svg.text(70, row2 + 34.5, "a hook runs before", size=12.5)

    y = 272
    svg.text(30, y, "**Teardown order**", size=14)
    steps = [("1", "hook", PURPLE), ("2", "buffer", BLUE), ("3", "device", BLUE),
             ("4", "instance", BLUE), ("5", "both libraries", GREEN)]
    x = 160.0
    for i, (n, label, colors) in enumerate(steps):
        svg.circle(x + 10, y - 5, 10, (colors[1], colors[1]))
        svg.text(x + 10, y - 0.5, n, size=12, bold=True, anchor="middle", color=PAPER)
        svg.text(x + 26, y, label, size=13.5)
        x += 26 + text_width(label, 13.5)
        if i < len(steps) - 1:
            svg.line(x + 8, y - 5, x + 22, y - 5, color=LINE, width=1.5, arrow=True)
            x += 32
    svg.text(30, y + 30, "Children before their parents, a hook before what it runs before, "
             "libraries after every handle.", size=12.5, color=MUTED)
    return svg


# --------------------------------------------------------------------------------------------
# policies.md: the window a guarded callback covers
# --------------------------------------------------------------------------------------------


def callback_window() -> Svg:
    width, height = 800, 420
    svg = Svg(
        width,
        height,
        "A native thread calling back into Python at exit: the hook, the guard, and the window",
        "Time runs left to right. The program runs; exitsafe's teardown begins; the teardown hook "
        "unregisters the logger, which stops the native thread; the runtime is released; the "
        "teardown ends and the registry is closed; then the interpreter finalizes. With a guard "
        "and a hook, the native thread's calls reach the Python function until the teardown "
        "begins, return the default between the start of the teardown and the hook, and stop at "
        "the hook. Without the hook, the thread keeps calling into the finalizing interpreter and "
        "is ended or parked, a crash or a hang. Without the guard, the Python function runs "
        "between the start of the teardown and the hook, while objects it may use are released.",
    )
    svg.text(16, 30, "A native thread calling back into Python at exit", size=17, bold=True)
    x0, x_end = 16, width - 16
    t_begin, t_hook, t_runtime, t_closed, t_final = 300, 452, 540, 620, 696
    top, bottom = 50, 318
    for x, label in [
        (t_begin, ["teardown", "begins"]),
        (t_hook, ["hook: unregister", "the logger"]),
        (t_runtime, ["runtime", "released"]),
        (t_closed, ["registry", "closed"]),
        (t_final, ["interpreter", "finalizes"]),
    ]:
        svg.line(x, top + 34, x, bottom, color="#afb8c1", width=1, dash="3 3")
        svg.lines(x, top + 8, label, size=12, leading=15, anchor="middle", color=MUTED)
    svg.rect(t_begin, top + 36, t_hook - t_begin, bottom - top - 36, ("#fff8e6", "#f0d48a"),
             rx=0, width=0.8)

    def lane(y: float, title: str) -> None:
        svg.text(x0, y - 16, title, size=12.5)
        svg.line(x0, y, x_end, y, color="#d0d7de", width=1)

    def ticks(y: float, x1: float, x2: float, colors: Tuple[str, str]) -> None:
        x = x1 + 8
        while x < x2 - 4:
            svg.line(x, y - 8, x, y + 8, color=colors[1], width=2.5)
            x += 20

    def stop(x: float, y: float) -> None:
        svg.line(x, y - 10, x, y + 10, color=INK, width=3)

    y = 124
    lane(y, "**main thread**")
    svg.rect(x0, y - 11, t_begin - x0 - 3, 22, NEUTRAL, rx=4, width=1)
    svg.text((x0 + t_begin) / 2, y + 4.5, "the program runs", size=12.5, anchor="middle")
    svg.rect(t_begin + 2, y - 11, t_closed - t_begin - 4, 22, GREEN, rx=4, width=1)
    svg.text((t_begin + t_closed) / 2, y + 4.5, "exitsafe's teardown", size=12.5,
             anchor="middle")
    svg.rect(t_final + 2, y - 11, x_end - t_final - 2, 22, NEUTRAL, rx=4, width=1)
    svg.text((t_final + x_end) / 2, y + 4.5, "finalization", size=12.5, anchor="middle")

    y = 184
    lane(y, "**native thread**, with `guard` and a hook (recommended)")
    ticks(y, x0, t_begin, GREEN)
    ticks(y, t_begin, t_hook, AMBER)
    stop(t_hook + 2, y)
    svg.text(t_hook + 10, y + 4.5, "stopped: never calls again", size=12.5)

    y = 244
    lane(y, "**without the hook** (`guard` only): it calls on into the finalizing interpreter")
    ticks(y, x0, t_begin, GREEN)
    ticks(y, t_begin, t_final, AMBER)
    _cross(svg, t_final + 12, y)
    svg.text(x_end, y + 26, "ended or parked as it enters Python", size=12.5, anchor="end",
             color=RED[1])

    y = 304
    lane(y, "**without the guard** (hook only): your function runs during the teardown")
    ticks(y, x0, t_begin, GREEN)
    ticks(y, t_begin, t_hook, RED)
    stop(t_hook + 2, y)
    svg.text(t_hook + 10, y + 4.5, "stopped", size=12.5)

    svg.text((t_begin + t_hook) / 2, bottom + 18, "the window the guard covers", size=12.5,
             anchor="middle", color=AMBER[1], bold=True)
    ly = 372
    items = [(GREEN, "your function runs"),
             (AMBER, "the guard returns its default; your function does not run"),
             (RED, "your function runs while the teardown releases what it may use")]
    places = [(16, ly), (200, ly), (16, ly + 22)]
    for (colors, label), (x, yy) in zip(items, places):
        svg.line(x + 4, yy - 12, x + 4, yy + 2, color=colors[1], width=2.5)
        svg.text(x + 14, yy, label, size=12.5)
    return svg


# --------------------------------------------------------------------------------------------
# threads.md: the phases of an exit, with threads
# --------------------------------------------------------------------------------------------


def exit_threads() -> Svg:
    width, height = 800, 640
    svg = Svg(
        width,
        height,
        "The phases of an exit, with threads",
        "Time runs left to right. The main module ends. In threading._shutdown(), exitsafe's "
        "early phase stops servers, executors and pools; then the interpreter joins non-daemon "
        "threads and concurrent.futures joins its workers. Then, from atexit, exitsafe's teardown "
        "quiesces: registered workers are stopped and joined, in-flight borrows are waited for "
        "(bounded), and a borrow started later on another thread parks that thread. Then handles "
        "and hooks are released in dependency order. Then the registry is closed: every later "
        "request is a recorded no-op, through module finalization. Guarded callbacks return "
        "their default from the start of the teardown.",
    )
    svg.text(16, 30, "The phases of an exit, with threads", size=17, bold=True)
    x_start, x_early, x_join, x_quiesce, x_release, x_closed, x_final, x_end = (
        16, 92, 202, 282, 428, 566, 648, width - 16)
    phases = [
        (x_start, x_early, "", ["program", "runs"], NEUTRAL),
        (x_early, x_join, "1", ["early phase"], BLUE),
        (x_join, x_quiesce, "", ["threads", "joined"], NEUTRAL),
        (x_quiesce, x_release, "2", ["quiesce"], AMBER),
        (x_release, x_closed, "3", ["ordered", "release"], GREEN),
        (x_closed, x_final, "4", ["closed"], PURPLE),
        (x_final, x_end, "", ["module", "finalization"], NEUTRAL),
    ]
    svg.path(f"M{x_early + 2} 70 L{x_early + 2} 64 L{x_quiesce - 2} 64 L{x_quiesce - 2} 70",
             color=MUTED, width=1)
    svg.text((x_early + x_quiesce) / 2, 57, "`threading._shutdown()`", size=12, anchor="middle",
             color=MUTED)
    svg.path(f"M{x_quiesce + 2} 70 L{x_quiesce + 2} 64 L{x_final - 2} 64 L{x_final - 2} 70",
             color=GREEN[1], width=1)
    svg.text((x_quiesce + x_final) / 2, 57, "`atexit`: **exitsafe's teardown**", size=12.5,
             anchor="middle", color=GREEN[1])
    for x1, x2, number, title, colors in phases:
        svg.rect(x1 + 2, 74, x2 - x1 - 4, 42, colors, rx=5, width=1)
        label = [f"**{number}** {title[0]}" if number else title[0], *title[1:]]
        first_y = 100 if len(label) == 1 else 92
        svg.lines((x1 + x2) / 2, first_y, label, size=12.5, leading=15, anchor="middle")
    lanes_top, lane_h, n_lanes = 130, 74, 5
    for x in (x_early, x_join, x_quiesce, x_release, x_closed, x_final):
        svg.line(x, 120, x, lanes_top + n_lanes * lane_h - 6, color="#d0d7de", width=1,
                 dash="3 3")

    def lane(i: int, title: str) -> float:
        y = lanes_top + i * lane_h + 36
        svg.text(16, y - 16, title, size=12.5)
        return y

    def bar(x1: float, x2: float, y: float, colors: Tuple[str, str], label: str = "") -> None:
        svg.rect(x1, y - 10, x2 - x1, 20, colors, rx=4, width=1)
        if label:
            svg.text((x1 + x2) / 2, y + 4.5, label, size=12, anchor="middle")

    def stop(x: float, y: float) -> None:
        svg.line(x, y - 12, x, y + 12, color=INK, width=3)

    def after(x: float, y: float, text: str, color: str = INK) -> None:
        svg.text(x, y + 4.5, text, size=12, color=color)

    y = lane(0, "**main thread**")
    bar(x_start + 2, x_early - 2, y, NEUTRAL, "your code")
    bar(x_early + 2, x_join - 2, y, BLUE, "early hooks")
    bar(x_join + 2, x_quiesce - 2, y, NEUTRAL, "joins")
    bar(x_quiesce + 2, x_release - 2, y, AMBER, "stop, wait, park")
    bar(x_release + 2, x_closed - 2, y, GREEN, "hooks, handles")
    bar(x_closed + 2, x_final - 2, y, PURPLE, "no-ops")
    bar(x_final + 2, x_end, y, NEUTRAL, "GC, modules")

    y = lane(1, "**executor or server thread** (non-daemon)")
    bar(x_start + 2, x_early + 40, y, NEUTRAL, "serving")
    stop(x_early + 40, y)
    after(x_early + 50, y, "stopped by an early hook, then joined")

    y = lane(2, "**registered worker** (declared with its handles and how to stop it)")
    bar(x_start + 2, x_quiesce + 40, y, NEUTRAL, "inference calls")
    stop(x_quiesce + 40, y)
    after(x_quiesce + 50, y, "stopped and joined before any release")

    y = lane(3, "**daemon thread** using `Handle.borrow()`")
    bar(x_start + 2, x_quiesce - 50, y, NEUTRAL, "work")
    bar(x_quiesce - 50, x_quiesce + 40, y, BLUE, "borrow")
    bar(x_quiesce + 40, x_quiesce + 70, y, NEUTRAL)
    _pause(svg, x_quiesce + 80, y)
    svg.line(x_quiesce + 90, y, x_end, y, color=AMBER[1], width=2.5, dash="2 5")
    svg.text(x_quiesce - 50, y + 28, "the teardown waits for the borrow (bounded); the "
             "thread's next borrow parks it: no native call", size=12, color=AMBER[1])

    y = lane(4, "**native thread** calling a `guard`ed callback")
    x = x_start + 8
    while x < x_quiesce - 4:
        svg.line(x, y - 8, x, y + 8, color=GREEN[1], width=2.5)
        x += 20
    while x < x_release + 30:
        svg.line(x, y - 8, x, y + 8, color=AMBER[1], width=2.5)
        x += 20
    stop(x_release + 36, y)
    after(x_release + 46, y, "unregistered by a hook")
    svg.text(x_quiesce + 4, y + 28, "returns its default once the teardown has begun",
             size=12, color=AMBER[1])

    ly = lanes_top + n_lanes * lane_h + 40
    svg.lines(
        16,
        ly,
        [
            "**1 early phase**: before the interpreter joins non-daemon threads; servers,",
            "executors and pools are stopped here.",
            "**2 quiesce**: registered workers stopped and joined, borrows in flight waited for",
            "(bounded); from then on a borrow on another thread parks that thread.",
            "**3 ordered release**: hooks and handles in dependency order, libraries last.",
            "**4 closed**: every later request, from any thread or finalizer, is a recorded "
            "no-op.",
        ],
        size=12.5,
        leading=18,
    )
    return svg


# --------------------------------------------------------------------------------------------
# the logo
# --------------------------------------------------------------------------------------------


def logo() -> str:
    """The site's logo and favicon: a door frame with an arrow leaving through it, and a check."""
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 64 64" '
        'role="img" aria-label="exitsafe">\n'
        "<title>exitsafe</title>\n"
        '<rect x="2" y="2" width="60" height="60" rx="14" fill="#1a7f37"/>\n'
        '<path d="M26 14 H44 a4 4 0 0 1 4 4 V46 a4 4 0 0 1 -4 4 H26" fill="none" '
        'stroke="#ffffff" stroke-width="5" stroke-linecap="round" stroke-linejoin="round"/>\n'
        '<path d="M12 32 H36 M28 24 L36 32 L28 40" fill="none" stroke="#ffffff" '
        'stroke-width="5" stroke-linecap="round" stroke-linejoin="round"/>\n'
        "</svg>\n"
    )


DIAGRAMS: Dict[str, Callable[[], str]] = {
    "shutdown-timeline.svg": lambda: shutdown_timeline().render(),
    "teardown-graph.svg": lambda: teardown_graph().render(),
    "callback-window.svg": lambda: callback_window().render(),
    "exit-threads.svg": lambda: exit_threads().render(),
    "logo.svg": logo,
}


def render_all() -> Dict[str, str]:
    """Every generated file's name and content."""
    return {name: make() for name, make in DIAGRAMS.items()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed files instead of writing them")
    parser.add_argument("--out", type=Path, default=IMG, help="directory (default: docs/img)")
    args = parser.parse_args(argv)
    stale = []
    for name, content in render_all().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != content:
                stale.append(name)
        else:
            path.write_text(content, encoding="utf-8", newline="\n")
            print(f"wrote {path}")
    if stale:
        print("out of date (run python docs/diagrams/generate.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
