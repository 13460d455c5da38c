"""Costs that must stay linear, each against a baseline measured in the same run.

``python -m benchmarks.scaling [--quick] [--instructions] [--only KINDS] [--json PATH]``,
or the ``scaling`` section of ``python -m benchmarks``.  Every figure is the CPU time of a
fresh child process (median of a few, the contenders interleaved), so that one
measurement cannot warm up or slow down the next, and each is given under both cores
(``EXITSAFE_PURE_PYTHON=0`` and ``=1``; the quick run measures only the core it runs):

* **chain**: ``add_dependency`` building a chain of ``n`` handles against the creation
  order (each older handle depends on the next newer one), edges added forward, in
  reverse and in random order; against the same chain built with the creation order (no
  search), per edge.  Growth: the cost per edge at the largest size over the smallest.
* **registries**: creating ``n`` registries (all kept alive), per registry, against the
  first hundred.
* **ledger file**: ``EXITSAFE_LEDGER``'s writer (`exitsafe._exit.write_ledger`) on a
  registry of ``n`` entries, against ``json.dumps`` of the same entries as dicts.
* **exit**: the exit of a process holding ``n`` live handles (all released at exit), per
  handle, over the exit of one holding ``n`` plain objects, and against ``n`` ``ffi.gc``
  objects.  With ``--instructions`` (valgrind), the exit's CPU instructions are counted
  too (the program's set-up is not instrumented): those do not move with the machine's load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Dict, List, Optional, Sequence

from ._util import EXIT_HANDLES, Bar, Config, Section, Table, clean_env, progress

#: Targets (CPU seconds, and per-unit growth for linearity).
BAR_CHAIN_S = 1.0  # a 10^4 chain, any order
BAR_REGISTRIES_S = 1.0  # 10^4 registries
BAR_LEDGER_S = 3.0  # a 10^6-entry ledger file
BAR_EXIT_US = 1.0  # exit CPU per handle over plain objects, at 10^6 (compiled core)
BAR_GROWTH = 2.0  # per-unit cost at the largest size / at the smallest

KINDS = ("chain", "registries", "ledger", "exit")
CORES = {"compiled": "0", "pure": "1"}
ORDERS = ("with", "forward", "reverse", "random")

CHILD = textwrap.dedent(
    """
    import json, os, random, sys, time
    import exitsafe
    from exitsafe import _exit
    cpu = time.process_time

    def noop(raw):
        pass

    def chain(n, order):
        reg = exitsafe.Registry("chain", ledger_limit=None)
        hs = [reg.track(i, noop) for i in range(n)]
        if order == "with":  # the creation order: each newer handle on the older one
            pairs = [(hs[i + 1], hs[i]) for i in range(n - 1)]
        else:  # against it: each older handle depends on the next newer one
            pairs = [(hs[i], hs[i + 1]) for i in range(n - 1)]
            if order == "reverse":
                pairs.reverse()
            elif order == "random":
                random.Random(n).shuffle(pairs)
        t0 = cpu()
        for child, parent in pairs:
            child.add_dependency(parent)
        return cpu() - t0

    def registries(n):
        keep = []
        t0 = cpu()
        for i in range(n):
            keep.append(exitsafe.Registry("r"))
        return cpu() - t0

    def ledger(n, path):
        reg = exitsafe.Registry("ledger", ledger_limit=None)
        track = reg.track
        for i in range(n):
            track(i, noop).release()
        t0 = cpu()
        _exit.write_ledger(path)
        written = cpu() - t0
        t0 = cpu()
        entries = [e.as_dict() for e in reg.ledger()]
        json.dumps({"registries": [{"entries": entries}]})
        return written, cpu() - t0, os.path.getsize(path)

    kind, args = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[kind](*args)))
    """
)

EXIT_CHILD = (
    """
import ctypes, sys, time
mode, n, helper = sys.argv[1], int(sys.argv[2]), sys.argv[3]
"""
    + EXIT_HANDLES
    + """
print(time.process_time(), flush=True)
if helper:
    ctypes.CDLL(helper).exitsafe_bench_start()
"""
)
EXIT_MODES = ("plain", "cffi_gc", "exitsafe")


def compiled_built() -> bool:
    return importlib.util.find_spec("exitsafe._speedups") is not None


def cores_to_run(quick: bool) -> List[str]:
    """Both cores (the compiled one when built); a quick run: the one this process runs."""
    built = compiled_built()
    if quick:
        return ["compiled" if built and os.environ.get("EXITSAFE_PURE_PYTHON") != "1" else "pure"]
    return [c for c in CORES if c != "compiled" or built]


#: The children's bytecode cache (``PYTHONPYCACHEPREFIX``): a directory of this run, so
#: that no child compiles a module another one compiled (exitsafe's teardown modules load
#: at the exit), whatever ``PYTHONDONTWRITEBYTECODE`` says; see `run`.
_PYCACHE: List[str] = []


def _env(core: str) -> Dict[str, str]:
    env = clean_env({"EXITSAFE_PURE_PYTHON": CORES[core]})
    if _PYCACHE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = _PYCACHE[0]
    return env


def _child(core: str, kind: str, *args: Any) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, kind, json.dumps(args)],
        env=_env(core), capture_output=True, text=True, timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scaling child {kind}{args} ({core}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def exit_cpu(core: str, mode: str, n: int) -> float:
    """CPU seconds of the exit of a child holding ``n`` objects (after its last statement;
    children run one at a time, so the children's usage grows by this one's)."""
    before = _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_CHILD, mode, str(n), ""],
        env=_env(core), capture_output=True, text=True, timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"exit child {mode} ({core}) failed:\n{proc.stderr[-3000:]}")
    return _children_cpu() - before - float(proc.stdout.strip().splitlines()[-1])


def exit_instructions(core: str, mode: str, n: int, helper: str) -> int:
    """Instructions of the exit of a child holding ``n`` objects (callgrind)."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         "--instr-atstart=no", sys.executable, "-c", EXIT_CHILD, mode, str(n), helper],
        env=_env(core), capture_output=True, text=True, timeout=7200,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind exit run failed: {proc.stderr[-2000:]}")
    return int(found.group(1))


def _chain(cores: List[str], quick: bool, repeats: int, data: Dict[str, Any],
           tables: List[Table], bars: List[Bar]) -> None:
    sizes = [200, 2_000] if quick else [1_000, 10_000]
    table = Table(
        "Building a chain with add_dependency (CPU, median of fresh processes)",
        ["core", "order", "edges", "total", "per edge", "vs with the order", "growth per edge"],
    )
    for core in cores:
        found: Dict[str, List[Dict[str, Any]]] = {}
        for n in sizes:
            runs: Dict[str, List[float]] = {order: [] for order in ORDERS}
            for rep in range(repeats):  # the orders interleaved, the first one rotated
                k = rep % len(ORDERS)
                for order in ORDERS[k:] + ORDERS[:k]:
                    progress(f"scaling: chain {order} n={n:,} ({core})")
                    runs[order].append(_child(core, "chain", n, order))
            for order in ORDERS:
                seconds = _median(runs[order])
                found.setdefault(order, []).append(
                    {"n": n, "seconds": seconds, "per_edge_s": seconds / (n - 1)}
                )
        for order, rows in found.items():
            growth = rows[-1]["per_edge_s"] / rows[0]["per_edge_s"]
            for row in rows:
                base = next(r for r in found["with"] if r["n"] == row["n"])
                row["ratio_vs_with"] = row["per_edge_s"] / base["per_edge_s"]
                table.add(
                    core, order, f"{row['n'] - 1:,}", f"{row['seconds']:.3f} s",
                    f"{row['per_edge_s'] * 1e6:.1f} us", f"{row['ratio_vs_with']:.2f}x",
                    f"{growth:.2f}x" if row is rows[-1] else "-",
                )
            if order == "with":
                continue
            big = rows[-1]
            bars.append(Bar(
                f"{core}: chain of {big['n']:,} built {order} against the creation order"
                f" <= {BAR_CHAIN_S:g} s", big["seconds"], BAR_CHAIN_S, "<=", "s",
            ))
            bars.append(Bar(
                f"{core}: chain built {order}: per-edge cost growth {rows[0]['n']:,} ->"
                f" {big['n']:,} <= {BAR_GROWTH:g}x", growth, BAR_GROWTH, "<=", "x",
            ))
        data["chain"][core] = found
    table.notes.append(
        "with: each newer handle depends on the older one (no search); the others: each older"
        " handle depends on the next newer one, edges added forward, in reverse, at random"
    )
    tables.append(table)


def _registries(cores: List[str], quick: bool, repeats: int, data: Dict[str, Any],
                tables: List[Table], bars: List[Bar]) -> None:
    sizes = [100, 1_000] if quick else [100, 10_000]
    table = Table("Creating registries (CPU)",
                  ["core", "registries", "total", "per registry", "growth per registry"])
    for core in cores:
        rows = []
        for n in sizes:
            progress(f"scaling: registries n={n:,} ({core})")
            seconds = _median([_child(core, "registries", n) for _ in range(repeats)])
            rows.append({"n": n, "seconds": seconds, "per_registry_s": seconds / n})
        growth = rows[-1]["per_registry_s"] / rows[0]["per_registry_s"]
        for row in rows:
            row["ratio_vs_first"] = row["per_registry_s"] / rows[0]["per_registry_s"]
            table.add(core, f"{row['n']:,}", f"{row['seconds']:.3f} s",
                      f"{row['per_registry_s'] * 1e6:.1f} us",
                      f"{growth:.2f}x" if row is rows[-1] else "-")
        data["registries"][core] = rows
        bars.append(Bar(f"{core}: {rows[-1]['n']:,} registries <= {BAR_REGISTRIES_S:g} s",
                        rows[-1]["seconds"], BAR_REGISTRIES_S, "<=", "s"))
        bars.append(Bar(f"{core}: registries: per-registry growth {rows[0]['n']:,} ->"
                        f" {rows[-1]['n']:,} <= {BAR_GROWTH:g}x", growth, BAR_GROWTH, "<=", "x"))
    tables.append(table)


def _ledger(cores: List[str], quick: bool, repeats: int, data: Dict[str, Any],
            tables: List[Table], bars: List[Bar]) -> None:
    sizes = [10_000, 100_000] if quick else [100_000, 1_000_000]
    table = Table(
        "Writing the ledger file (EXITSAFE_LEDGER), CPU",
        ["core", "entries", "written in", "per entry", "json.dumps of the entries", "ratio",
         "size"],
    )
    with tempfile.TemporaryDirectory(prefix="exitsafe-bench-ledger-") as tmp:
        for core in cores:
            rows = []
            for n in sizes:
                progress(f"scaling: ledger n={n:,} ({core})")
                path = os.path.join(tmp, "ledger.json")
                runs = [_child(core, "ledger", n, path) for _ in range(repeats)]
                written = _median([r[0] for r in runs])
                dumped = _median([r[1] for r in runs])
                rows.append({"n": n, "seconds": written, "json_dumps_s": dumped,
                             "ratio_vs_json_dumps": written / dumped, "bytes": runs[0][2]})
            for row in rows:
                table.add(core, f"{row['n']:,}", f"{row['seconds']:.2f} s",
                          f"{row['seconds'] / row['n'] * 1e9:,.0f} ns",
                          f"{row['json_dumps_s']:.2f} s", f"{row['ratio_vs_json_dumps']:.2f}x",
                          f"{row['bytes'] / 1e6:.0f} MB")
            data["ledger"][core] = rows
            bars.append(Bar(f"{core}: ledger file of {rows[-1]['n']:,} entries"
                            f" <= {BAR_LEDGER_S:g} s", rows[-1]["seconds"], BAR_LEDGER_S,
                            "<=", "s"))
    table.notes.append("json.dumps of the entries: LedgerEntry.as_dict() of each, then"
                       " the C encoder (no indent), in the same process")
    tables.append(table)


def _exit(cores: List[str], quick: bool, repeats: int, instructions: bool,
          data: Dict[str, Any], tables: List[Table], bars: List[Bar]) -> None:
    sizes = [1_000, 10_000] if quick else [10_000, 100_000, 1_000_000]
    table = Table(
        "Process exit with n live objects: CPU of the exit (median of fresh processes)",
        ["core", "objects", "n", "exit CPU", "per object", "over plain, per object"]
        + (["instructions per object", "over plain"] if instructions else []),
    )
    tmpdir = tempfile.mkdtemp(prefix="exitsafe-bench-exit-")
    helper = ""
    if instructions and shutil.which("valgrind"):
        from .steady import build_helper

        helper = build_helper(tmpdir)
    try:
        for core in cores:
            found: Dict[str, Any] = {}
            for n in sizes:
                runs: Dict[str, List[float]] = {mode: [] for mode in EXIT_MODES}
                for rep in range(repeats):  # interleaved, the first one rotated
                    k = rep % len(EXIT_MODES)
                    for mode in EXIT_MODES[k:] + EXIT_MODES[:k]:
                        progress(f"scaling: exit {mode} n={n:,} ({core})")
                        runs[mode].append(exit_cpu(core, mode, n))
                row: Dict[str, Any] = {}
                for mode in EXIT_MODES:
                    row[mode] = {"cpu_s": _median(runs[mode])}
                    added = [a - b for a, b in zip(runs[mode], runs["plain"])]
                    row[mode]["added_per_object_s"] = _median(added) / n
                    if helper and n <= (10**4 if quick else 10**5):
                        progress(f"scaling: exit {mode} n={n:,} ({core}), instructions")
                        row[mode]["instructions"] = exit_instructions(core, mode, n, helper)
                found[str(n)] = row
                for mode in EXIT_MODES:
                    cpu = row[mode]["cpu_s"]
                    cells = [core, mode, f"{n:,}", f"{cpu * 1e3:.1f} ms",
                             f"{cpu / n * 1e9:,.0f} ns",
                             f"{row[mode]['added_per_object_s'] * 1e9:+,.0f} ns"]
                    if instructions:
                        ins = row[mode].get("instructions")
                        base = row["plain"].get("instructions")
                        cells += [f"{ins / n:,.0f}" if ins else "-",
                                  f"{(ins - base) / n:+,.0f}" if ins and base else "-"]
                    table.add(*cells)
            data["exit"][core] = found
            big, small = found[str(sizes[-1])], found[str(sizes[0])]
            added_us = big["exitsafe"]["added_per_object_s"] * 1e6
            growth = big["exitsafe"]["added_per_object_s"] / max(
                small["exitsafe"]["added_per_object_s"], 1e-12
            )
            table.notes.append(
                f"{core}: exitsafe over plain objects at {sizes[-1]:,}: {added_us:.2f} us per"
                f" handle; cffi ffi.gc over plain: "
                f"{big['cffi_gc']['added_per_object_s'] * 1e6:.2f} us"
            )
            if core == "compiled":
                bars.append(Bar(
                    f"compiled: exit adds <= {BAR_EXIT_US:g} us of CPU per handle over plain"
                    f" objects at {sizes[-1]:,}", added_us, BAR_EXIT_US, "<=", "us",
                ))
            bars.append(Bar(
                f"{core}: exit linear: added CPU per handle {sizes[0]:,} -> {sizes[-1]:,}"
                f" <= {BAR_GROWTH:g}x", growth, BAR_GROWTH, "<=", "x",
            ))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    table.notes.append(
        "exit CPU = the child's CPU time after its last statement (atexit teardown, module and"
        " object finalization, interpreter shutdown); over plain = paired with the plain run"
        " of the same round"
    )
    tables.append(table)


def run(cfg: Config, instructions: bool = False, kinds: Sequence[str] = KINDS) -> Section:
    quick = cfg.quick
    repeats = 1 if quick else 3
    cores = cores_to_run(quick)
    data: Dict[str, Any] = {"cores": cores, "repeats": repeats}
    data.update({kind: {} for kind in kinds})
    tables: List[Table] = []
    bars: List[Bar] = []
    with tempfile.TemporaryDirectory(prefix="exitsafe-bench-pycache-") as cache:
        _PYCACHE[:] = [cache]
        try:
            for core in cores:  # warm up: the bytecode cache, every module the exit loads
                for mode in EXIT_MODES:
                    exit_cpu(core, mode, 100)
            if "chain" in kinds:
                _chain(cores, quick, repeats, data, tables, bars)
            if "registries" in kinds:
                _registries(cores, quick, repeats, data, tables, bars)
            if "ledger" in kinds:
                _ledger(cores, quick, repeats, data, tables, bars)
            if "exit" in kinds:
                _exit(cores, quick, repeats, instructions, data, tables, bars)
        finally:
            _PYCACHE.clear()
    return Section("scaling", data, tables, bars)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: checks it works")
    parser.add_argument("--instructions", action="store_true",
                        help="also count the exit's instructions (valgrind)")
    parser.add_argument("--only", metavar="KINDS",
                        help=f"comma-separated subset of: {', '.join(KINDS)}")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    kinds = KINDS
    if args.only:
        kinds = tuple(k.strip() for k in args.only.split(",") if k.strip())
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            parser.error(f"unknown kind(s) {unknown}; choose from {list(KINDS)}")
    section = run(Config.make(args.quick), instructions=args.instructions, kinds=kinds)
    for table in section.tables:
        print(table.render(), end="\n\n", flush=True)
    for bar in section.bars:
        print(f"{'PASS' if bar.passed else 'FAIL'} {bar.name}: {bar.value:.3g}{bar.unit}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"data": section.data, "bars": [b.as_dict() for b in section.bars]},
                      fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
