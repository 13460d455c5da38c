"""adopt / neutralize / neutralize_at_exit / handle_of on plain Python objects."""

from __future__ import annotations

import dataclasses
import gc

import pytest

import exitsafe
from exitsafe import AlreadyTrackedError, adopt
from exitsafe.lowlevel import NeutralizeError, handle_of, neutralize, neutralize_at_exit


class Resource:
    """Shaped like a third-party wrapper: a native handle, close(), and __del__ calling close."""

    def __init__(self, label, log):
        self.label = label
        self.log = log
        self._handle = object()

    def close(self):
        if self._handle is not None:
            self.log.append(self.label)
            self._handle = None

    def __del__(self):
        self.close()


def test_adopt_closes_in_dependency_order_at_teardown(reg):
    log = []
    env = Resource("env", log)
    session = Resource("session", log)
    h_env = adopt(env, registry=reg)
    h_session = adopt(session, registry=reg, depends_on=[env])  # an adopted object works too
    assert h_session.depends_on == (h_env,)
    assert h_env.kind == "Resource" and h_env.raw is env
    del env, session
    gc.collect()
    assert log == []  # exitsafe owns them now: not collected early
    reg.teardown()
    assert log == ["session", "env"]


def test_adopt_explicit_release_closes_once_and_forgets(reg):
    log = []
    r = Resource("r", log)
    h = adopt(r, registry=reg)
    assert handle_of(r, registry=reg) is h
    with pytest.raises(AlreadyTrackedError) as info:
        adopt(r, registry=reg)
    assert info.value.handle is h
    h.release()
    h.release()
    assert log == ["r"] and handle_of(r, registry=reg) is None
    adopt(r, registry=reg, close=None).release()  # may be adopted again once released


def test_adopt_close_variants(reg):
    calls = []
    obj = type("Thing", (), {"shutdown": lambda self: calls.append("shutdown")})()
    adopt(obj, close="shutdown", registry=reg).release()
    adopt(obj, close=lambda o: calls.append(("fn", o)), registry=reg).release()
    assert calls == ["shutdown", ("fn", obj)]
    with pytest.raises(TypeError, match="no callable 'close'"):
        adopt(obj, registry=reg)
    with pytest.raises(TypeError, match="needs an object"):
        adopt(None, registry=reg)
    with pytest.raises(TypeError, match="close must be"):
        adopt(obj, close=3, registry=reg)


def test_adopt_leak_policy_with_neutralize_makes_the_finalizer_a_no_op(reg):
    log = []
    r = Resource("r", log)
    h = adopt(r, registry=reg, exit_policy="leak", neutralize="_handle")
    reg.teardown()
    assert h.state == "leaked" and r._handle is None
    del r
    gc.collect()
    assert log == []  # its own __del__ found nothing to close


class ReadsBack(Resource):
    """A finalizer that is not idempotent (wgpu's read-back in __del__): it acts on the
    native object whether or not it was closed."""

    def close(self):
        self.log.append(f"close {self.label}")
        self.closed = True

    def __del__(self):
        if self._handle is not None:
            closed = getattr(self, "closed", False)
            self.log.append("read back" + (" a closed object" if closed else ""))


def test_adopt_neutralizes_after_a_successful_close_too(reg):
    log = []
    r = ReadsBack("r", log)
    h = adopt(r, registry=reg, neutralize="_handle")
    h.release()
    assert r._handle is None
    del r
    gc.collect()
    assert log == ["close r"]  # its own __del__ found nothing to act on


def test_adopt_without_neutralize_leaves_a_non_idempotent_finalizer_acting(reg):
    log = []
    r = ReadsBack("r", log)
    adopt(r, registry=reg)
    reg.teardown()
    del r
    gc.collect()
    assert log == ["close r", "read back a closed object"]


def test_adopt_after_teardown_is_leaked_and_neutralized():
    registry = exitsafe.Registry("closed")
    registry.teardown()
    log = []
    r = Resource("r", log)
    h = adopt(r, registry=registry, neutralize="_handle")
    assert h.state == "leaked" and r._handle is None


def test_failed_close_is_recorded_and_neutralized(reg):
    class Broken(Resource):
        def close(self):
            if self._handle is not None:
                raise RuntimeError("native error")

    r = Broken("b", [])
    adopt(r, registry=reg, neutralize="_handle")
    reg.teardown()
    assert reg.ledger()[0].outcome == "release_failed"
    assert r._handle is None  # so the later __del__ does not retry


# ---------------------------------------------------------------------- neutralize


class Slotted:
    __slots__ = ("__weakref__", "_handle")

    def __init__(self):
        self._handle = 7


class WithProperty:
    def __init__(self):
        self._h = 1

    @property
    def handle(self):
        return self._h

    @handle.setter
    def handle(self, value):
        self._h = value

    @property
    def readonly(self):
        return self._h


@dataclasses.dataclass(frozen=True)
class Frozen:
    _handle: int = 1


def test_neutralize_plain_slot_and_property():
    r = Resource("r", [])
    old = neutralize(r)
    assert r._handle is None and "_handle" in old
    s = Slotted()
    assert neutralize(s, null=0) == {"_handle": 7} and s._handle == 0
    p = WithProperty()
    neutralize(p, "handle")
    assert p._h is None


@pytest.mark.parametrize(
    "obj, attr, words",
    [
        (Resource("r", []), "_hdl", "no such attribute"),
        (WithProperty(), "readonly", "read-only property"),
        (Frozen(), "_handle", "refused"),
        (object(), "x", "no such attribute"),
        (Slotted.__new__(Slotted), "_handle", "no such attribute"),  # slot never set
    ],
)
def test_neutralize_refuses_at_call_time(obj, attr, words, reg):
    with pytest.raises(NeutralizeError, match=words):
        neutralize(obj, attr)
    with pytest.raises(NeutralizeError, match=words):
        neutralize_at_exit(obj, attr, registry=reg)
    assert isinstance(NeutralizeError("x"), AttributeError)
    assert len(reg) == 0


def test_neutralize_refuses_class_attribute_without_instance_dict():
    class NoDict:
        __slots__ = ()
        _handle = 5

    with pytest.raises(NeutralizeError, match="class attribute"):
        neutralize(NoDict())


def test_neutralize_several_attributes_checks_all_first():
    r = Resource("r", [])
    with pytest.raises(NeutralizeError):
        neutralize(r, ("_handle", "missing"))
    assert r._handle is not None  # nothing changed
    neutralize(r, ("_handle", "label"))
    assert r._handle is None and r.label is None


def test_neutralize_at_exit_runs_at_teardown(reg):
    log = []
    r = Resource("r", log)
    s = Slotted()
    hook = neutralize_at_exit(r, registry=reg)
    neutralize_at_exit(s, null=0, registry=reg)
    assert hook.kind == "hook" and r._handle is not None
    reg.teardown()
    assert r._handle is None and s._handle == 0
    del r
    gc.collect()
    assert log == []


def test_neutralize_at_exit_does_not_keep_the_object_alive(reg):
    log = []
    r = Resource("r", log)
    neutralize_at_exit(r, registry=reg)
    del r
    gc.collect()
    assert log == ["r"]  # collected normally: its own close ran while everything was loaded
    neutralize_at_exit(Resource("other", log), registry=reg)  # sweeps the dead hook
    assert [h.name for h in reg.live_handles()] == ["neutralize Resource._handle"]
    reg.teardown()


def test_neutralize_at_exit_before_and_after(reg):
    order = []
    parent = reg.track("p", lambda raw: order.append("release p"))
    child = reg.track("c", lambda raw: order.append("release c"), depends_on=[parent])

    class Probe:
        def __init__(self, label):
            self.label = label
            self._handle = 1

        def __setattr__(self, name, value):
            if name == "_handle" and value is None:
                order.append(f"neutralize {self.label}")
            object.__setattr__(self, name, value)

    a, b = Probe("a"), Probe("b")
    neutralize_at_exit(a, registry=reg, after=[child], before=[parent])
    neutralize_at_exit(b, registry=reg, before=[child])
    reg.teardown()
    assert order == ["neutralize b", "release c", "neutralize a", "release p"]


def test_neutralize_at_exit_can_be_cancelled(reg):
    r = Resource("r", [])
    hook = neutralize_at_exit(r, registry=reg)
    hook.release()
    reg.teardown()
    assert r._handle is not None


def test_handle_of_and_depends_on_errors(reg):
    h = reg.track(1, lambda raw: None)
    assert handle_of(h) is h
    assert handle_of(object(), registry=reg) is None
    with pytest.raises(TypeError, match="no live exitsafe handle"):
        adopt(Resource("r", []), registry=reg, depends_on=[object()])
    with pytest.raises(TypeError, match="Registry"):
        adopt(Resource("r", []), registry="default")


def test_a_closed_adopted_object_is_no_longer_referenced(reg):
    # (found with issue 26: every adopted object stayed referenced after its close)
    import weakref

    log = []
    released = Resource("released", log)
    h = adopt(released, registry=reg)
    h.release()
    at_teardown = Resource("at teardown", log)
    adopt(at_teardown, registry=reg)
    reg.teardown()
    refs = [weakref.ref(released), weakref.ref(at_teardown)]
    del released, at_teardown, h
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    assert log == ["released", "at teardown"]
