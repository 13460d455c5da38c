"""Keeping the recorder working to the very end of finalization, when module dictionaries
are cleared and the builtins restored: its functions get private copies of their globals,
and its sink is never freed."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Sequence


def keep_forever(obj: object) -> None:
    """Leak one reference to ``obj`` on purpose: finalization clears module dictionaries
    and restores the builtins, and the recorder's weak references must outlive every
    object they watch."""
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except Exception:
        import codecs

        # A codec search function lives in the interpreter state until its very end.
        codecs.register(lambda name, _kept=obj: None)  # type: ignore[misc]


def detach(classes: Sequence[type]) -> None:
    """Give the functions of every module of this package, and the methods of ``classes``,
    a private copy of their module's globals and of the builtins: finalization clears
    module dictionaries, and the recorder must keep working after that.  In each copy, a
    function imported from another module of the package is its rebound self too."""
    import builtins
    import types

    package = __name__.rpartition(".")[0]
    private_builtins = dict(vars(builtins))
    privates: dict[str, dict[str, Any]] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == package or name.startswith(package + ".")):
            privates[name] = dict(vars(module))
            privates[name]["__builtins__"] = private_builtins

    def rebind(fn: Any) -> Any:
        new = types.FunctionType(
            fn.__code__, privates[fn.__module__], fn.__name__, fn.__defaults__, fn.__closure__
        )
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__qualname__ = fn.__qualname__
        return new

    rebound: dict[int, Any] = {}
    for module_name, private in privates.items():
        for name, value in list(private.items()):
            if isinstance(value, types.FunctionType) and value.__module__ == module_name:
                private[name] = rebound[id(value)] = rebind(value)
    for private in privates.values():
        for name, value in list(private.items()):
            if isinstance(value, types.FunctionType) and id(value) in rebound:
                private[name] = rebound[id(value)]
    for cls in classes:
        for name, value in list(vars(cls).items()):
            if isinstance(value, types.FunctionType):
                setattr(cls, name, rebind(value))
