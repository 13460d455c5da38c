"""Measure how often each real-binding program fails, per interpreter.

    .venv/bin/python tests/real/measure.py [--runs N] [--case ID ...] [--jobs J] [--protected]

Runs every case's unprotected program N times (no early stop) under every interpreter
prepared by ``.ci/install-real`` and prints one line per (case, interpreter): runs that
failed as described, other unclean ends (with their kinds), clean exits.  With
``--protected``, the protected programs instead: unclean ends by kind / clean exits (clean
as ``test_protected.py`` means it).  Not a test: the numbers are for reports; the tests
only assert "fails in at least one of N" and "clean N of N".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import CASES, real_envs

from exitsafe.testing import ExitResult, run

#: what test_protected.py also refuses on a protected program's stderr
FORBIDDEN = ("Traceback", "Exception in thread")


def is_clean(result: ExitResult) -> bool:
    return result.clean and not any(text in result.stderr for text in FORBIDDEN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--case", action="append", help="only these case ids")
    parser.add_argument("--jobs", type=int, default=1, help="runs at the same time")
    parser.add_argument("--protected", action="store_true",
                        help="run the protected programs (cases that have one)")
    args = parser.parse_args(argv)
    envs = real_envs()
    if not envs:
        print("no environments: run .ci/install-real first")
        return 1
    print(f"{'case':<22} {'python':<6} {'as described':>12}  other unclean / clean")
    for case in CASES:
        if args.case and case.id not in args.case:
            continue
        if args.protected and case.protected is None:
            continue
        script = case.protected_script if args.protected else case.script
        for env in envs:
            if env.packages.get(case.package, "-") == "-":
                print(f"{case.id:<22} {env.name:<6} {'no wheel':>12}")
                continue

            def one(_: int, case=case, env=env, script=script):
                with tempfile.TemporaryDirectory() as cwd:
                    return run(script=script, python=env.python, timeout=case.timeout,
                               cwd=cwd, env=dict(case.env or ()))

            with ThreadPoolExecutor(args.jobs) as pool:
                results = list(pool.map(one, range(args.runs)))
            if args.protected:
                unclean = Counter(r.failure_kind or "stderr: " + ", ".join(
                    t for t in FORBIDDEN if t in r.stderr) for r in results if not is_clean(r))
                others = ", ".join(f"{k} x{n}" for k, n in unclean.items()) or "-"
                print(f"{case.id:<22} {env.name:<6} {'protected':>12}  {others} / "
                      f"{sum(map(is_clean, results))} of {args.runs} clean", flush=True)
                continue
            described = sum(case.fails(r, env.version) for r in results)
            other = Counter(r.failure_kind or "unclean" for r in results
                            if not r.clean and not case.fails(r, env.version))
            clean = sum(r.clean for r in results)
            others = ", ".join(f"{k} x{n}" for k, n in other.items()) or "-"
            print(f"{case.id:<22} {env.name:<6} {described:>5} of {args.runs:<4}  "
                  f"{others} / {clean} clean", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
