"""Audit mode on a program with each kind of late finalizer (a real run, no crash)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from exitsafe.cli import main
from exitsafe.testing import ExitResult, run

# weakref.finalize is used before exitsafe is imported, so weakref's own exit hook runs
# after exitsafe's teardown: its callbacks run in the audit window.
LATE_FINALIZERS = textwrap.dedent(
    """
    import ctypes, weakref

    class Frame:
        pass

    def free_frame(address):
        pass

    frame = Frame()
    frame_finalizer = weakref.finalize(frame, free_frame, 1234)

    import cffi
    import exitsafe

    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    libc = ffi.dlopen(None)

    class Instance:  # a binding object holding a cffi pointer, released in __del__
        def __init__(self):
            self._ptr = ffi.new("int *")

        def close(self):
            pass

        def __del__(self):
            self.close()

    class Device:  # holds a ctypes pointer and its parent instance
        def __init__(self, instance):
            self._instance = instance
            self._handle = ctypes.c_void_p(8)

        def __del__(self):
            pass

    runtime = exitsafe.track(1, lambda raw: None, kind="runtime", name="runtime")
    instance = Instance()
    device = Device(instance)
    scratch = ffi.gc(libc.malloc(64), libc.free)
    print("ok")
    """
)


def _line(text: str) -> str:
    """``<string>:N`` of the line of LATE_FINALIZERS that starts with ``text``."""
    lines = LATE_FINALIZERS.splitlines()
    return f"<string>:{next(i for i, line in enumerate(lines, 1) if line.startswith(text))}"


def _kinds(result: ExitResult) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in result.audit:
        found.setdefault(finding.what, []).append(finding.type)
    return found


def test_audit_reports_each_kind_of_late_finalizer() -> None:
    result = run(LATE_FINALIZERS, audit=True)
    assert isinstance(result, ExitResult)
    assert result.returncode == 0 and result.stdout == "ok\n"  # the run itself did not crash
    assert not result.clean  # ... but the audit found latent hazards
    kinds = _kinds(result)
    assert sorted(kinds["__del__"]) == ["__main__.Device", "__main__.Instance"]
    assert kinds["ffi.gc"] == ["cdata 'void *'"]
    assert kinds["weakref.finalize"] == ["finalizer of Frame"]
    by_type = {f.type: f for f in result.audit}
    device = by_type["__main__.Device"]
    assert device.holds == "_handle (ctypes pointer)"
    # no close method: its __del__ is made a no-op at exit (no order to keep then)
    assert device.suggest == 'exitsafe.lowlevel.neutralize_at_exit(obj, attr="_handle")'
    assert device.site == _line("device = Device(instance)")
    instance = by_type["__main__.Instance"]
    assert instance.suggest == 'exitsafe.adopt(obj, close="close")'
    assert instance.alternative == 'exitsafe.lowlevel.neutralize_at_exit(obj, attr="_ptr")'
    assert instance.site == _line("instance = Instance()")
    assert by_type["cdata 'void *'"].site == _line("scratch = ffi.gc(")
    assert by_type["finalizer of Frame"].site == _line("frame_finalizer = ")
    assert by_type["cdata 'void *'"].suggest == (
        "exitsafe.cffi.pin(ffi, lib); handle = exitsafe.cffi.track(ffi, ptr, lib.free)"
    )
    assert by_type["finalizer of Frame"].suggest == (
        "handle = exitsafe.track(raw, free_frame)"
    )
    report = result.report()
    assert "audit: 4 native release(s) ran after the exit teardown" in report
    assert result.summary() == (
        "NOT CLEAN [audit]: 4 native release(s) ran after exitsafe's teardown, during"
        " finalization: latent exit hazards; 4 latent exit hazard(s) found by the audit"
    )


def test_audit_finds_nothing_in_a_protected_program() -> None:
    code = textwrap.dedent(
        """
        import exitsafe
        runtime = exitsafe.track(1, lambda raw: None, kind="runtime", name="runtime")
        device = exitsafe.track(2, lambda raw: None, kind="device", depends_on=[runtime])
        """
    )
    result = run(code, audit=True)
    assert isinstance(result, ExitResult)
    assert result.clean and result.audit == []
    assert "audit: no native release ran after exitsafe's teardown" in result.report()


def test_exitsafe_audit_variable_alone_in_a_program_that_imports_exitsafe(tmp_path: Path) -> None:
    # no exitsafe run, no start-up hook: EXITSAFE_AUDIT=1 and the program's own import
    env = {"EXITSAFE_AUDIT": "1", "EXITSAFE_TRACE": None, "PYTHONPATH": None}
    code = LATE_FINALIZERS
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={k: v for k, v in {**__import__("os").environ, **env}.items() if v is not None},
        timeout=60, check=False,
    )
    assert proc.returncode == 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("exitsafe: audit-")]
    assert lines[0].startswith('exitsafe: audit-begin after="teardown"')
    assert sum(1 for line in lines if "audit-release" in line) == 4


def test_cli_audit_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(LATE_FINALIZERS)
    status = main(["run", "--audit", "--json", "--", sys.executable, str(tmp_path / "app.py")])
    data = json.loads(capsys.readouterr().out)
    assert status == 1
    assert data["schema"] == 3 and data["audited"] is True
    assert len(data["audit"]) == 4
    assert data["diagnosis"]["kind"] == "audit"
    assert data["audit"][0]["suggest"]


def test_audit_costs_nothing_when_off() -> None:
    # importing exitsafe with EXITSAFE_AUDIT, EXITSAFE_TRACE and EXITSAFE_LSAN unset loads
    # neither the audit nor tracemalloc, nor the LeakSanitizer hand-over
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("EXITSAFE_AUDIT", "EXITSAFE_TRACE", "EXITSAFE_LSAN", "PYTHONTRACEMALLOC")}
    probe = (
        "import sys, exitsafe, tracemalloc as _t\n"
        "print(sorted(m for m in sys.modules if m in ('exitsafe._audit', 'exitsafe._lsan')),"
        " _t.is_tracing())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True,
        timeout=60,
    ).stdout
    assert out.strip() == "[] False"


def _fastrlock_stand_in(module: str) -> Any:
    """A reentrant lock shaped as fastrlock's ``FastRLock`` of ``module`` (the real ones
    are C types): ``acquire(blocking)`` and ``release()``, no ``locked()``, no owner."""
    import threading

    class FastRLock:
        def __init__(self) -> None:
            self._lock = threading.RLock()

        def acquire(self, blocking: bool = True) -> bool:
            return self._lock.acquire(blocking)

        def release(self) -> None:
            self._lock.release()

    FastRLock.__module__ = module
    return FastRLock()


@pytest.mark.parametrize("module", ["fastrlock.rlock", "h5py._objects"])
def test_a_fastrlock_held_by_another_thread_is_listed_as_locked(module: str) -> None:
    """fastrlock's lock and h5py's copy of it (its global ``phil``) tell no owner and have
    no ``locked()``: the thread list tries to take one without waiting, and gives it
    back at once.  (A stand-in of the same module and name: the real ones are C types.)"""
    import threading

    from exitsafe._audit._threads import _lock_state

    phil = _fastrlock_stand_in(module)
    assert _lock_state(phil, 0) is None  # free: taken and given back
    assert phil.acquire(False)  # (it was given back: free again; now held here)
    assert _lock_state(phil, 0) is None  # held by the thread asking: reentrant, not a wait
    phil.release()
    taken, done = threading.Event(), threading.Event()

    def holder() -> None:
        with phil._lock:
            taken.set()
            done.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    taken.wait(30)
    try:
        assert _lock_state(phil, thread.ident or 0) == "locked"
    finally:
        done.set()
        thread.join()
    assert _lock_state(phil, 0) is None


def test_a_module_lock_taken_by_a_compiled_wrapper_is_listed_for_the_frames_of_its_module() -> (
    None
):
    """h5py's methods take its global ``phil`` in a compiled decorator: no name of their
    code shows it.  A thread with a frame of such a module, while that lock is held, is
    listed holding it."""
    import threading

    from exitsafe._audit._threads import _held_locks

    module: dict = {"phil": _fastrlock_stand_in("h5py._objects"), "threading": threading}
    exec(  # a library module whose function names no lock
        "def write(inside, done):\n    inside.set()\n    done.wait(30)\n", module
    )
    inside, done = threading.Event(), threading.Event()

    def wrapped() -> None:  # what the compiled decorator does around the method
        with module["phil"]._lock:
            module["write"](inside, done)

    thread = threading.Thread(target=wrapped)
    thread.start()
    inside.wait(30)
    try:
        frame = sys._current_frames()[thread.ident]  # type: ignore[index]
        held = _held_locks(frame, thread.ident or 0) or ""
        assert "phil (h5py._objects.FastRLock, locked)" in held.split("; "), held
    finally:
        done.set()
        thread.join()
