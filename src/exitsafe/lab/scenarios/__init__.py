"""The scenario programs: for each of S1-S13, the binding written the usual way
(``sN_unprotected.py``) and the same binding protected by exitsafe
(``sN_protected.py``).

Each file is a standalone program: run it with ``python path/to/sN_x.py`` or
``python -m exitsafe.lab.scenarios.sN_x``.  `exitsafe.lab.catalog`
describes what each must do; `exitsafe.lab.runner` runs and judges them.
"""
