"""Classes 5 and 6: every wait is bounded and recorded.

A release running on another thread when the exit teardown reaches it is waited for,
bounded (the step timeout, or ``IN_FLIGHT_WAIT`` seconds without one), then recorded
``leaked_in_use`` with the reason, and what it depends on is leaked; a callable exit
policy runs under the same bounds as a release.
"""

from __future__ import annotations

import pytest

from ..support import assert_clean, run_program

STUCK_ELSEWHERE = """
    inst = exitsafe.track("instance", record, name="instance")
    started = threading.Event()

    def stuck(raw):
        record("stuck-release-started")
        started.set()
        threading.Event().wait()  # a lost device: never returns

    dev = exitsafe.track("device", stuck, name="device", depends_on=[inst])
    threading.Thread(target=dev.release, daemon=True).start()
    started.wait()
"""


@pytest.mark.parametrize(
    ("env", "bound"),
    [({"EXITSAFE_STEP_TIMEOUT": "0.5"}, "0.5 s"), ({}, "5 s")],
    ids=["step-timeout", "default-bound"],
)
def test_release_stuck_on_another_thread_at_exit(tmp_path, env, bound):
    run = run_program(STUCK_ELSEWHERE, tmp_path, env=env, ledger=True, timeout=60)
    assert_clean(run)
    assert run.order == ["stuck-release-started"], "the instance was not released under it"
    assert run.outcomes() == {"device": "leaked_in_use", "instance": "leaked_dependent"}
    detail = next(e for e in run.ledger()["registries"][0]["entries"] if e["name"] == "device")
    assert detail["detail"] == f"still being released on another thread after {bound}"


BLOCKING_POLICY = """
    def policy(info):
        record(f"policy-asked-{info.name}")
        threading.Event().wait()  # a policy that never answers
        return "release"

    a = exitsafe.track("a", record, name="a", exit_policy=policy)
    b = exitsafe.track("b", record, name="b")
"""


@pytest.mark.parametrize(
    "env",
    [{"EXITSAFE_STEP_TIMEOUT": "1"}, {"EXITSAFE_TEARDOWN_TIMEOUT": "1"}],
    ids=["step-timeout", "teardown-timeout"],
)
def test_blocking_exit_policy_is_bounded_like_a_release(tmp_path, env):
    run = run_program(BLOCKING_POLICY, tmp_path, env=env, ledger=True, timeout=60)
    assert_clean(run)
    assert run.order == ["b", "policy-asked-a"]
    assert run.outcomes() == {"b": "released_at_exit", "a": "leaked_timeout"}
    detail = next(e for e in run.ledger()["registries"][0]["entries"] if e["name"] == "a")
    assert detail["detail"].startswith("exit policy still running after")
