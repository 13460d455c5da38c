"""``python -m exitsafe``: the ``exitsafe`` command; see `exitsafe.cli`."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
