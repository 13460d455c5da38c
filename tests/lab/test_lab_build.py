"""Building the lab libraries: the cache key, reuse, concurrent first use, a missing compiler."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exitsafe.lab import build

from .conftest import needs_posix

pytestmark = needs_posix


@pytest.fixture
def compiler() -> list[str]:
    try:
        return build.find_compiler()
    except build.LabBuildError as exc:
        pytest.skip(str(exc))


def test_build_into_an_empty_cache_then_reuse(tmp_path: Path, compiler: list[str]) -> None:
    libs = build.build(cache_dir=tmp_path)
    assert libs.directory == tmp_path / libs.key
    assert libs.runtime.name == "libexitsafe_lab_runtime.so"
    assert libs.compiler.name == "libexitsafe_lab_compiler.so"
    assert libs.runtime.is_file() and libs.compiler.is_file()
    stamps = (libs.runtime.stat().st_mtime_ns, libs.compiler.stat().st_mtime_ns)
    again = build.build(cache_dir=tmp_path)
    assert again == libs
    assert (again.runtime.stat().st_mtime_ns, again.compiler.stat().st_mtime_ns) == stamps
    leftovers = [p.name for p in libs.directory.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    forced = build.build(cache_dir=tmp_path, force=True)
    assert forced.runtime.stat().st_mtime_ns >= stamps[0]


def test_cache_root_honours_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiler: list[str]
) -> None:
    monkeypatch.setenv("EXITSAFE_LAB_CACHE", str(tmp_path / "lab"))
    assert build.cache_root() == tmp_path / "lab"
    libs = build.build()
    assert libs.directory.parent == tmp_path / "lab"
    monkeypatch.delenv("EXITSAFE_LAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "exitsafe" / "lab"


def test_the_key_changes_with_the_compiler_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiler: list[str]
) -> None:
    plain = build.build(cache_dir=tmp_path)
    monkeypatch.setenv("CC", " ".join([*compiler, "-DEXITSAFE_LAB_VARIANT=1"]))
    variant = build.build(cache_dir=tmp_path)
    assert variant.key != plain.key
    assert variant.runtime.is_file() and plain.runtime.is_file()


def test_concurrent_first_use_from_many_processes(tmp_path: Path, compiler: list[str]) -> None:
    """Eight processes build into the same cold cache at once: all get the same complete
    libraries, loadable right away, and no temporary file is left behind."""
    code = textwrap.dedent(f"""
        import cffi, sys
        from exitsafe.lab import build
        libs = build.build(cache_dir={str(tmp_path)!r})
        ffi = cffi.FFI()
        ffi.cdef("const char *rt_version(void); const char *cc_version(void);")
        rt = ffi.dlopen(str(libs.runtime)); cc = ffi.dlopen(str(libs.compiler))
        print(libs.runtime, ffi.string(rt.rt_version()).decode(),
              ffi.string(cc.cc_version()).decode(), sep="|")
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    assert len(set(outputs)) == 1, outputs
    path, rt_version, cc_version = outputs[0].split("|")
    assert rt_version == "exitsafe-lab-runtime 1" and cc_version == "exitsafe-lab-compiler 1"
    directory = Path(path).parent
    assert sorted(p.name for p in directory.iterdir()) == [
        ".lock",
        "libexitsafe_lab_compiler.so",
        "libexitsafe_lab_runtime.so",
    ]


def test_concurrent_builds_from_threads(tmp_path: Path, compiler: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: build.build(cache_dir=tmp_path), range(6)))
    assert len(set(results)) == 1


def test_a_missing_compiler_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    with pytest.raises(build.LabBuildError, match=r"apt-get install gcc"):
        build.build(cache_dir=tmp_path)
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.LabBuildError) as info:
        build.build(cache_dir=tmp_path)
    message = str(info.value)
    assert "no C compiler found" in message and "apt-get install gcc" in message
    assert not list(tmp_path.iterdir())


def test_a_failing_compiler_reports_its_output(tmp_path: Path) -> None:
    fake = tmp_path / "badcc"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo badcc 1; exit 0; fi\n'
        "echo 'badcc: error: nope' >&2\nexit 3\n"
    )
    fake.chmod(0o755)
    with pytest.raises(
        build.LabBuildError, match=r"(?s)compiling compiler.c failed \(exit 3\).*nope"
    ):
        build.build(cache_dir=tmp_path / "cache", cc=str(fake))
    (key_dir,) = (tmp_path / "cache").iterdir()
    assert not [p for p in key_dir.iterdir() if p.name.endswith(".so")]


def test_build_command_line(tmp_path: Path, compiler: list[str]) -> None:
    env = dict(os.environ, EXITSAFE_LAB_CACHE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "exitsafe.lab.build"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    runtime, compiler_path = proc.stdout.split()
    assert Path(runtime).is_file() and Path(compiler_path).is_file()
    env["CC"] = "/nonexistent/cc"
    proc = subprocess.run(
        [sys.executable, "-m", "exitsafe.lab.build"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 2 and "apt-get install gcc" in proc.stderr
