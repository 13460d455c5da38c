"""exitsafe lab: a native test runtime and the scenario catalogue S1-S10.

The lab is imported only on demand (``import exitsafe`` never imports it, nor
cffi).  Its parts:

- :mod:`exitsafe.lab.build`: compiles ``native/runtime.c`` and
  ``native/compiler.c`` with the system C compiler into a cache;
- :mod:`exitsafe.lab.shim`: the cffi ABI-mode ``ffi`` and loaders;
- :mod:`exitsafe.lab.report`: parsing of the runtime's leak report;
- :mod:`exitsafe.lab.catalog`: the scenarios and what each must do;
- :mod:`exitsafe.lab.scenarios`: the scenario programs, unprotected and protected;
- :mod:`exitsafe.lab.demo`: ``exitsafe demo``.
"""

from __future__ import annotations
