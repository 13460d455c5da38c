"""The interpreter matrix: the unit tests and the scenario suite on every supported CPython.

Run ``nox`` (or ``nox -s tests-3.12`` for one interpreter).  Interpreters are found on PATH
and, on machines that use pyenv, under ``$PYENV_ROOT/versions``; a supported interpreter that
is not installed is reported with a visible line and skipped, never silently.
"""

from __future__ import annotations

import glob
import os
import shutil

import nox

SUPPORTED = ["3.9", "3.10", "3.11", "3.12", "3.13"]

nox.options.sessions = ["tests"]
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
AVAILABLE = [v for v in SUPPORTED if shutil.which(f"python{v}")]
for _missing in sorted(set(SUPPORTED) - set(AVAILABLE)):
    print(f"nox: SKIPPING CPython {_missing}: no python{_missing} on this machine")


@nox.session(python=AVAILABLE)
def tests(session: nox.Session) -> None:
    """Unit tests and the scenario suite (the repetition runs stay on the main interpreter)."""
    session.install("-e", ".[test]")
    session.run(
        "python", "-m", "pytest", "-q", "-m", "not repeat", "-p", "no:cacheprovider",
        *session.posargs,
    )
