"""PROTECTED: pyarrow_daemon_writer.py with the writer adopted in place of its ``atexit``
close: ``exitsafe.adopt(writer, close="close")``, the one line.

The writer thread's code refers to the writer: the exit teardown parks the thread at its
next call made from this program's code, once the ``write_batch`` in flight has returned
(within the bound, 1 s), then closes the writer, which writes the file's footer, with no
thread left to write.  Exits 0 every time and the Parquet file reads back (20 runs
of 20 on each of CPython 3.9 to 3.13, 2026-11-29).
"""

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
exitsafe.adopt(writer, close="close")  # the one line: the footer is written at exit
started = threading.Event()


def record() -> None:
    while True:  # (nothing stops this thread)
        writer.write_batch(batch, row_group_size=20_000)
        started.set()


threading.Thread(target=record, name="writer", daemon=True).start()
started.wait()
time.sleep(0.3)  # the rest of the program
print("writing; main thread ends", flush=True)
sys.exit(0)
