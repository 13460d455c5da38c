"""The real-binding cases: which program, which package, and what "fails as described" means.

Shared by the tests (``test_unprotected.py``) and ``measure.py``; imports nothing from
pytest.  A classifier gets the :class:`exitsafe.testing.ExitResult` of one run and the
interpreter's ``(major, minor)`` and says whether that run failed the way the case
describes.  On CPython 3.14+ a daemon thread that re-enters the interpreter during
finalization hangs instead of unwinding (gh-87135): there any unclean end (crash, abort or
hang) counts, and a case whose failure was that unwinding is clean (``Case.clean_from``),
measured in Debian sid's 3.14 (``.ci/sid-python``).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Tuple

from exitsafe.testing import ExitResult

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
#: Where ``.ci/install-real`` puts one virtual environment per interpreter.
REAL_ENVS = Path(os.environ.get("EXITSAFE_REAL_ENVS", HERE.parent.parent / ".venv-real"))

Version = Tuple[int, int]
TERMINATE = "terminate called without an active exception"
#: glibc's abort when a ``catch (...)`` swallows a forced unwind and does not rethrow it
NOT_RETHROWN = "FATAL: exception not rethrown"


def _frames(result: ExitResult) -> Iterable[str]:
    fatal = result.fatal_error
    if fatal is None:
        return ()
    return [frame.function for thread in fatal.threads for frame in thread.frames]


def forced_unwind_abort(result: ExitResult, version: Version) -> bool:
    """<= 3.13: SIGABRT with libstdc++'s "terminate called without an active exception"
    (``pthread_exit()``'s forced unwinding reached a C++ frame that may not unwind) or
    glibc's "FATAL: exception not rethrown" (a ``catch (...)`` swallowed it)."""
    if version >= (3, 14):
        return not result.clean
    return result.signal == "SIGABRT" and (
        TERMINATE in result.stderr or NOT_RETHROWN in result.stderr
    )


def segfault_in_released_object(result: ExitResult, version: Version) -> bool:
    """<= 3.13: SIGSEGV (a thread's native call in flight wrote into memory the exit
    teardown freed under it); 3.14+: any unclean end."""
    if version >= (3, 14):
        return not result.clean
    return result.signal == "SIGSEGV"


def readback_ignored(result: ExitResult, version: Version) -> bool:
    """The program's ``Readback.__del__`` ran during the interpreter's finalization and
    raised (printed as "Exception ignored"), so its result was never written."""
    return any("Readback.__del__" in (r.object or r.context) for r in result.unraisable)


def writer_used_closed_file(result: ExitResult, version: Version) -> bool:
    """The daemon writer used the dataset after exitsafe's teardown had closed the file:
    its exception is printed ("Exception in thread writer", cut short when the thread is
    ended while printing it, which ``result.clean`` does not see), or it was stopped by
    finalization inside h5py holding h5py's global lock and the exit hangs (killed on
    timeout)."""
    if "Exception in thread" in result.stderr:
        return True
    if version >= (3, 14):
        return not result.clean
    return result.timed_out


def interrupted_query(result: ExitResult, version: Version) -> bool:
    """<= 3.13: the worker's query in flight at exit ends it badly: DuckDB interrupts it
    and the worker's ``InterruptException`` is printed ("Exception in thread"), or the
    worker, ended inside DuckDB's C++ code, aborts the process (SIGABRT, forced unwind);
    both were seen on the same interpreter.  3.14+: any unclean end."""
    if version >= (3, 14):
        return not result.clean
    return result.signal == "SIGABRT" or (
        "Exception in thread" in result.stderr and "InterruptException" in result.stderr
    )


def socket_closed_under_receiver(result: ExitResult, version: Version) -> bool:
    """<= 3.13: the context's ``destroy`` at exit closed the socket the receiver was blocked
    on: libzmq's assertion aborts the process (SIGABRT, "Assertion failed: ..."), or the
    receiver's ``recv`` raised ``ContextTerminated`` and its traceback is printed ("Exception
    in thread receiver", often cut short as the process ends); both were seen on the same
    interpreter, and on a loaded machine about one run in 40 exits cleanly (one in 30
    is killed on timeout too).  3.14+: any unclean end."""
    if version >= (3, 14):
        return not result.clean
    if result.signal == "SIGABRT" and "Assertion failed" in result.stderr:
        return True
    return "Exception in thread" in result.stderr


def shards_unreadable(result: ExitResult, version: Version) -> bool:
    """The parent could not read back a worker's HDF5 shard after the pool was terminated
    (it prints ``shards N, unreadable M`` with M > 0, and exits 1)."""
    return re.search(r"unreadable [1-9]", result.stdout) is not None and result.returncode == 1


def hang_in_threading_shutdown(result: ExitResult, version: Version) -> bool:
    """Killed on timeout, and faulthandler's dump shows the main thread inside
    ``threading._shutdown`` -> ``concurrent.futures``' ``_python_exit`` (joining the
    executor's workers)."""
    functions = set(_frames(result))
    return result.timed_out and {"_shutdown", "_python_exit"} <= functions


def fork_child_unclean(result: ExitResult, version: Version) -> bool:
    """After the fork, the child never ends cleanly: it hangs releasing the inherited
    objects (killed on timeout, the parent still waiting for it) or dies by a signal
    (the parent prints ``child exited with -N``); both were seen on the same machine.  A
    run that timed out is the hang, whatever the parent printed after the harness's own
    SIGABRT at the timeout ended the child (``child exited with -6``: seen on CI)."""
    if "adapter:" not in result.stdout:
        return False
    if result.timed_out:
        return True
    return re.search(r"child exited with -\d+", result.stdout) is not None


def hang_in_jvm_shutdown(result: ExitResult, version: Version) -> bool:
    """<= 3.13: killed on timeout, and faulthandler's dump shows the main thread in JPype's
    ``atexit`` handler ``_JTerminate`` (``DestroyJavaVM`` waiting for the JVM's non-daemon
    threads).  3.14+: any unclean end."""
    if version >= (3, 14):
        return not result.clean
    return result.timed_out and "_JTerminate" in set(_frames(result))


def qthread_destroyed_running(result: ExitResult, version: Version) -> bool:
    """<= 3.13: the ``QThread`` object was destroyed with the module's globals while its
    thread ran: Qt prints "QThread: Destroyed while thread ... is still running" and aborts
    (SIGABRT; twice in 700 runs a SIGSEGV after that line instead); or, rarely (4 runs in
    about 800, on 3.9, 3.10 and 3.11), PySide6's wrapper was invalidated first and the
    worker's ``run()`` raised "Internal C++ object (Hasher) already deleted", printed as
    "Error calling Python override of QThread::run()" with exit status 0.  3.14+: any
    unclean end or that traceback."""
    deleted = "Error calling Python override of QThread::run()" in result.stderr
    if version >= (3, 14):
        return not result.clean or deleted
    if result.signal is not None and "QThread: Destroyed while thread" in result.stderr:
        return True
    return deleted and "already deleted" in result.stderr


def container_closed_under_reader(result: ExitResult, version: Version) -> bool:
    """<= 3.13: the container closed at exit while the player read from it (a read in
    flight, or the player run on into a context being freed) kills the process: SIGSEGV,
    or SIGABRT from glibc's heap checks (no message); both were seen on the same
    interpreter.  Rarely the player instead runs on into PyAV's emptied stream list and
    its traceback is printed ("Exception in thread player", an ``IndexError``).  3.14+: any
    unclean end or that traceback."""
    traceback = "Exception in thread" in result.stderr
    if version >= (3, 14):
        return not result.clean or traceback
    return result.signal in ("SIGSEGV", "SIGABRT", "SIGBUS") or traceback


def writer_closed_under_write(result: ExitResult, version: Version) -> bool:
    """<= 3.13: the ``atexit`` callback closed the ``ParquetWriter`` while the daemon
    thread's ``write_batch`` was in flight on the same C++ writer: a crash (SIGSEGV, on
    either thread, or SIGABRT, "terminate called ..."), ``close()``'s exception printed
    ("Error in atexit._run_exitfuncs": "Column 2 had 20000 while previous column had ...",
    "Only 0 out of 3 columns are initialized"), or the writer's next ``write_batch`` raising
    on the closed file ("Exception in thread writer"); all were seen on the same
    interpreter.  A run may also exit 0 (2 in 10 on 3.10, none in 20 on 3.9 or 3.13; an
    earlier version of the program once left the file unreadable so): it does not count.
    3.14+: any unclean end or those tracebacks."""
    printed = "Error in atexit._run_exitfuncs" in result.stderr or (
        "Exception in thread" in result.stderr
    )
    if version >= (3, 14):
        return not result.clean or printed
    return result.signal in ("SIGSEGV", "SIGABRT") or printed


def file_closed_under_write(result: ExitResult, version: Version) -> bool:
    """<= 3.13: the ``atexit`` callback closed the ``SoundFile`` (libsndfile's ``sf_close``
    freed the ``SNDFILE``) while the daemon thread's ``write`` was in flight in it: a crash
    (SIGSEGV, on the writer's thread or on the main one inside ``close()``; SIGBUS; SIGABRT
    from glibc's heap check), or the writer's next ``write`` failing on the closed file
    ("Exception in thread writer", nearly always cut short as the process ends); all were
    seen on the same interpreter.  A run may also exit 0 (none to 6 in 20 on each
    interpreter, the FLAC file sometimes unreadable all the same): it does not count.
    3.14+: any unclean end or that traceback."""
    printed = "Exception in thread" in result.stderr
    if version >= (3, 14):
        return not result.clean or printed
    return result.signal in ("SIGSEGV", "SIGBUS", "SIGABRT") or printed


#: Why the daemon thread's native call in flight no longer aborts the process on 3.14+.
_UNWOUND_NO_MORE = (
    "CPython 3.14 no longer ends a daemon thread that wants the GIL back during finalization "
    "by pthread_exit()'s forced unwind (gh-87135): the thread hangs there instead, and the "
    "process exits clean"
)


@dataclass(frozen=True)
class Case:
    """One real-binding reproducer."""

    id: str
    program: str
    #: the import name that must be available in the interpreter's environment
    package: str
    #: what "fails as described" means for one run
    fails: Callable[[ExitResult, Version], bool]
    #: runs per interpreter in the test (it stops at the first failure)
    runs: int
    #: seconds before a run is killed (a hang case fails only this way)
    timeout: float
    summary: str
    env: Optional[Sequence[Tuple[str, str]]] = None
    #: a system library the case needs: (glob of a file it installs, what to install)
    system: Optional[Tuple[str, str]] = None
    #: the protected version of the program (tests/real/programs), if there is one
    protected: Optional[str] = None
    #: runs of the protected program, each of which must exit cleanly
    protected_runs: int = 20
    #: why the protected program does not exit cleanly every time yet (a limitation of
    #: exitsafe found by the case): its test is then an expected failure with this reason,
    #: and an unexpected pass says the limitation is gone
    protected_unclean: Optional[str] = None
    #: other protected versions (another recipe for the same program): each must exit
    #: cleanly ``protected_runs`` times of as many, never an expected failure
    also_protected: Tuple[str, ...] = ()
    #: Python code run after each protected run, in its directory with the same
    #: interpreter, that must exit 0: the file the program wrote reads back whole
    reads_back: Optional[str] = None
    #: the kinds ``exitsafe run`` may name a run that fails as described by (its report's
    #: first line, ``NOT CLEAN [kind]: ...``): each one right for one way the program
    #: fails; empty where no kind names the failure (`unnamed` says why)
    kinds: Tuple[str, ...] = ()
    #: why no kind names this case's failure (then ``kinds`` is empty)
    unnamed: Optional[str] = None
    #: one way of failing that no kind can name, though others are named: (a regular
    #: expression the program's stdout matches in such a run, why the run cannot see it)
    unnamed_when: Optional[Tuple[str, str]] = None
    #: the first interpreter on which the unprotected program no longer fails this way
    #: (CPython itself changed), with what was measured there: the test then checks that
    #: every run is clean instead
    clean_from: Optional[Tuple[Version, str]] = None
    #: the kinds of a failure that did not go with CPython's change, still seen now and then
    #: from ``clean_from`` on: a run there is clean, or unclean without a signal and named
    #: by one of these (the failure that went, a crash or an abort, never shows)
    still_from: Tuple[str, ...] = ()
    #: other import names the program needs besides ``package`` (h5py for the shards the
    #: scaling programs' workers write)
    also_needs: Tuple[str, ...] = ()

    def missing_system_library(self) -> Optional[str]:
        """Why the case cannot run on this machine's system libraries, or ``None``."""
        if self.system is None:
            return None
        pattern, what = self.system
        if glob.glob(pattern):
            return None
        return f"{what} is not installed (no {pattern}; .ci/install-real installs it)"

    @property
    def script(self) -> Path:
        return PROGRAMS / self.program

    @property
    def protected_script(self) -> Path:
        assert self.protected is not None
        return PROGRAMS / self.protected


CASES = [
    Case(
        id="onnxruntime-daemon",
        program="onnxruntime_daemon.py",
        package="onnxruntime",
        fails=forced_unwind_abort,
        runs=10,
        timeout=60.0,
        summary="daemon thread in InferenceSession.run() at exit: SIGABRT (terminate)",
        protected="onnxruntime_daemon_protected.py",
        kinds=("thread-in-native",),
        clean_from=((3, 14), _UNWOUND_NO_MORE + " (10 runs of 10 clean on 3.14.10, 2026-11-29)"),
    ),
    Case(
        id="grpc-stream-server",
        program="grpc_stream_server.py",
        package="grpc",
        fails=hang_in_threading_shutdown,
        runs=3,
        timeout=10.0,
        summary="streaming handler never ends: hang in threading._shutdown",
        protected="grpc_stream_server_protected.py",
        kinds=("hang-before-teardown",),
    ),
    Case(
        id="pyopencl-daemon",
        program="pyopencl_daemon.py",
        package="pyopencl",
        fails=forced_unwind_abort,
        runs=5,
        timeout=60.0,
        summary="daemon thread enqueuing pocl kernels at exit: SIGABRT (terminate)",
        protected="pyopencl_daemon_protected.py",
        # pytools warns about a missing optional hash module on every import
        env=(("PYTHONWARNINGS", "ignore"),),
        system=("/etc/OpenCL/vendors/pocl*.icd", "pocl (Debian pocl-opencl-icd)"),
        kinds=("thread-in-native",),
        clean_from=(
            (3, 14), _UNWOUND_NO_MORE + " (5 runs of 5 clean on 3.14.10 and on 3.15.2, 2026-11-29)"
        ),
    ),
    Case(
        id="wgpu-fork-child",
        program="wgpu_fork_child.py",
        package="wgpu",
        fails=fork_child_unclean,
        runs=3,
        timeout=10.0,
        summary="forked child's sys.exit(0) hangs or aborts releasing inherited wgpu objects",
        protected="wgpu_fork_child_protected.py",
        # Mesa prints an error line for a missing runtime dir; give it one
        env=(("XDG_RUNTIME_DIR", "/tmp"),),
        system=("/usr/share/vulkan/icd.d/lvp_icd*.json",
                "Mesa lavapipe (Debian mesa-vulkan-drivers)"),
        kinds=("child-process",),
        unnamed_when=(
            r"child exited with -11",
            # seen once in CI (3.11, 1 s, no faulthandler output anywhere): the child
            # crashed after its interpreter had ended faulthandler (a C exit handler of the
            # driver), and only the parent, which reaps it, sees its status
            "a forked child that dies by SIGSEGV after its interpreter ended faulthandler"
            " leaves no trace the run can read: only the program's own line says so",
        ),
    ),
    Case(
        id="wgpu-del-readback",
        program="wgpu_del_readback.py",
        package="wgpu",
        fails=readback_ignored,
        runs=3,
        timeout=20.0,
        summary="the program's own __del__ reads a wgpu buffer back at finalization: the "
                "queue is gone, the read-back raises (ignored), the result is never written",
        protected="wgpu_del_readback_protected.py",
        env=(("XDG_RUNTIME_DIR", "/tmp"),),
        system=("/usr/share/vulkan/icd.d/lvp_icd*.json",
                "Mesa lavapipe (Debian mesa-vulkan-drivers)"),
        kinds=("unraisable-at-exit",),
    ),
    Case(
        id="h5py-daemon-writer",
        program="h5py_daemon_writer.py",
        package="h5py",
        fails=writer_used_closed_file,
        runs=3,
        timeout=15.0,
        summary="daemon thread writing an h5py file that the program closes at exit "
                "(atexit): closed under the writer (its exception printed, or a hang on "
                "h5py's lock)",
        protected="h5py_daemon_writer_protected.py",
        # the declared recipe: the writer thread is given a borrowing view of the file; and
        # the adoption alone, which parks the writer (it holds a dataset of the file's
        # package) before the file is closed
        also_protected=("h5py_daemon_writer_borrowing.py", "h5py_daemon_writer_adopted.py"),
        reads_back="import h5py; assert h5py.File('frames.h5')['frames'].shape == (64, 16384)",
        # Found here and fixed in exitsafe._quiesce: a library's function entered from its
        # native code (h5py's Cython with_phil wrapper, holding h5py's lock) was taken for a
        # safe point; sysconfig was first imported inside the profile function (a deadlock
        # on the import lock, 3.13.0); on 3.9-3.11 a "return" by an exception killed the
        # thread ("PyObject is NULL").  Measured since: 20 of 20 clean on 3.9, 3.10, 3.11
        # and 3.13, 19 of 20 on 3.12 (a hang: weakref.py's remove(), the callback of h5py's
        # object registry run by a deallocation under h5py's lock, looked like a call from
        # the program's frame at `frames[i % 64] = row`).  Fixed next: a call event is a
        # safe point only where the caller executes a call instruction.  Then 20 of 20 on
        # 3.11 and 3.13, and in CI (2026-11-28, a loaded machine) on every one of 3.9-3.13.
        # (the writer's exception; or h5py's deallocator waiting for ever on h5py's lock,
        # named deadlock-at-exit when the trace saw the stopped writer holding it; or, 1 run
        # in about 100 on 3.14, the writer printing that exception while the interpreter
        # finalizes: "could not acquire lock for <stderr>", SIGABRT, a crash at exit)
        kinds=("thread-exception", "hang-in-finalizer", "deadlock-at-exit", "crash-at-exit"),
    ),
    Case(
        id="cairocffi-daemon",
        program="cairocffi_daemon.py",
        package="cairocffi",
        fails=segfault_in_released_object,
        runs=6,  # (3 runs without a failure: 1 series in 6 on a loaded machine)
        timeout=30.0,
        summary="daemon thread filling a cairo surface that the program finishes at exit "
                "(atexit): SIGSEGV in pixman",
        protected="cairocffi_daemon_protected.py",
        # the adoption alone, in place of the atexit line: the painter is parked first
        also_protected=("cairocffi_daemon_adopted.py",),
        system=("/usr/lib/*/libcairo.so.2", "cairo (Debian libcairo2)"),
        # from 3.14 any unclean end counts (the fails predicate): the painter's cairo call
        # may also raise on the finished surface instead of crashing (CI, 3.14.10, exit 0)
        kinds=("thread-crash-at-exit", "thread-exception"),
    ),
    Case(
        id="opencv-daemon",
        program="opencv_daemon.py",
        package="cv2",
        fails=forced_unwind_abort,
        runs=3,
        timeout=30.0,
        summary="daemon thread in cv2.GaussianBlur at exit: SIGABRT (forced unwind)",
        protected="opencv_daemon_protected.py",
        # the declared recipe: the worker's OpenCV call inside `with exitsafe.native("cv2"):`
        also_protected=("opencv_daemon_native.py",),
        # Found here and fixed in exitsafe._quiesce: cv2.GaussianBlur.__module__ is None and
        # its type's module is builtins, so a worker in flight in it was taken for idle in
        # the standard library (now: the module the name goes through, cv2).  Measured since:
        # 20 of 20 clean on 3.9, 3.10, 3.11, 3.12 and 3.13 in series run alone, but one
        # series on 3.9 under a loaded machine aborted 14 of 20 ("FATAL: exception not
        # rethrown": the worker unwound, not parked), not seen again: 20 of 20 on every one
        # of 3.9-3.13 in CI since (2026-11-28, a loaded machine).
        kinds=("thread-in-native",),
        clean_from=(
            (3, 14), _UNWOUND_NO_MORE + " (3 runs of 3 clean on 3.14.10 and on 3.15.2, 2026-11-29)"
        ),
    ),
    Case(
        id="h5py-pool-terminate",
        program="h5py_pool_terminate.py",
        package="h5py",
        fails=shards_unreadable,
        runs=3,
        timeout=60.0,
        summary="with multiprocessing.Pool(...) ends with terminate(): the workers' HDF5 "
                "shards are never closed and read back as unreadable",
        protected="h5py_pool_terminate_protected.py",
        # (the protected program also checks each worker's ledger)
        env=(("EXITSAFE_LEDGER", "ledger-{pid}.json"),),
        unnamed="the workers die by the pool's SIGTERM, which the parent's run cannot see: "
                "the report is the program's own read-back failure (exit status 1)",
    ),
    Case(
        id="duckdb-daemon-query",
        program="duckdb_daemon_query.py",
        package="duckdb",
        fails=interrupted_query,
        runs=3,
        timeout=30.0,
        summary="daemon thread inside a DuckDB query at exit: its interrupted query's "
                "exception printed, or SIGABRT (forced unwind)",
        protected="duckdb_daemon_query_protected.py",
        # (the forced unwind's abort; or the interrupted query's exception, printed)
        kinds=("thread-in-native", "thread-exception"),
        clean_from=(
            (3, 14), _UNWOUND_NO_MORE + " (3 runs of 3 clean on 3.14.10 and on 3.15.2, 2026-11-29)"
        ),
        # (the interrupted query's exception did not go: once in CI on 3.15.2, 2026-11-30,
        # the worker's traceback was printed, the process not killed)
        still_from=("thread-exception",),
    ),
    Case(
        id="pyzmq-daemon-receiver",
        program="pyzmq_daemon_receiver.py",
        package="zmq",
        fails=socket_closed_under_receiver,
        # (up to 10: the test stops at the first failure, so more runs cost only a series
        # that exits clean; with three programs at once on two cores 6 runs of 10 exited
        # clean on 3.12, where 20 of 20 failed with one other program running)
        runs=10,
        timeout=30.0,
        summary="daemon thread blocked in a ZeroMQ recv() while the context is destroyed at "
                "exit: libzmq's assertion aborts the process, or ContextTerminated printed",
        protected="pyzmq_daemon_receiver_protected.py",
        # (libzmq's assertion; or, on 3.10 and 3.12 mostly, the receiver's ContextTerminated;
        # or, seen once in CI on 3.13, the receiver's ContextTerminated and then ``term()``
        # waiting for ever for the socket whose close raced with the receiver's recv)
        # crash-at-exit: the receiver's exception printed while the interpreter finalized,
        # and CPython aborted on stderr's buffer lock (CI, 3.14.10): the diagnosis's
        # headline names it ("<stderr>'s lock was held by another thread")
        kinds=("native-fatal", "thread-exception", "hang-in-atexit", "crash-at-exit"),
    ),
    Case(
        id="jpype-exit-handler",
        program="jpype_exit_handler.py",
        package="jpype",
        fails=hang_in_jvm_shutdown,
        runs=2,
        # a hang case: the timeout is its detection; a protected run takes 1-3 s, 8 s on a
        # loaded machine (two cores, a dozen JVMs starting at once)
        timeout=20.0,
        summary="a non-daemon Java pool adopted to be shut down at exit: JPype's atexit "
                "JVM shutdown runs first and waits for it for ever (hang in _JTerminate)",
        protected="jpype_exit_handler_protected.py",
        system=("/usr/lib/jvm/*/lib/server/libjvm.so", "a JDK (Debian default-jdk-headless)"),
        kinds=("hang-in-atexit",),
    ),
    Case(
        id="pyside6-qthread",
        program="pyside6_qthread.py",
        package="PySide6",
        fails=qthread_destroyed_running,
        runs=3,
        timeout=20.0,
        summary="a QThread subclass still hashing when the program ends: \"QThread: "
                "Destroyed while thread is still running\", SIGABRT",
        protected="pyside6_qthread_protected.py",
        env=(("QT_QPA_PLATFORM", "offscreen"),),
        # QtCore's only system library not in a minimal Debian (libgthread-2.0)
        system=("/usr/lib/*/libglib-2.0.so.0", "GLib (Debian libglib2.0-0)"),
        kinds=("native-fatal",),
    ),
    Case(
        id="pyav-daemon-decoder",
        program="pyav_daemon_decoder.py",
        package="av",
        fails=container_closed_under_reader,
        runs=5,
        timeout=20.0,
        summary="daemon thread decoding a PyAV input container that the program closes at "
                "exit (atexit): SIGSEGV or SIGABRT in the demuxer",
        # the one line, ``exitsafe.quiesce()``, the program's own ``atexit`` close kept
        # (60 of 60 on each of 3.9-3.13); the other recipe adopts the container in place of
        # that line: the teardown parks the player, then closes it (at the bound it would
        # leak it, not close it under the read)
        protected="pyav_daemon_decoder_protected.py",
        also_protected=("pyav_daemon_decoder_adopted.py",),
        # (a crash or a bare abort on the player's thread; rarely its traceback; once, in
        # CI on 3.10, glibc's own heap check aborted the process on the main thread
        # ("munmap_chunk(): invalid pointer"), the player still alive: native-fatal, whose
        # report names the player and the thread recipe; once in 5 on 3.12 and once in 10
        # on 3.9 here, the player's SIGSEGV, then glibc's "malloc_consolidate(): invalid
        # chunk size" abort on the main thread during the fault's dump: the crash came
        # first, so thread-crash-at-exit)
        kinds=("thread-crash-at-exit", "thread-exception", "native-fatal"),
    ),
    Case(
        id="pyarrow-daemon-writer",
        program="pyarrow_daemon_writer.py",
        package="pyarrow",
        fails=writer_closed_under_write,
        runs=6,  # (3 runs without a failure: 1 series in 6 on a loaded machine)
        timeout=20.0,
        summary="daemon thread in ParquetWriter.write_batch() while atexit closes the writer: "
                "SIGSEGV, SIGABRT or close()'s error printed, the Parquet file unreadable",
        protected="pyarrow_daemon_writer_protected.py",
        # the adoption alone, in place of the atexit line: the writer is parked first
        also_protected=("pyarrow_daemon_writer_adopted.py",),
        # (the footer written: every row group it announces is there)
        reads_back="import pyarrow.parquet as pq; assert pq.read_table('batches.parquet').num_rows",
        # (each way it fails has its kind: the writer's exception, its crash or C++ abort,
        # atexit's close raising; a bare crash-at-exit when the crash's dump and the close's
        # traceback, written at once by two threads, interleave: 1 run in 30 to 1 in 3; and
        # thread-in-native when the writer, let run again by the close's native call, is
        # unwound inside Arrow's C++ ("pure virtual method called", "terminate called
        # without an active exception", SIGABRT): seen once in CI on 3.9, 2026-11-29)
        kinds=("thread-exception", "thread-crash-at-exit", "native-fatal", "atexit-error",
               "crash-at-exit", "thread-in-native"),
    ),
    Case(
        id="soundfile-daemon-writer",
        program="soundfile_daemon_writer.py",
        package="soundfile",
        fails=file_closed_under_write,
        runs=6,
        timeout=20.0,
        summary="daemon thread in SoundFile.write() (FLAC) while atexit closes the file: "
                "SIGSEGV in libsndfile, or the writer's exception printed",
        protected="soundfile_daemon_writer_protected.py",
        # (libsndfile is bundled in soundfile's Linux wheels: no system library needed)
        # (the writer's crash, or its exception; glibc's heap check, "free(): corrupted
        # unsorted chunks", 2 runs in about 300 on 3.13; a SIGSEGV on the main thread in
        # the atexit close() while the writer is inside libsndfile, 6 runs of 200 on
        # 3.9-3.13, which was reported with no kind until the thread rule named a crash in
        # an exit handler with a daemon thread running)
        kinds=("thread-crash-at-exit", "thread-exception", "native-fatal"),
    ),
]


@dataclass(frozen=True)
class RealEnv:
    """One interpreter's environment made by ``.ci/install-real``."""

    version: Version
    python: Path
    #: import name -> installed version, "-" where it could not be installed
    packages: dict

    @property
    def name(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def real_envs() -> list[RealEnv]:
    """The environments listed in ``.venv-real/available.txt`` whose interpreter exists."""
    listing = REAL_ENVS / "available.txt"
    found: dict[str, dict] = {}
    if listing.exists():
        for line in listing.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                found.setdefault(parts[0], {})[parts[1]] = parts[2]
    envs = []
    for name, packages in found.items():
        python = REAL_ENVS / name / "bin" / "python"
        if python.exists():
            major, minor = (int(p) for p in name.split("."))
            envs.append(RealEnv((major, minor), python, packages))
    return sorted(envs, key=lambda env: env.version)
