"""UNPROTECTED: a daemon thread writes record batches to a Parquet file with pyarrow's
``ParquetWriter`` in a loop while the main thread ends; the program closes the writer at
exit itself, with ``atexit.register(writer.close)``.

Each ``write_batch`` encodes and zstd-compresses ten row groups in Arrow's C++ code with
the GIL released, nearly all the writer's time, so when the main thread ends (after
0.3 s of other work) the writer is inside one.  The ``atexit`` callback's ``close()``
(which ends the row group and writes the file's footer, GIL released too) then runs on
the same C++ ``FileWriter`` as the write in flight, which is not made for two threads at
once.  Seen on the same interpreter: SIGSEGV (on the writer's thread or on the main one),
SIGABRT ("terminate called ..."), ``close()`` raising "OSError: Column 2 had 20000 while
previous column had ..." or "Only 0 out of 3 columns are initialized" (printed after "Error
in atexit._run_exitfuncs"), and the writer's next ``write_batch`` raising on the closed
file ("Exception in thread writer").  Unclean in 20 runs of 20 on CPython 3.9 and on 3.13,
and the Parquet file left unreadable ("Parquet magic bytes not found in footer") after
every one of those 40 runs; unclean in 8 runs of 10 on 3.10 and 10 of 10 on 3.11 and
3.12 (measured 2026-11-28 on a 2-core machine, pyarrow 21 on 3.9, 25-26 on the others).

(``exitsafe.adopt(writer, close="close")`` in place of the ``atexit`` line is one fix, and
the file then reads back: ``pyarrow_daemon_writer_adopted.py``.)
"""

import atexit
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

rng = np.random.default_rng(0)
rows = 200_000
batch = pa.record_batch(
    {
        "t": np.arange(rows, dtype="i8"),
        "x": rng.random(rows),
        "label": pa.array(rng.integers(0, 1000, rows).astype(str)),
    }
)
writer = pq.ParquetWriter("batches.parquet", batch.schema, compression="zstd")
atexit.register(writer.close)  # the footer is written at exit...
started = threading.Event()


def record() -> None:
    while True:  # ...but nothing stops this thread
        writer.write_batch(batch, row_group_size=20_000)
        started.set()


threading.Thread(target=record, name="writer", daemon=True).start()
started.wait()
time.sleep(0.3)  # the rest of the program
print("writing; main thread ends", flush=True)
sys.exit(0)
