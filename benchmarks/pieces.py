"""What the pure-Python core's hot path is made of, in CPU instructions: ``python -m
benchmarks.pieces``.

`benchmarks.instructions` measures whole operations; this measures the building blocks
of one, each on its own in the same kind of run (callgrind, the pure-Python core, the
difference of two loop lengths; the empty loop's cost subtracted): a Python call, a C
call, the lock's ownership test, one lock section (``acquire(False)`` + ``release()`` of
exitsafe's lock, the pure core's ``_thread.RLock``), a weak reference, a handle record
allocated and freed, a record made by ``_record.new`` (its fields set).  Then it counts
how often the pure core's ``Registry.track`` + ``Handle.release`` uses each (its profile:
Python calls and C calls, read with ``sys.setprofile``, the lock's calls among them) and
sets the sum beside the measured whole: what a plain track + release cannot go below
while it keeps those steps.

Needs valgrind; prints why and exits 2 without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from typing import Dict, List, Optional, Tuple

from .instructions import per_operation

#: Bound in each measured program (`per_operation`'s ``setup``, one line).
SETUP = (
    "import _thread, _weakref; from exitsafe import _sync, _record; "
    "from exitsafe._handle import Handle; st = reg._state; h = track(ptr, release); "
    "lock = _sync.LOCK; acq, rel_, owned = lock.acquire, lock.release, lock._is_owned; "
    "ident, wref, new = _thread.get_ident, _weakref.ref, object.__new__; "
    "noop = lambda raw: None"
)

#: name -> (label, body).  Each is measured net of the empty loop.
PIECES: Dict[str, Tuple[str, str]] = {
    "python_call": ("a call of a Python function (one argument, empty body)", "noop(ptr)"),
    "c_call": ("any other C call, as one with no argument (`_thread.get_ident()`)", "ident()"),
    "owned": ("the lock's ownership test (`_is_owned()`)", "owned()"),
    "section": ("one lock section: `acquire(False)` + `release()`", "acq(False); rel_()"),
    "weakref": ("a weak reference to a handle (`weakref.ref`)", "wref(h)"),
    "allocation": ("a handle record allocated and freed (`object.__new__`)", "new(Handle)"),
    "record": (
        "a record made by `_record.new` (allocation, 20 fields) and freed",
        "_record.new(Handle, st, ptr, release, 'handle', None, (), None, None, 0, 0, 0)",
    ),
    "whole": ("`Registry.track` + `Handle.release`", "track(ptr, release).release()"),
}
EMPTY = "pass"

#: What one pure-core track + release is made of (see `profile`): piece -> times used.
PROFILE_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    import cffi, exitsafe
    ffi = cffi.FFI(); ptr = ffi.cast("void *", 0x1234)
    def release(raw):
        pass
    reg = exitsafe.Registry("bench")
    track = reg.track
    for _ in range(1000):
        track(ptr, release).release()
    calls = {"python": 0, "c": 0, "acquire": 0, "release": 0, "owned": 0, "new": 0}
    def hook(frame, event, arg):
        if event == "call":
            calls["python"] += 1
        elif event == "c_call":
            calls["c"] += 1
            name = getattr(arg, "__name__", "")
            if name in ("acquire", "release", "_is_owned") and "lock" in repr(arg).lower():
                calls["owned" if name == "_is_owned" else name] += 1
            elif name == "__new__":  # (the record's allocation: measured with the record)
                calls["new"] += 1
    N = 100
    sys.setprofile(hook)
    for _ in range(N):
        track(ptr, release).release()
    sys.setprofile(None)
    print(json.dumps({k: v / N for k, v in calls.items()}))
    """
)


def profile() -> Dict[str, float]:
    """Calls per pure-core track + release: Python calls (the program's release function
    among them, the profiler's own exit call not), C calls, and the lock's."""
    env = dict(os.environ, EXITSAFE_PURE_PYTHON="1")
    proc = subprocess.run(
        [sys.executable, "-c", PROFILE_PROGRAM], env=env, capture_output=True, text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"profile run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def measure(names: List[str]) -> Dict[str, float]:
    """name -> instructions per operation, net of the empty loop (the pure-Python core)."""
    empty = per_operation(EMPTY, pure=True, setup=SETUP)
    results: Dict[str, float] = {"empty_loop": empty}
    for name in names:
        print(f"pieces: {name}", file=sys.stderr, flush=True)
        results[name] = per_operation(PIECES[name][1], pure=True, setup=SETUP) - empty
    return results


def model(results: Dict[str, float], calls: Dict[str, float]) -> Dict[str, float]:
    """The pieces a track + release is made of, times how often it uses each."""
    sections = min(calls["acquire"], calls["release"])
    return {
        "sections": sections * results["section"],
        "ownership tests": calls["owned"] * results["owned"],
        "other C calls": _other_c_calls(calls) * results["c_call"],
        "Python calls": calls["python"] * results["python_call"],
        "weak reference": results["weakref"],
        "record": results["record"],
    }


def _other_c_calls(calls: Dict[str, float]) -> float:
    """C calls that are not the lock's nor the record's allocation."""
    return calls["c"] - calls["acquire"] - calls["release"] - calls["owned"] - calls["new"]


def table(results: Dict[str, float], calls: Dict[str, float]) -> str:
    lines = [
        "| piece (pure-Python core, CPU instructions) | each | in a track + release | total |",
        "| --- | ---: | ---: | ---: |",
    ]
    uses = {
        "python_call": calls["python"],
        "c_call": _other_c_calls(calls),
        "owned": calls["owned"],
        "section": min(calls["acquire"], calls["release"]),
        "weakref": 1.0,
        "record": 1.0,
    }
    for name in ("python_call", "c_call", "owned", "section", "weakref", "allocation", "record"):
        if name not in results:
            continue
        used = uses.get(name)
        times = f"{used:g}" if used is not None else "(in the record)"
        total = f"{used * results[name]:,.0f}" if used is not None else ""
        lines.append(f"| {PIECES[name][0]} | {results[name]:,.0f} | {times} | {total} |")
    parts = sum(model(results, calls).values())
    whole = results["whole"]
    lines.append(f"| sum of the pieces | | | {parts:,.0f} |")
    lines.append(
        f"| the rest: the functions' own bytecode (fields read and written, tests, the ledger "
        f"record) | | | {whole - parts:,.0f} |"
    )
    lines.append(f"| {PIECES['whole'][0]}, measured | | | {whole:,.0f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--note", default="", help="a line saved with the numbers")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("benchmarks.pieces needs valgrind (callgrind): not found", file=sys.stderr)
        return 2
    calls = profile()
    results = measure(list(PIECES))
    print(table(results, calls))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"note": args.note, "calls": calls, "results": results}, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
