"""Release functions that report failure by their result: [`exitsafe.checked`][exitsafe.checked].

exitsafe ignores what a release function returns; a release fails by raising (the handle ends
``release_failed``, an explicit ``release()`` re-raises).  C release functions report failure
by a return code instead (``sqlite3_close`` returns ``SQLITE_BUSY`` while statements are open):
``checked`` turns that code into the raise exitsafe understands, and stays transparent to the
adapters (``__wrapped__``), so the release keeps its automatic dependency on a pinned library.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Union

from ._errors import ReleaseError
from ._usage import explained

#: What a release's result is accepted by: one value, a collection of values, or a predicate.
Accepts = Union[object, Collection[object], Callable[[Any], bool]]


@explained(
    "exitsafe.checked",
    "exitsafe.checked(lib.thing_free, ok=0)",
    needs={"release": "the release function, such as lib.thing_free"},
)
def checked(release: Callable[[Any], object], *, ok: Accepts = 0) -> Callable[[Any], object]:
    """`release`, raising [`ReleaseError`][exitsafe.ReleaseError] when its result says it failed.

    Use it where a C release function returns a status: the failure then reaches the program
    as exitsafe's other release failures do.  An explicit
    [`Handle.release()`][exitsafe.Handle.release] (or the end of a `with` block) raises the
    `ReleaseError`; a release at teardown or by garbage collection records the handle as
    `release_failed` in the ledger, with the result in the entry's detail.  Either way the
    release is never called again and the handles it depends on are leaked rather than
    released under it (a database left open keeps its library loaded).

    The returned function keeps `release` as its `__wrapped__`: `exitsafe.cffi.track` and
    `exitsafe.ctypes.track` see through it to find the pinned library `release` lives in, as
    they do for a bare library function.

    Args:
        release: the release function, called as `release(raw)`.
        ok: the result of a successful release: a value (compared with `==`; default `0`,
            the usual C convention), a tuple, set or frozenset of such values, or a function
            taking the result and returning whether it is a success.

    Returns:
        A function to pass as the `release` of `track`: it calls `release(raw)`, returns its
            result when `ok` accepts it, and raises `ReleaseError` otherwise.

    Raises:
        TypeError: `release` is not callable.

    Example:
        ```python
        close = exitsafe.checked(lib.sqlite3_close, ok=lib.SQLITE_OK)
        db = exitsafe.cffi.track(ffi, conn, close)
        db.release()  # a statement still open: ReleaseError ... returned 5, expected 0
        ```
    """
    if not callable(release):
        raise TypeError(
            f"exitsafe.checked() needs the release function, got {type(release).__name__}: "
            f"write exitsafe.checked(lib.thing_free, ok=0)"
        )
    return _Checked(release, ok)


class _Checked:
    """The function `checked` returns (a class, so that it shows what it wraps)."""

    __slots__ = ("__wrapped__", "ok")

    def __init__(self, release: Callable[[Any], object], ok: Accepts) -> None:
        self.__wrapped__ = release
        self.ok = ok

    def __call__(self, raw: object) -> object:
        result = self.__wrapped__(raw)
        if not self._accepts(result):
            raise ReleaseError(
                f"the release function {_name_of(self.__wrapped__)} returned {result!r}, "
                f"expected {self._expected()}",
                result=result,
            )
        return result

    def _accepts(self, result: object) -> bool:
        ok = self.ok
        if callable(ok):
            return bool(ok(result))
        if isinstance(ok, (tuple, set, frozenset)):
            return result in ok
        return bool(result == ok)

    def _expected(self) -> str:
        ok = self.ok
        if callable(ok):
            return f"a result accepted by ok={_name_of(ok)}"
        if isinstance(ok, (tuple, set, frozenset)):
            return "one of " + ", ".join(repr(x) for x in ok)
        return repr(ok)

    def __repr__(self) -> str:
        return f"exitsafe.checked({self.__wrapped__!r}, ok={self.ok!r})"


def _name_of(fn: object) -> str:
    name = getattr(fn, "__name__", None)  # (a cffi function's is "<cdata>": its repr says more)
    return name if isinstance(name, str) and name.isidentifier() else repr(fn)
