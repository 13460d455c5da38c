"""Adversarial tests: programs that force the hazards of issue 11 deterministically.

Each test runs a program in a fresh interpreter (a hang kills it and fails the test)
and checks what a user would: exit status, no noise on stderr, one ledger outcome per
handle, and the release order and count from an ``os.write`` log.

Hazards are forced, not hoped for: :data:`FORCE_IN_SECTIONS` installs a trace function
that runs code (a full garbage collection, a signal) at every line executed while
the thread holds exitsafe's lock, so the finalizers and handlers run inside every
critical section the program reaches, on every interpreter.
"""
