"""Thread affinity through the adapters: `exitsafe.cffi.track`, `exitsafe.ctypes.track` and
`exitsafe.adopt` take `affinity=` as `Registry.track` does."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

import exitsafe
from exitsafe import AlreadyTrackedError, Outcome
from exitsafe import ctypes as es_ctypes

es_cffi = pytest.importorskip("exitsafe.cffi")

LONG = 30.0


def drop_elsewhere(handle: exitsafe.Handle) -> None:
    """Release the handle's only owner on another thread (it ends before this returns)."""
    worker = threading.Thread(target=handle.release, name="dropper")
    worker.start()
    worker.join(LONG)
    assert not worker.is_alive()


def recorder(free: Callable[[Any], object], where: list[str]) -> Callable[[Any], None]:
    def release(raw: Any) -> None:
        where.append(threading.current_thread().name)
        free(raw)

    return release


def test_cffi_track_with_affinity_releases_on_the_creating_thread(abi, reg):
    ffi, lib = abi
    before = lib.toy_live()
    where: list[str] = []
    h = es_cffi.track(
        ffi, lib.toy_ctx_new(), recorder(lib.toy_ctx_free, where), registry=reg,
        name="ctx", affinity="creator",
    )
    drop_elsewhere(h)
    assert where == [] and lib.toy_live() == before + 1  # queued for its creator
    exitsafe.lowlevel.run_pending()
    assert where == [threading.current_thread().name] and lib.toy_live() == before
    assert [(e.name, e.outcome) for e in reg.ledger()] == [("ctx", Outcome.RELEASED)]


def test_ctypes_track_with_affinity_releases_on_the_creating_thread(ctoy, reg):
    before = ctoy.toy_live()
    where: list[str] = []
    h = es_ctypes.track(
        ctoy.toy_ctx_new(), recorder(ctoy.toy_ctx_free, where), registry=reg,
        name="ctx", affinity="creator",
    )
    drop_elsewhere(h)
    assert where == [] and ctoy.toy_live() == before + 1
    exitsafe.lowlevel.run_pending()
    assert where == [threading.current_thread().name] and ctoy.toy_live() == before


def test_adopt_with_affinity_closes_on_the_creating_thread(reg):
    where: list[str] = []

    class Texture:
        def close(self) -> None:
            where.append(threading.current_thread().name)

    h = exitsafe.adopt(Texture(), registry=reg, name="texture", affinity="creator")
    drop_elsewhere(h)
    assert where == []
    exitsafe.lowlevel.run_pending()
    assert where == [threading.current_thread().name]


def test_adapters_check_affinity_and_leave_the_pointer_free(abi, ctoy, reg):
    ffi, lib = abi
    ptr = lib.toy_ctx_new()
    with pytest.raises(ValueError, match="affinity must be"):
        es_cffi.track(ffi, ptr, lib.toy_ctx_free, registry=reg, affinity="gpu")
    # the refused call claimed nothing: the same pointer can be tracked now
    es_cffi.track(ffi, ptr, lib.toy_ctx_free, registry=reg).release()

    address = ctoy.toy_ctx_new()
    with pytest.raises(TypeError, match="affinity must be"):
        es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg, affinity=1)  # type: ignore[arg-type]
    es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg).release()

    obj = type("Session", (), {"close": lambda self: None})()
    with pytest.raises(ValueError, match="affinity must be"):
        exitsafe.adopt(obj, registry=reg, affinity="gpu")
    exitsafe.adopt(obj, registry=reg).release()  # not left adopted by the refused call


def test_cffi_track_with_affinity_none_is_the_plain_call(abi, reg):
    ffi, lib = abi
    h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg, affinity=None)
    with pytest.raises(AlreadyTrackedError):
        es_cffi.track(ffi, h.raw, lib.toy_ctx_free, registry=reg)
    h.release()
    assert h.state == "released"
