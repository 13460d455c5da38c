"""The optional compiled core (exitsafe._speedups): everything else is in pyproject.toml.

``optional=True``: when the extension cannot be built (no C compiler, no Python
headers) the package still installs and exitsafe runs its pure-Python core.
``EXITSAFE_PURE_PYTHON=1`` at run time selects the pure-Python core even when built.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "exitsafe._speedups",
            sources=["src/exitsafe/_speedups.c"],
            optional=True,
        )
    ]
)
