"""The columns of a key index segment, whatever its file format: names, key fields and the in-memory store.

A segment's records are sorted by the 64-bit key hash (:mod:`index.key_hash`).
Every record carries the hash, a file ordinal into the segment's list of data
file paths (-1: a *tombstone*, the key has no live image as of this segment)
and four integers: ``_row_id``, ``__pos`` (position in the data file),
``_row_created_at_version`` and ``_row_last_updated_at_version``. The key
values themselves are stored only when the hash cannot give them back
(:func:`index.key_hash.hash_is_injective`): a single integer-like key is
recovered from its hash, any other key is kept beside it so that equal
hashes are resolved by comparing keys.

A *store* holds those columns; three kinds exist: :class:`ArrayStore` (numpy
arrays: a segment built or merged in memory), the packed file format 3
(:mod:`index.key_packed`) and the Arrow files of formats 1 and 2
(:mod:`index.key_legacy`). They answer the same questions (:class:`Store`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

import lineage.columns as columns

HASH = "__hash"
TOMBSTONE = "__tombstone"
ROW_ID = columns.ROW_ID
FILE_PATH = "__file_path"
POS = "__pos"
CREATED = columns.CREATED_AT
UPDATED = columns.UPDATED_AT
ENTRY_COLUMNS = (ROW_ID, FILE_PATH, POS, CREATED, UPDATED)
INT_ENTRIES = (ROW_ID, POS, CREATED, UPDATED)


@dataclass(frozen=True)
class KeyField:
    """One key column as the index records it: Iceberg field id, name and Arrow type."""

    field_id: int
    name: str
    type: pa.DataType

    def to_json(self) -> dict[str, object]:
        """The JSON object stored in segment metadata."""
        return {"id": self.field_id, "name": self.name, "type": str(self.type)}


def key_schema(key: Sequence[KeyField]) -> pa.Schema:
    """The Arrow schema of the key columns (not nullable)."""
    return pa.schema([pa.field(k.name, k.type, nullable=False) for k in key])


class Store(Protocol):
    """What a segment's storage answers (records are numbered in hash order)."""

    n: int
    files: list[str]

    def hashes(self) -> np.ndarray:
        """Every record's hash (uint64, ascending)."""

    def hashes_at(self, records: np.ndarray) -> np.ndarray:
        """The hashes of ``records``."""

    def match(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (i, record) with ``hashes()[record] == wanted[i]``, as two int64 arrays."""

    def fields(self, records: np.ndarray | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """File ordinals (int64, -1 for a tombstone) and the integer entry columns of ``records`` (None: all)."""

    def stored_keys(self, records: np.ndarray | None) -> pa.Table | None:
        """The key columns of ``records`` (None: all) as stored, or None when the segment stores no keys."""


def match_sorted(hashes: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Store.match` over a sorted hash array (binary search; zero-copy when memory-mapped)."""
    lo = np.searchsorted(hashes, wanted, side="left")
    hi = np.searchsorted(hashes, wanted, side="right")
    counts = hi - lo
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    which = np.repeat(np.arange(len(wanted), dtype=np.int64), counts)
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return which, np.repeat(lo, counts).astype(np.int64) + offsets


@dataclass(frozen=True)
class ArrayStore:
    """A segment's columns as numpy arrays (hash order); ``keys`` None when the hash gives them back."""

    hash_values: np.ndarray
    file: np.ndarray  # int32 or int64 ordinals into ``files``; -1 for a tombstone
    files: list[str]
    ints: dict[str, np.ndarray] = field(repr=False)
    keys: pa.Table | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        """Number of records."""
        return len(self.hash_values)

    def hashes(self) -> np.ndarray:
        """Every record's hash."""
        return self.hash_values

    def hashes_at(self, records: np.ndarray) -> np.ndarray:
        """The hashes of ``records``."""
        return self.hash_values[records]

    def match(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Records whose hash equals ``wanted[i]`` (binary search)."""
        return match_sorted(self.hash_values, wanted)

    def fields(self, records: np.ndarray | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """File ordinals and integer columns of ``records`` (None: all)."""
        if records is None:
            return self.file.astype(np.int64, copy=False), self.ints
        return self.file[records].astype(np.int64, copy=False), {c: v[records] for c, v in self.ints.items()}

    def stored_keys(self, records: np.ndarray | None) -> pa.Table | None:
        """The stored key columns of ``records`` (None: all), or None."""
        if self.keys is None or records is None:
            return self.keys
        return self.keys.take(pa.array(records, pa.int64()))

    def subset(self, records: np.ndarray) -> ArrayStore:
        """The store of ``records`` only (still sorted when ``records`` ascend)."""
        file, ints = self.fields(records)
        return ArrayStore(self.hash_values[records], file, self.files, ints, self.stored_keys(records))


def to_arrays(store: Store) -> ArrayStore:
    """Any store decoded into numpy arrays (O(n); merges and rewrites)."""
    if isinstance(store, ArrayStore):
        return store
    file, ints = store.fields(None)
    return ArrayStore(store.hashes(), file, list(store.files), ints, store.stored_keys(None))
