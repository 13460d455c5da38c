"""exitsafe lab: a native test runtime and the scenario catalogue S1-S13.

The lab is imported only on demand (``import exitsafe`` never imports it, nor
cffi).  Its parts:

- `exitsafe.lab.build`: compiles ``native/runtime.c`` and
  ``native/compiler.c`` with the system C compiler into a cache;
- `exitsafe.lab.shim`: the cffi ABI-mode ``ffi`` and loaders;
- `exitsafe.lab.report`: parsing of the runtime's leak report;
- `exitsafe.lab.catalog`: the scenarios and what each must do;
- `exitsafe.lab.scenarios`: the scenario programs, unprotected and protected;
- `exitsafe.lab.demo`: ``exitsafe demo``.
"""

from __future__ import annotations
