"""Error messages of wrong calls to the public functions: each names the call and the fix.

`explained` wraps a public function.  A call that Python cannot bind to its signature (a
missing argument, one too many, an unknown keyword) raises a ``TypeError`` that names the
public call, says what is wrong with the arguments given and what to write instead:
``exitsafe.cffi.track(ptr, release)`` answers that the cffi ``FFI`` object comes first, not
that the argument ``'release'`` is missing.  A ``TypeError`` or ``ValueError`` raised by
exitsafe's own checks inside the call gets the public call's name in front of its message
(the same exception object: its type and traceback do not change).  Nothing runs on a call
that succeeds but the wrapper's own frame; everything here is done on the error path only.

The hot paths are not wrapped where it would cost a frame: the compiled core's ``track``
functions call the wrapped Python function only for what they do not handle themselves
(every wrong call among it), and ``call()`` checks its function on the error path only.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Callable, Optional, TypeVar, Union

    F = TypeVar("F", bound=Callable[..., Any])
    #: A function's public name, or a function of the call's arguments giving it.
    Name = Union[str, Callable[[tuple[Any, ...]], str]]
    #: Says what is wrong with the call's arguments (a sentence), or ``None``.
    Diagnose = Callable[[tuple[Any, ...], dict[str, Any]], Optional[str]]

#: The directory of exitsafe's sources: an error raised by code there is exitsafe's own.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def explained(
    name: Name,
    usage: Name,
    *,
    diagnose: Optional[Diagnose] = None,
    needs: Optional[Mapping[str, str]] = None,
    method: bool = False,
    rename: bool = True,
    forward: Optional[tuple[Callable[..., Any], list[Any], Callable[[], Any]]] = None,
) -> Callable[[F], F]:
    """Wrap a public function so that a wrong call says which call and what to write.

    Args:
        name: the public name (``"exitsafe.cffi.track"``), or a function of the arguments.
        usage: the call to write (``"exitsafe.cffi.track(ffi, ptr, release)"``), or a
            function of the arguments.
        diagnose: says, from the arguments, what is wrong when Python cannot bind them (a
            swapped or missing leading argument), or ``None`` to let the generic text say.
        needs: what each parameter is, for "is missing" messages.
        method: the function is called with the object first (``self``), not shown.
        rename: put the public name in front of the messages of exitsafe's checks inside
            the call; ``False`` for a function that serves more than one public call
            (``track``: the module's and the registry's, whose messages say ``track()``).
            A ``name`` that is empty for the arguments given explains nothing.
        forward: ``(method, instances, make)`` for a function that only calls a method of
            a lazily made object with its own arguments (``exitsafe.track``: the default
            registry's ``Registry.track``): the wrapper calls ``method(instance, *args,
            **kwargs)`` itself, ``instance`` being ``instances[0]``, or ``make()`` while
            ``instances`` is empty, one frame fewer on the hot path.  The wrapped function
            still gives the signature, the documentation and the diagnosis, so its
            parameters must be the method's (``self`` aside).
    """

    def decorate(fn: F) -> F:
        def explain(
            exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Optional[TypeError]:
            """The error to raise instead of ``exc`` (a call Python could not bind), or
            ``None`` after naming the call in the message of ``exc`` (exitsafe's checks)."""
            tb = exc.__traceback__
            if tb is not None and tb.tb_next is None and type(exc) is TypeError:
                # raised by the call itself: Python could not bind the arguments
                return _binding_error(fn, exc, args, kwargs, name, usage, diagnose,
                                      needs, method)
            if rename and type(exc) in (TypeError, ValueError) and _raised_by_exitsafe(tb):
                _name_the_call(exc, _text(name, args))
            return None

        if forward is None:

            def public(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except (TypeError, ValueError) as exc:
                    new = explain(exc, args, kwargs)
                    if new is not None:
                        raise new from None
                    raise

        else:
            call, instances, make = forward

            def public(*args: Any, **kwargs: Any) -> Any:
                try:
                    return call(instances[0] if instances else make(), *args, **kwargs)
                except (TypeError, ValueError) as exc:
                    new = explain(exc, args, kwargs)
                    if new is not None:
                        raise new from None
                    raise

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(public, attr, getattr(fn, attr))
        public.__dict__.update(fn.__dict__)
        public.__wrapped__ = fn  # type: ignore[attr-defined]
        return public  # type: ignore[return-value]

    return decorate


def _text(value: Name, args: tuple[Any, ...]) -> str:
    return value if isinstance(value, str) else value(args)


def _raised_by_exitsafe(tb: Any) -> bool:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def _name_the_call(exc: BaseException, name: str) -> None:
    """Put ``name`` in front of the message of ``exc`` (an error of exitsafe's checks)."""
    if len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return
    message: str = exc.args[0]
    if message.startswith("exitsafe."):
        return  # named already (by a check that knows its caller)
    short = name.rpartition(".")[2]
    for head in (f"{short}() ", f"{short}(): "):
        if message.startswith(head):
            exc.args = (f"{name}(){message[len(short) + 2:]}",)
            return
    exc.args = (f"{name}(): {message}",)


# ------------------------------------------------------------------ arguments Python refused


def describe(value: object) -> str:
    """A short description of an argument, for a message."""
    kind = type(value)
    module = kind.__module__ or ""
    if value is None:
        return "None"
    if module == "_cffi_backend" or kind.__name__.startswith("__CData"):
        if _looks_like_ffi(value):
            return "the FFI object"
        text = repr(value)
        if text.startswith("<cdata '"):
            return f"a cdata '{text.split(chr(39))[1]}'"
        return f"a cffi {kind.__name__}"
    if kind.__name__ == "FFILibrary" or callable(getattr(value, "__cffi_close__", None)):
        return "a library (what ffi.dlopen() returned)"
    if _looks_like_ffi(value):
        return "the FFI object"
    name = getattr(value, "_name", None)
    if isinstance(getattr(value, "_handle", None), int) and hasattr(value, "_FuncPtr"):
        return f"a library ({kind.__name__} {name!r})"
    if isinstance(value, (str, bytes)):
        shown = value if len(value) <= 40 else value[:37] + "..."  # type: ignore[operator]
        return f"a {kind.__name__} ({shown!r})"
    if isinstance(value, (list, tuple)) and is_handles(value):
        return f"a {kind.__name__} of handles"
    if isinstance(value, (bool, int, float)):
        return f"{kind.__name__} {value!r}"
    if module.startswith("exitsafe"):
        public = next((c for c in kind.__mro__ if "._" not in f".{c.__module__}"), kind)
        return f"an exitsafe {public.__name__}"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    if module in ("ctypes", "_ctypes"):
        return f"a ctypes {kind.__name__}"
    if callable(value) and not isinstance(value, type):
        label = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        return f"the function {label}" if label else "a callable"
    return _article(kind.__name__)


def _article(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _looks_like_ffi(value: object) -> bool:
    return all(hasattr(value, attr) for attr in ("typeof", "cast", "dlopen", "NULL"))


def is_handles(value: object) -> bool:
    """A handle, or a list / tuple / set of them."""
    items = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    return bool(items) and all(
        type(item).__module__.startswith("exitsafe") and hasattr(item, "raw") for item in items
    )


def _keyword_for(value: object, keywords: list[str]) -> Optional[str]:
    """The keyword-only parameter an extra positional argument most likely meant."""

    def first(*names: str) -> Optional[str]:
        return next((n for n in names if n in keywords), None)

    if type(value).__name__ == "Registry" and type(value).__module__.startswith("exitsafe"):
        return first("registry")
    if is_handles(value):
        return first("depends_on", "before", "uses")
    if isinstance(value, bool):
        return first("close", "early")
    if isinstance(value, (int, float)):
        return first("timeout", "default")
    if isinstance(value, str):
        return first("close", "kind", "name")
    if callable(getattr(value, "set", None)) or callable(value):
        return first("stop", "close", "default", "onerror")
    return first("default")


def _binding_error(
    fn: Callable[..., Any],
    exc: TypeError,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: Name,
    usage: Name,
    diagnose: Optional[Diagnose],
    needs: Optional[Mapping[str, str]],
    method: bool,
) -> Optional[TypeError]:
    import inspect
    import re

    signature = inspect.signature(fn)
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        pass
    else:
        return None  # bound: the error came from somewhere else
    public = _text(name, args)
    if not public:
        return None
    write = _text(usage, args)
    shown = args[1:] if method else args
    parameters = [p for p in signature.parameters.values()
                  if not (method and p.name in ("self", "cls"))]
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = [p.name for p in parameters if p.kind == p.KEYWORD_ONLY]
    every = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    message = str(exc)
    problem = diagnose(shown, kwargs) if diagnose is not None else None
    if problem is None:
        names = message.partition(":")[2] if ":" in message else message.partition(")")[2]
        quoted = re.findall(r"'(\w+)'", names)
        if "positional argument" in message and " given" in message:
            extra = shown[len(positional):]
            guesses = [kw for kw in (_keyword_for(value, keywords) for value in extra) if kw]
            problem = (
                f"takes {len(positional)} positional argument"
                f"{'' if len(positional) == 1 else 's'}"
                f"{' (' + ', '.join(positional) + ')' if positional else ''}, "
                f"not {len(shown)}"
            )
            if keywords:
                problem += f"; the options are keyword-only ({', '.join(keywords)})"
            if guesses:
                head = write.partition("(")[0]
                write = f"{head}({', '.join([*positional, *(f'{kw}=...' for kw in guesses)])})"
        elif "missing" in message and quoted:
            what = [f"{q} ({needs[q]})" if needs and q in needs else q for q in quoted]
            keyword_only = "keyword-only" in message
            problem = (f"missing {'the keyword argument' if keyword_only else 'the argument'}"
                       f"{'s' if len(what) > 1 else ''} {' and '.join(what)}")
            absent = [q for q in quoted if f"{q}=" not in write]
            if keyword_only and absent and write.endswith(")"):
                write = write[:-1] + ", " + ", ".join(f"{q}=..." for q in absent) + ")"
        elif "unexpected keyword argument" in message and quoted:
            import difflib

            bad = quoted[0]
            close = difflib.get_close_matches(bad, every, n=1)
            problem = f"has no parameter {bad!r}"
            problem += (f"; did you mean {close[0]}=?" if close
                        else f"; its parameters are {', '.join(every)}")
        elif "multiple values" in message and quoted:
            problem = f"got {quoted[0]!r} twice, by position and by keyword"
        else:
            problem = message.partition(" ")[2] or message
    given = [describe(a) for a in shown] + [f"{k}=..." for k in kwargs]
    gave = ", ".join(given) if given else "no argument"
    stop = " " if problem.endswith("?") else ". "
    return TypeError(f"{public}(): {problem}{stop}The call gave {gave}; write {write}")


# ------------------------------------------------------------------ checks inside the calls


def release_not_callable(raw: object, release: object, usage: str, head: str = "") -> str:
    """The message of a ``track`` whose release function is not callable."""
    text = head + (f"release must be callable: the function that frees the object, called as "
            f"release(raw) (a library's function such as lib.thing_free); got {describe(release)}")
    function = callable(raw) and not (
        type(raw).__module__ == "_cffi_backend" and "(*)" not in repr(raw)  # a data pointer
    )
    if function:
        text += f"; the object and its release function are swapped? Write {usage}"
    return text


def kind_not_str(kind: object) -> str:
    """The message of a ``track`` whose ``kind`` (its third positional argument) is wrong."""
    text = f"kind must be a str (a label such as 'device'), got {describe(kind)}"
    if is_handles(kind):
        text += ("; the argument after release is kind: pass the handles it depends on as "
                 "depends_on=[...]")
    return text


def not_a_function(what: str, value: object) -> str:
    """The message of an argument that must be a function (a hook, a guarded callable)."""
    text = f"{what} must be callable, got {describe(value)}"
    if value is None or not isinstance(value, type):
        text += (f"; pass the function itself, not what calling it returned "
                 f"({what}=obj.close, not {what}=obj.close())")
    return text


def first_argument(check: Callable[[object], bool], text: str) -> Diagnose:
    """A `Diagnose` for a call whose first argument, when ``check`` refuses it, is missing:
    ``text`` says what must come first."""

    def diagnose(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[str]:
        if args and not check(args[0]):
            return text
        return None

    return diagnose


def not_a_foreign_function(call: str, fn: object, args: tuple[Any, ...]) -> str:
    """The message of ``call(fn, *args)`` when ``fn`` cannot be called."""
    text = f"{call}(): fn must be the foreign function to call, got {describe(fn)}"
    if args and callable(args[0]):
        return text + f": the function comes first. Write {call}(lib.thing_run, handle, ...)"
    return text + (
        f": pass the function and its arguments apart. Write {call}(lib.thing_run, handle, 10), "
        f"not {call}(lib.thing_run(handle.raw, 10))"
    )


def explained_track(track: F, default: list[Any]) -> F:
    """The compiled core's Python path of ``track`` (``Registry.track``), for the calls it
    hands over: a wrong call of ``exitsafe.track`` (the default registry, ``default[0]``)
    is explained as the pure-Python core's ``exitsafe.track`` explains it; for another
    registry nothing is (Python's own message, as the pure-Python ``Registry.track`` gives),
    and the messages of its checks say ``track()`` from either call."""

    def call(args: tuple[Any, ...]) -> str:
        return "exitsafe.track" if args and default and args[0] is default[0] else ""

    usage = "exitsafe.track(raw, release, depends_on=[...])"
    return explained(call, usage, method=True, needs=TRACK_NEEDS, rename=False)(track)


#: What a ``track`` call is missing, said in its error.
TRACK_NEEDS = {
    "raw": "the native object",
    "release": "the function that frees it, called as release(raw)",
}


def ffi_first(what: str) -> Diagnose:
    """The `Diagnose` of an ``exitsafe.cffi`` function taking the ``FFI`` first."""
    return first_argument(
        _looks_like_ffi,
        "the first argument must be the cffi FFI object (the ffi = cffi.FFI() whose cdef() "
        f"declared the library), before {what}",
    )


def cffi_function_type(ffi: Any, ctype: object) -> Any:
    """``ffi.typeof(ctype)`` for ``exitsafe.cffi.callback``, taking a function type as its
    pointer type, as ``ffi.callback`` does (``'int(void *)'`` is ``'int(*)(void *)'``, a
    typedef ``fn_t`` of a function type is ``'fn_t *'``)."""
    try:
        return ffi.typeof(ctype)
    except Exception as exc:
        if not (isinstance(ctype, str) and "not a pointer-to-function type" in str(exc)):
            raise
        head, paren, rest = ctype.partition("(")
        pointers = [head.rstrip() + "(*)(" + rest] if paren else []
        pointers.append(ctype + " *")
        for pointer in pointers:
            try:
                return ffi.typeof(pointer)
            except Exception:  # cffi's parser refuses this spelling: try the next one
                continue
        raise type(exc)(
            f"{exc}: exitsafe.cffi.callback() takes the pointer-to-function type, "
            f"such as {pointers[0]!r}"
        ) from None
