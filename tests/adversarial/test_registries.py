"""Class 7: registries outside the plan of the exit teardown.

A registry created during the exit teardown (in a hook) is torn down by it too; one
created after it finished (in an atexit handler that runs later) is closed at once,
its handles ``leaked_after_close``; a registry holding only hooks keeps them when its
object is dropped.
"""

from __future__ import annotations

from ..support import assert_clean, run_program


def test_registry_created_in_a_hook_during_the_exit_teardown(tmp_path):
    body = """
        late = []

        def make_registry():
            reg = exitsafe.Registry("made-in-a-hook")
            late.append(reg.track("late-handle", record, name="late-handle"))

        exitsafe.on_teardown(make_registry, name="hook")
        h = exitsafe.track("h", record, name="h")
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["h", "late-handle"]
    assert run.outcomes("made-in-a-hook") == {"late-handle": "released_at_exit"}


def test_registry_created_after_the_exit_teardown_starts_closed(tmp_path):
    body = """
        import atexit, os

        def after_exitsafe():  # registered before exitsafe's atexit callback: runs after it
            import exitsafe

            reg = exitsafe.Registry("too-late")
            h = reg.track("late", print, name="late")  # print would show a release
            print(reg.closed, h.state, reg.ledger()[0].outcome, flush=True)
            KEEP.append(h)

        KEEP = []
        atexit.register(after_exitsafe)
        import exitsafe
    """
    run = run_program(body, tmp_path, prelude=False)
    assert_clean(run)
    assert run.stdout.split() == ["True", "leaked", "leaked_after_close"]


def test_dropping_a_registry_that_only_holds_hooks_keeps_its_hooks(tmp_path):
    body = """
        reg = exitsafe.Registry("hooks-only")
        reg.on_teardown(lambda: record("hook-ran"), name="hook")
        del reg
        gc.collect()
    """
    run = run_program(body, tmp_path)
    assert_clean(run)
    assert run.order == ["hook-ran"]


def test_timeouts_first_asked_for_during_the_exit_teardown(tmp_path):
    # CPython 3.12+ refuses new threads once shutdown began, and a timeout needs a
    # worker thread: the registrations still answer as documented, nothing raises.
    body = """
        def hook():
            h = exitsafe.track("late", record, name="late", timeout=1)
            record(f"late track: {h.state}")
            reg = exitsafe.Registry("late-registry", step_timeout=1)
            record(f"late registry: {reg.name}")

        exitsafe.on_teardown(hook, name="hook")
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["late track: leaked", "late registry: late-registry"]
    assert run.outcomes() == {"hook": "hook_ran", "late": "leaked_after_close"}
