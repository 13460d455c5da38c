"""MkDocs hook: the version of exitsafe shown in the site's header and footer.

Read from the installed distribution when there is one (``pip install -e '.[docs]'``), else
from ``pyproject.toml``, so the site never shows a version typed by hand in ``mkdocs.yml``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def project_version() -> str:
    """The version of exitsafe in this checkout."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if match:
        return match.group(1)
    from importlib.metadata import version  # a dynamic version: ask the installed package

    return version("exitsafe")


def on_config(config: Any) -> Any:
    """Fill in ``extra.version`` and the version in the copyright line."""
    version = project_version()
    config.extra["version"] = version
    if config.copyright:
        config.copyright = config.copyright.replace("{version}", version)
    return config
