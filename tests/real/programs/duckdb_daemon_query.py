"""UNPROTECTED: a daemon thread runs DuckDB analytical queries in a loop while the main
thread ends.

Each query runs in DuckDB's C++ code with the GIL released for about a second, nearly
all the worker's time, so the exit finds the worker inside one.  On CPython <= 3.13
either DuckDB interrupts the query in flight and the worker's ``execute`` raises
``duckdb.InterruptException``, whose traceback is printed ("Exception in thread crunch"),
or the worker is ended inside DuckDB's C++ code as the interpreter finalizes and the
process aborts (SIGABRT, "FATAL: exception not rethrown"); on 3.14+ any unclean end.
"""

import sys
import threading

import duckdb

con = duckdb.connect()
started = threading.Event()
QUERY = "SELECT sum(a.range * b.range) FROM range(20000) a, range(20000) b"


def crunch_forever() -> None:
    started.set()
    while True:  # the worker's own code: it never checks a stop flag
        con.execute(QUERY).fetchall()


threading.Thread(target=crunch_forever, name="crunch", daemon=True).start()
started.wait()
print("querying; main thread ends", flush=True)
sys.exit(0)
