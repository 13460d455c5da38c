"""exitsafe.checked and ReleaseError, on Python release functions (both cores)."""

from __future__ import annotations

import pickle

import pytest

import exitsafe
from exitsafe import ReleaseError


def returning(*results):  # type: ignore[no-untyped-def]
    """A release function returning each of ``results`` in turn, recording its calls."""
    calls = []

    def release(raw):  # type: ignore[no-untyped-def]
        calls.append(raw)
        return results[len(calls) - 1]

    return release, calls


@pytest.mark.parametrize(
    ("ok", "result", "accepted"),
    [
        (0, 0, True),
        (0, 5, False),
        (0, None, False),
        (None, None, True),
        ((0, 101), 101, True),
        (frozenset({0}), 1, False),
        (lambda rc: rc >= 0, 3, True),
        (lambda rc: rc >= 0, -1, False),
    ],
)
def test_ok_accepts_a_value_a_set_of_values_or_a_predicate(ok, result, accepted):
    release, calls = returning(result)
    reg = exitsafe.Registry("checked")
    h = reg.track("raw", exitsafe.checked(release, ok=ok))
    if accepted:
        h.release()
        assert [e.outcome for e in reg.ledger()] == ["released"]
    else:
        with pytest.raises(ReleaseError) as raised:
            h.release()
        assert raised.value.result == result
        assert [e.outcome for e in reg.ledger()] == ["release_failed"]
    assert calls == ["raw"]
    h.release()  # never called again
    assert calls == ["raw"]
    reg.teardown()


def test_the_message_names_the_function_its_result_and_what_was_expected():
    def db_close(raw):  # type: ignore[no-untyped-def]
        return 5

    with pytest.raises(ReleaseError, match=r"^the release function db_close returned 5, "
                                           r"expected one of 0, 101$"):
        exitsafe.checked(db_close, ok=(0, 101))("raw")


def test_a_failed_release_leaks_what_it_depends_on():
    reg = exitsafe.Registry("checked")
    released = []
    parent = reg.track("parent", released.append)
    child = reg.track("child", exitsafe.checked(lambda raw: 1), depends_on=[parent])
    parent.release()  # deferred: the child lives
    with pytest.raises(ReleaseError):
        child.release()
    assert released == []
    assert {e.name: e.outcome for e in reg.ledger()} == {
        child.name: "release_failed", parent.name: "leaked_dependent",
    }


def test_at_teardown_the_ledger_keeps_the_error():
    reg = exitsafe.Registry("checked")
    reg.track("raw", exitsafe.checked(lambda raw: -1), name="db")
    reg.teardown()
    (entry,) = reg.ledger()
    assert entry.outcome == "release_failed"
    assert "ReleaseError" in entry.detail and "returned -1, expected 0" in entry.detail


def test_wrong_calls_name_the_fix():
    fix = r"write exitsafe.checked\(lib.thing_free, ok=0\)"
    with pytest.raises(TypeError, match=r"needs the release function, got int: " + fix):
        exitsafe.checked(0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"the options are keyword-only \(ok\).*" + fix):
        exitsafe.checked(print, 0)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"missing the argument release.*" + fix):
        exitsafe.checked()  # type: ignore[call-arg]


def test_checked_shows_what_it_wraps_and_the_error_pickles():
    wrapped = exitsafe.checked(print, ok=(0,))
    assert wrapped.__wrapped__ is print  # type: ignore[attr-defined]
    assert repr(wrapped) == f"exitsafe.checked({print!r}, ok=(0,))"
    error = pickle.loads(pickle.dumps(ReleaseError("closing failed", result=5)))
    assert (str(error), error.result) == ("closing failed", 5)
    assert isinstance(error, exitsafe.ExitsafeError)
    assert type(error).__module__ == "exitsafe"
