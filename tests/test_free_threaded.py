"""Free-threaded CPython (PEP 703 / PEP 779): importing exitsafe must not turn the GIL back on.

On a free-threaded build, importing an extension module that does not declare itself safe
without the GIL re-enables the GIL for the whole process (with a RuntimeWarning), silently
taking away what the user chose that build for.  Each public module is imported in a fresh
interpreter with ``PYTHON_GIL`` unset, and ``sys._is_gil_enabled()`` must still be False.
On a build with the GIL there is nothing to re-enable: the tests are skipped with that reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

pytestmark = pytest.mark.skipif(
    not FREE_THREADED,
    reason=f"CPython {sys.version.split()[0]} here is built with the GIL (not a free-threaded "
    "build): there is no GIL to re-enable",
)

MODULES = [
    "exitsafe",
    "exitsafe.cffi",
    "exitsafe.ctypes",
    "exitsafe.policies",
    "exitsafe.signals",
    "exitsafe.testing",
    "exitsafe.lab.shim",
]


@pytest.mark.parametrize("module", MODULES)
def test_importing_does_not_reenable_the_gil(module: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = (
        "import sys\n"
        "assert not sys._is_gil_enabled(), 'the GIL was on before the import'\n"
        f"import {module}\n"
        "print(sys._is_gil_enabled())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", (
        f"import {module} re-enabled the GIL\n{proc.stderr}"
    )


def test_threads_track_and_release_without_the_gil_losing_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = (
        "import sys, threading, exitsafe\n"
        "reg = exitsafe.Registry(name='ft')\n"
        "released = []\n"
        "def work(t):\n"
        "    for i in range(2000):\n"
        "        reg.track((t, i), released.append).release()\n"
        "threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "assert len(released) == len(set(released)) == 8000, len(released)\n"
        "print(sys._is_gil_enabled())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", proc.stderr


def test_the_pure_python_core_runs_on_a_free_threaded_build() -> None:
    """The compiled core refuses to load there (its C sections never ran without the
    GIL), whether or not it was built: exitsafe runs its reference core."""
    code = (
        "import exitsafe.lowlevel, importlib.util\n"
        "print(exitsafe.lowlevel.CORE)\n"
        "try:\n"
        "    import exitsafe._speedups\n"
        "except ImportError as exc:\n"
        "    print('refused' if 'free-threaded' in str(exc) else 'not built')\n"
        "else:\n"
        "    print('loaded')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "EXITSAFE_PURE_PYTHON"},
    )
    assert proc.returncode == 0, proc.stderr
    core, speedups = proc.stdout.split()
    assert core == "python"
    assert speedups in ("refused", "not built")
