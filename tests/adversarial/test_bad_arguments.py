"""Bad arguments found by the adversarial review: each answered at once with a TypeError
that names the argument and what it accepts.

``neutralize_at_exit(obj, attr=5)`` answered "'int' object is not iterable";
``exitsafe.cffi.borrowing()`` / ``exitsafe.ctypes.borrowing()`` accepted anything (``None``,
``5``, a library's name) and failed later, at the first call through the view, with an
AttributeError of the wrapped object.
"""

from __future__ import annotations

import ctypes

import cffi
import pytest

import exitsafe
import exitsafe.cffi as es_cffi
import exitsafe.ctypes as es_ctypes

BAD_ATTRS = [5, None, 1.5, b"_handle", [], (), ["_handle", 5], [""], object()]


def _id(value: object) -> str:
    """A test id that is the same in every process (no object address in it)."""
    return "object()" if type(value) is object else repr(value)


class Catalog:
    def __init__(self) -> None:
        self._handle = object()


@pytest.fixture
def reg() -> exitsafe.Registry:
    return exitsafe.Registry("bad-arguments")


@pytest.mark.parametrize("attr", BAD_ATTRS, ids=_id)
def test_neutralize_at_exit_refuses_an_attr_that_is_no_name(reg, attr):
    obj = Catalog()
    with pytest.raises(TypeError, match=r"^attr must be an attribute name .*, got ") as info:
        exitsafe.lowlevel.neutralize_at_exit(obj, attr, registry=reg)
    assert "not iterable" not in str(info.value)
    assert reg.live_handles() == []  # nothing registered
    with pytest.raises(TypeError, match=r"^attr must be an attribute name"):
        exitsafe.lowlevel.neutralize(obj, attr)
    assert obj._handle is not None  # nothing neutralized


@pytest.mark.parametrize("attr", [5, b"_handle", []], ids=repr)
def test_adopt_refuses_a_neutralize_argument_that_is_no_name(reg, attr):
    class Conn:
        _handle = None

        def close(self) -> None:
            pass

    with pytest.raises(TypeError, match=r"^exitsafe\.adopt\(\): neutralize must be an attribute"):
        exitsafe.adopt(Conn(), neutralize=attr, registry=reg)
    assert reg.live_handles() == []


def test_good_attr_arguments_are_still_accepted(reg):
    obj = Catalog()
    exitsafe.lowlevel.neutralize_at_exit(obj, "_handle", registry=reg)
    exitsafe.lowlevel.neutralize_at_exit(obj, ["_handle"], registry=reg)
    exitsafe.lowlevel.neutralize_at_exit(obj, ("_handle",), registry=reg)
    reg.teardown()
    assert obj._handle is None


NOT_LIBRARIES = [None, 5, 0, True, 1.5, "libc.so.6", b"libc.so.6", [], {}, ("lib",)]


@pytest.mark.parametrize("lib", NOT_LIBRARIES, ids=repr)
def test_cffi_borrowing_refuses_what_is_not_a_library(lib):
    with pytest.raises(TypeError) as info:
        es_cffi.borrowing(lib)
    message = str(info.value)
    assert message.startswith("exitsafe.cffi.borrowing() needs a library: ")
    assert "ffi.dlopen()" in message and repr(lib) in message


@pytest.mark.parametrize("lib", NOT_LIBRARIES, ids=repr)
def test_ctypes_borrowing_refuses_what_is_not_a_library(lib):
    with pytest.raises(TypeError) as info:
        es_ctypes.borrowing(lib)
    message = str(info.value)
    assert message.startswith("exitsafe.ctypes.borrowing() needs a library: ")
    assert "ctypes.CDLL" in message and repr(lib) in message


def test_a_library_name_is_refused_with_the_hint_to_load_it():
    for borrowing in (es_cffi.borrowing, es_ctypes.borrowing):
        with pytest.raises(TypeError, match="a library's name must be loaded first"):
            borrowing("libc.so.6")


def test_cffi_borrowing_refuses_the_ffi_object_and_a_cdata():
    ffi = cffi.FFI()
    with pytest.raises(TypeError, match="got the ffi object itself"):
        es_cffi.borrowing(ffi)
    with pytest.raises(TypeError, match="got a cdata"):
        es_cffi.borrowing(ffi.new("int *"))


def test_a_handle_is_not_a_library(reg):
    h = reg.track("dev", lambda raw: None)
    for borrowing in (es_cffi.borrowing, es_ctypes.borrowing):
        with pytest.raises(TypeError, match="needs a library"):
            borrowing(h)


def test_real_libraries_are_still_accepted_and_borrow(reg):
    ffi = cffi.FFI()
    ffi.cdef("size_t strlen(const char *);")
    clib = es_cffi.borrowing(ffi.dlopen(None))
    text = ffi.new("char[]", b"four")
    h = reg.track(text, lambda raw: None, name="text")
    assert clib.strlen(h) == 4
    libc = ctypes.CDLL(None)
    libc.strlen.restype = ctypes.c_size_t
    libc.strlen.argtypes = [ctypes.c_char_p]
    tlib = es_ctypes.borrowing(libc)
    h2 = reg.track(b"seven!!", lambda raw: None, name="bytes")
    assert tlib.strlen(h2) == 7
