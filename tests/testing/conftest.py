"""Shared set-up for the tests of exitsafe.testing, its pytest plugin and the CLI."""

from __future__ import annotations

pytest_plugins = ["pytester"]
