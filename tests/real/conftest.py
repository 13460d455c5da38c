"""Set-up for the real-binding tests: every test here carries the ``real`` marker, and the
interpreters come from the environments ``.ci/install-real`` made (``.venv-real/<X.Y>``).

A case is skipped, with the reason shown in pytest's summary, only where its environment
or its package is missing: no such interpreter on the machine, ``.ci/install-real`` not
run, or no wheel of the package for that interpreter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exitsafe.testing import ExitResult, run

from .cases import REAL_ENVS, Case, RealEnv, real_envs

#: The interpreters every case is parametrized over (the supported ones), plus any newer
#: one that ``.ci/install-real`` prepared.
SUPPORTED = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
#: Supported interpreters that come only from Debian's sid packages, in
#: ``.ci/sid-python``'s root: their programs cannot be started from outside it, so their
#: real tests run inside it.
SID_ONLY = ("3.14", "3.15")


def versions() -> list[str]:
    names = list(SUPPORTED)
    names += [env.name for env in real_envs() if env.name not in names]
    return names


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real)


def environment_for(version: str, case: Case) -> RealEnv:
    """The environment of ``version`` with the case's package, or a visible skip."""
    missing = case.missing_system_library()
    if missing:
        pytest.skip(missing)
    for env in real_envs():
        if env.name == version:
            for package in (case.package, *case.also_needs):
                if env.packages.get(package, "-") == "-":
                    pytest.skip(
                        f"{package} could not be installed for CPython {version} "
                        f"(the UNAVAILABLE lines of .ci/install-real say why: no wheel, or "
                        f"for torch no CPU build on this machine)"
                    )
            return env
    if version in SID_ONLY:
        pytest.skip(
            f"no real-binding environment for CPython {version} here: its interpreter is "
            f"Debian sid's, whose real tests run inside .ci/sid-python's root (.ci/run: "
            f".ci/sid-python run -- bash .ci/install-real {version}, then .ci/sid-python "
            f"test {version} -m real -k {version} tests/real)"
        )
    pytest.skip(
        f"no environment for CPython {version} in {REAL_ENVS}: the interpreter is not on "
        f"this machine or .ci/install-real was not run"
    )


def run_until_failure(case: Case, env: RealEnv, cwd: Path) -> tuple[list[ExitResult], bool]:
    """Run the case's program up to ``case.runs`` times; stop at the first run that fails
    the way the case describes.  Returns the results and whether one did."""
    results = []
    for _ in range(case.runs):
        result = _run_once(case, env, cwd)
        results.append(result)
        if case.fails(result, env.version):
            return results, True
    return results, False


def run_all(case: Case, env: RealEnv, cwd: Path) -> list[ExitResult]:
    """Run the case's program ``case.runs`` times, whatever each run does."""
    return [_run_once(case, env, cwd) for _ in range(case.runs)]


def _run_once(case: Case, env: RealEnv, cwd: Path) -> ExitResult:
    return run(
        script=case.script,
        python=env.python,
        timeout=case.timeout,
        cwd=cwd,
        env=dict(case.env or ()),
    )
