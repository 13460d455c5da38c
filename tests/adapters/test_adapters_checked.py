"""exitsafe.checked: a release function's return code turned into the failure exitsafe records.

On a real C library (SQLite through ctypes: ``sqlite3_close`` returns ``SQLITE_BUSY`` while a
statement is open) and on the toy library through cffi; the wrapped release keeps the automatic
dependency on its library's pin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pytest

import exitsafe
from exitsafe import ReleaseError
from exitsafe import cffi as es_cffi
from exitsafe import ctypes as es_ctypes

SQLITE_OK, SQLITE_BUSY = 0, 5


@pytest.fixture
def sqlite():  # type: ignore[no-untyped-def]
    """libsqlite3 through ctypes: open, prepare, finalize, close (the v1 close, which refuses
    to close a connection with an open statement)."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        pytest.skip("libsqlite3 is not installed here (Debian: libsqlite3-0)")
    lib = ctypes.CDLL(name)
    vp = ctypes.c_void_p
    lib.sqlite3_open.argtypes = (ctypes.c_char_p, ctypes.POINTER(vp))
    lib.sqlite3_prepare_v2.argtypes = (vp, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(vp), vp)
    lib.sqlite3_finalize.argtypes = (vp,)
    lib.sqlite3_close.argtypes = (vp,)
    for fn in (lib.sqlite3_open, lib.sqlite3_prepare_v2, lib.sqlite3_finalize, lib.sqlite3_close):
        fn.restype = ctypes.c_int
    return lib


def _open(lib):  # type: ignore[no-untyped-def]
    db = ctypes.c_void_p()
    assert lib.sqlite3_open(b":memory:", ctypes.byref(db)) == SQLITE_OK
    return db.value


def _prepare(lib, db):  # type: ignore[no-untyped-def]
    stmt = ctypes.c_void_p()
    assert lib.sqlite3_prepare_v2(db, b"select 1", -1, ctypes.byref(stmt), None) == SQLITE_OK
    return stmt.value


def test_an_explicit_close_that_fails_raises_with_the_code(sqlite, reg):
    db = _open(sqlite)
    stmt = _prepare(sqlite, db)  # not tracked: the close comes first, and fails
    h = es_ctypes.track(db, exitsafe.checked(sqlite.sqlite3_close, ok=SQLITE_OK), registry=reg)
    with pytest.raises(ReleaseError, match=r"returned 5, expected 0") as raised:
        h.release()
    assert raised.value.result == SQLITE_BUSY
    assert [(e.name, e.outcome) for e in reg.ledger()] == [(h.name, "release_failed")]
    assert sqlite.sqlite3_finalize(stmt) == SQLITE_OK
    assert sqlite.sqlite3_close(db) == SQLITE_OK  # the connection was left open, as SQLite says


def test_a_failed_close_at_teardown_is_recorded_with_its_code(sqlite, reg):
    db = _open(sqlite)
    stmt = _prepare(sqlite, db)
    h = es_ctypes.track(db, exitsafe.checked(sqlite.sqlite3_close), registry=reg, name="db")
    reg.teardown()
    (entry,) = reg.ledger()
    assert (entry.name, entry.outcome) == ("db", "release_failed")
    assert "returned 5, expected 0" in entry.detail
    assert h.state == "leaked"
    assert sqlite.sqlite3_finalize(stmt) == SQLITE_OK
    assert sqlite.sqlite3_close(db) == SQLITE_OK


def test_a_close_that_succeeds_is_a_plain_release(sqlite, reg):
    h = es_ctypes.track(_open(sqlite), exitsafe.checked(sqlite.sqlite3_close), registry=reg)
    h.release()
    assert [e.outcome for e in reg.ledger()] == ["released"]


def test_a_checked_release_keeps_the_pin_of_its_library(sqlite, reg):
    # ctypes: the library of the wrapped function is found through __wrapped__ (checked,
    # functools.wraps) and functools.partial; a lambda shows nothing to follow
    pin = es_ctypes.pin(sqlite, registry=reg)
    close = sqlite.sqlite3_close

    @functools.wraps(close)
    def logged(db):  # type: ignore[no-untyped-def]
        return close(db)

    for release in (exitsafe.checked(close), logged, functools.partial(close)):
        h = es_ctypes.track(_open(sqlite), release, registry=reg)
        assert h.depends_on == (pin,), release
        h.release()
    h = es_ctypes.track(_open(sqlite), lambda db: close(db), registry=reg)
    assert h.depends_on == ()
    h.release()
    h = es_ctypes.track(_open(sqlite), lambda db: close(db), registry=reg, lib=sqlite)
    assert h.depends_on == (pin,)
    h.release()


def test_a_checked_cffi_release_keeps_the_pin_of_its_library(abi, reg):
    ffi, lib = abi
    pin = es_cffi.pin(ffi, lib, registry=reg)
    h = es_cffi.track(ffi, lib.toy_ctx_new(), exitsafe.checked(lib.toy_ctx_free, ok=None),
                      registry=reg)
    assert h.depends_on == (pin,)
    h.release()
    assert [e.outcome for e in reg.ledger()] == ["released"]
