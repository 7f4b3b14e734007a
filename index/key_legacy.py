"""Key index segment file formats 1 and 2: one uncompressed Arrow IPC record batch.

Columns, sorted by the hash:

=================================  ==========================================
``__hash``                         uint64, ascending
*the key columns*                  the table's key columns, in the table's types
``__tombstone``                    bool: the key has no live image (as of this segment)
``_row_id``                        int64 (format 1); int32 where every value fits (format 2)
``__file_path``                    dictionary<int32 (1) / int16 or int32 (2), string> (null for a tombstone)
``__pos``                          as ``_row_id``
``_row_created_at_version``        as ``_row_id``
``_row_last_updated_at_version``   as ``_row_id``
=================================  ==========================================

About 34 bytes per 64-bit key in format 2, 52 in format 1. Tables written by
earlier releases hold such segments: they are read (memory-mapped, the hash
column searched in place) and rewritten in format 3 by ``reindex`` and key
index maintenance. :func:`legacy_batch` still writes format 2, for tests of
tables that mix formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from index.key_hash import unhash
from index.key_store import (
    ENTRY_COLUMNS,
    FILE_PATH,
    HASH,
    INT_ENTRIES,
    TOMBSTONE,
    ArrayStore,
    KeyField,
    match_sorted,
)


@dataclass(frozen=True)
class ArrowStore:
    """A format 1 or 2 segment's record batch (memory-mapped when local)."""

    batch: pa.RecordBatch = field(repr=False)
    key_names: tuple[str, ...]

    @property
    def n(self) -> int:
        """Number of records."""
        return self.batch.num_rows

    @property
    def files(self) -> list[str]:
        """The file path dictionary."""
        return [str(p) for p in self.batch.column(FILE_PATH).dictionary.to_pylist()]

    def hashes(self) -> np.ndarray:
        """The hash column (zero-copy)."""
        return self.batch.column(HASH).to_numpy()

    def hashes_at(self, records: np.ndarray) -> np.ndarray:
        """The hashes of ``records``."""
        return self.hashes()[records]

    def match(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Records with the wanted hashes (binary search over the mapped column: O(log n) pages each)."""
        return match_sorted(self.hashes(), wanted)

    def fields(self, records: np.ndarray | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """File ordinals (-1: tombstone) and integer columns of ``records`` (None: all)."""
        idx = None if records is None else pa.array(records, pa.int64())

        def col(name: str) -> pa.Array:
            c = self.batch.column(name)
            return c if idx is None else c.take(idx)

        dead = col(TOMBSTONE).to_numpy(zero_copy_only=False)
        file = col(FILE_PATH).indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        file[dead] = -1
        return file, {c: col(c).to_numpy(zero_copy_only=False).astype(np.int64) for c in INT_ENTRIES}

    def stored_keys(self, records: np.ndarray | None) -> pa.Table:
        """The key columns of ``records`` (None: all)."""
        keys = pa.Table.from_batches([self.batch.select(list(self.key_names))])
        return keys if records is None else keys.take(pa.array(records, pa.int64()))


def check_columns(batch: pa.RecordBatch) -> None:
    """Refuse a format 1 or 2 batch that lacks a column or has a non-integer entry column (ValueError)."""
    for name in (HASH, TOMBSTONE, *ENTRY_COLUMNS):
        batch.schema.field(name)
    for name in INT_ENTRIES:
        if not pa.types.is_integer(batch.schema.field(name).type):
            raise ValueError(f"column {name} has type {batch.schema.field(name).type}, expected an integer type")


def _narrow(values: np.ndarray) -> pa.Array:
    """An entry column as int32 when every value fits (format 2), else int64."""
    info = np.iinfo(np.int32)
    if len(values) and info.min <= values.min() and values.max() <= info.max:
        return pa.array(values.astype(np.int32), pa.int32())
    return pa.array(values.astype(np.int64), pa.int64())


def legacy_batch(store: ArrayStore, key: tuple[KeyField, ...]) -> pa.RecordBatch:
    """A format 2 record batch of ``store`` (unused file paths dropped)."""
    file, ints = store.fields(None)
    tomb = file < 0
    used = np.unique(file[~tomb])
    index_type = np.int16 if len(used) <= np.iinfo(np.int16).max else np.int32
    remap = np.zeros(max(len(store.files), 1), index_type)
    remap[used] = np.arange(len(used), dtype=index_type)
    files = pa.DictionaryArray.from_arrays(
        pa.array(remap[np.where(tomb, 0, file)], pa.from_numpy_dtype(index_type), mask=tomb),
        pa.array([store.files[i] for i in used], pa.string()),
    )
    keys = store.keys
    if keys is None:
        keys = pa.table({key[0].name: unhash(store.hash_values, key[0].type)})
    arrays = [pa.array(store.hash_values, pa.uint64())]
    fields = [pa.field(HASH, pa.uint64(), nullable=False)]
    for k in key:
        col = keys.column(k.name)
        arrays.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
        fields.append(pa.field(k.name, k.type, nullable=False))
    arrays.append(pa.array(tomb, pa.bool_()))
    fields.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
    for name in ENTRY_COLUMNS:
        arrays.append(files if name == FILE_PATH else _narrow(ints[name]))
        fields.append(pa.field(name, arrays[-1].type, nullable=name == FILE_PATH))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
