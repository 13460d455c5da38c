"""Fixtures for the lab tests: the lab libraries built once per session, and a runner.

The libraries are built into a session temporary cache (``EXITSAFE_LAB_CACHE`` is set
for the whole session, so every subprocess finds them there and never rebuilds).
Every program that is expected to crash runs in its own process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

needs_posix = pytest.mark.skipif(sys.platform == "win32", reason="the lab is POSIX only")


@dataclass
class Proc:
    """How a lab subprocess ended."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def signal(self) -> Optional[str]:
        if self.returncode < 0:
            return signal.Signals(-self.returncode).name
        return None

    def __str__(self) -> str:
        return (
            f"returncode={self.returncode} signal={self.signal} timed_out={self.timed_out}\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )


def run_python(
    code: str,
    *,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 60.0,
    args: tuple[str, ...] = (),
) -> Proc:
    """Run ``code`` in a fresh ``python -X faulthandler`` in its own process group."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return Proc(
        proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), timed_out
    )


@pytest.fixture(scope="session")
def lab_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A session cache directory holding freshly built lab libraries."""
    if sys.platform == "win32":
        pytest.skip("the lab is POSIX only")
    from exitsafe.lab import build

    cache = tmp_path_factory.mktemp("labcache")
    old = os.environ.get("EXITSAFE_LAB_CACHE")
    os.environ["EXITSAFE_LAB_CACHE"] = str(cache)
    try:
        try:
            build.build()
        except build.LabBuildError as exc:
            pytest.skip(f"cannot build the lab libraries: {exc}")
        yield cache
    finally:
        if old is None:
            os.environ.pop("EXITSAFE_LAB_CACHE", None)
        else:
            os.environ["EXITSAFE_LAB_CACHE"] = old


@pytest.fixture
def lab(lab_cache: Path) -> Path:
    """The session lab cache (the libraries are built); use it to get a built lab."""
    return lab_cache
