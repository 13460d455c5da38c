"""Shared helpers: timing loops, summary statistics, tables and bars."""

from __future__ import annotations

import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

#: A benchmark loop: runs ``n`` operations and returns the elapsed seconds.
Loop = Callable[[int], float]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector for a timed region (as :mod:`timeit` does)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summarize(values: Sequence[float]) -> Dict[str, Any]:
    """Median, quartiles, extremes; spread = IQR / median, range = (max - min) / median."""
    if not values:
        raise ValueError("no values to summarize")
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    if len(values) >= 2:
        q1, _q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = med
    return {
        "median": med,
        "min": lo,
        "max": hi,
        "p25": q1,
        "p75": q3,
        "spread_pct": (q3 - q1) / med * 100.0 if med else 0.0,
        "range_pct": (hi - lo) / med * 100.0 if med else 0.0,
        "n": len(values),
        "values": list(values),
    }


def interleaved(loops: Dict[str, Loop], n: int, rounds: int) -> Dict[str, List[float]]:
    """Run every loop once per round, for ``rounds`` rounds: seconds per operation.

    Rounds are short (``n`` operations per contender) and the starting contender
    rotates, so that the contenders of one round run within milliseconds of each
    other: a ratio taken inside one round compares measurements made under the same
    machine conditions, and the median over many rounds discards the rounds that
    other jobs disturbed.  The cyclic GC is paused during the rounds (collected
    between them); reference counting still frees every object at once.
    """
    names = list(loops)
    warm = max(1, n // 5)
    per_op: Dict[str, List[float]] = {name: [] for name in names}
    with gc_paused():
        for name in names:
            loops[name](warm)
        for rep in range(rounds):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                per_op[name].append(loops[name](n) / n)
            gc.collect()
    return per_op


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> List[float]:
    """Ratios of measurements taken in the same repeat (``num[i] / den[i]``)."""
    return [a / b for a, b in zip(num, den)]


def timed(fn: Callable[[], Any]) -> float:
    """Seconds taken by one call of ``fn``."""
    t0 = perf_counter()
    fn()
    return perf_counter() - t0


def fmt_ns(seconds: float) -> str:
    return f"{seconds * 1e9:,.0f} ns"


def fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e9:.0f} ns"


def fmt_spread(summary: Dict[str, Any]) -> str:
    """The spread column: interquartile range / median over the repeats."""
    return f"{summary['spread_pct']:.0f}%"


@dataclass
class Table:
    """A result table: printed aligned on the terminal, or as Markdown for the docs."""

    title: str
    headers: List[str]
    rows: List[List[str]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    #: Markdown: render the first column as inline code (function and module names).
    code_first_column: bool = False

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def line(cells: Sequence[str]) -> str:
            out = []
            for i, cell in enumerate(cells):
                out.append(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]))
            return "  ".join(out).rstrip()

        parts = [self.title, "-" * len(self.title), line(self.headers)]
        parts.append("  ".join("-" * w for w in widths))
        parts.extend(line(row) for row in self.rows)
        parts.extend(f"  {note}" for note in self.notes)
        return "\n".join(parts)

    def markdown(self) -> str:
        def esc(cell: str) -> str:
            return cell.replace("|", "\\|")

        def first(cell: str) -> str:
            return f"`{cell}`" if self.code_first_column else esc(cell)

        parts = [f"#### {self.title}", ""]
        parts.append("| " + " | ".join(esc(h) for h in self.headers) + " |")
        parts.append("| " + " | ".join(["---"] + ["---:"] * (len(self.headers) - 1)) + " |")
        parts.extend(
            "| " + " | ".join([first(row[0]), *(esc(c) for c in row[1:])]) + " |"
            for row in self.rows
        )
        if self.notes:
            parts.append("")
            parts.extend(f"- {note}" for note in self.notes)
        return "\n".join(parts)


@dataclass
class Bar:
    """One of the product's performance bars, checked against a measured value."""

    name: str
    value: float
    limit: float
    op: str  # "<=" or ">="
    unit: str = ""
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def as_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "op": self.op,
            "unit": self.unit,
            "passed": self.passed,
            "detail": self.detail,
        }


@dataclass
class Section:
    """What one benchmark section produces: JSON data, tables to print, bars checked."""

    name: str
    data: Dict[str, Any]
    tables: List[Table] = field(default_factory=list)
    bars: List[Bar] = field(default_factory=list)
    seconds: float = 0.0


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment for benchmark subprocesses: no EXITSAFE_* settings leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXITSAFE_")}
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    env.pop("PYTHONTRACEMALLOC", None)
    if extra:
        env.update(extra)
    return env


def progress(message: str) -> None:
    """A progress line on stderr (the tables go to stdout)."""
    sys.stderr.write(f"[benchmarks] {message}\n")
    sys.stderr.flush()


@dataclass
class Config:
    """Sizes and repeat counts of one run (``quick`` shrinks everything to seconds)."""

    quick: bool = False
    hot_n: int = 5_000
    hot_repeats: int = 41
    profile_n: int = 100_000
    teardown_wide: List[int] = field(default_factory=lambda: [10**3, 10**4, 10**5, 10**6])
    teardown_deep: List[int] = field(default_factory=lambda: [10**3, 10**4, 10**5])
    wide_parents: int = 10
    memory_n: int = 20_000
    thread_ops: int = 40_000
    thread_counts: List[int] = field(default_factory=lambda: [1, 2, 4])
    thread_repeats: int = 7
    import_repeats: int = 30
    importtime_runs: int = 5
    exit_n: int = 1_000_000  # the exit bar is set at 10^6 handles
    exit_repeats: int = 3

    @classmethod
    def make(cls, quick: bool) -> Config:
        if not quick:
            return cls()
        return cls(
            quick=True,
            hot_n=500,
            hot_repeats=5,
            profile_n=2_000,
            teardown_wide=[10**2, 10**3, 10**4],
            teardown_deep=[10**2, 10**3, 10**4],
            memory_n=1_000,
            thread_ops=2_000,
            thread_counts=[1, 2],
            thread_repeats=2,
            import_repeats=3,
            importtime_runs=1,
            exit_n=1_000,
            exit_repeats=2,
        )

    def teardown_repeats(self, size: int) -> int:
        """Fewer repeats for bigger graphs: building 10^6 handles dominates the run."""
        if self.quick:
            return 2
        if size <= 10**3:
            return 9
        if size <= 10**4:
            return 7
        if size <= 10**5:
            return 5
        return 2


def profile_call(fn: Callable[[], Any], ops: int, top: int = 14) -> Dict[str, Any]:
    """cProfile one call of ``fn`` (which performs ``ops`` operations): top entries by own time."""
    profiler = cProfile.Profile()
    with gc_paused():
        profiler.runcall(fn)
    stats = pstats.Stats(profiler, stream=io.StringIO())
    raw: Any = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1.0
    entries = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        if filename == "~":
            where = func
        else:
            where = f"{filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}({func})"
        entries.append(
            {
                "function": where,
                "ncalls": ncalls,
                "tottime_s": tottime,
                "cumtime_s": cumtime,
                "tottime_pct": tottime / total * 100.0,
                "tottime_per_op_ns": tottime / ops * 1e9,
            }
        )
    entries.sort(key=lambda e: e["tottime_s"], reverse=True)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return {"ops": ops, "total_s": total, "top": entries[:top], "text": text.getvalue()}


def profile_table(title: str, prof: Dict[str, Any], rows: int = 10) -> Table:
    """A table of the top entries of :func:`profile_call`."""
    table = Table(
        title,
        ["function", "calls/op", "own time %", "own ns/op (profiled)"],
        code_first_column=True,
    )
    ops = prof["ops"]
    for entry in prof["top"][:rows]:
        table.add(
            entry["function"],
            f"{entry['ncalls'] / ops:.2g}",
            f"{entry['tottime_pct']:.1f}",
            f"{entry['tottime_per_op_ns']:,.0f}",
        )
    return table


#: The live objects both exit measurements end with (``benchmarks.startup``, in wall time;
#: ``benchmarks.scaling``, in CPU time and instructions): ``keep``, ``n`` of the kind
#: ``mode`` names (``"plain"``, ``"cffi_gc"`` or ``"exitsafe"``), both set before this code.
EXIT_HANDLES = """
import cffi

import exitsafe

ffi = cffi.FFI()
ptr = ffi.cast("void *", 0x1234)


def release(raw):
    pass


class Plain:
    __slots__ = ("__weakref__", "raw")

    def __init__(self, raw):
        self.raw = raw


if mode == "plain":
    keep = [Plain(ptr) for _ in range(n)]
elif mode == "cffi_gc":
    keep = [ffi.gc(ptr, release) for _ in range(n)]
else:
    keep = [exitsafe.track(ptr, release) for _ in range(n)]
"""
