"""What changed in CPython's shutdown from 3.9 to 3.15, shown on the interpreter running.

Each test runs a small program in a fresh interpreter and asserts what *this* version does;
the expectations per version are the rows of the table in ``docs/why.md`` ("What changed
between versions").  Where a behaviour exists on every version the test runs everywhere
and asserts each version's answer; a test that can only show something on some versions is
skipped elsewhere with the reason.  Probes write with ``os.write`` (it keeps working until
the very end of finalization) and a finalizer of an object in a reference cycle runs in
the collection that follows ``sys.is_finalizing()`` becoming true (step 4 of the sequence).
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from exitsafe.testing import run

V = sys.version_info[:3]
LINUX = sys.platform.startswith("linux")


# step 4 of the shutdown sequence: a finalizer in a cycle collected after finalizing began.
# An automatic collection may come earlier (the allocations of the atexit phase can trigger
# one): a finalizer that runs before ``sys.is_finalizing()`` leaves a new cycle behind for
# the next collection instead of checking at the wrong moment (seen on CI, 3.10).
AT_FINALIZATION = """
import sys as _sys
class Late:
    def __del__(self, check=check, is_finalizing=_sys.is_finalizing):
        if not is_finalizing():
            again = type(self)(); again.me = again
            return
        check("finalizing")
late = Late(); late.me = late; del late
"""


def probe(code: str, finalizer: bool = False):
    """Run ``code`` (dedented), plus AT_FINALIZATION's finalizer calling ``check``."""
    code = textwrap.dedent(code) + (AT_FINALIZATION if finalizer else "")
    result = run(code=code, timeout=60)
    assert not result.signal, result.report()
    return result


# --- 3.12.0-3.12.2 only: no new thread from an atexit callback ------------------------------


def test_an_atexit_callback_may_start_a_thread_except_on_3_12_0_to_3_12_2():
    result = probe("""
        import atexit, os, threading
        def check(where):
            def noop():
                pass
            try:
                t = threading.Thread(target=noop)
                t.start()
                t.join()
                os.write(1, f"{where}: started\\n".encode())
            except RuntimeError as exc:
                os.write(1, f"{where}: {type(exc).__name__}: {exc}\\n".encode())
        atexit.register(check, "atexit")
    """)
    if (3, 12, 0) <= V < (3, 12, 3):
        # gh-104690 (3.12.0) forbade it; the fix of gh-113964 (3.12.3) allows it again
        # until the non-daemon threads have been joined
        assert result.stdout == (
            "atexit: RuntimeError: can't create new thread at interpreter shutdown\n"
        )
    else:
        assert result.stdout == "atexit: started\n"


# --- starting a thread once finalization began ------------------------------------------------


def test_starting_a_thread_in_a_finalizer_at_shutdown():
    code = textwrap.dedent("""
        import os, threading
        def check(where):
            try:
                threading.Thread(target=lambda: None, daemon=True).start()
                os.write(1, f"{where}: started\\n".encode())
            except RuntimeError as exc:
                os.write(1, f"{where}: {type(exc).__name__}: {exc}\\n".encode())
    """) + AT_FINALIZATION
    if V < (3, 12):
        # Thread.start() waits for a thread that is terminated as soon as it tries to take
        # the GIL: the exit hangs (killed here after a few seconds)
        result = run(code=code, timeout=5)
        assert result.timed_out and result.stdout == "", result.report()
        return
    result = probe(code)
    message = "can't create new thread at interpreter shutdown"
    if V < (3, 13):
        assert result.stdout == f"finalizing: RuntimeError: {message}\n"
    else:
        # 3.13 names it: PythonFinalizationError, a RuntimeError subclass
        assert result.stdout == f"finalizing: PythonFinalizationError: {message}\n"
        assert issubclass(PythonFinalizationError, RuntimeError)  # noqa: F821


# --- 3.14: a thread entering the interpreter after finalization began is parked ---------------


@pytest.mark.skipif(not LINUX, reason="reads the thread's state in /proc (Linux)")
def test_a_daemon_thread_entering_a_finalizing_interpreter_is_ended_or_parked():
    # A daemon thread blocked in a system call (GIL released) is woken during finalization:
    # it tries to take the GIL back.  3.9-3.13 end the thread on the spot (its native
    # stack is torn down); from 3.14 (gh-87135) it is parked forever instead.  Either way
    # it never runs Python again.
    result = probe("""
        import os, threading, time
        r, w = os.pipe()
        tid = []
        def daemon():
            tid.append(threading.get_native_id())
            os.read(r, 1)
            os.write(1, b"the daemon thread ran Python after finalization began\\n")
        threading.Thread(target=daemon, daemon=True).start()
        while not tid:
            time.sleep(0.001)

        def syscall(path):
            with open(path + "/syscall") as f:
                return f.read().split()[0]

        def check(where, tid=tid[0], os=os, time=time, syscall=syscall):
            path = f"/proc/self/task/{tid}"
            blocked_in = syscall(path)  # the read() it waits in
            os.write(w, b"x")           # wake it
            last, same = None, 0
            for _ in range(2000):       # until it is gone, or waits in another call for good
                time.sleep(0.005)
                try:
                    now = syscall(path)
                except OSError:         # gone between two looks
                    now = None
                if now is None or not os.path.exists(path):
                    os.write(1, f"{where}: ended\\n".encode())
                    return
                if now in (blocked_in, "running"):
                    # not scheduled yet, or on its way out: under load either lasts (an
                    # ending thread seen "running" once was reported parked: CI, 3.11)
                    last, same = None, 0
                    continue
                same = same + 1 if now == last else 1
                last = now
                if same >= 40:          # in the same other call for 200 ms: parked
                    break
            os.write(1, f"{where}: parked\\n".encode())
    """, finalizer=True)
    if V < (3, 14):
        assert result.stdout == "finalizing: ended\n"
    else:
        assert result.stdout == "finalizing: parked\n"


# --- 3.14: forkserver is the default start method on Linux ------------------------------------


@pytest.mark.skipif(not LINUX, reason="the default start method changed on Linux only")
def test_default_multiprocessing_start_method_on_linux():
    result = probe("""
        import multiprocessing
        print(multiprocessing.get_start_method())
    """)
    assert result.stdout.strip() == ("forkserver" if V >= (3, 14) else "fork")


# --- 3.15: taking a lock late in finalization raises instead of blocking forever ---------------


def test_a_lock_held_by_a_daemon_thread_at_finalization():
    # The holder will never run again (ended, or parked from 3.14).  Up to 3.14 a blocking
    # acquire() waits forever (shown here with a timeout); from 3.15 (GH-135991) acquire()
    # raises PythonFinalizationError, timed or not.
    result = probe("""
        import os, threading
        lock = threading.Lock()
        held = threading.Event()
        r, w = os.pipe()
        def holder():
            lock.acquire()
            held.set()
            os.read(r, 1)  # never written: the lock stays held
        threading.Thread(target=holder, daemon=True).start()
        held.wait()

        def check(where, lock=lock, os=os):
            try:
                got = lock.acquire(timeout=0.5)
                os.write(1, f"{where}: acquire returned {got}\\n".encode())
            except RuntimeError as exc:
                os.write(1, f"{where}: {type(exc).__name__}: {exc}\\n".encode())
    """, finalizer=True)
    if V < (3, 15):
        assert result.stdout == "finalizing: acquire returned False\n"
    else:
        assert result.stdout == (
            "finalizing: PythonFinalizationError: cannot acquire lock at interpreter "
            "finalization\n"
        )


# --- 3.15: PEP 788 interpreter guards ---------------------------------------------------------


def test_pep_788_interpreter_guards_exist_from_3_15():
    result = probe("""
        import ctypes
        print(hasattr(ctypes.pythonapi, "PyInterpreterGuard_FromView"))
    """)
    assert result.stdout.strip() == str(V >= (3, 15))


@pytest.mark.skipif(V < (3, 15), reason="PEP 788's interpreter guards are new in CPython 3.15")
def test_pep_788_a_guard_can_be_taken_in_atexit_but_not_once_finalization_began():
    # What a native thread using the new C API sees: a guard (permission to attach and
    # call Python) is granted while the program runs and in atexit callbacks, where
    # exitsafe's teardown runs, and refused once finalization began, instead of the
    # thread being parked forever inside PyGILState_Ensure().
    result = probe("""
        import atexit, ctypes, os
        api = ctypes.pythonapi
        api.PyInterpreterView_FromCurrent.restype = ctypes.c_void_p
        api.PyInterpreterGuard_FromView.restype = ctypes.c_void_p
        api.PyInterpreterGuard_FromView.argtypes = [ctypes.c_void_p]
        api.PyInterpreterGuard_Close.argtypes = [ctypes.c_void_p]
        view = api.PyInterpreterView_FromCurrent()
        assert view

        def check(where, api=api, view=view, os=os):
            guard = api.PyInterpreterGuard_FromView(view)
            os.write(1, f"{where}: {'granted' if guard else 'refused'}\\n".encode())
            if guard:
                api.PyInterpreterGuard_Close(guard)  # a guard left open blocks finalization

        check("running")
        atexit.register(check, "atexit")
    """, finalizer=True)
    assert result.stdout == "running: granted\natexit: granted\nfinalizing: refused\n"
