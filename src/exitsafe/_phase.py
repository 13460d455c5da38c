"""A registry's phases: ``OPEN`` (handles come and go), ``TEARING`` (its teardown runs:
the borrow gate is closed to other threads), ``CLOSED`` (every handle ended; every later
request is a recorded no-op).  The phase only ever grows, except in a forked child whose
parent's teardown ran on another thread (see ``Closing._after_fork_in_child``)."""

OPEN, TEARING, CLOSED = 0, 1, 2
