"""The lab runtime's rules, each proven in a fresh process.

Every broken rule must end the process with SIGABRT and one ``FATAL: <rule>`` line;
the unloaded compiler must give a real SIGSEGV; the leak report, the logger thread,
lost devices, fork and the library destructor behave as native/README.md says.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exitsafe.lab import report as lab_report
from exitsafe.lab import shim
from exitsafe.lab.catalog import CRASH_SIGNALS

from .conftest import Proc, needs_posix, run_python

pytestmark = needs_posix

PRELUDE = """
import os, sys, threading, time
from exitsafe.lab import shim
ffi = shim.ffi
cc = shim.load_compiler()
rt = shim.load_runtime()
assert rt.rt_init(str(shim.compiler_path()).encode()) == 0
"""


def lab_run(body: str, **kwargs: object) -> Proc:
    return run_python(PRELUDE + textwrap.dedent(body), **kwargs)  # type: ignore[arg-type]


def fatal_lines(proc: Proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("FATAL: ")]


def assert_fatal(proc: Proc, rule: str) -> None:
    assert proc.signal == "SIGABRT", proc
    lines = fatal_lines(proc)
    assert len(lines) == 1, proc
    assert rule in lines[0], proc


# --- the API surface -------------------------------------------------------------


def test_every_header_function_is_in_the_cdef() -> None:
    header = (Path(shim.__file__).parent / "native" / "exitsafe_lab.h").read_text()
    declared = set(re.findall(r"^[a-z_ ]+\*?\s*\**(rt_\w+|cc_\w+)\(", header, re.MULTILINE))
    in_cdef = set(re.findall(r"\b(rt_\w+|cc_\w+)\(", shim.CDEF))
    assert declared, "the header parse found nothing"
    assert declared == in_cdef


def test_sources_compile_without_warnings(tmp_path: Path) -> None:
    from exitsafe.lab import build

    try:
        argv = build.find_compiler()
    except build.LabBuildError as exc:
        pytest.skip(str(exc))
    for source in ("runtime.c", "compiler.c"):
        proc = subprocess.run(
            [
                *argv,
                *build._CFLAGS,
                "-Werror",
                "-pedantic",
                f"-I{build.NATIVE_DIR}",
                "-o",
                str(tmp_path / "out.so"),
                str(build.NATIVE_DIR / source),
                "-ldl",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr


def test_a_correct_program_exits_cleanly_with_zero_leaks(lab: Path) -> None:
    proc = lab_run("""
        instance = rt.rt_instance_create()
        device = rt.rt_device_create(instance)
        assert rt.rt_device_program(device) >= 0 and cc.cc_live_programs() == 1
        buf = rt.rt_buffer_create(device, 8)
        assert rt.rt_buffer_write(buf, 0, b"abcdefgh", 8) == 0
        out = ffi.new("char[8]")
        assert rt.rt_buffer_read(buf, 0, out, 8) == 0 and ffi.buffer(out)[:] == b"abcdefgh"
        assert rt.rt_buffer_write(buf, 4, b"abcdefgh", 8) == rt.RT_ERR_RANGE
        assert rt.rt_buffer_size(buf) == 8
        catalog = rt.rt_catalog_create()
        names = [ffi.string(rt.rt_catalog_name(catalog, i)).decode()
                 for i in range(rt.rt_catalog_count(catalog))]
        assert names == ["lab-cpu", "lab-gpu", "lab-npu"], names
        assert rt.rt_catalog_name(catalog, 3) == ffi.NULL
        assert rt.rt_device_submit(device) == 1 and rt.rt_device_submit(device) == 2
        assert rt.rt_instance_device_count(instance) == 1
        assert [rt.rt_live(k) for k in range(4)] == [1, 1, 1, 1]
        rt.rt_catalog_release(catalog)
        rt.rt_buffer_release(buf)
        rt.rt_device_release(device)
        rt.rt_instance_release(instance)
        assert cc.cc_live_programs() == 0
        assert [rt.rt_live(k) for k in range(4)] == [0, 0, 0, 0]
        assert rt.rt_torn_down() == rt.RT_LIVE
        print("ok")
    """)
    assert proc.returncode == 0, proc
    assert proc.stdout.strip() == "ok"
    reports = lab_report.parse_leak_reports(proc.stderr)
    assert len(reports) == 1, proc
    assert reports[0].total == 0 and reports[0].teardown == "unload" and not reports[0].forked
    assert "FATAL" not in proc.stderr


def test_rt_init_borrows_a_loaded_compiler_only(lab: Path) -> None:
    proc = run_python("""
        from exitsafe.lab import shim
        rt = shim.load_runtime()
        path = str(shim.compiler_path()).encode()
        assert rt.rt_init(path) == rt.RT_ERR_COMPILER_NOT_LOADED
        assert rt.rt_init(str(shim.runtime_path()).encode()) == rt.RT_ERR_COMPILER_SYMBOLS
        cc = shim.load_compiler()
        assert rt.rt_init(path) == rt.RT_OK
        assert rt.rt_init(path) == rt.RT_ERR_STATE
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc


def test_devices_work_without_a_compiler(lab: Path) -> None:
    proc = run_python("""
        from exitsafe.lab import shim
        rt = shim.load_runtime()
        instance = rt.rt_instance_create()
        device = rt.rt_device_create(instance)
        assert rt.rt_device_program(device) == -1
        rt.rt_device_release(device)
        rt.rt_instance_release(instance)
    """)
    assert proc.returncode == 0, proc


# --- FATAL rules --------------------------------------------------------------------

FATAL_CASES = {
    "instance released twice": (
        "i = rt.rt_instance_create(); rt.rt_instance_release(i); rt.rt_instance_release(i)",
        "FATAL: instance released twice",
    ),
    "device released twice": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i);"
        " rt.rt_device_release(d); rt.rt_device_release(d)",
        "FATAL: device released twice",
    ),
    "buffer released twice": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i); b = rt.rt_buffer_create(d, 4);"
        " rt.rt_buffer_release(b); rt.rt_buffer_release(b)",
        "FATAL: buffer released twice",
    ),
    "catalog released twice": (
        "c = rt.rt_catalog_create(); rt.rt_catalog_release(c); rt.rt_catalog_release(c)",
        "FATAL: catalog released twice",
    ),
    "device used after release": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i);"
        " rt.rt_device_release(d); rt.rt_device_submit(d)",
        "FATAL: device used after release (rt_device_submit",
    ),
    "buffer used after release": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i); b = rt.rt_buffer_create(d, 4);"
        " rt.rt_buffer_release(b); rt.rt_buffer_size(b)",
        "FATAL: buffer used after release (rt_buffer_size",
    ),
    "catalog used after release": (
        "c = rt.rt_catalog_create(); rt.rt_catalog_release(c); rt.rt_catalog_count(c)",
        "FATAL: catalog used after release",
    ),
    "device released after its instance": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i);"
        " rt.rt_instance_release(i); rt.rt_device_release(d)",
        "FATAL: device released after its parent instance was released",
    ),
    "buffer released after its device": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i); b = rt.rt_buffer_create(d, 4);"
        " rt.rt_device_release(d); rt.rt_buffer_release(b)",
        "FATAL: buffer released after its parent device was released",
    ),
    "buffer released after its instance": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i); b = rt.rt_buffer_create(d, 4);"
        " rt.rt_instance_release(i); rt.rt_buffer_release(b)",
        "FATAL: buffer released after its ancestor instance was released",
    ),
    "device used after its instance": (
        "i = rt.rt_instance_create(); d = rt.rt_device_create(i);"
        " rt.rt_instance_release(i); rt.rt_device_submit(d)",
        "FATAL: device used after its parent instance was released",
    ),
    "child created on a released parent": (
        "i = rt.rt_instance_create(); rt.rt_instance_release(i); rt.rt_device_create(i)",
        "FATAL: instance used after release (rt_device_create",
    ),
    "call after rt_shutdown": (
        "i = rt.rt_instance_create(); rt.rt_shutdown(); rt.rt_instance_release(i)",
        "FATAL: runtime used after it was torn down (rt_instance_release called after"
        " rt_shutdown()",
    ),
    "rt_shutdown twice": (
        "rt.rt_shutdown(); rt.rt_shutdown()",
        "FATAL: runtime used after it was torn down (rt_shutdown",
    ),
    "rt_shutdown while rt_filter runs": (
        """
threading.Thread(target=rt.rt_filter, args=(5000,), daemon=True).start()
while not rt.rt_filters_running():
    time.sleep(0.001)
rt.rt_shutdown()
""",
        "FATAL: rt_shutdown() while rt_filter is running on another thread (1 call(s) in"
        " progress)",
    ),
    "device released while a thread waits on it": (
        """
d = rt.rt_device_create(rt.rt_instance_create())
threading.Thread(target=rt.rt_device_wait, args=(d,), daemon=True).start()
while not rt.rt_device_waiting(d):
    time.sleep(0.001)
rt.rt_device_release(d)
""",
        "FATAL: device #2 released while rt_device_wait is blocked on it (1 thread(s) waiting)",
    ),
    "NULL object": ("rt.rt_device_release(ffi.NULL)", "FATAL: rt_device_release: NULL device"),
    "not an object of the runtime": (
        "keep = ffi.new('char[256]'); rt.rt_device_release(ffi.cast('rt_device *', keep))",
        "is not a device created by this runtime",
    ),
    "wrong kind": (
        "i = rt.rt_instance_create(); rt.rt_device_release(ffi.cast('rt_device *', i))",
        "is the wrong kind of object (kind instance, expected device)",
    ),
    "logger unregistered from its own callback": (
        """
@ffi.callback("void(int, const char *)")
def log(level, msg):
    rt.rt_logger_unregister()
rt.rt_logger_register(log, 1000)
time.sleep(5)
""",
        "FATAL: the logger was unregistered from its own callback",
    ),
}


@pytest.mark.parametrize("case", sorted(FATAL_CASES))
def test_broken_rule_aborts_with_its_fatal_message(lab: Path, case: str) -> None:
    body, rule = FATAL_CASES[case]
    proc = lab_run(body)
    assert_fatal(proc, rule)


def test_double_release_is_detected_deterministically(lab: Path) -> None:
    """The graveyard keeps released objects: 200 double releases in a row, all detected
    even after many other objects were created and released in between."""
    proc = lab_run(
        """
        victims = []
        for n in range(200):
            i = rt.rt_instance_create()
            rt.rt_instance_release(i)
            victims.append(i)
            for _ in range(10):
                rt.rt_instance_release(rt.rt_instance_create())
        rt.rt_instance_release(victims[int(sys.argv[1])])
    """,
        args=("37",),
    )
    assert_fatal(proc, "FATAL: instance released twice")


def test_orphaning_a_child_warns_but_does_not_abort(lab: Path) -> None:
    proc = lab_run("""
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        rt.rt_instance_release(i)
        print("alive")
    """)
    assert proc.returncode == 0, proc
    assert "instance #1 released while 1 child object(s) are still alive" in proc.stderr
    report = lab_report.parse_leak_reports(proc.stderr)[0]
    assert report.leaks == {"devices": 1}


# --- the compiler dependency ----------------------------------------------------------


def test_unloaded_compiler_gives_a_real_sigsegv(lab: Path) -> None:
    body = """
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        ffi.dlclose(cc)        # the host's last reference: the compiler's code is unmapped
        print("releasing", flush=True)
        rt.rt_device_release(d)  # jumps into the unmapped compiler
        print("survived", flush=True)
    """
    for _ in range(5):
        proc = lab_run(body)
        assert proc.returncode == -11, proc
        assert proc.signal == "SIGSEGV"
        assert "releasing" in proc.stdout and "survived" not in proc.stdout
        assert "Fatal Python error: Segmentation fault" in proc.stderr


def test_a_second_host_reference_keeps_the_compiler_mapped(lab: Path) -> None:
    proc = lab_run("""
        cc2 = shim.load_compiler()
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        ffi.dlclose(cc)
        rt.rt_device_release(d)
        rt.rt_instance_release(i)
        assert cc2.cc_live_programs() == 0
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc


# --- the leak report -------------------------------------------------------------------


def test_leak_report_counts_each_kind_and_goes_to_the_file(lab: Path, tmp_path: Path) -> None:
    path = tmp_path / "leaks.txt"
    proc = lab_run(
        """
        i = rt.rt_instance_create()
        d1 = rt.rt_device_create(i); d2 = rt.rt_device_create(i)
        b = rt.rt_buffer_create(d1, 4); b2 = rt.rt_buffer_create(d1, 4); rt.rt_buffer_release(b2)
        c = rt.rt_catalog_create(); c2 = rt.rt_catalog_create(); c3 = rt.rt_catalog_create()
        print(os.getpid())
    """,
        env={"EXITSAFE_LAB_LEAK_REPORT": str(path)},
    )
    assert proc.returncode == 0, proc
    assert "leak report" not in proc.stderr
    text = path.read_text()
    assert text.count("\n") == 1
    assert re.fullmatch(
        r"exitsafe-lab leak report: pid=\d+ forked=0 instances=1 devices=2 buffers=1 catalogs=3"
        r" inherited=0 teardown=unload logger=0\n",
        text,
    ), text
    (rep,) = lab_report.read_leak_reports(path)
    assert rep.pid == int(proc.stdout) and rep.total == 7
    assert rep.summary() == "leaked instances=1 devices=2 buffers=1 catalogs=3"


def test_leak_report_is_appended_by_each_process(lab: Path, tmp_path: Path) -> None:
    path = tmp_path / "leaks.txt"
    for n in range(3):
        proc = lab_run(
            f"[rt.rt_catalog_create() for _ in range({n})]",
            env={"EXITSAFE_LAB_LEAK_REPORT": str(path)},
        )
        assert proc.returncode == 0, proc
    assert [r.catalogs for r in lab_report.read_leak_reports(path)] == [0, 1, 2]


def test_leak_report_is_written_when_the_library_is_unloaded(lab: Path, tmp_path: Path) -> None:
    path = tmp_path / "leaks.txt"
    proc = lab_run(
        """
        rt.rt_device_create(rt.rt_instance_create())
        ffi.dlclose(rt)
        with open(os.environ["EXITSAFE_LAB_LEAK_REPORT"]) as fh:
            print(fh.read(), end="")
        print("still running")
    """,
        env={"EXITSAFE_LAB_LEAK_REPORT": str(path)},
    )
    assert proc.returncode == 0, proc
    reports = lab_report.parse_leak_reports(proc.stdout)
    assert len(reports) == 1 and reports[0].leaks == {"instances": 1, "devices": 1}, proc
    assert proc.stdout.rstrip().endswith("still running")


def test_leak_exit_code_turns_leaks_into_a_failed_exit(lab: Path) -> None:
    leaky = lab_run("rt.rt_instance_create()", env={"EXITSAFE_LAB_LEAK_EXITCODE": "23"})
    assert leaky.returncode == 23, leaky
    clean = lab_run(
        "rt.rt_instance_release(rt.rt_instance_create())", env={"EXITSAFE_LAB_LEAK_EXITCODE": "23"}
    )
    assert clean.returncode == 0, clean


def test_rt_leak_report_returns_the_same_line(lab: Path) -> None:
    proc = lab_run("""
        rt.rt_catalog_create()
        out = ffi.new("char[256]")
        n = rt.rt_leak_report(out, 256)
        line = ffi.string(out).decode()
        assert n == len(line), (n, line)
        print(line, end="")
    """)
    assert proc.returncode == 0, proc
    (rep,) = lab_report.parse_leak_reports(proc.stdout)
    assert rep.catalogs == 1 and rep.teardown == "live"


# --- teardown and the library destructor -------------------------------------------------

LATE_CALLER_C = r"""
static void (*late_fn)(void);
void late_set(void (*fn)(void)) { late_fn = fn; }
__attribute__((destructor)) static void late_fini(void) { if (late_fn) late_fn(); }
"""


def test_a_call_after_the_library_destructor_aborts(lab: Path, tmp_path: Path) -> None:
    """The static-destructor fiasco: a library loaded before the runtime has its destructor
    run after the runtime's; its call into the runtime aborts instead of misbehaving."""
    from exitsafe.lab import build

    source = tmp_path / "late.c"
    source.write_text(LATE_CALLER_C)
    late = tmp_path / "liblate.so"
    subprocess.run(
        [*build.find_compiler(), "-shared", "-fPIC", "-o", str(late), str(source)], check=True
    )
    proc = run_python(f"""
        import ctypes
        from exitsafe.lab import shim
        ffi = shim.ffi
        # ctypes never dlcloses: both libraries stay mapped until the process exits, where
        # glibc runs the destructors of unrelated libraries in load order: the runtime's
        # first, then late's, which calls into the torn-down runtime.
        ctypes.CDLL(str(shim.runtime_path()))
        late = ctypes.CDLL({str(late)!r})
        rt = shim.load_runtime()
        late.late_set(ctypes.c_void_p(int(ffi.cast("uintptr_t",
                                                   ffi.addressof(rt, "rt_catalog_create")))))
        rt.rt_catalog_release(rt.rt_catalog_create())
        print("exiting", flush=True)
    """)
    assert proc.stdout.strip() == "exiting"
    assert_fatal(
        proc,
        "FATAL: runtime used after it was torn down (rt_catalog_create called "
        "after the library was unloaded (its destructor ran))",
    )
    (rep,) = lab_report.parse_leak_reports(proc.stderr)
    assert rep.total == 0 and rep.teardown == "unload"


def test_rt_shutdown_marks_teardown_and_stops_the_logger(lab: Path) -> None:
    proc = lab_run("""
        @ffi.callback("void(int, const char *)")
        def log(level, msg):
            pass
        rt.rt_logger_register(log, 500)
        while rt.rt_logger_calls() < 3:
            time.sleep(0.001)
        rt.rt_catalog_create()
        rt.rt_shutdown()
        n = rt.rt_logger_calls()
        time.sleep(0.05)
        assert rt.rt_logger_calls() == n
        assert rt.rt_torn_down() == rt.RT_TORN_DOWN_SHUTDOWN
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc
    (rep,) = lab_report.parse_leak_reports(proc.stderr)
    assert rep.teardown == "shutdown" and rep.catalogs == 1 and not rep.logger


# --- the logger thread ------------------------------------------------------------------------


def test_logger_thread_calls_until_unregistered_and_never_after(lab: Path) -> None:
    proc = lab_run("""
        state = {"after": 0, "calls": 0, "unregistered": False, "threads": set()}
        @ffi.callback("void(int, const char *)")
        def log(level, msg):
            state["calls"] += 1
            state["threads"].add(threading.get_ident())
            if state["unregistered"]:
                state["after"] += 1
        assert rt.rt_logger_register(log, 1000) == rt.RT_OK
        assert rt.rt_logger_register(log, 1000) == rt.RT_ERR_STATE
        deadline = time.monotonic() + 10
        while rt.rt_logger_calls() < 20 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert rt.rt_logger_unregister() == rt.RT_OK
        state["unregistered"] = True
        n = rt.rt_logger_calls()
        time.sleep(0.1)
        assert rt.rt_logger_calls() == n and state["after"] == 0, state
        assert state["calls"] >= 20 and threading.get_ident() not in state["threads"]
        assert rt.rt_logger_unregister() == rt.RT_ERR_STATE
        assert rt.rt_logger_register(log, 1000) == rt.RT_OK   # again, after a clean stop
        assert rt.rt_logger_unregister() == rt.RT_OK
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc
    (rep,) = lab_report.parse_leak_reports(proc.stderr)
    assert not rep.logger


def test_a_logger_still_registered_at_exit_crashes_the_interpreter(lab: Path) -> None:
    """At unload the runtime tells its logger it is going away, after Py_Finalize: cffi's
    callback into a finalized interpreter (or a freed callback) is undefined behaviour.

    It ends with any crash signal (SIGSEGV mostly; SIGILL, SIGTRAP...), sometimes before
    the runtime wrote its report (the logger thread's own callback crashed first), and,
    rarely, not at all: then the report, written just before the late call, proves the
    callback was still registered.  Most runs must really crash."""
    runs = 5
    crashed = 0
    for _ in range(runs):
        proc = lab_run("""
            @ffi.callback("void(int, const char *)")
            def log(level, msg):
                pass
            rt.rt_logger_register(log, 1000)
            while rt.rt_logger_calls() < 5:
                time.sleep(0.001)
            print("exiting", flush=True)
        """)
        assert "exiting" in proc.stdout, proc
        reports = lab_report.parse_leak_reports(proc.stderr)
        assert len(reports) <= 1, proc
        if reports:
            assert reports[0].logger, proc  # the late call was made (or about to be)
        if proc.signal in CRASH_SIGNALS:
            crashed += 1
        else:
            assert not proc.timed_out and proc.signal is None and reports, proc
    assert crashed > runs // 2, f"only {crashed} of {runs} runs crashed"


# --- long and blocking calls ------------------------------------------------------------------


def test_rt_filter_counts_the_calls_in_progress_and_shutdown_after_them_is_clean(
    lab: Path,
) -> None:
    proc = lab_run(
        """
        threads = [threading.Thread(target=rt.rt_filter, args=(300,)) for _ in range(2)]
        for t in threads:
            t.start()
        while rt.rt_filters_running() < 2:
            time.sleep(0.001)
        for t in threads:
            t.join()
        assert rt.rt_filters_running() == 0
        assert rt.rt_filter(0) == 0
        assert rt.rt_shutdown() == 0
        print("ok")
    """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc


def test_rt_device_wait_blocks_until_woken_and_then_returns_at_once(lab: Path) -> None:
    proc = lab_run(
        """
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        got = []
        t = threading.Thread(target=lambda: got.append(rt.rt_device_wait(d)), daemon=True)
        t.start()
        while not rt.rt_device_waiting(d):
            time.sleep(0.001)
        t.join(0.3)
        assert t.is_alive() and rt.rt_device_waiting(d) == 1   # blocked: nothing woke it
        assert rt.rt_device_wake(d) == 0
        t.join(5)
        assert not t.is_alive() and got == [1] and rt.rt_device_waiting(d) == 0
        assert rt.rt_device_wait(d) == 1                        # woken for good
        rt.rt_device_release(d); rt.rt_instance_release(i)
        print("ok")
    """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc
    (rep,) = lab_report.parse_leak_reports(proc.stderr)
    assert rep.total == 0


# --- lost devices --------------------------------------------------------------------------


def test_releasing_a_lost_device_blocks_forever(lab: Path) -> None:
    proc = lab_run(
        """
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        rt.rt_device_lose(d)
        t = threading.Thread(target=rt.rt_device_release, args=(d,), daemon=True)
        t.start()
        t.join(0.5)
        assert t.is_alive()
        assert rt.rt_device_submit(d) == 1    # still usable: the release never completed
        print("blocked")
    """,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "blocked", proc
    (rep,) = lab_report.parse_leak_reports(proc.stderr)
    assert rep.leaks == {"instances": 1, "devices": 1}


def test_a_lost_device_released_on_the_main_thread_hangs(lab: Path) -> None:
    proc = lab_run(
        """
        d = rt.rt_device_create(rt.rt_instance_create())
        rt.rt_device_lose(d)
        print("releasing", flush=True)
        rt.rt_device_release(d)
    """,
        timeout=2,
    )
    assert proc.timed_out and proc.stdout.strip() == "releasing", proc


# --- fork ------------------------------------------------------------------------------------


def test_a_forked_child_releasing_inherited_objects_corrupts_the_parent(lab: Path) -> None:
    proc = lab_run("""
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        pid = os.fork()
        if pid == 0:
            assert rt.rt_inherited() == 2 and rt.rt_live(1) == 0
            rt.rt_device_release(d)       # silently destroys the parent's device too
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        print("child done", flush=True)
        rt.rt_device_submit(d)
    """)
    assert proc.stdout.strip() == "child done", proc
    assert_fatal(proc, "FATAL: device #2 was destroyed by another process (pid ")


def test_a_forked_child_reports_inherited_objects_separately(lab: Path, tmp_path: Path) -> None:
    path = tmp_path / "leaks.txt"
    proc = lab_run(
        """
        i = rt.rt_instance_create(); d = rt.rt_device_create(i)
        pid = os.fork()
        if pid == 0:
            rt.rt_catalog_create()
            sys.exit(0)                  # a normal exit: the destructor reports
        assert os.waitpid(pid, 0)[1] == 0
        rt.rt_device_release(d); rt.rt_instance_release(i)
        print(os.getpid())
    """,
        env={"EXITSAFE_LAB_LEAK_REPORT": str(path)},
    )
    assert proc.returncode == 0, proc
    child, parent = lab_report.read_leak_reports(path)
    assert child.forked and child.inherited == 2 and child.leaks == {"catalogs": 1}
    assert not parent.forked and parent.pid == int(proc.stdout) and parent.total == 0
    assert parent.inherited == 0
    assert lab_report.main_report([child, parent]) == parent


def test_objects_created_after_fork_do_not_collide(lab: Path) -> None:
    proc = lab_run("""
        i = rt.rt_instance_create()
        pid = os.fork()
        if pid == 0:
            objs = [rt.rt_catalog_create() for _ in range(50)]
            for o in objs:
                rt.rt_catalog_release(o)
            os._exit(0)
        objs = [rt.rt_catalog_create() for _ in range(50)]
        assert os.waitpid(pid, 0)[1] == 0
        for o in objs:
            rt.rt_catalog_count(o)
            rt.rt_catalog_release(o)
        rt.rt_instance_release(i)
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc


def test_lab_is_not_imported_by_exitsafe() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, exitsafe; print('cffi' in sys.modules, 'exitsafe.lab' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == ["False", "False"]
