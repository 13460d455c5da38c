"""Which core runs exitsafe's hot path: the compiled one or the pure-Python one.

`speedups` is the compiled extension module ``exitsafe._speedups`` when it was built
(``pip install`` builds it with the system's C compiler; the package installs without
it when it cannot be built), ``EXITSAFE_PURE_PYTHON`` is unset, empty or ``0``, this is
the main interpreter and the build has the GIL; otherwise ``None``, and exitsafe runs in
pure Python.  The pure-Python core is the reference: every transition of a handle is a
function of ``exitsafe._record``; the compiled one mirrors the hot transitions (track,
release and retain of a handle nothing else holds, a handle's finalizer, the teardown's
common steps, the adapters' common ``track``) and hands every other case to the Python
functions.  Decided once, at import.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Literal, Optional

speedups: Optional[ModuleType]

_CHOICE = os.environ.get("EXITSAFE_PURE_PYTHON", "")

if _CHOICE not in ("", "0"):
    speedups = None
else:
    try:
        from . import _speedups
    except ImportError:  # not built (no compiler at install time): the pure-Python core
        speedups = None
    else:
        # The compiled core keeps its state in process-wide C variables, set up by the
        # main interpreter's exitsafe; a subinterpreter runs the pure-Python core.
        speedups = _speedups if _speedups.main_interpreter() else None

CORE: Literal["compiled", "python"] = "compiled" if speedups is not None else "python"
"""Which core runs exitsafe's hot path in this process: `"compiled"` (the C extension
`exitsafe._speedups`, built by `pip install` when a C compiler is available) or
`"python"` (not built, `EXITSAFE_PURE_PYTHON=1` in the environment at import, a
subinterpreter: the compiled core serves the main interpreter only, or a free-threaded
build: the compiled core refuses to load there, since its C sections were never run
without the GIL).

Both cores keep the same semantics, checked by running the whole test suite against
each and by a differential test comparing them program by program; only the cost per
handle differs (see the [performance page](../performance.md)).
"""
