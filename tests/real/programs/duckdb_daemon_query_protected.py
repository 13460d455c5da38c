"""PROTECTED: duckdb_daemon_query.py plus ``exitsafe.quiesce(wake=con.interrupt)``.

At exit, before any ``atexit`` callback (DuckDB's own included), the worker is set to
park at its next call or return from a C function made from this program's code; then
``con.interrupt()`` wakes the query in flight.  Its ``execute`` raises into the worker's
code, and the worker parks before the exception reaches it: no traceback, no abort.
Exit 0.
"""

import sys
import threading

import duckdb

import exitsafe

con = duckdb.connect()
exitsafe.quiesce(wake=con.interrupt)  # the one line
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
