"""exitsafe's benchmark suite.

Run it from the repository root with ``python -m benchmarks`` (full run, a few
minutes) or ``python -m benchmarks --quick`` (seconds; checks that everything
works).  See ``docs/performance.md`` and :mod:`benchmarks.run`.
"""
