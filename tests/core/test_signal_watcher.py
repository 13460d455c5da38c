"""teardown_on_signals(watch=True): a signal whose handler a native wait holds up is acted on.

The hazard is forced deterministically: the main thread blocks the signal, so the kernel
gives it to another thread; Python's C-level handler notes it there, and the main thread,
blocked in a ``multiprocessing`` lock (the wait of an idle pool worker), is never
interrupted: without the watcher the handler never runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from exitsafe.signals import teardown_on_signals

pytestmark = pytest.mark.skipif(
    os.name != "posix" or not hasattr(signal, "pthread_kill"), reason="POSIX signals"
)

LOST_WAKEUP = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, threading, time
    import exitsafe
    from exitsafe.signals import teardown_on_signals

    mode, watch, log = sys.argv[1], sys.argv[2] == "watch", sys.argv[3]
    teardown_on_signals("SIGTERM", mode=mode, watch=watch)
    shard = exitsafe.track(log, lambda path: open(path, "w").write("closed"), name="shard")

    blocked = threading.Event()

    def sender():
        blocked.wait()
        time.sleep(0.1)  # (the main thread is in the lock's wait by then)
        os.kill(os.getpid(), signal.SIGTERM)  # taken by a thread other than the main one

    threading.Thread(target=sender, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    lock = multiprocessing.Lock()
    lock.acquire()
    print("waiting", flush=True)
    blocked.set()
    lock.acquire()  # an idle pool worker's wait for its next task
    """
)


def _run(tmp_path, mode: str, watch: str, wait: float) -> tuple[object, str]:
    script = tmp_path / "prog.py"
    script.write_text(LOST_WAKEUP)
    log = tmp_path / "shard.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, watch, str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return "hung", log.read_text() if log.exists() else ""
    assert "Traceback" not in err, err
    assert out == "waiting\n"
    return proc.returncode, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("mode", ["exit", "immediate"])
def test_without_the_watcher_the_signal_waits_for_ever(tmp_path, mode):
    # (3 s is far beyond the 0.2 s the signal takes to come: the handler never runs)
    assert _run(tmp_path, mode, "no", wait=3) == ("hung", "")


@pytest.mark.parametrize(
    ("mode", "status"), [("exit", 128 + signal.SIGTERM), ("immediate", -signal.SIGTERM)]
)
def test_the_watcher_wakes_the_main_thread_so_the_teardown_runs(tmp_path, mode, status):
    assert _run(tmp_path, mode, "watch", wait=60) == (status, "closed")


FORKED = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, threading, time, warnings
    import exitsafe
    from exitsafe.signals import teardown_on_signals

    teardown_on_signals("SIGTERM", mode="immediate", watch=True)
    warnings.simplefilter("ignore", DeprecationWarning)  # (3.12+: a fork with two threads)
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), flush=True)
        time.sleep(0.5)  # (a wake or a signal meant for the child would reach us here)
        print("parent alive", flush=True)
        sys.exit(0)
    shard = exitsafe.track(sys.argv[1], lambda p: open(p, "w").write("closed"), name="shard")

    blocked = threading.Event()

    def sender():
        blocked.wait()
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=sender, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    lock = multiprocessing.Lock()
    lock.acquire()
    blocked.set()
    lock.acquire()
    """
)


def test_a_forked_child_gets_a_watcher_of_its_own_and_the_parent_is_left_alone(tmp_path):
    log = tmp_path / "shard.log"
    proc = subprocess.run(
        [sys.executable, "-c", FORKED, str(log)], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == [f"child {-signal.SIGTERM}", "parent alive"]
    assert proc.returncode == 0
    assert log.read_text() == "closed"


def test_the_watcher_is_not_a_thread_that_quiesce_waits_for(tmp_path):
    # quiesce() of every thread at a normal exit: the watcher is exitsafe's, never the
    # program's, so it neither parks nor counts as running (which would leak every handle).
    code = textwrap.dedent(
        """
        import sys, exitsafe
        from exitsafe.signals import teardown_on_signals
        teardown_on_signals("SIGTERM", mode="immediate", watch=True)
        exitsafe.quiesce(timeout=2)
        shard = exitsafe.track(sys.argv[1], lambda p: open(p, "w").write("closed"))
        """
    )
    log = tmp_path / "shard.log"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "still running" not in proc.stderr
    assert log.read_text() == "closed"


def _in_subprocess(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=60
    )


def test_a_wakeup_fd_of_the_program_is_refused_and_nothing_is_installed():
    proc = _in_subprocess(
        """
        import os, signal
        from exitsafe.signals import teardown_on_signals
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)  # as asyncio's signal handling does
        try:
            teardown_on_signals("SIGTERM", watch=True)
        except RuntimeError as exc:
            print(exc)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.set_wakeup_fd(-1) == w
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "cannot watch here: the program set a wakeup fd itself" in proc.stdout


def test_a_sigurg_handler_of_the_program_is_refused():
    proc = _in_subprocess(
        """
        import signal
        from exitsafe.signals import teardown_on_signals
        def mine(signum, frame): pass
        signal.signal(signal.SIGURG, mine)
        try:
            teardown_on_signals("SIGTERM", watch=True)
        except RuntimeError as exc:
            print(exc)
        assert signal.getsignal(signal.SIGURG) is mine
        assert signal.set_wakeup_fd(-1) == -1
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "the program handles SIGURG itself" in proc.stdout


def test_watch_must_be_a_bool_and_asked_from_the_main_thread():
    with pytest.raises(TypeError, match="watch must be True or False"):
        teardown_on_signals("SIGTERM", watch="yes")  # type: ignore[arg-type]
    proc = _in_subprocess(
        """
        import threading
        from exitsafe.signals import teardown_on_signals
        errors = []
        def off_main():
            try:
                teardown_on_signals("SIGTERM", watch=True)
            except ValueError as exc:
                errors.append(str(exc))
        t = threading.Thread(target=off_main)
        t.start(); t.join()
        print(errors)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "main thread" in proc.stdout


#: The end of a program: the main thread waits as an idle pool worker does, SIGTERM blocked,
#: and a thread sends it SIGTERM once it is in the wait (the C handler runs elsewhere).
IDLE_WORKER_GETS_SIGTERM = textwrap.dedent(
    """
    blocked = threading.Event()
    threading.Thread(target=lambda: (blocked.wait(), time.sleep(0.1),
                                     os.kill(os.getpid(), signal.SIGTERM)), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    lock = multiprocessing.Lock()
    lock.acquire()
    blocked.set()
    lock.acquire()
    """
)


def test_a_second_call_watches_a_signal_an_earlier_call_took():
    # the application took SIGTERM ("exit" mode); the pool initializer asks to watch it
    proc = _in_subprocess(textwrap.dedent(
        """
        import multiprocessing, os, signal, threading, time
        from exitsafe.signals import teardown_on_signals
        teardown_on_signals("SIGTERM")
        print(teardown_on_signals("SIGTERM", mode="immediate", watch=True), flush=True)
        """
    ) + IDLE_WORKER_GETS_SIGTERM)
    assert proc.stdout == "{}\n"  # (no handler installed again: the first call's mode stays)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr


def test_a_second_signal_soon_after_a_handled_one_is_woken_too():
    proc = _in_subprocess(textwrap.dedent(
        """
        import multiprocessing, os, signal, threading, time
        from exitsafe.signals import teardown_on_signals
        teardown_on_signals("SIGTERM", watch=True)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except SystemExit:
            print("first handled", flush=True)
        """
    ) + IDLE_WORKER_GETS_SIGTERM)
    assert proc.stdout == "first handled\n"
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr


def test_a_handler_the_program_installs_later_gets_no_wakes():
    # each wake interrupts a native call that does not retry (usleep through ctypes)
    proc = _in_subprocess(
        """
        import ctypes, os, signal, threading, time
        from exitsafe.signals import teardown_on_signals
        teardown_on_signals("SIGTERM", watch=True)
        stop = []
        signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))  # the program's own
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        libc = ctypes.CDLL(None)
        interrupted, started = 0, time.monotonic()
        while time.monotonic() - started < 2:
            interrupted += libc.usleep(100_000) != 0
        print(stop, interrupted)
        """
    )
    assert proc.returncode == 0, proc.stderr
    stop, interrupted = proc.stdout.split(" ")
    assert stop == f"[{int(signal.SIGTERM)}]"
    assert int(interrupted) <= 1  # (the signal itself; the watcher sends none)


def test_descriptors_the_program_closed_and_reopened_are_left_alone():
    # a daemonizing program closes every low descriptor and opens its own files there;
    # the watcher's pipe is elsewhere, and a forked child does not close the program's
    proc = _in_subprocess(
        """
        import os, signal, sys, tempfile, warnings
        from exitsafe.signals import teardown_on_signals
        teardown_on_signals("SIGTERM", watch=True)
        os.closerange(3, 64)
        directory = tempfile.mkdtemp()
        a = open(os.path.join(directory, "a"), "w")
        b = open(os.path.join(directory, "b"), "w")
        signal.signal(signal.SIGUSR1, lambda *args: None)
        os.kill(os.getpid(), signal.SIGUSR1)  # (its byte must go to the watcher's pipe)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
        if pid == 0:
            b.write("child\\n")
            b.flush()
            os._exit(0)
        os.waitpid(pid, 0)
        a.close()
        b.close()
        print(repr(open(a.name).read()), repr(open(b.name).read()))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "'' 'child\\n'\n"
    assert "wakeup fd" not in proc.stderr
