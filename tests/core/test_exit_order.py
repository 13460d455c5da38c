"""Order against the exit handlers of other libraries: ``adopt(..., early=True)`` closes an
object before any ``atexit`` callback, a library's own handler registered at import after
exitsafe's included (JPype's JVM shutdown, which waits for the threads of its pools)."""

from __future__ import annotations

import pytest

import exitsafe

from ..support import assert_clean, run_program

#: A library whose exit handler (registered at import, after exitsafe's) waits until its
#: pool was shut down: it hangs unless the pool is closed before it runs.
LIBRARY = """
    import atexit

    class Pool:
        def __init__(self):
            self.closed = threading.Event()

        def shutdown(self):
            record("pool shut down")
            self.closed.set()

    pools = []

    @atexit.register
    def _library_exit():  # waits for its pools, as the JVM waits for non-daemon threads
        for pool in pools:
            pool.closed.wait()
        record("library exit handler done")

    pool = Pool()
    pools.append(pool)
"""


def test_an_early_adopted_object_is_closed_before_a_librarys_exit_handler(tmp_path):
    body = LIBRARY + '    h = exitsafe.adopt(pool, close="shutdown", early=True)\n'
    run = run_program(body, tmp_path, ledger=True, timeout=20)
    assert_clean(run)
    assert run.order == ["pool shut down", "library exit handler done"]
    outcomes = run.outcomes()
    assert outcomes["close Pool#1"] == "hook_ran"
    assert outcomes["Pool#1"] == "released"


def test_adopted_in_the_teardown_the_librarys_handler_waits_first_and_hangs(tmp_path):
    body = LIBRARY + '    h = exitsafe.adopt(pool, close="shutdown")\n'
    run = run_program(body, tmp_path, timeout=5)
    assert run.hung and run.order == []


def test_an_early_close_released_before_the_exit_is_cancelled():
    reg = exitsafe.Registry("early", ledger_limit=None)
    log: list[str] = []

    class Pool:
        def shutdown(self) -> None:
            log.append("shut down")

    h = exitsafe.adopt(Pool(), close="shutdown", early=True, registry=reg, name="pool")
    h.release()
    reg.teardown()
    assert log == ["shut down"]
    assert {e.name: e.outcome for e in reg.ledger()} == {
        "pool": "released", "close pool": "hook_cancelled",
    }


def test_early_is_checked():
    with pytest.raises(TypeError, match="early must be True or False, got str"):
        exitsafe.adopt(object(), close=None, early="yes")  # type: ignore[arg-type]
