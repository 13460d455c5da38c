"""Forked children: leaving quietly (exitsafe.exit, the forked-child setting), hooks
inherited by a child, and the neutralization that belongs to the process it runs in.

Every child records with ``os.write`` (it works after a fork and during finalization);
a *sentinel* is an object whose ``__del__`` writes a line: in a child that leaves
quietly, the finalizer of an object it inherited must never run.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from ..support import assert_clean, run_program

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD = """
    class Sentinel:  # an object of the parent whose finalizer must not run in the child
        def __del__(self):
            record(f"finalizer ran in {os.getpid()}")

    SENTINEL = Sentinel()
    inherited = exitsafe.track(
        "inherited", lambda raw: record(f"{raw} released"), name="inherited"
    )

    def child_body():
        own = exitsafe.track("child-own", lambda raw: record(f"{raw} released"), name="child-own")
        print("child output, never flushed by hand", end="")
        END

    pid = os.fork()
    if pid == 0:
        child_body()
        record("child fell through")  # only reached if END returned
    else:
        _, status = os.waitpid(pid, 0)
        record(f"child status {os.waitstatus_to_exitcode(status)}")
        record(f"parent {os.getpid()}")
"""


def run_child(tmp_path, end: str, env=None, **kwargs):
    body = CHILD.replace("END", end)
    return run_program(
        body,
        tmp_path,
        env={"EXITSAFE_LEDGER": str(tmp_path / "ledger-{pid}.json"), **(env or {})},
        **kwargs,
    )


def ledgers(tmp_path) -> dict[int, dict[str, str]]:
    found = {}
    for path in tmp_path.glob("ledger-*.json"):
        data = json.loads(path.read_text())
        found[data["pid"]] = {
            e["name"]: e["outcome"] for r in data["registries"] for e in r["entries"]
        }
    return found


def child_lines(run) -> list[str]:
    parent_pid = next(x for x in run.order if x.startswith("parent ")).split()[1]
    return [x for x in run.order if parent_pid not in x and not x.startswith("parent")]


@pytest.mark.skipif(sys.version_info < (3, 9), reason="os.waitstatus_to_exitcode")
def test_exitsafe_exit_in_a_forked_child(tmp_path):
    run = run_child(tmp_path, "exitsafe.exit(3)")
    assert_clean(run, allow=("DeprecationWarning",))
    assert run.stdout.startswith("child output, never flushed by hand"), "stdio flushed"
    assert "child status 3" in run.order
    assert "child fell through" not in run.order
    child = [x for x in run.order if x.startswith(("finalizer", "child-own", "inherited"))]
    parent = next(x for x in run.order if x.startswith("parent ")).split()[1]
    # the child released its own handle and nothing it inherited; no inherited finalizer
    assert child[0] == "child-own released"
    assert f"finalizer ran in {parent}" in run.order  # the parent's own exit, normally
    assert [x for x in run.order if x.startswith("finalizer")] == [f"finalizer ran in {parent}"]
    assert run.order.count("inherited released") == 1  # once: by the parent
    by_pid = ledgers(tmp_path)
    child_pid = next(p for p in by_pid if str(p) != parent)
    assert by_pid[child_pid] == {"child-own": "released_at_exit", "inherited": "leaked_inherited"}


@pytest.mark.parametrize(
    ("end", "status", "allow"),
    [
        ("sys.exit(4)", 4, ()),
        ("pass", 0, ()),
        ("raise RuntimeError('boom')", 1, ("Traceback",)),
        ("sys.exit('bad input')", 1, ()),
    ],
    ids=["sys-exit", "end-of-main", "uncaught-exception", "exit-message"],
)
def test_forked_child_setting_leaves_quietly_with_the_status(tmp_path, end, status, allow):
    run = run_child(tmp_path, end, env={"EXITSAFE_FORK_EXIT": "quiet"})
    assert_clean(run, allow=("DeprecationWarning", *allow))
    assert f"child status {status}" in run.order
    parent = next(x for x in run.order if x.startswith("parent ")).split()[1]
    assert [x for x in run.order if x.startswith("finalizer")] == [f"finalizer ran in {parent}"]
    assert "child-own released" in run.order
    assert run.order.count("inherited released") == 1
    assert "child output, never flushed by hand" in run.stdout


@pytest.mark.skipif(sys.version_info < (3, 12), reason="SystemExit seen through sys.monitoring")
def test_forked_child_setting_sees_a_system_exit_raised_directly(tmp_path):
    run = run_child(tmp_path, "raise SystemExit(5)", env={"EXITSAFE_FORK_EXIT": "quiet"})
    assert_clean(run, allow=("DeprecationWarning",))
    assert "child status 5" in run.order


def test_set_fork_exit_in_code(tmp_path):
    body = CHILD.replace(
        "pid = os.fork()", 'exitsafe.lowlevel.set_fork_exit("quiet")\n    pid = os.fork()'
    )
    run = run_program(body.replace("END", "sys.exit(6)"), tmp_path)
    assert_clean(run, allow=("DeprecationWarning",))
    assert "child status 6" in run.order
    assert len([x for x in run.order if x.startswith("finalizer")]) == 1


def test_without_the_setting_the_child_finalizes_what_it_inherited(tmp_path):
    # The baseline: an ordinary child exit finalizes its copy of the parent's objects.
    run = run_child(tmp_path, "sys.exit(0)")
    assert_clean(run, allow=("DeprecationWarning",))
    assert len([x for x in run.order if x.startswith("finalizer")]) == 2


FROM_A_THREAD = """
    class Sentinel:
        def __del__(self):
            record(f"finalizer ran in {os.getpid()}")

    SENTINEL = Sentinel()
    inherited = exitsafe.track("inherited", lambda raw: record(f"{raw} released"))

    def fork_here():  # in the child, this thread is the only one: it leaves from here
        pid = os.fork()
        if pid == 0:
            own = exitsafe.track("child-own", lambda raw: record(f"{raw} released"))
            exitsafe.exit(7)
        _, status = os.waitpid(pid, 0)
        record(f"child status {os.waitstatus_to_exitcode(status)}")

    t = threading.Thread(target=fork_here)
    t.start()
    t.join()
"""


def test_child_forked_from_a_thread_leaves_quietly(tmp_path):
    run = run_program(FROM_A_THREAD, tmp_path)
    assert_clean(run, allow=("DeprecationWarning",))
    assert run.order[:2] == ["child-own released", "child status 7"]
    assert len([x for x in run.order if x.startswith("finalizer")]) == 1


@pytest.mark.parametrize("code", ["-1", "256", "'3'", "3.0"])
def test_exit_code_is_checked(tmp_path, code):
    run = run_program(f"exitsafe.exit({code})", tmp_path)
    assert run.returncode == 1 and ("ValueError" in run.stderr or "TypeError" in run.stderr)


@pytest.mark.parametrize("when", ["atexit", "explicit"])
def test_exitsafe_exit_from_a_release_during_the_teardown_writes_every_outcome(tmp_path, when):
    # The teardown records its outcomes when it ends; exitsafe.exit() called by one of its
    # release functions ends the process without returning to it, and the ledger written
    # on the way out held no entry at all (not even the release that had run).
    body = f"""
        a = exitsafe.track("a", lambda raw: record("released a"), name="a")
        b = exitsafe.track("b", lambda raw: exitsafe.exit(4), name="b", depends_on=[a])
        c = exitsafe.track("c", lambda raw: record("released c"), name="c", depends_on=[b])
        if {when!r} == "explicit":
            exitsafe.teardown(reason="explicit")
            record("never reached")
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 4, run.describe()
    assert run.order == ["released c"]
    assert run.outcomes() == {
        "c": "released_at_exit",
        "b": "leaked_interrupted",  # its release function ended the process
        "a": "leaked_interrupted",
    }


def test_set_fork_exit_is_checked():
    import exitsafe

    with pytest.raises(ValueError, match="mode must be one of"):
        exitsafe.lowlevel.set_fork_exit("loud")


INHERITED_HOOKS = """
    class Catalog:  # a third-party object whose finalizer calls native code
        def __init__(self):
            self._handle = 42

        def __del__(self):
            if self._handle is not None:
                record(f"native release in {os.getpid()}")

    CATALOG = Catalog()
    exitsafe.lowlevel.neutralize_at_exit(CATALOG)
    exitsafe.on_teardown(lambda: record(f"default hook in {os.getpid()}"), name="default")
    exitsafe.on_teardown(
        lambda: record(f"run-in-child hook in {os.getpid()}"), name="runs", in_child="run"
    )
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a normal exit: the child's own teardown, then finalization
    os.waitpid(pid, 0)
    record(f"parent {os.getpid()}")
"""


def test_inherited_hooks_in_a_child(tmp_path):
    run = run_program(
        INHERITED_HOOKS, tmp_path, env={"EXITSAFE_LEDGER": str(tmp_path / "ledger-{pid}.json")}
    )
    assert_clean(run, allow=("DeprecationWarning",))
    parent = next(x for x in run.order if x.startswith("parent ")).split()[1]
    # neutralization is pure Python and belongs to the process it runs in: in the child
    # too, so no finalizer calls native code anywhere
    assert not [x for x in run.order if x.startswith("native release")]
    hooks = [x for x in run.order if "hook in" in x]
    assert f"default hook in {parent}" in hooks
    assert len([h for h in hooks if h.startswith("default")]) == 1, "skipped in the child"
    assert len([h for h in hooks if h.startswith("run-in-child")]) == 2
    by_pid = ledgers(tmp_path)
    child = by_pid[next(p for p in by_pid if str(p) != parent)]
    assert child["default"] == "leaked_inherited"
    assert child["runs"] == "hook_ran"
    assert child["neutralize Catalog._handle"] == "hook_ran"


def test_a_fork_from_inside_a_section_leaves_the_child_able_to_finish_it(tmp_path):
    # A finalizer or a signal handler that interrupted an exitsafe section may call
    # os.fork(): the section resumes in the child as in the parent, and ends by releasing
    # the lock (the child's reinitialized lock was not held: RuntimeError "cannot release
    # un-acquired lock" out of the program's own track()).  Forced here by forking inside
    # a section directly.
    run = run_program(
        """
        import os
        import exitsafe
        from exitsafe import _sync

        registry = exitsafe.Registry("forking")
        with _sync.LOCK:  # (a section, interrupted by a fork)
            pid = os.fork()
        who = "child" if pid == 0 else "parent"
        record(f"{who} held after the section: {_sync.reentered()}")  # (one write each)
        h = registry.track("x", lambda raw: record(f"{who} released {raw}"))
        h.release()
        if pid:
            _, status = os.waitpid(pid, 0)
            record(f"child status {status}")
        """,
        tmp_path,
    )
    assert_clean(run)
    for who in ("parent", "child"):
        assert f"{who} held after the section: False" in run.order, run.describe()
        assert f"{who} released x" in run.order, run.describe()
    assert "child status 0" in run.order, run.describe()
