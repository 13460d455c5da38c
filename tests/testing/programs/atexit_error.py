"""An ``atexit`` callback that raises: it flushes a cache whose connection the program
already closed."""

import atexit

cache = {"rows": 3}
connection = None


def flush_cache() -> None:
    connection.executemany("INSERT ...", cache)  # type: ignore[attr-defined]


atexit.register(flush_cache)
print("done", flush=True)
