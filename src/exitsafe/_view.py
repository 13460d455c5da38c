"""Borrowing views: [`Handle.borrowing`][exitsafe.Handle.borrowing].

A view stands for a handle's object (or an object derived from it) and borrows the handle
for the duration of every call made through it, so that threads whose code is not changed
(they call methods of what they were given) are waited for by a release and by the exit
teardown, and parked once the teardown began (see the threads page).

What is borrowed: every method call, every attribute read or write, and the special
operations a program uses on such objects (``[]`` read, write and delete, ``len``, ``in``,
``iter`` and each step of the iteration, calling, ``with``).  A callable result (a method,
a function the object holds) is returned as a call that borrows.  A result that belongs to the
same library as the handle's object (its type's top-level module is the same: an h5py
``Dataset`` from an h5py ``File``) is returned as a view borrowing the same handle, so that
``f["frames"][i] = row`` is borrowed end to end; any other result (a number, a numpy array)
is returned as it is.  Identity checks see the view, not the object: pass ``view.raw`` (the
handle's ``raw``) where a function needs the object itself.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, Optional

    from ._handle import Handle

__all__ = ["BorrowingView", "view_of"]


def view_of(handle: Handle) -> BorrowingView:
    """The view of ``handle``'s object (a new view each time; views hold no state)."""
    with handle.borrow() as raw:
        library = _library_of(raw)
    return BorrowingView(handle, None, library)


def _library_of(obj: object) -> Optional[str]:
    module = getattr(type(obj), "__module__", None)
    return module.split(".")[0] if isinstance(module, str) else None


class BorrowingView:
    """What [`Handle.borrowing`][exitsafe.Handle.borrowing] returns: a stand-in for the
    handle's object whose every call borrows the handle.  Its attributes are the object's;
    see `Handle.borrowing` for what is borrowed and what is wrapped."""

    __slots__ = ("_es_handle", "_es_library", "_es_target")

    def __init__(self, handle: Handle, target: object, library: Optional[str]) -> None:
        # (`target` None: the handle's own object, read at each use under the borrow)
        object.__setattr__(self, "_es_handle", handle)
        object.__setattr__(self, "_es_target", target)
        object.__setattr__(self, "_es_library", library)

    # -- the borrow around each use

    def _es_apply(self, use: Callable[[Any], Any]) -> Any:
        handle = self._es_handle
        with handle.borrow() as raw:
            target = self._es_target
            result = use(raw if target is None else target)
            return self._es_wrap(result, raw)

    def _es_wrap(self, result: Any, raw: object) -> Any:
        if result is raw or result is self._es_target:
            return self  # (a method returning its own object: `with f as g`, chaining)
        if callable(result) and not isinstance(result, type):
            return _BorrowingMethod(self, result)  # (a method, or a function it holds)
        if self._es_library is not None and _library_of(result) == self._es_library:
            return BorrowingView(self._es_handle, result, self._es_library)
        return result

    # -- attributes

    def __getattr__(self, name: str) -> Any:
        return self._es_apply(lambda obj: getattr(obj, name))

    def __setattr__(self, name: str, value: Any) -> None:
        self._es_apply(lambda obj: setattr(obj, name, value))

    def __delattr__(self, name: str) -> None:
        self._es_apply(lambda obj: delattr(obj, name))

    # -- the special operations (looked up on the type, not through __getattr__)

    def __getitem__(self, key: Any) -> Any:
        return self._es_apply(lambda obj: obj[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        def store(obj: Any) -> None:
            obj[key] = value

        self._es_apply(store)

    def __delitem__(self, key: Any) -> None:
        def delete(obj: Any) -> None:
            del obj[key]

        self._es_apply(delete)

    def __len__(self) -> int:
        return int(self._es_apply(len))

    def __contains__(self, item: Any) -> bool:
        return bool(self._es_apply(lambda obj: item in obj))

    def __iter__(self) -> Iterator[Any]:
        iterator = self._es_apply(iter)
        sentinel = object()
        while True:
            item = self._es_apply(lambda _obj: next(iterator, sentinel))
            if item is sentinel:
                return
            yield item

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._es_apply(lambda obj: obj(*args, **kwargs))

    def __enter__(self) -> Any:
        return self._es_apply(lambda obj: obj.__enter__())

    def __exit__(self, *exc: Any) -> Any:
        return self._es_apply(lambda obj: obj.__exit__(*exc))

    def __bool__(self) -> bool:
        return bool(self._es_apply(bool))

    def __repr__(self) -> str:
        target = self._es_target
        what = "its object" if target is None else f"{type(target).__name__} of it"
        return f"<exitsafe borrowing view of {what}, {self._es_handle!r}>"


class _BorrowingMethod:
    """A bound method of a viewed object: each call borrows the view's handle."""

    __slots__ = ("method", "view")

    def __init__(self, view: BorrowingView, method: Callable[..., Any]) -> None:
        self.view = view
        self.method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        method = self.method
        return self.view._es_apply(lambda _obj: method(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<exitsafe borrowing call of {self.method!r}>"
