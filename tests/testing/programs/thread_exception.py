"""A thread's uncaught exception as the program ends: the shape of a DuckDB query
interrupted by the interpreter's finalization, or a pyzmq receiver whose context was
terminated.  The process still exits 0.
"""

import threading


class Connection:
    def __init__(self) -> None:
        self.closed = False

    def query(self, sql: str) -> list:
        if self.closed:
            raise RuntimeError("Connection already closed!")
        return []


connection = Connection()
main_done = threading.Event()


def report() -> None:
    main_done.wait(30)
    connection.query("SELECT count(*) FROM events")  # the connection is gone by now


threading.Thread(target=report, name="report-query").start()
connection.closed = True  # the main code closes it as it ends
main_done.set()
print("done", flush=True)
