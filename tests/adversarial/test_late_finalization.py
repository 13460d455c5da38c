"""Late in interpreter shutdown, after the exit teardown: nothing may wait for exitsafe's
lock.  A daemon thread that was inside one of exitsafe's steps when the interpreter began
finalizing never runs again and holds the lock for ever; a finalizer that then asks for a
release, a retain, a borrow or a registration must answer at once (a wait would hang the
exit; on CPython 3.15 taking such a lock raises ``PythonFinalizationError``).
"""

from __future__ import annotations

from ..support import assert_clean, run_program

#: In a module of its own: a daemon thread running a function of ``__main__`` would keep
#: ``__main__``'s globals (the finalizer under test) alive through its frame.
FREEZER = """
import threading

take, taken = threading.Event(), threading.Event()


def freeze_inside_exitsafe():
    take.wait()
    # Imported only now, when the program has long imported exitsafe: importing it at the
    # thread's start raced the program's own atexit.register, and when it won, exitsafe's
    # exit callback was registered first and so ran *after* after_exitsafe, finding the
    # lock already frozen (the test's own race, about 1 run in 8 under load).
    import exitsafe._sync as probe

    probe.LOCK.acquire()  # never released: this thread stands for one frozen mid-step
    taken.set()
    threading.Event().wait()


threading.Thread(target=freeze_inside_exitsafe, daemon=True).start()
"""

PROGRAM = """
    import atexit, os, sys

    sys.path.insert(0, os.getcwd())
    from freezer import take, taken

    def after_exitsafe():  # registered before exitsafe's callback: runs after it
        take.set()
        taken.wait()

    atexit.register(after_exitsafe)
    import exitsafe

    reg = exitsafe.Registry("late")
    h = reg.track("h", print, name="h")

    class Binding:
        def __del__(self):  # runs during module finalization, after the teardown
            h.release()
            try:
                h.retain()
            except exitsafe.HandleClosedError:
                pass
            try:
                with h.borrow():
                    pass
            except exitsafe.HandleClosedError:
                pass
            reg.track("late", print, name="late")
            os.write(1, f"finalizer done, late requests {reg.late_requests}\\n".encode())

    BINDING = Binding()
"""


def test_finalizers_never_wait_for_a_lock_a_frozen_thread_holds(tmp_path):
    (tmp_path / "freezer.py").write_text(FREEZER)
    run = run_program(PROGRAM, tmp_path, prelude=False, timeout=30)
    assert_clean(run)
    assert "finalizer done, late requests 1" in run.stdout
