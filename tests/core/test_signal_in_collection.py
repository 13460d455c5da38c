"""A signal whose handler runs inside a garbage collection on the main thread.

A handler runs at the main thread's next bytecode, and a collection runs bytecode: the
finalizers of its garbage, the functions of ``gc.callbacks`` (a dask worker's memory
monitor collects as its memory grows, just when the nanny sends SIGTERM).  There a
teardown waits for the collection's end (``exitsafe._collection``), and CPython drops
what a finalizer raises.  Before the fix the immediate mode died by the signal with the
teardown still waiting (what the program tracked never released: a real dask worker's
HDF5 shard left unreadable, 3 runs in 4), and the exit mode's ``SystemExit`` was printed
as ignored and the program ran on.  Here a finalizer sends the signal itself, so the
handler lands inside the collection every time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

PROGRAM = textwrap.dedent(
    """
    import gc, os, signal, sys, time, exitsafe
    from exitsafe.signals import teardown_on_signals
    log = sys.argv[2]
    def record(raw):
        with open(log, "a") as fh:
            fh.write(raw + "\\n")
    device = exitsafe.track("device", record)
    teardown_on_signals("SIGTERM", mode=sys.argv[1])

    class Garbage:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # bytecode of a finalizer: the handler runs here
                pass
            record("finalizer-done")

    garbage = Garbage()
    garbage.cycle = garbage
    del garbage
    gc.collect()
    record("collected")
    time.sleep(30)  # (the exit mode's signal is sent again after the collection)
    record("ran-on")
    """
)


def run(tmp_path, mode: str) -> tuple[int, list[str], str]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    log = tmp_path / "events.log"
    proc = subprocess.run([sys.executable, str(script), mode, str(log)],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, log.read_text().split() if log.exists() else [], proc.stderr


def test_immediate_mode_tears_down_when_the_collection_ends(tmp_path) -> None:
    code, events, err = run(tmp_path, "immediate")
    assert code == -signal.SIGTERM, err
    # the finalizer finished, then the teardown ran at the collection's end, and the
    # process died by the signal before the program's next line
    assert events == ["finalizer-done", "device"], err
    assert "Traceback" not in err and "ignored" not in err, err


def test_exit_mode_exits_after_the_collection(tmp_path) -> None:
    code, events, err = run(tmp_path, "exit")
    assert code == 128 + signal.SIGTERM, err
    # the SystemExit raised in the main thread's code after the collection: never in the
    # finalizer (where it was ignored), and before the program's 30 s sleep ended
    assert events[:1] == ["finalizer-done"] and events[-1] == "device", (events, err)
    assert "ran-on" not in events, err
    assert "ignored" not in err and "Traceback" not in err, err
