"""Process-level costs, measured in subprocesses: ``import exitsafe`` and process exit.

Import time: wall time of ``python -c "import exitsafe"`` against ``python -c pass``
(and ``import cffi`` for scale), interleaved, many repeats, medians.  Bytecode is
cached in a private ``PYTHONPYCACHEPREFIX`` warmed up first, as for an installed
package (a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise recompile
every changed module on every import).  ``-X importtime`` gives the breakdown.

Exit cost: a child process creates ``n`` objects and prints a timestamp
(``time.monotonic``, a system-wide clock) as its last statement; the parent notes
the time when the child has exited.  Tracking ``n`` handles with exitsafe is
compared with creating ``n`` plain objects (and ``n`` ``ffi.gc`` cdata objects); both
children import the same modules, so only what happens at exit differs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ._util import (
    EXIT_HANDLES,
    Bar,
    Config,
    Section,
    Table,
    clean_env,
    fmt_spread,
    paired_ratios,
    progress,
    summarize,
)

#: "import exitsafe adds only a few milliseconds": checked as at most 5 ms.
BAR_IMPORT_MS = 5.0
#: Process exit: at most this many microseconds per live handle over plain objects.
BAR_EXIT_US_PER_HANDLE = 1.0

IMPORT_COMMANDS = {
    "python -c pass": "pass",
    "python -c 'import exitsafe'": "import exitsafe",
    "python -c 'import cffi'": "import cffi",
}

EXIT_CHILD = (
    """
import sys
import time

mode, n = sys.argv[1], int(sys.argv[2])
"""
    + EXIT_HANDLES
    + """
print(time.monotonic(), flush=True)
"""
)

EXIT_MODES: Dict[str, Tuple[str, Dict[str, str]]] = {
    "plain": ("plain objects", {}),
    "cffi_gc": ("cffi ffi.gc cdata", {}),
    "exitsafe": ("exitsafe.track (released at exit)", {}),
    "exitsafe_leak": ("exitsafe.track, EXITSAFE_AT_EXIT=leak", {"EXITSAFE_AT_EXIT": "leak"}),
}


def _env(cache: str, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = clean_env(extra)
    core = os.environ.get("EXITSAFE_PURE_PYTHON")
    if core is not None:  # the core under test, in the children too
        env.setdefault("EXITSAFE_PURE_PYTHON", core)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _wall(args: List[str], env: Dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def parse_importtime(stderr: str, top: str) -> List[Tuple[str, int, int, int]]:
    """``(module, self_us, cumulative_us, depth)`` for ``top`` and everything it imported."""
    rows: List[Tuple[str, int, int, int]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3:
            continue
        self_us, cum_us, label = parts
        depth = (len(label) - len(label.lstrip(" ")) - 1) // 2
        rows.append((label.strip(), int(self_us), int(cum_us), depth))
    # Children are printed before their parent: the subtree of a top-level entry is
    # everything after the previous top-level entry.
    start = 0
    for i, (module, _s, _c, depth) in enumerate(rows):
        if depth == 0:
            if module == top:
                return rows[start : i + 1]
            start = i + 1
    return []


def run_import(cfg: Config) -> Section:
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="exitsafe-bench-pycache-") as cache:
        env = _env(cache)
        for code in IMPORT_COMMANDS.values():  # warm the bytecode cache
            _wall([python, "-c", code], env)
            _wall([python, "-c", code], env)
        progress(f"import time x{cfg.import_repeats}")
        times: Dict[str, List[float]] = {label: [] for label in IMPORT_COMMANDS}
        for rep in range(cfg.import_repeats):
            items = list(IMPORT_COMMANDS.items())
            k = rep % len(items)
            for label, code in items[k:] + items[:k]:
                times[label].append(_wall([python, "-c", code], env))
        breakdown: Dict[str, List[Tuple[int, int]]] = {}
        order: List[str] = []
        for _ in range(cfg.importtime_runs):
            proc = subprocess.run(
                [python, "-X", "importtime", "-c", "import exitsafe"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            for module, self_us, cum_us, _depth in parse_importtime(proc.stderr, "exitsafe"):
                if module not in breakdown:
                    order.append(module)
                breakdown.setdefault(module, []).append((self_us, cum_us))

    base = times["python -c pass"]
    summaries = {label: summarize(v) for label, v in times.items()}
    added = {
        label: summarize([a - b for a, b in zip(v, base)])
        for label, v in times.items()
        if label != "python -c pass"
    }
    modules = [
        {
            "module": m,
            "self_us": statistics.median(s for s, _ in breakdown[m]),
            "cumulative_us": statistics.median(c for _, c in breakdown[m]),
        }
        for m in order
    ]
    table = Table(
        f"Import time: subprocess wall time, {cfg.import_repeats} interleaved runs each",
        ["command", "median", "spread", "added vs pass (paired median)"],
    )
    for label, s in summaries.items():
        table.add(
            label,
            f"{s['median'] * 1e3:.1f} ms",
            fmt_spread(s),
            f"{added[label]['median'] * 1e3:+.1f} ms" if label in added else "-",
        )
    top = Table(
        "import exitsafe, -X importtime (median us; children listed before parents)",
        ["module", "self us", "cumulative us"],
        code_first_column=True,
    )
    for row in sorted(modules, key=lambda r: -r["self_us"])[:10]:
        top.add(row["module"], f"{row['self_us']:,.0f}", f"{row['cumulative_us']:,.0f}")
    exitsafe_row = [r for r in modules if r["module"] == "exitsafe"]
    if exitsafe_row:
        top.notes.append(
            f"exitsafe cumulative: {exitsafe_row[0]['cumulative_us'] / 1e3:.2f} ms"
            f" (median of {cfg.importtime_runs})"
        )
    added_ms = added["python -c 'import exitsafe'"]["median"] * 1e3
    bars = [
        Bar(
            f"import exitsafe adds <= {BAR_IMPORT_MS:g} ms over python -c pass",
            added_ms,
            BAR_IMPORT_MS,
            "<=",
            "ms",
            f"-X importtime cumulative {exitsafe_row[0]['cumulative_us'] / 1e3:.2f} ms"
            if exitsafe_row
            else "",
        )
    ]
    data = {
        "repeats": cfg.import_repeats,
        "wall_s": summaries,
        "added_vs_pass_s": added,
        "importtime": modules,
        "importtime_runs": cfg.importtime_runs,
        "bytecode": "cached (private PYTHONPYCACHEPREFIX, warmed up)",
    }
    return Section("import", data, [table, top], bars)


def _exit_once(script: Path, mode: str, n: int, env: Dict[str, str]) -> Tuple[float, float]:
    """(seconds from the child's last statement until it has exited, total wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, str(n)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate()
    t_end = time.monotonic()
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"exit benchmark child ({mode}) failed: rc={proc.returncode}\n{err}")
    if "Exception ignored" in err or "Traceback" in err:
        raise RuntimeError(f"exit benchmark child ({mode}) printed errors:\n{err}")
    marker = float(out.strip().splitlines()[-1])
    return t_end - marker, t_end - t0


def run_exit(cfg: Config) -> Section:
    n = cfg.exit_n
    with tempfile.TemporaryDirectory(prefix="exitsafe-bench-exit-") as tmp:
        script = Path(tmp) / "exit_child.py"
        script.write_text(EXIT_CHILD, encoding="utf-8")
        cache = os.path.join(tmp, "pycache")
        envs = {mode: _env(cache, extra) for mode, (_label, extra) in EXIT_MODES.items()}
        for mode in EXIT_MODES:  # warm up: bytecode cache
            _exit_once(script, mode, min(n, 1000), envs[mode])
        progress(f"exit cost n={n:,} x{cfg.exit_repeats}")
        exit_s: Dict[str, List[float]] = {mode: [] for mode in EXIT_MODES}
        wall_s: Dict[str, List[float]] = {mode: [] for mode in EXIT_MODES}
        modes = list(EXIT_MODES)
        for rep in range(cfg.exit_repeats):
            k = rep % len(modes)
            for mode in modes[k:] + modes[:k]:
                ex, wall = _exit_once(script, mode, n, envs[mode])
                exit_s[mode].append(ex)
                wall_s[mode].append(wall)

    base = exit_s["plain"]
    results: Dict[str, Any] = {}
    for mode in modes:
        added = [a - b for a, b in zip(exit_s[mode], base)]
        results[mode] = {
            "exit_s": summarize(exit_s[mode]),
            "wall_s": summarize(wall_s[mode]),
            "added_exit_s": summarize(added),
            "ratio_vs_plain": summarize(paired_ratios(exit_s[mode], base)),
        }
    table = Table(
        f"Process exit with {n:,} live objects (median of {cfg.exit_repeats} subprocess runs)",
        ["objects", "exit time", "spread", "added vs plain", "added per handle", "total wall"],
    )
    for mode, (label, _extra) in EXIT_MODES.items():
        r = results[mode]
        table.add(
            label,
            f"{r['exit_s']['median'] * 1e3:.1f} ms",
            fmt_spread(r["exit_s"]),
            f"{r['added_exit_s']['median'] * 1e3:+.1f} ms" if mode != "plain" else "-",
            f"{r['added_exit_s']['median'] / n * 1e9:+,.0f} ns" if mode != "plain" else "-",
            f"{r['wall_s']['median'] * 1e3:.0f} ms",
        )
    table.notes.append(
        "exit time = from the child's last statement until the parent sees it exited"
        " (atexit teardown, module and object finalization, interpreter shutdown)"
    )
    data = {"n": n, "repeats": cfg.exit_repeats, "modes": results}
    added_us = results["exitsafe"]["added_exit_s"]["median"] / n * 1e6
    bars = [
        Bar(
            f"process exit adds <= {BAR_EXIT_US_PER_HANDLE:g} us per handle over plain objects"
            f" ({n:,} handles released at exit)",
            added_us,
            BAR_EXIT_US_PER_HANDLE,
            "<=",
            "us",
        )
    ]
    return Section("exit", data, [table], bars)
