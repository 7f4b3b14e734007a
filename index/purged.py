"""The purged-rows file: row ids whose values were erased for good (GDPR).

One immutable Parquet file (``purged-rows`` format 1) holding a serialized
64-bit roaring bitmap of row ids, cumulative over every purge of the table;
the lineage list names the current one. The change feed flags every image of
these rows with ``_purged = true`` (their data columns read as null).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyroaring import BitMap64

from lineage.arrays import member
from lineage.errors import LineageMetadataError
from lineage.storage.fileio import ImmutableFileCache
from lineage.storage.metadata import read_tagged_parquet, write_tagged_parquet

PURGED_FORMAT = "purged-rows"
_CACHE: ImmutableFileCache[BitMap64] = ImmutableFileCache(64)


def write_purged(fileio: FileIO, path: str, row_ids: BitMap64) -> int:
    """Write the purged row ids; return the file size."""
    return write_tagged_parquet(fileio, path, pa.table({"row_ids": pa.array([row_ids.serialize()], pa.binary())}), PURGED_FORMAT)


def read_purged(fileio: FileIO, path: str | None) -> BitMap64:
    """The purged row ids named by a lineage list (empty when it names none)."""
    if not path:
        return BitMap64()
    return _CACHE.get(path, lambda: _read(fileio, path))


def _read(fileio: FileIO, path: str) -> BitMap64:
    table = read_tagged_parquet(fileio, path, PURGED_FORMAT, "purged-rows file")
    try:
        return BitMap64.deserialize(table.column("row_ids")[0].as_py())
    except Exception as exc:
        raise LineageMetadataError(f"purged-rows file {path} has damaged content: {exc!r}") from None


def is_purged(bitmap: BitMap64, row_ids: np.ndarray) -> np.ndarray:
    """A boolean mask: which of ``row_ids`` are purged."""
    if len(bitmap) == 0 or len(row_ids) == 0:
        return np.zeros(len(row_ids), bool)
    purged = np.frombuffer(bitmap.to_array(), dtype=np.uint64).astype(np.int64)
    return member(row_ids, purged)
