"""exitsafe.exit() called by a teardown step that runs on a worker thread (a step under
a timeout).

Such a step used to leave the teardown running in parallel with the exit it started:
the thread calling exit() waited (5 s) for the teardown that waited for it, and the
ledger was written before the teardown recorded any outcome (or the step ended
``leaked_timeout``).  Now the step hands the exit to the thread running the teardown,
which finishes it (every outcome recorded once) and then leaves with the status asked
for.

Every step timeout here is far longer than the test: the exit is handed back at once,
so no wait in these programs depends on timing.
"""

from __future__ import annotations

import collections
import os
import textwrap

import pytest

from ..support import run_program

#: Long enough never to be reached: a step that hands its exit back ends at once.
NEVER = 600

#: Handles of the default registry, around the release that calls exitsafe.exit(3) on
#: its worker thread: "a" is what it depends on, "c" depends on it, the others are
#: independent (timed, untimed, a timed hook, a library), and a second registry.
HANDLES = f"""
    lib = exitsafe.pin("lib", close=lambda raw: record("closed lib"), name="lib")
    a = exitsafe.track("a", lambda raw: record("released a"), name="a", depends_on=[lib])
    b = exitsafe.track(
        "b", lambda raw: exitsafe.exit(3), name="b", depends_on=[a], timeout={NEVER}
    )
    c = exitsafe.track("c", lambda raw: record("released c"), name="c", depends_on=[b])
    d = exitsafe.track("d", lambda raw: record("released d"), name="d", timeout={NEVER})
    e = exitsafe.track("e", lambda raw: record("released e"), name="e")
    exitsafe.on_teardown(lambda: record("hook ran"), name="hook", timeout={NEVER})
    other = exitsafe.Registry("other", step_timeout={NEVER})
    x = other.track("x", lambda raw: record("released x"), name="x")
"""

EXPECTED_DEFAULT = {
    "hook": "hook_ran",
    "lib": "leaked_dependent",
    "a": "leaked_dependent",  # b's release never finished: a must outlive it
    "b": "leaked_interrupted",
    "c": "released_at_exit",
    "d": "released_at_exit",
    "e": "released_at_exit",
}

ENDS = {
    "atexit": "",
    "explicit": """
        exitsafe.teardown()
        record("never reached")
    """,
    "exit": """
        exitsafe.exit(0)  # its teardown's step asks for 3: the step's exit wins
    """,
    "thread": """
        t = threading.Thread(target=exitsafe.teardown, name="tearing-down")
        t.start()
        t.join()
        record("never reached")
    """,
}


def entries_by_registry(run) -> dict[str, list[dict]]:
    return {reg["name"]: reg["entries"] for reg in run.ledger()["registries"]}


def assert_one_outcome_each(run, expected: dict[str, dict[str, str]]) -> None:
    """Every handle of every registry has exactly one entry, with the outcome expected."""
    found = entries_by_registry(run)
    assert set(found) == set(expected), run.describe()
    for name, entries in found.items():
        seen = collections.Counter(e["name"] for e in entries)
        assert all(n == 1 for n in seen.values()), (name, seen, run.describe())
        assert {e["name"]: e["outcome"] for e in entries} == expected[name], run.describe()


def assert_no_temporary_files(tmp_path) -> None:
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("end", sorted(ENDS))
def test_exit_from_a_timed_release_ends_the_process_after_one_whole_teardown(tmp_path, end):
    body = textwrap.dedent(HANDLES) + textwrap.dedent(ENDS[end])
    run = run_program(body, tmp_path, ledger=True)
    assert not run.hung, run.describe()
    assert run.returncode == 3, run.describe()
    assert_one_outcome_each(
        run, {"default": EXPECTED_DEFAULT, "other": {"x": "released_at_exit"}}
    )
    b = next(e for e in entries_by_registry(run)["default"] if e["name"] == "b")
    assert "exitsafe.exit(3)" in b["detail"], run.describe()
    assert sorted(run.order) == [
        "hook ran", "released c", "released d", "released e", "released x"
    ], run.describe()
    assert "gave up waiting" not in run.stderr, run.describe()
    assert_no_temporary_files(tmp_path)


def test_exit_from_a_registry_step_timeout_leaves_the_other_registries_complete(tmp_path):
    body = f"""
        first = exitsafe.track("first", lambda raw: record("released first"), name="first")
        timed = exitsafe.Registry("timed", step_timeout={NEVER})
        handles = [
            timed.track(i, lambda raw: record(f"released {{raw}}"), name=f"h{{i}}")
            for i in range(5)
        ]
        leaving = timed.track("leaving", lambda raw: exitsafe.exit(5), name="leaving")
        later = exitsafe.Registry("later")
        last = later.track("last", lambda raw: record("released last"), name="last")
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 5, run.describe()
    assert_one_outcome_each(
        run,
        {
            "default": {"first": "released_at_exit"},
            "timed": {
                "leaving": "leaked_interrupted", **{f"h{i}": "released_at_exit" for i in range(5)}
            },
            "later": {"last": "released_at_exit"},
        },
    )
    assert sorted(run.order) == sorted(
        ["released first", "released last", *(f"released {i}" for i in range(5))]
    )


def test_exit_from_a_timed_hook_leaks_what_it_had_to_run_before(tmp_path):
    body = f"""
        buf = exitsafe.track("buf", lambda raw: record("released buf"), name="buf")
        other = exitsafe.track("other", lambda raw: record("released other"), name="other")

        def flush():
            record("flushing")
            exitsafe.exit(4)

        exitsafe.on_teardown(flush, before=[buf], name="flush", timeout={NEVER})
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 4, run.describe()
    assert_one_outcome_each(
        run,
        {
            "default": {
                "flush": "leaked_interrupted",
                "buf": "leaked_dependent",  # the flush it needed never finished
                "other": "released_at_exit",
            }
        },
    )
    assert sorted(run.order) == ["flushing", "released other"]


@pytest.mark.parametrize("end", ["atexit", "explicit"])
def test_exit_from_a_timed_early_hook_ends_the_process_after_the_teardown(tmp_path, end):
    body = f"""
        h = exitsafe.track("h", lambda raw: record("released h"), name="h")

        def stop():
            record("stopping")
            exitsafe.exit(6)

        exitsafe.on_early_exit(stop, name="stop", timeout={NEVER})
        if {end!r} == "explicit":
            exitsafe.teardown()
            record("never reached")
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 6, run.describe()
    assert_one_outcome_each(
        run, {"default": {"stop": "leaked_interrupted", "h": "released_at_exit"}}
    )
    assert run.order == ["stopping", "released h"], run.describe()


def test_the_first_exit_asked_for_by_a_timed_step_wins(tmp_path):
    body = f"""
        later = exitsafe.track("later", lambda raw: exitsafe.exit(7), name="later",
                               timeout={NEVER})
        sooner = exitsafe.track("sooner", lambda raw: exitsafe.exit(8), name="sooner",
                                timeout={NEVER})  # the newer: its step runs first
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 8, run.describe()
    assert_one_outcome_each(
        run, {"default": {"later": "leaked_interrupted", "sooner": "leaked_interrupted"}}
    )


def test_exit_from_a_forked_timed_step_ends_only_the_child(tmp_path):
    # In a child forked by the step, no teardown waits for the worker: its exit() is the
    # usual one, there (the child's own teardown, its status), and the parent goes on.
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    body = f"""
        def forking(raw):
            pid = os.fork()
            if pid == 0:
                exitsafe.exit(9)
            _, status = os.waitpid(pid, 0)
            record(f"child status {{os.waitstatus_to_exitcode(status)}}")

        h = exitsafe.track("h", forking, name="h", timeout={NEVER})
        # Torn down before the exit: CPython 3.12+ refuses os.fork() at interpreter shutdown.
        exitsafe.lowlevel.default_registry().teardown()
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 0, run.describe()
    assert run.order == ["child status 9"], run.describe()
    assert_one_outcome_each(run, {"default": {"h": "released_at_exit"}})
