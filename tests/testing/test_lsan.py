"""LeakSanitizer and handles leaked on purpose (EXITSAFE_LSAN=1), on the lab runtime.

The lab runtime is built with ``-fsanitize=address`` (then it frees released objects,
so LeakSanitizer sees exactly the objects never released) and the interpreter runs with
the sanitizer's runtime preloaded.  The same program is run three ways: everything
released at exit (no leak), leaked by policy (LeakSanitizer reports the two objects and
fails the run), leaked by policy with EXITSAFE_LSAN=1 (the leaked handles are handed to
``__lsan_ignore_object``: the run is green).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

from exitsafe.testing import ExitResult, run

#: The sanitizer's options for the runs: leak detection on, and dynamic TLS blocks not
#: tracked (``__tls_get_addr``).  GCC's libsanitizer takes a block that starts 16 bytes
#: into a page for glibc 2.19's layout and reads its bounds from the bytes before it: garbage
#: bounds, and the leak check at exit crashes ("Tracer caught signal 11", "DTLS at
#: 0x000000000490-...").  Where the block lands moves with every allocation made before it
#: (which modules are compiled at start-up, the environment's size), so without this the
#: tests fail or pass by the layout of the heap.
ASAN_OPTIONS = "detect_leaks=1:intercept_tls_get_addr=0"

PROGRAM = textwrap.dedent(
    """
    import sys
    import exitsafe.cffi
    from exitsafe.lab.shim import ffi, load_compiler, load_runtime

    compiler = load_compiler(sys.argv[2])
    rt = load_runtime(sys.argv[1])
    rt.rt_init(sys.argv[2].encode())
    instance = exitsafe.cffi.track(
        ffi, rt.rt_instance_create(), rt.rt_instance_release, kind="instance", name="inst0"
    )
    device = exitsafe.cffi.track(
        ffi, rt.rt_device_create(instance.raw), rt.rt_device_release,
        kind="device", name="dev0", depends_on=[instance],
    )
    print("work done")
    """
)

#: CPython's own allocations still reachable only from interpreter state at exit.
PYTHON_SUPPRESSIONS = "leak:_PyObject_Malloc\nleak:PyMem_\nleak:_PyMem_\nleak:libpython\n"


def _sanitizer_runtime() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the lab runtime with -fsanitize=address")
    path = subprocess.run(
        [cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not path or not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip("the AddressSanitizer runtime (libasan) is not installed")
    return os.path.realpath(path)


@pytest.fixture(scope="module")
def asan_lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    if sys.platform != "linux":
        pytest.skip("LD_PRELOAD of the sanitizer runtime is Linux-only here")
    runtime = _sanitizer_runtime()
    from exitsafe.lab.build import build

    cache = tmp_path_factory.mktemp("asan-lab")
    libs = build(cache_dir=cache, cc="gcc -fsanitize=address -fno-omit-frame-pointer")
    # Whether the sanitizer runtime can run this interpreter at all (leak detection off:
    # the interpreter's own allocations are what the tests' suppressions are for).
    probe = subprocess.run(
        [sys.executable, "-c", "pass"], capture_output=True, text=True, check=False,
        env={**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0"},
    )
    if probe.returncode != 0:
        pytest.skip(f"the sanitizer runtime cannot run here: {probe.stderr.strip()[:200]}")
    # Whether the interpreter itself exits leak-free under the suppressions, running the
    # program with every handle released (Debian's statically linked python3.14.10 does
    # not: its own allocations carry no symbol the suppressions can name, and naming the
    # executable would hide the runtime's leaks too).
    lab = (runtime, str(libs.runtime), str(libs.compiler))
    baseline = _run(lab, cache, EXITSAFE_AT_EXIT="release")
    report = baseline.stderr
    if "SUMMARY: AddressSanitizer" in report and "libexitsafe_lab" not in report:
        summary = [line for line in report.splitlines() if "SUMMARY" in line]
        pytest.skip(
            f"this CPython ({sys.version.split()[0]}) leaks at exit by itself under "
            f"LeakSanitizer (no lab runtime frame in the report): {summary[0].strip()}"
        )
    return lab


def _run(asan_lab: tuple[str, str, str], tmp_path: Path, **env: str) -> ExitResult:
    runtime, library, compiler = asan_lab
    supp = tmp_path / "python.supp"
    supp.write_text(PYTHON_SUPPRESSIONS)
    result = run(
        PROGRAM,
        args=[library, compiler],
        env={
            "LD_PRELOAD": runtime,
            "ASAN_OPTIONS": ASAN_OPTIONS,
            "LSAN_OPTIONS": f"suppressions={supp}",
            "EXITSAFE_LSAN": None,
            **env,
        },
        timeout=120,
    )
    assert isinstance(result, ExitResult)
    assert result.stdout == "work done\n"
    return result


def test_released_at_exit_leaks_nothing(asan_lab: tuple[str, str, str], tmp_path: Path) -> None:
    result = _run(asan_lab, tmp_path, EXITSAFE_AT_EXIT="release")
    assert result.clean, result.report()
    assert "LeakSanitizer" not in result.stderr


@pytest.mark.parametrize("lsan", [None, "0"], ids=["unset", "off"])
def test_leaked_by_policy_fails_a_leak_checked_run(
    asan_lab: tuple[str, str, str], tmp_path: Path, lsan: Optional[str]
) -> None:
    # (EXITSAFE_LSAN=0 is off: it used to turn the hand-over on, as any value did)
    result = _run(asan_lab, tmp_path, EXITSAFE_AT_EXIT="leak", EXITSAFE_LSAN=lsan)
    assert result.returncode != 0  # LeakSanitizer's exit status
    assert "ERROR: LeakSanitizer: detected memory leaks" in result.stderr
    # the instance and the device (their size follows the lab's struct)
    assert re.search(
        r"SUMMARY: AddressSanitizer: \d+ byte\(s\) leaked in 2 allocation\(s\)\.", result.stderr
    ), result.stderr


def test_leaked_by_policy_is_handed_to_lsan(
    asan_lab: tuple[str, str, str], tmp_path: Path
) -> None:
    result = _run(asan_lab, tmp_path, EXITSAFE_AT_EXIT="leak", EXITSAFE_LSAN="1")
    assert result.clean, result.report()
    assert "LeakSanitizer" not in result.stderr
    (registry,) = result.registries
    # still leaked (the OS reclaims them), just not reported
    assert registry.outcomes == {"leaked_policy": 1, "leaked_dependent": 1}
