"""Non-idempotent finalizers at the exit (issue 26, rule 5): once the exit has closed an
adopted object, that object's own ``__del__``, run later by the interpreter's finalization
(the object is still referenced by a module global), does nothing: the object's class is
swapped for a twin whose ``__del__`` does nothing, and with ``neutralize=`` the attribute
it would act on is cleared too.

The object stands for a third-party wrapper whose ``close()`` frees its native handle but
leaves the attribute set, and whose ``__del__`` frees whatever the attribute holds: run after
the close, it frees the handle a second time.  Its "native library" aborts the process on a
double free, as glibc does, so without exitsafe the hazard is a crash every run.  Each
program records what ran in the order log (with functions bound at definition, since
finalization clears the module's globals before the object goes).
"""

from __future__ import annotations

import signal

import pytest

from ..support import assert_clean, run_program

PROGRAM = """
    class Library:  # stands for the C library: freeing a handle twice aborts the process
        def __init__(self):
            self.live = set()
            self.count = 0

        def alloc(self):
            self.count += 1
            self.live.add(self.count)
            return self.count

        def free(self, handle, _write=os.write, _abort=os.abort, _note=record):
            if handle not in self.live:
                _note(f"double free of handle {{handle}}")
                _write(2, b"double free detected\\n")
                _abort()
            self.live.discard(handle)
            _note(f"freed handle {{handle}}")

    lib = Library()

    class Native:
        def __init__(self):
            self._lib = lib
            self._handle = lib.alloc()

        def close(self):  # not idempotent: frees the handle, leaves the attribute set
            record("close")
            self._lib.free(self._handle)

        def __del__(self, _note=record):
            _note("__del__ ran")
            if self._handle is not None:
                self._lib.free(self._handle)

    obj = Native()
    {adoption}
    record("main done")
"""

#: The program's own close at exit, without exitsafe: the control.
OWN_CLOSE = "import atexit; atexit.register(obj.close)"

#: How the close is named: the method, the ``__del__`` itself (which exitsafe recognises:
#: the object's class becomes a twin without ``__del__``), or the same ``__del__`` hidden in
#: a lambda (not recognised: only the neutralization keeps the second run harmless).
CLOSES = {
    "method": '"close"',
    "del": "type(obj).__del__",
    "del-in-a-lambda": "lambda o: type(o).__del__(o)",
}

#: What the close itself records, per kind of close.
CLOSE_RECORDS = {
    "method": ["close", "freed handle 1"],
    "del": ["__del__ ran", "freed handle 1"],
    "del-in-a-lambda": ["__del__ ran", "freed handle 1"],
}


def run(tmp_path, close, *, neutralize, early=False, adoption=None):
    if adoption is None:
        options = ', neutralize="_handle"' if neutralize else ""
        adoption = f"handle = exitsafe.adopt(obj, close={CLOSES[close]}, early={early}{options})"
    return run_program(PROGRAM.format(adoption=adoption), tmp_path, ledger=True, timeout=30)


@pytest.mark.parametrize("neutralize", [False, True], ids=["plain", "neutralize"])
@pytest.mark.parametrize("early", [False, True], ids=["teardown", "early"])
@pytest.mark.parametrize("close", ["method", "del-in-a-lambda"])
def test_the_finalizer_of_an_object_closed_at_exit_does_nothing(
    tmp_path, close, early, neutralize
):
    result = run(tmp_path, close, neutralize=neutralize, early=early)
    assert_clean(result)
    assert "double free" not in result.stderr, result.describe()
    assert "may run again" not in result.stderr, result.describe()
    # The exit closed it once; the interpreter's finalization then collected it (the global
    # still referenced it) without running its __del__: its class is the twin's.
    assert result.order == ["main done", *CLOSE_RECORDS[close]], result.describe()
    outcomes = result.outcomes()
    if early:  # closed by the early hook (a release), before the teardown
        assert outcomes["Native#1"] == "released", outcomes
        assert outcomes["close Native#1"] == "hook_ran", outcomes
    else:
        assert outcomes["Native#1"] == "released_at_exit", outcomes


def test_without_exitsafe_the_finalizer_frees_again_and_aborts(tmp_path):
    """The control: the hazard is real, the same program closing the object with its own
    ``atexit`` callback dies by the second free."""
    result = run(tmp_path, "method", neutralize=False, adoption=OWN_CLOSE)
    assert result.returncode == -signal.SIGABRT, result.describe()
    assert "double free detected" in result.stderr, result.describe()
    assert result.order == [
        "main done", "close", "freed handle 1", "__del__ ran", "double free of handle 1",
    ], result.describe()


def test_a_close_before_the_exit_leaves_the_class_and_its_finalizer_alone(tmp_path):
    """Released by the program while it runs, the object keeps its class (``type(obj) is
    Native``) and its ``__del__`` runs as it would: only the exit's closes swap it."""
    adoption = (
        'handle = exitsafe.adopt(obj, close="close", neutralize="_handle"); '
        "handle.release(); record(f'same class {type(obj) is Native}')"
    )
    result = run(tmp_path, "method", neutralize=True, adoption=adoption)
    assert_clean(result)
    assert result.order == [
        "close", "freed handle 1", "same class True", "main done", "__del__ ran",
    ], result.describe()


@pytest.mark.parametrize("neutralize", [False, True], ids=["plain", "neutralize"])
def test_a_del_adopted_as_the_close_does_not_run_again_at_finalization(tmp_path, neutralize):
    """``close=type(obj).__del__``: the destructor runs once, as the close, at the exit;
    the object, still referenced, is not finalized again (its class is the twin whose
    ``__del__`` does nothing), with or without ``neutralize=``."""
    result = run(tmp_path, "del", neutralize=neutralize)
    assert_clean(result)
    assert "may run again" not in result.stderr, result.describe()
    assert result.order == ["main done", *CLOSE_RECORDS["del"]], result.describe()
    assert result.outcomes()["Native#1"] == "released_at_exit", result.outcomes()


def test_a_class_with_its_own_subclass_hook_is_left_as_it_is(tmp_path):
    """A plugin base whose ``__init_subclass__`` registers (or refuses) every subclass: a
    twin made unasked would run that hook at exit.  The class is left alone (its
    ``__del__`` runs as it would), and the close stays a success."""
    body = """
    REGISTRY = {}

    class Plugin:
        def __init_subclass__(cls, **kw):
            super().__init_subclass__(**kw)
            if cls.__name__ in REGISTRY:
                raise ValueError(f"duplicate plugin {cls.__name__}")
            REGISTRY[cls.__name__] = cls

    class Device(Plugin):
        def close(self):
            record("close")

        def __del__(self, _record=record, _registry=REGISTRY):
            _record(f"__del__ ran, plugins {sorted(_registry)}")

    obj = Device()
    exitsafe.adopt(obj, close="close")
    """
    result = run_program(body, tmp_path, ledger=True, timeout=30)
    assert_clean(result)
    assert result.order == ["close", "__del__ ran, plugins ['Device']"], result.describe()
    assert result.outcomes() == {"Device#1": "released_at_exit"}, result.outcomes()
