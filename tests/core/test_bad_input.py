"""Bad input is answered with TypeError / ValueError (or an ExitsafeError) naming the
argument, before anything changes; never a crash, a hang or a later AttributeError."""

from __future__ import annotations

import gc
import signal
import sys

import pytest

import exitsafe
from exitsafe import HandleClosedError, LiveDependentsError, Registry, RegistryClosedError
from exitsafe.policies import any_leak
from exitsafe.signals import teardown_on_signals


@pytest.fixture
def reg() -> Registry:
    return Registry("bad-input", ledger_limit=None)


def noop(raw: object) -> None:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": 5}, TypeError, "name must be a str"),
        ({"strict": "no"}, TypeError, "strict must be True or False"),
        ({"strict": 1}, TypeError, "strict must be True or False"),
        ({"exit_policy": "maybe"}, ValueError, "exit_policy must be"),
        ({"exit_policy": 5}, TypeError, "exit_policy must be"),
        ({"ledger_limit": -1}, ValueError, "ledger_limit"),
        ({"ledger_limit": True}, ValueError, "ledger_limit"),
        ({"step_timeout": "1"}, TypeError, "step_timeout must be a number"),
        ({"teardown_timeout": 0}, ValueError, "teardown_timeout must be a positive"),
    ],
)
def test_registry_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        Registry(**kwargs)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (10**400, ValueError),  # too large for a float: not an OverflowError
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        (-1, ValueError),
        (0, ValueError),
        ("1", TypeError),
        (True, TypeError),
    ],
)
def test_timeouts(reg, timeout, error):
    with pytest.raises(error, match="timeout must be"):
        reg.track("x", noop, timeout=timeout)
    with pytest.raises(error, match="timeout must be"):
        reg.step_timeout = timeout
    assert reg.live_handles() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"kind": 5}, TypeError, "kind must be a str"),
        ({"name": b"x"}, TypeError, "name must be a str"),
        ({"depends_on": 5}, TypeError, "depends_on must be a Handle or an iterable"),
        ({"depends_on": [object()]}, TypeError, "depends_on must contain exitsafe Handles"),
        ({"exit_policy": "never"}, ValueError, "exit_policy must be"),
    ],
)
def test_track_arguments(reg, kwargs, error, match):
    with pytest.raises(error, match=match):
        reg.track("x", noop, **kwargs)
    assert reg.live_handles() == []


def test_track_release_must_be_callable(reg):
    with pytest.raises(TypeError, match="release must be callable"):
        reg.track("x", "free")


def test_guard_arguments():
    with pytest.raises(TypeError, match=r"registry must be an exitsafe\.Registry"):
        exitsafe.guard(print, registry="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a callable"):
        exitsafe.guard("print")  # type: ignore[arg-type]


def test_teardown_reason_is_checked_before_anything_is_claimed(reg):
    h = reg.track("x", noop, name="x")
    with pytest.raises(TypeError, match="reason must be a str"):
        reg.teardown(reason=5)  # type: ignore[arg-type]
    assert not reg.tearing_down and h.state == "live" and h.raw == "x"
    reg.teardown()
    assert h.state == "released"


def test_handle_cannot_be_constructed_directly_and_leaves_no_noise():
    unraisable = []
    old, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(TypeError, match="created by track"):
            exitsafe.Handle()
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert unraisable == []


def test_on_teardown_and_pin_arguments(reg):
    with pytest.raises(TypeError, match="fn must be callable"):
        reg.on_teardown("hook")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a loaded library"):
        reg.pin(None)
    with pytest.raises(TypeError, match="close must be callable"):
        reg.pin("lib", close="dlclose")  # type: ignore[arg-type]


def test_adopt_arguments(reg):
    with pytest.raises(TypeError, match="needs an object"):
        exitsafe.adopt(None, registry=reg)
    h = reg.track("x", noop)
    with pytest.raises(TypeError, match="not an exitsafe Handle"):
        exitsafe.adopt(h, registry=reg)
    with pytest.raises(TypeError, match=r"registry must be an exitsafe\.Registry"):
        exitsafe.adopt(object(), close=None, registry="default")  # type: ignore[arg-type]


def test_any_leak_rejects_what_is_not_a_policy():
    with pytest.raises(ValueError, match="not an exit policy"):
        any_leak("release", "sometimes")


def test_detach_refusals(reg):
    parent = reg.track("p", noop, name="p")
    child = reg.track("c", noop, name="c", depends_on=[parent])
    with pytest.raises(LiveDependentsError, match="live dependents: c") as info:
        parent.detach()
    assert info.value.dependents == ("c",)
    with child.borrow():
        with pytest.raises(HandleClosedError, match="borrowed"):
            child.detach()
    assert child.detach() == "c"
    assert child.state == "detached"
    with pytest.raises(HandleClosedError):
        child.detach()
    reg.teardown()
    with pytest.raises(RegistryClosedError):
        parent.detach()


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("restore_signals")
def test_teardown_on_signals_takes_one_signal_name_as_one_signal():
    installed = teardown_on_signals("SIGTERM")
    assert list(installed) == [signal.SIGTERM]
    installed = teardown_on_signals(signal.SIGINT, mode="immediate")
    assert list(installed) in ([signal.SIGINT], [])


@pytest.mark.usefixtures("restore_signals")
@pytest.mark.parametrize(
    ("signals", "error", "match"),
    [
        (["SIGKILL"], ValueError, "SIGKILL cannot be caught"),
        (["SIGSTOP"], ValueError, "SIGSTOP cannot be caught"),
        (["SIGNOPE"], ValueError, "unknown signal name"),
        ([10_000], ValueError, "not a valid signal number"),
        ([3.5], TypeError, "names or numbers"),
        (None, TypeError, "a signal or an iterable"),
    ],
)
def test_teardown_on_signals_bad_signals(signals, error, match):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(error, match=match):
        teardown_on_signals(["SIGTERM", *signals] if isinstance(signals, list) else signals)
    assert signal.getsignal(signal.SIGTERM) is before, "nothing installed"


def test_teardown_on_signals_bad_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        teardown_on_signals(mode="later")
