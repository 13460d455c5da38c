"""UNPROTECTED: a daemon thread renders audio into a FLAC file with soundfile (libsndfile
through cffi) one second at a time while the main thread ends; the program closes the file
at exit itself, with ``atexit.register(take.close)``, as soundfile's users do.

Each ``take.write(second)`` encodes the second with libsndfile's FLAC encoder in a cffi
call that releases the GIL, most of the writer's time, so when the main thread ends (after
0.3 s of other work) the writer is inside one.  The ``atexit`` callback's ``close()``
(``sf_write_sync``, then ``sf_close``, which finishes the stream, rewrites the FLAC header
and frees the ``SNDFILE``; GIL released too) then runs under the write in flight.  Seen on
the same interpreter: SIGSEGV on the writer's thread (most runs), on the main thread inside
``close()`` (a few runs in a hundred), SIGBUS, SIGABRT from glibc's heap check ("free():
corrupted unsorted chunks"), and the writer's next ``write`` failing on the closed file
(an ``AssertionError`` in soundfile: fewer frames written than given), printed as
"Exception in thread writer" and nearly always cut short as the process ends.  Unclean in
19 or 20 runs of 20 on each of CPython 3.9 to 3.13, and in 40 of 40 on each in another
series (14 of 20 on 3.11 in the worst series); the FLAC file left unreadable ("flac
decoder lost sync", "unknown error in flac decoder") after 6 to 13 runs of 20, once after
a run that exited 0 (measured 2026-11-29 on a 2-core machine, soundfile 0.13.1 on 3.9 and
0.14.0 on the others, libsndfile 1.2.2 from the wheels).
"""

import atexit
import sys
import threading
import time

import numpy as np
import soundfile as sf

rate = 48_000
second = np.random.default_rng(0).uniform(-0.5, 0.5, (rate, 2))  # one second of stereo
take = sf.SoundFile("take.flac", "w", rate, channels=2, format="FLAC")
atexit.register(take.close)  # the header is finished at exit...
started = threading.Event()


def render() -> None:
    while True:  # ...but nothing stops this thread
        take.write(second)
        started.set()


threading.Thread(target=render, name="writer", daemon=True).start()
started.wait()
time.sleep(0.3)  # the rest of the program
print("rendering; main thread ends", flush=True)
sys.exit(0)
