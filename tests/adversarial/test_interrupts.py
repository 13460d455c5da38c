"""Class 4: whatever interrupts a teardown, every handle it claimed ends with one outcome.

An exception escaping the teardown (here: from the trace writer) leaves the handles it
never reached ``leaked_interrupted`` and the registry closed; exceptions of hooks,
release functions and policies (even ``KeyboardInterrupt`` and ``SystemExit``) are
recorded per step and the teardown goes on; a ledger that cannot be written is one
logged error.
"""

from __future__ import annotations

from ..support import assert_clean, run_program

HANDLES = 1000


def test_exception_escaping_the_teardown_leaves_one_outcome_per_handle(tmp_path):
    body = f"""
        import io

        class BrokenStderr(io.StringIO):
            lines = 0

            def write(self, text):
                type(self).lines += 1
                if type(self).lines > 10:  # the trace breaks after a few steps
                    raise RuntimeError("stderr is gone")
                return super().write(text)

        reg = exitsafe.Registry("interrupted", ledger_limit=None)
        handles = [reg.track(i, record, name=f"h{{i}}") for i in range({HANDLES})]
        real, sys.stderr = sys.stderr, BrokenStderr()
        try:
            reg.teardown()
        except RuntimeError as exc:
            print("teardown raised", exc)
        finally:
            sys.stderr = real
        counts = reg.ledger_counts()
        print(sorted(counts.items()), sum(counts.values()), reg.closed)
        handles[0].release()  # a late request: a recorded no-op
        print(reg.late_requests)
    """
    run = run_program(body, tmp_path, env={"EXITSAFE_TRACE": "1"}, timeout=60)
    assert_clean(run)
    lines = run.stdout.splitlines()
    assert lines[0] == "teardown raised stderr is gone"
    released = len(run.order)
    assert 0 < released < HANDLES
    assert lines[1] == (
        f"[('leaked_interrupted', {HANDLES - released}), ('released_at_exit', {released})]"
        f" {HANDLES} True"
    )
    assert lines[2] == "1"
    assert len(set(run.order)) == released, "released at most once"


def test_hooks_releases_and_policies_raising_base_exceptions_are_recorded(tmp_path):
    body = """
        def policy(info):
            raise SystemExit(3)

        def raising(raw):
            raise KeyboardInterrupt

        a = exitsafe.track("a", record, name="a", exit_policy=policy)
        b = exitsafe.track("b", raising, name="b")
        c = exitsafe.track("c", record, name="c")
        exitsafe.on_teardown(lambda: (_ for _ in ()).throw(KeyboardInterrupt), name="hook")
    """
    run = run_program(body, tmp_path, ledger=True, timeout=60)
    assert run.returncode == 0, run.describe()
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr
    assert run.order == ["c"]
    assert run.outcomes() == {
        "hook": "hook_failed",
        "c": "released_at_exit",
        "b": "release_failed",
        "a": "leaked_policy",
    }


def test_ledger_that_cannot_be_written_is_one_logged_error(tmp_path):
    body = """
        import logging
        logging.basicConfig()
        h = exitsafe.track("h", record, name="h")
    """
    run = run_program(
        body, tmp_path, env={"EXITSAFE_LEDGER": str(tmp_path / "missing-dir" / "l.json")}
    )
    assert run.returncode == 0 and run.order == ["h"], run.describe()
    assert run.stderr.count("could not write the ledger") == 1, run.describe()
    assert "Traceback" not in run.stderr
