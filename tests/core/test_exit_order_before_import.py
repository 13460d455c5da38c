"""Order against the exit handlers of other libraries (issue 26, rule 4), for a library
imported *before* exitsafe: its ``atexit`` handler is registered before exitsafe's.

docs/threads.md ("Before other libraries' exit handlers") promises, ``atexit`` running its
callbacks newest first:

- early hooks (``adopt(..., early=True)``) run when the main thread finished, before every
  ``atexit`` callback;
- then the handlers of the libraries imported after exitsafe, then exitsafe's teardown
  (a plain ``adopt``), then the handlers of those imported before.

tests/core/test_exit_order.py covers a handler registered after exitsafe's; these programs
register one before ``import exitsafe`` (and one after, so that one run pins the whole
row of the table).
"""

from __future__ import annotations

import pytest

from ..support import assert_clean, run_program

PROGRAM = """
    import atexit
    import os

    _LOG = os.open(os.environ["ORDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(raw):
        os.write(_LOG, (str(raw) + "\\n").encode())

    {before}

    import exitsafe

    {after}

    class Pool:
        closed = False

        def shutdown(self):
            record("pool shut down")
            self.closed = True

    pool = Pool()
    exitsafe.adopt(pool, close="shutdown", early={early})

    def library_handler(which):  # says whether the pool was shut down before it ran
        record(f"{{which}} handler: pool closed={{pool.closed}}")

    record("main done")
"""

BEFORE = 'atexit.register(lambda: library_handler("imported before"))'
AFTER = 'atexit.register(lambda: library_handler("imported after"))'


def run(tmp_path, *, early, after):
    body = PROGRAM.format(before=BEFORE, after=AFTER if after else "", early=early)
    result = run_program(body, tmp_path, prelude=False, ledger=True, timeout=30)
    assert_clean(result)
    return result


def test_the_teardown_runs_before_a_handler_registered_before_import_exitsafe(tmp_path):
    result = run(tmp_path, early=False, after=False)
    assert result.order == [
        "main done",
        "pool shut down",
        "imported before handler: pool closed=True",
    ], result.describe()
    assert result.outcomes()["Pool#1"] == "released_at_exit"


def test_an_early_close_runs_before_a_handler_registered_before_import_exitsafe(tmp_path):
    result = run(tmp_path, early=True, after=False)
    assert result.order == [
        "main done",
        "pool shut down",
        "imported before handler: pool closed=True",
    ], result.describe()
    outcomes = result.outcomes()
    assert outcomes["close Pool#1"] == "hook_ran"
    assert outcomes["Pool#1"] == "released"


@pytest.mark.parametrize(
    ("early", "expected"),
    [
        # atexit, newest first: the library imported after, exitsafe's teardown, the one
        # imported before
        (False, [
            "main done",
            "imported after handler: pool closed=False",
            "pool shut down",
            "imported before handler: pool closed=True",
        ]),
        # the early phase first, whatever the order of the imports
        (True, [
            "main done",
            "pool shut down",
            "imported after handler: pool closed=True",
            "imported before handler: pool closed=True",
        ]),
    ],
    ids=["teardown", "early"],
)
def test_the_table_of_what_runs_when_with_handlers_on_both_sides(tmp_path, early, expected):
    result = run(tmp_path, early=early, after=True)
    assert result.order == expected, result.describe()
