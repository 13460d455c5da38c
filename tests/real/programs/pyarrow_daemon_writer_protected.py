"""PROTECTED: pyarrow_daemon_writer.py plus ``exitsafe.quiesce()``.

At exit, before any ``atexit`` callback (the writer's ``close`` included), the writer
thread is parked at its next call made from this program's code: the ``write_batch`` in
flight is waited for (it is inside pyarrow, Python and C++), and the thread stops before
the next one, for good.  Then ``close()`` flushes the last row group and writes the footer
with no thread left to write: exit 0 and a readable Parquet file, 20 runs of 20 on
CPython 3.9 to 3.13.
"""

import atexit
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import exitsafe

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
exitsafe.quiesce()  # ...after the writer has stopped between two batches
started = threading.Event()


def record() -> None:
    while True:
        writer.write_batch(batch, row_group_size=20_000)
        started.set()


threading.Thread(target=record, name="writer", daemon=True).start()
started.wait()
time.sleep(0.3)  # the rest of the program
print("writing; main thread ends", flush=True)
sys.exit(0)
