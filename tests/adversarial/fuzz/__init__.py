"""A generator of small exitsafe programs, run in subprocesses and checked against invariants.

:mod:`.scenario` holds hypothesis strategies that draw a :class:`~.scenario.Scenario`: a
small typed description of a program (a dependency graph of handles in the default
registry or one of its own, extra owners, exit policies — ``"release"``, ``"leak"`` or a
callable that answers or raises —, teardown hooks with ``before=`` / ``after=`` edges,
worker threads holding a borrow for a while or until the process ends, explicit
``release()`` calls and dropped references, an ``os.fork()`` whose child tracks, releases
and leaves through ``sys.exit`` or :func:`exitsafe.exit`, and the way the main program
ends: the end of the main module, ``sys.exit(n)``, :func:`exitsafe.exit` (``os._exit``
after the teardown), an explicit teardown followed by late releases, an exception
escaping the main module, ``KeyboardInterrupt``, or SIGTERM sent to itself with
:func:`exitsafe.signals.teardown_on_signals` in either mode).

:mod:`.render` turns a scenario into the program's text (every release function and hook
writes one ``os.write`` line with its pid and name; the ledger goes to
``EXITSAFE_LEDGER=ledger-{pid}.json``), :mod:`.model` computes what the documentation says
must happen to each handle in each process, and :mod:`.check` asserts the invariants on
the finished run: no hang (a hard timeout), the expected exit status, no
"Exception ignored" / traceback noise except the exception the program raised on
purpose, every handle released at most once per process and never by a child that
inherited it, never a handle before one that depends on it (nor while a dependent was
leaked), hooks on the right side of their edges, exactly one ledger outcome per handle,
and outcomes matching the model (a ``"leak"`` policy ends ``leaked_*``, never released).

The test (``tests/adversarial/test_generated_programs.py``) is derandomized: CI runs the
same ``EXITSAFE_FUZZ_EXAMPLES`` programs (default 25) every time and hypothesis writes no
database.  For a longer local run, draw more programs::

    EXITSAFE_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest \
        tests/adversarial/test_generated_programs.py

``EXITSAFE_FUZZ_SEED=<int>`` draws a different fixed series (the default series is
``derandomize=True``'s), and ``EXITSAFE_FUZZ_SHRINK=1`` lets hypothesis minimize a failure
(slow: every step reruns programs).  A failure prints the scenario and the rendered program.
"""
