"""Unit tests of the lifetime core: each rule of the API contract, and bad input."""

from __future__ import annotations

import gc
import threading

import pytest

import exitsafe
from exitsafe import (
    ExitsafeError,
    HandleClosedError,
    LiveDependentsError,
    Outcome,
    Registry,
    RegistryClosedError,
)
from exitsafe.lowlevel import DependencyCycleError, ForeignHandleError


class Recorder:
    """Release functions that write what they release into one shared log."""

    def __init__(self) -> None:
        self.log: list[object] = []

    def __call__(self, raw: object) -> None:
        self.log.append(raw)


@pytest.fixture
def reg() -> Registry:
    return Registry("test", ledger_limit=None)


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


#: Handles a test must keep referenced: dropping the last reference releases a handle.
KEEP: list[object] = []


@pytest.fixture(autouse=True)
def _clear_keep():
    yield
    KEEP.clear()


def outcomes(registry: Registry) -> dict[str, str]:
    return {e.name: e.outcome for e in registry.ledger()}


# ---------------------------------------------------------------- owners and release


def test_release_calls_the_release_function_once(reg, rec):
    h = reg.track("a", rec, name="a")
    assert h.raw == "a" and h.state == "live" and h.owners == 1
    h.release()
    h.release()
    assert rec.log == ["a"]
    assert h.state == "released"
    assert outcomes(reg) == {"a": Outcome.RELEASED}


def test_raw_after_release_raises(reg, rec):
    h = reg.track("a", rec, name="a")
    h.release()
    with pytest.raises(HandleClosedError, match="'a' was released"):
        h.raw  # noqa: B018
    with pytest.raises(HandleClosedError):
        h.retain()
    with pytest.raises(HandleClosedError):
        h.borrow().__enter__()


def test_retain_adds_an_owner(reg, rec):
    h = reg.track("a", rec)
    assert h.retain() is h
    h.release()
    assert rec.log == [] and h.raw == "a"
    h.release()
    assert rec.log == ["a"]


def test_context_manager_releases(reg, rec):
    with reg.track("a", rec) as h:
        assert h.raw == "a"
    assert rec.log == ["a"]


def test_gc_of_last_reference_releases(reg, rec):
    h = reg.track("a", rec, name="a")
    del h
    gc.collect()
    assert rec.log == ["a"]
    assert outcomes(reg) == {"a": Outcome.RELEASED}


def test_gc_drops_every_remaining_owner(reg, rec):
    h = reg.track("a", rec)
    h.retain()
    del h
    gc.collect()
    assert rec.log == ["a"]


def test_gc_in_reference_cycle_releases(reg, rec):
    class Wrapper:
        pass

    w = Wrapper()
    w.self = w
    w.handle = reg.track("cyc", rec)
    del w
    gc.collect()
    assert rec.log == ["cyc"]


# ---------------------------------------------------------------- dependencies


def test_parent_outlives_children(reg, rec):
    inst = reg.track("inst", rec, name="inst")
    dev = reg.track("dev", rec, depends_on=[inst])
    buf = reg.track("buf", rec, depends_on=[dev])
    inst.release()
    dev.release()
    assert rec.log == []
    assert inst.state == "live"
    with pytest.raises(HandleClosedError, match="pending until 1 dependent"):
        inst.raw  # noqa: B018
    buf.release()
    assert rec.log == ["buf", "dev", "inst"]


def test_depends_on_accepts_a_single_handle(reg, rec):
    inst = reg.track("inst", rec)
    dev = reg.track("dev", rec, depends_on=inst)
    inst.release()
    dev.release()
    assert rec.log == ["dev", "inst"]


def test_gc_of_parent_handle_defers_to_children(reg, rec):
    inst = reg.track("inst", rec)
    dev = reg.track("dev", rec, depends_on=[inst])
    del inst
    gc.collect()
    assert rec.log == []
    dev.release()
    assert rec.log == ["dev", "inst"]


def test_long_chain_releases_iteratively(reg):
    count = 100_000
    log: list[int] = []
    head = reg.track(0, log.append)
    handles = [head]
    for i in range(1, count):
        handles.append(reg.track(i, log.append, depends_on=[handles[-1]]))
    for h in handles[:-1]:
        h.release()
    assert log == []
    handles[-1].release()
    assert log == list(range(count - 1, -1, -1))


def test_strict_mode_names_live_dependents(rec):
    reg = Registry("strict", strict=True)
    inst = reg.track("inst", rec, name="inst")
    dev = reg.track("dev", rec, name="dev0", depends_on=[inst])
    with pytest.raises(LiveDependentsError, match="dev0") as info:
        inst.release()
    assert info.value.dependents == ("dev0",)
    assert inst.owners == 1 and inst.raw == "inst"
    dev.release()
    inst.release()
    assert rec.log == ["dev", "inst"]


def test_cycle_via_add_dependency_is_rejected(reg, rec):
    a = reg.track("a", rec, name="a")
    b = reg.track("b", rec, name="b", depends_on=[a])
    c = reg.track("c", rec, name="c", depends_on=[b])
    with pytest.raises(DependencyCycleError, match="a -> c -> b -> a") as info:
        a.add_dependency(c)
    assert info.value.cycle == ("a", "c", "b", "a")
    with pytest.raises(DependencyCycleError):
        a.add_dependency(a)
    # nothing was added: releasing in the natural order still works
    for h in (a, b, c):
        h.release()
    assert rec.log == ["c", "b", "a"]


def test_add_dependency_orders_release(reg, rec):
    a = reg.track("a", rec)
    b = reg.track("b", rec)
    b.add_dependency(a)
    a.release()
    assert rec.log == []
    b.release()
    assert rec.log == ["b", "a"]


def test_hook_cycle_is_rejected(reg, rec):
    a = reg.track("a", rec, name="a")
    b = reg.track("b", rec, name="b", depends_on=[a])
    with pytest.raises(DependencyCycleError, match="flush"):
        # flush must run before a goes, and after b goes, but b depends on a: fine.
        # The reverse (before b, after a) is a cycle: a -> flush -> b -> a.
        reg.on_teardown(lambda: None, before=[b], after=[a], name="flush")
    reg.on_teardown(lambda: None, before=[a], after=[b], name="ok")


# ---------------------------------------------------------------- bad input


def test_bad_input_is_rejected_clearly(reg, rec):
    with pytest.raises(TypeError, match="release must be callable"):
        reg.track("a", "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="depends_on must contain exitsafe Handles"):
        reg.track("a", rec, depends_on=["x"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="iterable of Handles"):
        reg.track("a", rec, depends_on=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kind must be a str"):
        reg.track("a", rec, kind=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exit_policy"):
        reg.track("a", rec, exit_policy="sometimes")
    with pytest.raises(ValueError, match="timeout"):
        reg.track("a", rec, timeout=-1)
    with pytest.raises(TypeError, match="needs a loaded library"):
        reg.pin(None)
    with pytest.raises(TypeError, match="fn must be callable"):
        reg.on_teardown(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Registry("x", exit_policy="maybe")
    with pytest.raises(TypeError):
        exitsafe.guard(42)  # type: ignore[arg-type]
    assert len(reg) == 0, "a rejected registration must not leave anything behind"


def test_handle_from_another_registry_is_rejected(reg, rec):
    other = Registry("other")
    foreign = other.track("f", rec, name="f")
    with pytest.raises(ForeignHandleError, match="belongs to registry 'other'"):
        reg.track("a", rec, depends_on=[foreign])
    assert isinstance(ForeignHandleError("x"), (ExitsafeError, ValueError))


def test_depends_on_a_released_handle_is_rejected(reg, rec):
    a = reg.track("a", rec, name="a")
    a.release()
    with pytest.raises(HandleClosedError, match="depends_on: handle 'a' was released"):
        reg.track("b", rec, depends_on=[a])


def test_release_from_a_foreign_thread(reg, rec):
    h = reg.track("a", rec)
    t = threading.Thread(target=h.release)
    t.start()
    t.join()
    assert rec.log == ["a"]


def test_failing_release_is_recorded_and_raised(reg):
    def boom(raw):
        raise RuntimeError("driver said no")

    parent = reg.track("p", lambda r: None, name="p")
    h = reg.track("a", boom, name="a", depends_on=[parent])
    parent.release()
    with pytest.raises(RuntimeError, match="driver said no"):
        h.release()
    h.release()  # never called again
    got = outcomes(reg)
    assert got["a"] == Outcome.RELEASE_FAILED
    assert got["p"] == Outcome.LEAKED_DEPENDENT, "a parent is never released from under a failure"


@pytest.mark.parametrize("how", ["release", "collected"])
@pytest.mark.parametrize("with_parent", [False, True], ids=["leaf", "chain"])
def test_a_failed_release_keeps_nothing_of_its_caller_alive(reg, rec, how, with_parent):
    """The exception of a release function, raised to the caller of `release()` (or logged
    after a garbage collection), must not keep the caller's frame alive, nor the handles it
    referred to: with the cyclic collector off, a handle the caller dropped is released as
    the caller returns, as after a release that did not fail.  (The pure-Python core kept the
    exception in a local of its own frames, which the exception's traceback reaches: a cycle
    only a collection broke.)"""

    def boom(raw: object) -> None:
        raise OSError(raw)

    def caller() -> None:
        parents = [reg.track("p", rec, name="p")] if with_parent else []
        bad = reg.track("bad", boom, name="bad", depends_on=parents)
        for parent in parents:
            parent.release()
        other = reg.track("other", rec, name="other")  # noqa: F841  (dropped on return)
        if how == "release":
            try:
                bad.release()
            except OSError:
                pass
        else:
            del bad  # its release fails, and is logged
        assert rec.log == []

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        caller()
        assert rec.log == ["other"], "the handle the caller dropped was not released"
    finally:
        if enabled:
            gc.enable()
    assert outcomes(reg)["bad"] == Outcome.RELEASE_FAILED


def test_borrow_defers_release(reg, rec):
    h = reg.track("a", rec)
    with h.borrow() as raw:
        assert raw == "a"
        h.release()
        assert rec.log == []
    assert rec.log == ["a"]


# ---------------------------------------------------------------- teardown


def test_teardown_order_children_first_libraries_last(reg, rec):
    lib = reg.pin("lib", close=rec, name="lib")
    inst = reg.track("inst", rec, kind="instance")
    dev = reg.track("dev", rec, kind="device", depends_on=[inst, lib])
    buf = reg.track("buf", rec, kind="buffer", depends_on=[dev])
    other = reg.track("other", rec)
    reg.on_teardown(lambda: rec.log.append("flush"), name="flush", before=[dev])
    del other
    reg.teardown()
    assert rec.log == ["other", "flush", "buf", "dev", "inst", "lib"]
    assert (lib.state, inst.state, dev.state, buf.state) == ("released",) * 4
    assert reg.closed
    assert {e.outcome for e in reg.ledger() if e.at_exit} == {
        Outcome.RELEASED_AT_EXIT,
        Outcome.HOOK_RAN,
    }


def test_hook_after_runs_after_handle(reg, rec):
    h = reg.track("h", rec)
    reg.on_teardown(lambda: rec.log.append("unregister"), after=[h])
    reg.teardown()
    assert rec.log == ["h", "unregister"]


def test_hook_does_not_keep_its_before_handles_alive(reg, rec):
    buf = reg.track("buf", rec)
    reg.on_teardown(lambda: rec.log.append("flush"), before=[buf])
    buf.release()
    assert rec.log == ["buf"]
    reg.teardown()
    assert rec.log == ["buf", "flush"]


def test_cancelled_hook_does_not_run(reg, rec):
    hook = reg.on_teardown(lambda: rec.log.append("hook"), name="hook")
    hook.release()
    reg.teardown()
    assert rec.log == []
    assert outcomes(reg) == {"hook": Outcome.HOOK_CANCELLED}


def test_teardown_is_idempotent_and_closes(reg, rec):
    h = reg.track("a", rec, name="a")
    reg.teardown()
    reg.teardown()
    assert rec.log == ["a"]
    h.release()
    assert rec.log == ["a"]
    assert reg.late_requests == 1
    assert outcomes(reg) == {"a": Outcome.RELEASED_AT_EXIT}


def test_registration_after_close_is_leaked_at_once(reg, rec):
    reg.teardown()
    h = reg.track("late", rec, name="late")
    assert h.state == "leaked"
    with pytest.raises(HandleClosedError):
        h.raw  # noqa: B018
    h.release()
    assert rec.log == []
    assert outcomes(reg) == {"late": Outcome.LEAKED_AFTER_CLOSE}


def test_registration_after_close_raises_in_strict_mode(rec):
    reg = Registry("strict", strict=True)
    reg.teardown()
    with pytest.raises(RegistryClosedError):
        reg.track("late", rec)


def test_exception_in_one_release_does_not_stop_teardown(reg, rec, caplog):
    def boom(raw):
        raise ValueError("bad handle")

    KEEP.append(reg.track("ok1", rec, name="ok1"))
    KEEP.append(reg.track("bad", boom, name="bad"))
    KEEP.append(reg.track("ok2", rec, name="ok2"))
    reg.teardown()
    assert sorted(rec.log) == ["ok1", "ok2"]
    assert outcomes(reg)["bad"] == Outcome.RELEASE_FAILED
    assert "bad handle" in caplog.text


def test_exit_policies(reg, rec):
    KEEP.append(reg.track("keep", rec, name="keep", exit_policy="leak"))
    KEEP.append(reg.track("rel", rec, name="rel"))
    KEEP.append(reg.track("fn-leak", rec, name="fn-leak", exit_policy=lambda info: "leak"))
    KEEP.append(reg.track("fn-rel", rec, name="fn-rel", exit_policy=lambda info: "release"))
    KEEP.append(reg.track("fn-bad", rec, name="fn-bad", exit_policy=lambda info: "maybe"))
    reg.teardown()
    assert sorted(rec.log) == ["fn-rel", "rel"]
    got = outcomes(reg)
    assert got["keep"] == got["fn-leak"] == got["fn-bad"] == Outcome.LEAKED_POLICY


def test_leak_propagates_to_dependencies(reg, rec):
    lib = reg.pin("lib", close=rec, name="lib")
    inst = reg.track("inst", rec, name="inst", depends_on=[lib])
    KEEP.append(reg.track("dev", rec, name="dev", depends_on=[inst], exit_policy="leak"))
    reg.teardown()
    assert rec.log == []
    got = outcomes(reg)
    assert got == {
        "dev": Outcome.LEAKED_POLICY,
        "inst": Outcome.LEAKED_DEPENDENT,
        "lib": Outcome.LEAKED_DEPENDENT,
    }


def test_borrowed_handle_is_leaked_at_teardown(reg, rec):
    inst = reg.track("inst", rec, name="inst")
    dev = reg.track("dev", rec, name="dev", depends_on=[inst])
    with dev.borrow():
        reg.teardown()
    assert rec.log == []
    assert outcomes(reg) == {"dev": Outcome.LEAKED_IN_USE, "inst": Outcome.LEAKED_DEPENDENT}


def test_registry_default_policy_leak(rec):
    reg = Registry("leaky", exit_policy="leak")
    KEEP.append(reg.track("a", rec))
    reg.teardown()
    assert rec.log == []


def test_env_override_release_and_leak(monkeypatch, rec):
    monkeypatch.setenv("EXITSAFE_AT_EXIT", "release")
    reg = Registry("r1", exit_policy="leak")
    KEEP.append(reg.track("a", rec))
    reg.teardown()
    assert rec.log == ["a"]
    monkeypatch.setenv("EXITSAFE_AT_EXIT", "leak")
    reg2 = Registry("r2")
    KEEP.append(reg2.track("b", rec))
    reg2.on_teardown(lambda: rec.log.append("hook"))
    reg2.teardown()
    assert rec.log == ["a", "hook"], "leak override leaks handles but still runs hooks"


def test_bad_env_value_warns_once_and_uses_default(monkeypatch, rec, caplog):
    from exitsafe import _config

    monkeypatch.setattr(_config, "_warned", set())
    monkeypatch.setenv("EXITSAFE_AT_EXIT", "bogus")
    for name in ("r1", "r2"):
        reg = Registry(name)
        reg.track(name, rec)
        reg.teardown()
    assert rec.log == ["r1", "r2"]
    assert caplog.text.count("EXITSAFE_AT_EXIT='bogus' is not valid") == 1


def test_trace_lines(monkeypatch, capsys, rec):
    monkeypatch.setenv("EXITSAFE_TRACE", "1")
    reg = Registry("traced")
    KEEP.append(reg.track("a", rec, name='dev "0"', kind="device"))
    reg.teardown()
    h = reg.track("b", rec)
    h.release()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == 'exitsafe: teardown-begin registry="traced" reason="explicit" live=1 hooks=0'
    assert err[1] == 'exitsafe: plan registry="traced" steps=1'
    assert err[2] == (
        'exitsafe: step-begin registry="traced" index=1 of=1 kind="device" name="dev \\"0\\""'
    )
    assert err[3].startswith(
        'exitsafe: step registry="traced" index=1 of=1 action=release kind="device" '
        'name="dev \\"0\\"" outcome=released_at_exit ms='
    )
    assert err[4].startswith('exitsafe: teardown-end registry="traced" released=1 leaked=0')
    assert err[5] == 'exitsafe: late-release registry="traced" kind="handle" name="handle#2"'
    # every line is in the grammar exitsafe.testing parses
    from exitsafe._ledger import TRACE_EVENTS, parse_trace_line

    for line in err:
        parsed = parse_trace_line(line)
        assert parsed is not None and set(parsed[1]) <= set(TRACE_EVENTS[parsed[0]]), line
    assert parse_trace_line(err[2])[1]["name"] == 'dev "0"'


def test_step_timeout_abandons_a_blocked_release(rec):
    gate = threading.Event()
    reg = Registry("slow", step_timeout=0.2)
    inst = reg.track("inst", rec, name="inst")
    KEEP.append(reg.track("stuck", lambda raw: gate.wait(), name="stuck", depends_on=[inst]))
    KEEP.append(reg.track("other", rec, name="other"))
    reg.teardown()
    gate.set()
    got = outcomes(reg)
    assert got["stuck"] == Outcome.LEAKED_TIMEOUT
    assert got["inst"] == Outcome.LEAKED_DEPENDENT
    assert got["other"] == Outcome.RELEASED_AT_EXIT


def test_guard_goes_quiet_at_teardown(reg):
    calls = []
    g = exitsafe.guard(lambda x: calls.append(x) or x * 2, default=-1, registry=reg)
    assert g(2) == 4 and g.active
    reg.teardown()
    assert g(3) == -1 and not g.active
    assert calls == [2]


@pytest.mark.parametrize("from_releases", [False, True])
def test_from_releases_lets_a_release_call_back_during_the_teardown(reg, from_releases):
    # A release function whose native code calls back (SQLite's xDestroy when a connection
    # closes) reaches the callback on the teardown's own thread, and on the worker thread
    # of a step with a time limit, with from_releases=True; a native thread calling
    # meanwhile, and any call after the teardown, get the default.  Without it, every
    # call from the teardown's start is silenced (a release logging through it).
    calls = []
    g = exitsafe.guard(lambda who: calls.append(who) or 1, default=0, registry=reg,
                       from_releases=from_releases)

    def close(name):  # type: ignore[no-untyped-def]
        def release(raw):  # type: ignore[no-untyped-def]
            calls.append((name, g(f"{name} xDestroy")))
            other = threading.Thread(target=lambda: calls.append(("native", g("native"))))
            other.start()
            other.join()

        return release

    KEEP.append(reg.track("db", close("db"), name="db"))
    KEEP.append(reg.track("timed", close("timed"), name="timed", timeout=30))
    reg.teardown()
    if from_releases:
        expected = ["db xDestroy", ("db", 1), "timed xDestroy", ("timed", 1)]
    else:
        expected = [("db", 0), ("timed", 0)]
    expected += [("native", 0), ("native", 0)]
    assert sorted(map(str, calls)) == sorted(map(str, expected))
    assert g("late") == 0 and not g.active
    assert "late" not in calls
    with pytest.raises(TypeError, match="from_releases must be True or False"):
        exitsafe.guard(print, registry=reg, from_releases=1)  # type: ignore[arg-type]


def test_policies_compose(reg, rec):
    from exitsafe.policies import any_leak, leak_if_foreign_thread, leak_in_forked_child

    policy = any_leak(leak_in_forked_child, leak_if_foreign_thread)
    KEEP.append(reg.track("main", rec, name="main", exit_policy=policy))
    box = []
    t = threading.Thread(
        target=lambda: box.append(reg.track("w", rec, name="w", exit_policy=policy))
    )
    t.start()
    t.join()
    reg.teardown()
    assert rec.log == ["main"]
    assert outcomes(reg)["w"] == Outcome.LEAKED_POLICY
    with pytest.raises(ValueError):
        any_leak("sometimes")


def test_ledger_limit_keeps_counts_exact(rec):
    reg = Registry("bounded", ledger_limit=10)
    for i in range(100):
        reg.track(i, rec).release()
    assert len(reg.ledger()) == 10
    assert reg.ledger_counts() == {Outcome.RELEASED: 100}
    assert [e.seq for e in reg.ledger()] == list(range(91, 101))


def test_ledger_entry_is_data(reg, rec):
    reg.track("a", rec, name="a", kind="device").release()
    (entry,) = reg.ledger()
    assert entry.as_dict() == {
        "at_exit": False,
        "detail": None,
        "kind": "device",
        "name": "a",
        "outcome": "released",
        "registry": "test",
        "seq": 1,
    }


def test_module_level_functions_use_default_registry():
    assert exitsafe.lowlevel.default_registry() is exitsafe.lowlevel.default_registry()
    assert exitsafe.lowlevel.default_registry() in exitsafe.lowlevel.registries()
    log: list[object] = []
    h = exitsafe.track("x", log.append)
    assert h.registry is exitsafe.lowlevel.default_registry()
    h.release()
    assert log == ["x"]
    assert any(e.outcome == Outcome.RELEASED for e in exitsafe.ledger())


def test_handle_repr_and_info(reg, rec):
    h = reg.track("a", rec, name="a", kind="device")
    assert "device" in repr(h) and "'a'" in repr(h)
    assert h.kind == "device" and h.created_on_main_thread
    assert not h.inherited and not h.borrowed
    assert "live" in repr(reg)


def test_a_log_handler_that_keeps_records_does_not_keep_handles_alive():
    # A failed release is logged with the exception's repr, not the exception: a
    # handler that keeps records (pytest's caplog, logging.handlers.MemoryHandler)
    # would otherwise keep its traceback, the frames, and the handles they refer to.
    import logging
    import weakref

    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    def boom(raw: object) -> None:
        raise RuntimeError(f"cannot free {raw}")

    handler = Keep()
    logger = logging.getLogger("exitsafe")
    logger.addHandler(handler)
    try:
        reg = Registry(name="log-keeps-records")
        parent = reg.track("p", lambda raw: None, name="p")
        child = reg.track("c", boom, name="c", depends_on=[parent])
        refs = [weakref.ref(parent), weakref.ref(child)]
        del parent, child  # the child's release fails, from the garbage collector's drop
        gc.collect()
    finally:
        logger.removeHandler(handler)
    assert any("cannot free c" in record.getMessage() for record in kept)
    assert [ref() for ref in refs] == [None, None]
    assert {e.name: e.outcome for e in reg.ledger()}["c"] == Outcome.RELEASE_FAILED


def test_a_timeout_starts_standby_workers_before_shutdown():
    from exitsafe import _steps

    Registry(name="timed-standby", step_timeout=1.0)
    assert len(_steps._standby) == _steps.STANDBY
    reg = Registry(name="timed-standby-reuse", step_timeout=1.0)
    reg.track("x", lambda raw: None, name="x")
    reg.teardown()
    # the worker the teardown used is handed back, not left to end
    assert len(_steps._standby) == _steps.STANDBY


def test_a_timed_step_without_a_worker_is_leaked_not_run_unbounded(monkeypatch):
    # What CPython 3.12 does at exit once the standby workers are used up.
    from exitsafe import _steps

    def refuse(*args: object) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    calls: list[object] = []
    reg = Registry(name="no-worker", step_timeout=1.0)
    timed = reg.track("timed", calls.append, name="timed")  # noqa: F841  (held: live at teardown)
    reg.on_teardown(lambda: calls.append("hook"), name="hook")
    monkeypatch.setattr(_steps, "_standby", [])
    monkeypatch.setattr(_steps, "_Worker", refuse)
    reg.teardown()
    assert calls == []
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["timed"][0] == Outcome.LEAKED_TIMEOUT
    assert got["hook"][0] == Outcome.HOOK_TIMEOUT
    assert "no thread could be started" in got["timed"][1]


def test_importing_exitsafe_loads_only_the_core():
    # The adapters, the teardown executor and the step runner load on first use.
    import subprocess
    import sys

    code = (
        "import sys; import exitsafe; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('exitsafe')))); "
        "print(' '.join(m for m in ('cffi', 'ctypes', 'threading', 'logging') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    loaded = set(out[0].split())
    assert not loaded & {
        "exitsafe._adopt",
        "exitsafe._wrapper",
        "exitsafe._teardown",
        "exitsafe._steps",
        "exitsafe.cffi",
        "exitsafe.ctypes",
        "exitsafe.testing",
        "exitsafe.lab",
        "exitsafe.lowlevel",  # (loaded on first use, like the deprecated spellings)
    }
    assert out[1:] in ([], [""])
    # ... and the lazy names resolve
    import exitsafe

    assert exitsafe.adopt.__module__ == "exitsafe"  # where it is imported from
    assert "NativeObject" in dir(exitsafe)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        exitsafe.nope  # noqa: B018


# ---------------------------------------------------------------- detach


def test_detach_gives_the_object_back_without_releasing_it(reg, rec):
    parent = reg.track("p", rec, name="p")
    child = reg.track("c", rec, name="c", depends_on=[parent])
    assert child.detach() == "c"
    assert child.state == "detached" and child.owners == 0
    with pytest.raises(HandleClosedError, match="detached"):
        child.raw  # noqa: B018
    child.release()  # a no-op: nobody owns it any more
    parent.release()  # no dependent waits for it now: released at once
    assert rec.log == ["p"]
    assert outcomes(reg) == {"c": Outcome.DETACHED, "p": Outcome.RELEASED}
    reg.teardown()
    assert rec.log == ["p"]


def test_detach_of_the_last_dependent_releases_a_parent_that_lost_its_owners(reg, rec):
    parent = reg.track("p", rec, name="p")
    child = reg.track("c", rec, name="c", depends_on=[parent])
    parent.release()  # deferred behind the child
    assert rec.log == []
    child.detach()
    assert rec.log == ["p"]
