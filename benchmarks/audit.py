"""The cost of ``exitsafe run --audit``: each program's audited wall time as a ratio to its
plain run, under ``exitsafe run`` both times (its start-up hook and trace on).

    python -m benchmarks.audit [--runs N] [--before SRC] [--json PATH] [PROGRAM ...]

Programs (the bar: at most 2x):

* ``alloc``: 200,000 ``ffi.gc`` pointers among 400,000 plain objects, all alive until
  exit, when their destructors run while the interpreter finalizes (200,000 late releases
  for the audit to see);
* ``lab``: the lab runtime (``exitsafe.lab``) used as a binding: an instance, 2,000
  devices and 20,000 buffers held by wrapper objects whose ``__del__`` releases them,
  released at exit;
* ``FILE``: any program file, such as the real-binding programs of ``tests/real/programs``
  (with ``--python .venv-real/3.11/bin/python``).

``--before SRC`` also times the audit of another checkout's ``src`` directory (for
instance the commit before the audit stopped starting ``tracemalloc``: ``git archive
<commit> src | tar -x -C /tmp/before``), so the table has the old ratio beside the new.
Each figure is the median of ``--runs`` runs (default 5), plain and audited runs
interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent

ALLOC = textwrap.dedent(
    """
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    lib = ffi.dlopen(None)


    class Row:
        __slots__ = ("index", "value")

        def __init__(self, index):
            self.index = index
            self.value = index * 2


    keep = []
    for i in range(200_000):
        keep.append(ffi.gc(lib.malloc(16), lib.free))  # a native buffer, freed at exit
        keep.append(Row(i))
        keep.append(Row(-i))
    print(len(keep))
    """
)

LAB = textwrap.dedent(
    """
    from exitsafe.lab import shim

    ffi = shim.ffi
    rt = shim.load_runtime()
    rt.rt_init(ffi.NULL)
    instance = rt.rt_instance_create()


    class Device:
        def __init__(self):
            self._ptr = rt.rt_device_create(instance)

        def __del__(self, release=rt.rt_device_release):
            release(self._ptr)


    class Buffer:
        def __init__(self, device, size):
            self._device = device
            self._ptr = rt.rt_buffer_create(device._ptr, size)

        def __del__(self, release=rt.rt_buffer_release):
            release(self._ptr)


    buffers = []
    devices = [Device() for _ in range(2_000)]
    for device in devices:
        for _ in range(10):
            buffers.append(Buffer(device, 64))
    print(len(buffers))
    """
)

PROGRAMS = {"alloc": ALLOC, "lab": LAB}


def _time(argv: list[str], src: Optional[Path], audit: bool, timeout: float) -> float:
    """Wall seconds of one run of ``argv`` under ``exitsafe run`` of the tree ``src``."""
    runner = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from exitsafe.testing import run_command
        result = run_command(json.loads(sys.argv[2]), audit=sys.argv[3] == "1",
                             timeout=float(sys.argv[4]))
        print(json.dumps([result.duration, result.returncode, result.timed_out,
                          len(result.audit)]))
        """
    )
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", runner, str(src or ROOT / "src"), json.dumps(argv),
         "1" if audit else "0", str(timeout)],
        capture_output=True, text=True, env=env, timeout=timeout + 60, check=True,
    )
    duration, _returncode, timed_out, _findings = json.loads(proc.stdout.splitlines()[-1])
    if timed_out:
        raise RuntimeError(f"{argv}: timed out after {timeout} s (audit={audit})")
    return float(duration)


def measure(name: str, argv: list[str], runs: int, before: Optional[Path],
            timeout: float) -> dict[str, object]:
    plain: list[float] = []
    after: list[float] = []
    old: list[float] = []
    for _ in range(runs):
        plain.append(_time(argv, None, False, timeout))
        after.append(_time(argv, None, True, timeout))
        if before is not None and (not old or old[-1] >= 0):
            try:
                old.append(_time(argv, before, True, timeout))
            except RuntimeError:
                old.append(-1.0)  # did not finish within the timeout
    row: dict[str, object] = {
        "program": name,
        "plain_s": statistics.median(plain),
        "audit_s": statistics.median(after),
        "ratio": statistics.median(after) / statistics.median(plain),
    }
    if old and min(old) < 0:
        row["before_audit_s"] = None
        row["before_note"] = f"did not finish within {timeout:g} s"
    elif old:
        row["before_audit_s"] = statistics.median(old)
        row["before_ratio"] = statistics.median(old) / statistics.median(plain)
    return row


def main(args: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout's src directory: its audit is timed too")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=None, help="write the results there")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs the programs (default: this one);"
                        " an environment of .ci/install-real for tests/real/programs")
    parser.add_argument("programs", nargs="*", default=["alloc", "lab"],
                        help="alloc, lab, or a Python file")
    options = parser.parse_args(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in options.programs:
            if name in PROGRAMS:
                path = Path(tmp) / f"{name}.py"
                path.write_text(PROGRAMS[name])
            else:
                path = Path(name).resolve()
            argv = [options.python, str(path)]
            rows.append(measure(name, argv, options.runs, options.before, options.timeout))
            row = rows[-1]
            before = ""
            if "before_note" in row:
                before = f"; before: {row['before_note']}"
            if "before_ratio" in row:
                before = f"; before: {row['before_audit_s']:.2f} s ({row['before_ratio']:.2f}x)"
            print(f"{name}: plain {row['plain_s']:.2f} s, audited {row['audit_s']:.2f} s"
                  f" ({row['ratio']:.2f}x){before}", flush=True)
    if options.json is not None:
        meta = {
            "python": sys.version.split()[0],
            "runs": options.runs,
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "machine": f"{os.cpu_count()} cores",
        }
        options.json.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
