"""What the scaling programs (``dask_worker_shards.py``, ``ray_actor_shards.py``,
``torch_gloo_shards.py``) share: after the run, reading back each worker's HDF5 shard and
its own exitsafe ledger (``EXITSAFE_LEDGER=ledger-{pid}.json``).  Not a program.

Imported from this directory: ``sys.path[0]`` of a program run as a script (a
``torchrun`` worker runs the script itself), and on the ``PYTHONPATH`` that each program
sets for the workers it starts (a dask nanny's, Ray's, ``torchrun``'s), so that a worker
which imports a program's module (to unpickle a class sent by reference) imports this one
with it.  h5py is imported by :func:`readable`, not with this module: the torch launcher
reads the shards back but has no other use for h5py.

The shards are HDF5 files (h5py) unless ``SHARD_FORMAT=parquet`` is in the environment
(which the workers inherit): then Parquet files written by pyarrow's ``ParquetWriter``,
the stand-in where h5py has no wheel (CPython 3.15).  Both are native writers whose file
does not read back unless closed: HDF5 writes its superblock at close, Parquet its footer.
"""

import json
import os
import threading
from typing import Any, Tuple, Union

#: the shards' format: ``hdf5`` or ``parquet`` (see the module's docstring)
FORMAT = os.environ.get("SHARD_FORMAT", "hdf5")
#: the shards' file suffix
SUFFIX = {"hdf5": ".h5", "parquet": ".parquet"}[FORMAT]


def shard_path(directory: str, pid: Union[int, str]) -> str:
    """The path of worker ``pid``'s shard in ``directory``: ``shard-<pid><SUFFIX>``."""
    return os.path.join(directory, f"shard-{pid}{SUFFIX}")


def open_shard(directory: str) -> Any:
    """A new shard of this process in ``directory``, open for writing: an ``h5py.File`` or a
    ``pyarrow.parquet.ParquetWriter``; either is closed by its ``close()``."""
    path = shard_path(directory, os.getpid())
    if FORMAT == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pq.ParquetWriter(path, pa.schema([("row", pa.int64())]))
    import h5py

    return h5py.File(path, "w")


def write_row(shard: Any, i: int) -> None:
    """Write the row ``i`` (1,000 values) to a shard from :func:`open_shard`."""
    import numpy as np

    values = np.full(1000, i)
    if FORMAT == "parquet":
        import pyarrow as pa

        shard.write_table(pa.table({"row": values}))
    else:
        shard.create_dataset(f"row{i}", data=values)


def readable(path: str) -> bool:
    """Whether the shard at ``path`` opens and reads; ``False`` when it does not: a file
    never closed does not (HDF5 writes its superblock at close, Parquet its footer)."""
    if FORMAT == "parquet":
        import pyarrow.parquet as pq

        try:
            pq.read_table(path)
        except (OSError, ValueError):  # (pyarrow's ArrowInvalid is a ValueError)
            return False
        return True
    import h5py

    try:
        with h5py.File(path, "r") as shard:
            len(shard)
    except OSError:
        return False
    return True


#: whether each worker also adopts a `Stuck` object before its shard (``SHARD_HANG=1``)
HANG = os.environ.get("SHARD_HANG") == "1"


class Stuck:
    """A native object whose close never returns (a release that hangs, as a driver call
    can).  Adopted before the shard (``SHARD_HANG=1``; the pools program's ``--hang``),
    the teardown reaches it after the shard (newest first): with
    ``EXITSAFE_TEARDOWN_TIMEOUT`` it abandons that close at the bound and leaks it
    (``leaked_timeout``), and the worker still ends."""

    def close(self) -> None:
        threading.Event().wait()


def adopt_stuck() -> None:
    """Under ``SHARD_HANG=1``, adopt a `Stuck` object (named ``stuck``); else nothing.
    Called before the shard is adopted, so that the teardown reaches it after the shard."""
    if HANG:
        import exitsafe

        exitsafe.adopt(Stuck(), name="stuck")


def adopt_shard(directory: str) -> Any:
    """`adopt_stuck`, then a new shard of this process (`open_shard`) adopted, named
    ``shard`` and closed by the teardown; the open shard."""
    import exitsafe

    adopt_stuck()
    return exitsafe.adopt(open_shard(directory), close="close", name="shard").raw


def released(pid: Union[int, str], directory: str = "") -> bool:
    """Whether the ledger of the worker ``pid``, ``ledger-<pid>.json`` in ``directory``
    (default: the current one), records its shard (the one entry named ``shard``) released
    by the worker's own teardown (``released_at_exit``: the programs never close a shard
    themselves, so a ``released`` would mean something else closed it during the run, and
    a ``leaked...`` that the teardown left it), and under ``SHARD_HANG=1`` its `Stuck`
    object (named ``stuck``) ``leaked_timeout``; ``False`` when that file is missing or not
    JSON."""
    try:
        with open(os.path.join(directory, f"ledger-{pid}.json")) as file:
            ledger = json.load(file)
    except (OSError, ValueError):
        return False
    outcomes = {
        name: [
            entry["outcome"]
            for registry in ledger["registries"]
            for entry in registry["entries"]
            if entry["name"] == name
        ]
        for name in ("shard", "stuck")
    }
    return outcomes == {"shard": ["released_at_exit"],
                        "stuck": ["leaked_timeout"] if HANG else []}


def read_back(shard: str, pid: Union[int, str], ledgers: str = "") -> Tuple[bool, str]:
    """A worker's shard (the file ``shard``) and ledger (``pid``'s in the directory
    ``ledgers``, as :func:`released`) read back, in that order: whether the shard is
    readable, and what the programs print of both, ``shard readable|unreadable, ledger
    released|none``."""
    ok = readable(shard)
    ledger = released(pid, ledgers)
    return ok, (f"shard {'readable' if ok else 'unreadable'}, "
                f"ledger {'released' if ledger else 'none'}")
