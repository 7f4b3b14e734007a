"""Deleted-rows index segments: pointers to the row images a commit removed.

Every commit that removes row images (a delete, or the old side of an update
or upsert) writes one immutable segment (Parquet, ``deleted-rows-segment``
format 1). Per data file it stores the removed positions as a serialized
roaring bitmap plus, in position order, the images' row ids, created versions
and valid-from versions; the removing version is the commit's own. Row values
are never copied: the pointed-to data files stay pinned while the retention
window needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyroaring import BitMap64

from lineage.errors import LineageMetadataError
from lineage.fileio import ImmutableFileCache
from lineage.metadata import read_tagged_parquet, write_tagged_parquet
from lineage.rle import Runs, decode_values, encode_values

INDEX_FORMAT = "deleted-rows-segment"

_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("positions", pa.binary(), nullable=False),
        pa.field("row_ids", pa.list_(pa.int64()), nullable=False),
        pa.field("created_values", pa.list_(pa.int64()), nullable=False),
        pa.field("created_lengths", pa.list_(pa.int64()), nullable=False),
        pa.field("valid_from_values", pa.list_(pa.int64()), nullable=False),
        pa.field("valid_from_lengths", pa.list_(pa.int64()), nullable=False),
        pa.field("valid_to", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class RemovedImages:
    """The images of one data file that one commit removed (sorted by position)."""

    file_path: str
    positions: np.ndarray
    row_ids: np.ndarray
    created: np.ndarray
    valid_from: np.ndarray
    valid_to: int

    def __len__(self) -> int:
        return len(self.positions)


def write_index_segment(fileio: FileIO, path: str, removed: list[RemovedImages]) -> int:
    """Write one commit's removed images; return the file size in bytes."""
    cols: dict[str, list[Any]] = {f.name: [] for f in _SCHEMA}
    for r in removed:
        order = np.argsort(r.positions, kind="stable")
        bitmap = BitMap64(r.positions[order].tolist())
        created = encode_values(r.created[order])
        valid_from = encode_values(r.valid_from[order])
        cols["file_path"].append(r.file_path)
        cols["positions"].append(bitmap.serialize())
        cols["row_ids"].append(r.row_ids[order])
        cols["created_values"].append(created.values)
        cols["created_lengths"].append(created.lengths)
        cols["valid_from_values"].append(valid_from.values)
        cols["valid_from_lengths"].append(valid_from.lengths)
        cols["valid_to"].append(r.valid_to)
    return write_tagged_parquet(fileio, path, pa.table(cols, schema=_SCHEMA), INDEX_FORMAT)


_CACHE: ImmutableFileCache[tuple[RemovedImages, ...]] = ImmutableFileCache(1024)


def read_index_segment(fileio: FileIO, path: str) -> tuple[RemovedImages, ...]:
    """Read one index segment (cached by path: segments are immutable)."""
    return _CACHE.get(path, lambda: _read(fileio, path))


def _read(fileio: FileIO, path: str) -> tuple[RemovedImages, ...]:
    table = read_tagged_parquet(fileio, path, INDEX_FORMAT, "deleted-rows index segment")
    out = []
    try:
        for row in table.to_pylist():
            positions = np.array(list(BitMap64.deserialize(row["positions"])), dtype=np.int64)
            created_runs = Runs(np.array(row["created_values"], np.int64), np.array(row["created_lengths"], np.int64))
            from_runs = Runs(np.array(row["valid_from_values"], np.int64), np.array(row["valid_from_lengths"], np.int64))
            if len(created_runs.values) != len(created_runs.lengths) or len(from_runs.values) != len(from_runs.lengths):
                raise ValueError("version runs are malformed")
            created, valid_from = decode_values(created_runs), decode_values(from_runs)
            row_ids = np.array(row["row_ids"], dtype=np.int64)
            if not (len(positions) == len(row_ids) == len(created) == len(valid_from)):
                raise ValueError(f"lengths disagree for {row['file_path']}")
            out.append(RemovedImages(row["file_path"], positions, row_ids, created, valid_from, int(row["valid_to"])))
    except Exception as exc:  # missing columns, nulls, corrupt bitmaps
        raise LineageMetadataError(f"deleted-rows index segment {path} has damaged content: {exc!r}") from None
    return tuple(out)
