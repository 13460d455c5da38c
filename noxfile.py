"""The interpreter matrix: the unit tests and the scenario suite on every supported CPython.

Run ``nox`` for the whole matrix, CPython 3.9 to 3.15 (``nox -s tests-3.12`` for one
interpreter).  Interpreters are found on PATH and, on machines that use pyenv, under
``$PYENV_ROOT/versions``.  A supported version with no local interpreter is handled so:

- 3.14 and 3.15: the session ``tests-3.14`` / ``tests-3.15`` delegates to
  ``.ci/sid-python test VERSION``, which runs the same pytest command in a venv of
  Debian sid's interpreter inside a cached sid root (Linux, as root; see that script).
  When even that cannot be had, it prints ``SKIPPED CPython 3.14: <reason>`` and the
  session passes.
- older versions: a visible ``SKIPPING CPython 3.x`` line, never silently.

Each session runs ``pytest -q -m "not repeat and not real"`` plus the arguments after
``--`` twice: against the compiled core (``exitsafe._speedups``, built by the install)
and against the pure-Python core (``EXITSAFE_PURE_PYTHON=1``).  The pure-core pass leaves
out the tests marked ``any_core`` (docs, source layout, the test harness: their subject does
not depend on the core, and the compiled pass runs them).  ``--repeat`` among the arguments
after ``--`` includes the 20x repetition runs (``nox -s tests-3.15 -- --repeat -n 2``);
``--compiled-only`` leaves out the pure-core pass (CI, for the local interpreters between
the oldest and the newest, to keep its run well under its time bound).
``tests/real`` (marker ``real``) runs once, from the main interpreter, over every
interpreter's environment itself.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

import nox

SUPPORTED = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
#: versions that .ci/sid-python can provide from Debian sid when none is installed
FROM_SID = ["3.14", "3.15"]
PYTEST = ["-q", "-p", "no:cacheprovider"]

#: The suite runs against each core: the compiled one (which the editable install builds;
#: tests/core/test_cores.py fails when EXITSAFE_EXPECT_COMPILED=1 and it is not there) and
#: the pure-Python one, each with the tests it selects (tests/real runs once, from the main
#: interpreter, over every interpreter itself).
CORES = [
    ({"EXITSAFE_PURE_PYTHON": "0"}, "not real"),
    ({"EXITSAFE_PURE_PYTHON": "1"}, "not real and not any_core"),
]


def _passes(posargs: list[str]) -> list[tuple[dict[str, str], list[str]]]:
    """``(environment, pytest arguments)`` of each core's pass; ``--repeat`` in ``posargs``
    keeps the repetition runs in, ``--compiled-only`` leaves the pure-core pass out."""
    repeat = "--repeat" in posargs
    cores = CORES[:1] if "--compiled-only" in posargs else CORES
    rest = [arg for arg in posargs if arg not in ("--repeat", "--compiled-only")]
    return [
        (env, [*PYTEST, "-m", marks if repeat else f"not repeat and {marks}", *rest])
        for env, marks in cores
    ]

nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False


def _add_pyenv_interpreters() -> None:
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    extra = []
    for version in SUPPORTED:
        found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin")))
        found = [d for d in found if os.path.exists(os.path.join(d, f"python{version}"))]
        if found:
            extra.append(found[-1])
    if extra:
        os.environ["PATH"] = os.pathsep.join([*extra, os.environ.get("PATH", "")])


_add_pyenv_interpreters()
LOCAL = [v for v in SUPPORTED if shutil.which(f"python{v}")]
SID = [v for v in FROM_SID if v not in LOCAL and sys.platform.startswith("linux")]
for _missing in sorted(set(SUPPORTED) - set(LOCAL) - set(SID)):
    print(f"nox: SKIPPING CPython {_missing}: no python{_missing} on this machine")

nox.options.sessions = ["tests", *[f"tests-{v}" for v in SID]]


@nox.session(python=LOCAL)
def tests(session: nox.Session) -> None:
    """Unit tests and the scenario suite (the repetition runs with ``-- --repeat``)."""
    session.install("-e", ".[test]")
    for env, args in _passes(session.posargs):
        session.run("python", "-m", "pytest", *args, env=env)


def _sid_session(version: str) -> None:
    def run_in_sid_root(session: nox.Session) -> None:
        # exit status 75: the interpreter cannot be had here; the script printed why
        for env, args in _passes(session.posargs):
            session.run(
                "bash", ".ci/sid-python", "test", version, *args,
                external=True, success_codes=[0, 75], env=env,
            )

    run_in_sid_root.__doc__ = (
        f"The same tests on Debian sid's CPython {version} (no local python{version})."
    )
    nox.session(name=f"tests-{version}", python=False)(run_in_sid_root)


for _version in SID:
    _sid_session(_version)
