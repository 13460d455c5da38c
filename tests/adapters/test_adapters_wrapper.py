"""NativeObject: wrapper classes without lifetime code of their own."""

from __future__ import annotations

import copy
import gc
import pickle

import pytest

from exitsafe import HandleClosedError, NativeObject
from exitsafe.lowlevel import handle_of


@pytest.fixture
def binding(abi, reg):
    """A small binding over the toy library, written the way an author would."""
    import exitsafe.cffi as es_cffi

    ffi, lib = abi

    class Context(NativeObject, kind="context", release=lib.toy_ctx_free, registry=reg):
        def __init__(self):
            super().__init__(lib.toy_ctx_new())

        def new_object(self):
            return Obj(self)

    class Obj(NativeObject, kind="object", registry=reg):
        __slots__ = ()

        def __init__(self, ctx):
            # validated by exitsafe.cffi.track (NULL, ownership), then wrapped
            handle = es_cffi.track(
                ffi, lib.toy_obj_new(ctx.raw), lib.toy_obj_free, registry=reg, kind="object"
            )
            super().__init__(handle=handle, parent=ctx)

        @property
        def id(self):
            return lib.toy_obj_id(self.raw)

    return Context, Obj, lib


def test_wrapper_basics(binding):
    Context, _Obj, lib = binding
    before = lib.toy_live()
    with Context() as ctx:
        obj = ctx.new_object()
        assert obj.parent is ctx and obj.handle.depends_on == (ctx.handle,)
        assert obj.id > 0 and not obj.closed
        assert repr(obj) == f"<binding.<locals>.Obj {obj.handle.name!r} live>"
        assert handle_of(obj) is None  # wrappers live in the test registry
    assert not ctx.closed or obj.closed is False
    # the context's release is deferred until its child is gone
    assert ctx.closed and ctx.handle.state == "live"
    obj.close()
    assert obj.closed and ctx.handle.state == "released"
    assert lib.toy_live() == before
    with pytest.raises(HandleClosedError):
        _ = obj.id


def test_wrapper_collected_releases_children_then_parent(binding):
    Context, _Obj, lib = binding
    before = lib.toy_live()
    ctx = Context()
    objs = [ctx.new_object() for _ in range(3)]
    del ctx  # the objects keep their parent alive
    gc.collect()
    assert lib.toy_live() == before + 4
    del objs
    gc.collect()
    assert lib.toy_live() == before


def test_wrapper_teardown_order_and_late_close_is_a_no_op(binding, reg):
    Context, _Obj, _lib = binding
    ctx = Context()
    obj = ctx.new_object()
    reg.teardown()
    names = [(e.kind, e.outcome) for e in reg.ledger()]
    assert names == [("object", "released_at_exit"), ("context", "released_at_exit")]
    obj.close()  # after teardown: recorded no-op, never calls native code
    ctx.close()
    assert obj.closed and ctx.closed


def test_close_twice_never_drops_another_owner(binding):
    Context, _Obj, _lib = binding
    ctx = Context()
    extra = ctx.handle.retain()
    ctx.close()
    ctx.close()
    assert extra.state == "live" and extra.owners == 1
    extra.release()
    assert extra.state == "released"


def test_wrapper_borrow_and_copy_refusals(binding):
    Context, _Obj, _lib = binding
    ctx = Context()
    with ctx.borrow() as raw:
        assert raw is ctx.raw
        ctx.close()
        assert ctx.handle.state == "live"  # waits for the borrow to end
    assert ctx.handle.state == "released"
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(Context())
    with pytest.raises(TypeError, match="copied"):
        copy.copy(Context())
    with pytest.raises(TypeError, match="copied"):
        copy.deepcopy(Context())


def test_wrapper_argument_errors(reg):
    class NoRelease(NativeObject, registry=reg):
        pass

    with pytest.raises(TypeError, match="no release function"):
        NoRelease(1)
    with pytest.raises(TypeError, match="needs the raw"):
        NoRelease()
    with pytest.raises(TypeError, match="either raw"):
        NoRelease(1, handle=reg.track(1, lambda r: None))
    with pytest.raises(TypeError, match="callable"):

        class Bad(NativeObject, release=3):
            pass

    plain = NoRelease(5, release=lambda raw: None, name="five")
    assert plain.raw == 5 and plain.handle.name == "five" and plain.handle.kind == "NoRelease"
    plain.close()


def test_wrapper_exit_policy_class_default(reg):
    released = []

    class Leaky(NativeObject, release=released.append, exit_policy="leak", registry=reg):
        pass

    w = Leaky("x")
    reg.teardown()
    assert released == [] and w.handle.state == "leaked"
