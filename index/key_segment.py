"""Key index segments: point lookups, merges, and the files they live in.

A segment is an immutable list of records sorted by the 64-bit key hash
(:mod:`index.key_hash`): per key the location of its live image (data file,
position) and its lineage (row id, created and last-updated versions), or a
tombstone. Within one segment a key appears at most once. Its columns and
how each file format stores them are described in :mod:`index.key_store`.

Files carry ``lineage.format`` = ``key-index-segment`` and a
``lineage.format-version`` (a newer version is refused with
:class:`UnsupportedFormatError`), the hash function's name, the key fields,
the segment's merge level, whether it is a *base* (holds every live key, no
tombstones) and the version of the commit that wrote it. Writers write
format 3 (:mod:`index.key_packed`: about 14 bytes per 64-bit key); formats
1 and 2 (:mod:`index.key_legacy`, Arrow files of 52 and 34 bytes per key)
are still read, and ``reindex`` / key index maintenance rewrite them.

A local segment is memory-mapped: a lookup of k keys touches O(k) pages of a
format 3 file (O(k log n) of an Arrow one), never the whole file. Segments
on other storage are read whole through the table's FileIO once and cached.
Equal hashes of different keys are resolved by comparing the stored key
values; keys the hash gives back are not stored, and cannot collide.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from index.key_hash import hash_is_injective, hash_name, key_hash, unhash
from index.key_legacy import ArrowStore, check_columns, legacy_batch
from index.key_packed import MAGIC, PackedStore, SpooledStore, encode, read_header
from index.key_store import (
    CREATED,
    ENTRY_COLUMNS,
    FILE_PATH,
    HASH,
    INT_ENTRIES,
    POS,
    ROW_ID,
    TOMBSTONE,
    UPDATED,
    ArrayStore,
    KeyField,
    Store,
    key_schema,
    to_arrays,
)
from lineage.arrays import merge_sorted
from lineage.errors import LineageMetadataError, UnsupportedFormatError
from lineage.storage.fileio import ImmutableFileCache, local_path, overwrite_allowed, read_bytes, write_bytes

__all__ = [
    "CREATED", "ENTRY_COLUMNS", "FILE_PATH", "HASH", "POS", "ROW_ID", "SEGMENT_FORMAT", "SEGMENT_FORMAT_VERSION", "TOMBSTONE",
    "UPDATED", "KeyField", "Segment", "distinct_keys", "drop_tombstones", "entry_schema", "hash_order", "keys_equal",
    "make_segment", "merge_segments", "read_key_segment", "remember_written", "with_path", "write_key_segment",
]

SEGMENT_FORMAT = "key-index-segment"
SEGMENT_FORMAT_VERSION = 3  # 3: packed records (index.key_packed); 2 and 1: Arrow files (index.key_legacy)
_ARROW_MAGIC = b"ARROW1"


def entry_schema(key: Sequence[KeyField]) -> pa.Schema:
    """Columns of lookup results and entry tables: the key columns, then the entry columns."""
    return pa.schema(
        [pa.field(k.name, k.type, nullable=False) for k in key]
        + [
            pa.field(ROW_ID, pa.int64(), nullable=False),
            pa.field(FILE_PATH, pa.string(), nullable=False),
            pa.field(POS, pa.int64(), nullable=False),
            pa.field(CREATED, pa.int64(), nullable=False),
            pa.field(UPDATED, pa.int64(), nullable=False),
        ]
    )


def _storage(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr.storage if isinstance(arr.type, pa.BaseExtensionType) else arr


def keys_equal(left: pa.Table | pa.RecordBatch, li: np.ndarray, right: pa.Table | pa.RecordBatch, ri: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Whether row ``li[j]`` of ``left`` and row ``ri[j]`` of ``right`` have equal keys, for every j."""
    eq = np.ones(len(li), bool)
    if not len(li):
        return eq
    for name in names:
        a = _storage(left.column(name)).take(pa.array(li))
        b = _storage(right.column(name)).take(pa.array(ri))
        if not a.type.equals(b.type):
            b = b.cast(a.type)
        eq &= pc.equal(a, b).to_numpy(zero_copy_only=False)
    return eq


def _injective(key: Sequence[KeyField]) -> bool:
    return hash_is_injective([k.type for k in key])


@dataclass(frozen=True)
class Segment:
    """One segment: its records (memory-mapped from its file, or in memory before it is written) and facts."""

    store: Store = field(repr=False)
    key: tuple[KeyField, ...]
    level: int
    base: bool
    hash: str
    path: str | None = None
    format_version: int = SEGMENT_FORMAT_VERSION
    mapping: mmap.mmap | None = field(default=None, repr=False, compare=False)  # the local file's memory map
    hash_range: tuple[int, int] | None = None  # a base *piece*: every live key hashing into [lo, hi) as of its place (see key_slices)

    def release(self) -> None:
        """Drop the pages of the memory-mapped file from this process's resident memory (they stay in the page
        cache and are mapped again on the next touch; nothing for a segment in memory)."""
        if self.mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            self.mapping.madvise(mmap.MADV_DONTNEED)

    @property
    def entries(self) -> int:
        """Number of records (entries and tombstones)."""
        return self.store.n

    @property
    def names(self) -> list[str]:
        """The key column names."""
        return [k.name for k in self.key]

    @property
    def hashes(self) -> np.ndarray:
        """The sorted hash column (zero-copy for Arrow files, decoded for packed ones)."""
        return self.store.hashes()

    @property
    def tombstones(self) -> np.ndarray:
        """The tombstone flags."""
        return self.store.fields(None)[0] < 0

    @property
    def batch(self) -> pa.RecordBatch:
        """The Arrow record batch of a format 1 or 2 segment (AttributeError for others)."""
        if not isinstance(self.store, ArrowStore):
            raise AttributeError(f"a format {self.format_version} segment has no Arrow record batch")
        return self.store.batch

    def keys(self, records: np.ndarray | None = None) -> pa.Table:
        """The key columns of ``records`` (None: all): stored, or recovered from the hash."""
        stored = self.store.stored_keys(records)
        if stored is not None:
            return stored.select(self.names)
        h = self.store.hashes() if records is None else self.store.hashes_at(records)
        return pa.Table.from_arrays([unhash(h, self.key[0].type)], schema=key_schema(self.key))

    def probe(self, hashes: np.ndarray, keys: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Match rows ``rows`` of ``keys`` (whose hashes are ``hashes[rows]``) with this segment.

        Returns (matched rows of ``keys``, their record numbers here).
        """
        which, records = self.store.match(hashes[rows])
        found = rows[which]
        if not len(records) or _injective(self.key):
            return found, records
        eq = keys_equal(keys, found, self.keys(records), np.arange(len(records)), self.names)
        return found[eq], records[eq]

    def dead(self, records: np.ndarray) -> np.ndarray:
        """Whether each of ``records`` is a tombstone."""
        return self.store.fields(records)[0] < 0

    def take(self, records: np.ndarray, keys: pa.Table | None = None) -> pa.Table:
        """Key and entry columns of ``records`` (file paths decoded; key columns from ``keys`` when given)."""
        file, ints = self.store.fields(records)
        keys = self.keys(records) if keys is None else keys
        paths = pa.DictionaryArray.from_arrays(pa.array(np.maximum(file, 0), pa.int64(), mask=file < 0),
                                               pa.array(self.store.files or [""], pa.string())).cast(pa.string())
        cols: dict[str, Any] = {k.name: keys.column(k.name) for k in self.key}
        cols.update({c: pa.array(ints[c].astype(np.int64, copy=False)) for c in INT_ENTRIES})
        cols[FILE_PATH] = paths
        schema = entry_schema(self.key)
        return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)

    def live(self) -> pa.Table:
        """Every entry that is not a tombstone."""
        return self.take(np.flatnonzero(~self.tombstones))


def make_segment(
    key: Sequence[KeyField],
    entries: pa.Table,
    tombstones: pa.Table | None = None,
    *,
    level: int = 0,
    base: bool = False,
) -> Segment:
    """A segment (in memory) from entries (key + entry columns) and tombstoned keys; sorted here.

    Keys must be unique across ``entries`` and ``tombstones`` together.
    """
    names = [k.name for k in key]
    schema = key_schema(key)
    dead = tombstones if tombstones is not None else schema.empty_table()
    n_live, n_dead = entries.num_rows, dead.num_rows
    keys = pa.concat_tables([entries.select(names).cast(schema), dead.select(names).cast(schema)])
    files = entries.column(FILE_PATH)
    files = files.combine_chunks() if isinstance(files, pa.ChunkedArray) else files
    if not pa.types.is_dictionary(files.type):
        files = files.dictionary_encode() if n_live else pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
    indices = np.concatenate([files.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), np.full(n_dead, -1, np.int32)])
    ints = {c: _padded(_ints(entries.column(c)), n_dead) for c in INT_ENTRIES}
    order, hashes = hash_order(key_hash(keys))
    stored = None if _injective(key) else keys.take(pa.array(order))
    gathered = _gather_all({FILE_PATH: indices, **ints}, order)
    file = gathered.pop(FILE_PATH)
    store = ArrayStore(hashes, file, [str(p) for p in files.dictionary.cast(pa.string()).to_pylist()], gathered, stored)
    return Segment(store, tuple(key), level, base, hash_name())


def _gather_all(columns: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """``values[order]`` of every column (``order`` a permutation or a subset of the records): constant ones without a gather, the int32 ones (most) four side by side
    in one matrix gathered row by row (one cache miss per record instead of one per column), the rest one by one."""
    out: dict[str, np.ndarray] = {}
    narrow: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        if len(values) and values[0] == values.min() == values.max():
            out[name] = _gather(values, order)
            continue
        values = _narrowed(values)
        if values.dtype == np.int32:
            narrow[name] = values
        else:
            out[name] = np.take(values, order)
    names = list(narrow)
    for start in range(0, len(names), 4):
        group = names[start : start + 4]
        if len(group) == 1:
            out[group[0]] = np.take(narrow[group[0]], order)
            continue
        # Four int32 side by side are one 16-byte element: numpy gathers those whole (viewed as complex128,
        # a plain copy of the bytes), about 2.5 times faster than one gather per column.
        matrix = np.zeros((len(narrow[group[0]]), 4), np.int32)
        for j, name in enumerate(group):
            matrix[:, j] = narrow[name]
        rows = np.take(matrix.view(np.complex128).reshape(len(matrix)), order).view(np.int32).reshape(len(order), 4)
        del matrix
        for j, name in enumerate(group):
            out[name] = rows[:, j]
    return {name: out[name] for name in columns}


def hash_order(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stable order that sorts ``hashes`` (equal hashes keep their input order), and the sorted hashes.

    A plain sort of 64-bit values is several times faster than an argsort, so the row number is packed
    into the hash's low bits and the packed values are sorted; that orders by the high bits exactly and
    breaks ties by row number. Rows whose hashes differ only in the low bits (rare) may come out of
    order; the few groups of rows with equal high bits are sorted again by (hash, row).
    """
    n = len(hashes)
    bits = max(1, (n - 1).bit_length())
    if n < 2 or bits > 40:
        order = np.argsort(hashes, kind="stable")
        return order, hashes[order]
    mask = np.uint64((1 << bits) - 1)
    packed = hashes & ~mask
    packed |= np.arange(n, dtype=np.uint64)
    packed = _sorted(packed)
    packed &= mask
    order = packed.view(np.int64)
    ordered = hashes[order]
    high = ordered >> np.uint64(bits)
    same_high = high[1:] == high[:-1]
    # A run of equal high bits is in (hash, row) order already when its hashes are all equal (one key several times,
    # as a merge of segments has it): only runs holding two different hashes need sorting again.
    mixed = same_high & (ordered[1:] != ordered[:-1])
    if mixed.any():  # sort those runs (contiguous) by (hash, row), a lexsort of the few rows in them
        run = np.concatenate(([0], np.cumsum(~same_high)))
        bad = np.zeros(int(run[-1]) + 1, bool)
        bad[run[1:][mixed]] = True
        sub = np.flatnonzero(bad[run])
        fix = sub[np.lexsort((order[sub], ordered[sub]))]
        order[sub], ordered[sub] = order[fix], ordered[fix]
    return order, ordered


PARALLEL_SORT = 2_000_000  # values from which a sort is split in two halves sorted by two threads


def _sorted(values: np.ndarray) -> np.ndarray:
    """``values`` (uint64, spread evenly as hashes are) sorted; large arrays as two halves by their top bit,
    each sorted by a thread of its own (numpy's sort releases the GIL: 10M values, 0.64 s on one core)."""
    if len(values) < PARALLEL_SORT or (os.cpu_count() or 1) < 2:
        values.sort()
        return values
    high = values >= np.uint64(1 << 63)
    halves = [values[~high], values[high]]
    del values, high
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(np.ndarray.sort, halves))
    return np.concatenate(halves)


def _narrowed(values: np.ndarray) -> np.ndarray:
    """``values`` as int32 when they all fit (a gather of half the bytes), else int64."""
    if len(values) and values.dtype != np.int32 and np.iinfo(np.int32).min <= values.min() and values.max() <= np.iinfo(np.int32).max:
        return values.astype(np.int32)
    return values


def _gather(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values[order]``, narrowed to int32 where that fits (a gather of half the bytes); a constant column
    (the versions of a bulk load) without the random gather."""
    if len(values) and values[0] == values.min() == values.max():
        return np.full(len(order), values[0], np.int32 if np.iinfo(np.int32).min <= values[0] <= np.iinfo(np.int32).max else values.dtype)
    return np.take(_narrowed(values), order)


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An entry column's integers: int32 if it is int32 (narrowed by the caller), else int64 (no copy when already so)."""
    values = col.to_numpy()
    return values if values.dtype in (np.int32, np.int64) else values.astype(np.int64)


def _padded(values: np.ndarray, zeros: int) -> np.ndarray:
    """``values`` followed by ``zeros`` zeros of their type (no copy when there is nothing to add)."""
    return np.concatenate([values, np.zeros(zeros, values.dtype)]) if zeros else values


def drop_tombstones(segment: Segment) -> Segment:
    """``segment`` without its tombstones (still sorted; the same segment when it has none)."""
    tomb = segment.tombstones
    if not tomb.any():
        return segment
    return replace(segment, store=to_arrays(segment.store).subset(np.flatnonzero(~tomb)), path=None, format_version=SEGMENT_FORMAT_VERSION)


def rewritten(segment: Segment) -> Segment:
    """``segment`` in memory, to be written again in the current format (the same records)."""
    store = to_arrays(segment.store)
    if _injective(segment.key) and store.keys is not None:
        store = replace(store, keys=None)
    return replace(segment, store=store, path=None, format_version=SEGMENT_FORMAT_VERSION)


def merge_segments(segments: Sequence[Segment], *, base: bool, level: int) -> Segment:
    """Merge segments (oldest first) into one: per key the newest record wins.

    With ``base`` (the merge includes the oldest segment of the index) tombstones
    are dropped: nothing older is left for them to hide.
    """
    key = segments[0].key
    newest_first = [to_arrays(s.store) for s in reversed(segments)]
    paths: dict[str, int] = {}
    file_parts = []
    for s in newest_first:
        remap = np.array([paths.setdefault(p, len(paths)) for p in s.files] + [0], np.int64)
        f = s.file.astype(np.int64, copy=False)
        file_parts.append(np.where(f >= 0, remap[np.maximum(f, 0)], -1))
    runs = [s.hash_values for s in newest_first]
    hashes = np.concatenate(runs)
    file = np.concatenate(file_parts)
    ints = {c: np.concatenate([s.ints[c] for s in newest_first]) for c in INT_ENTRIES}  # int32 where every part is
    # stable: newest first within equal hashes; each segment is in hash order, so the runs are merged, not sorted
    order, ordered = merge_sorted(runs) or hash_order(hashes)
    keys = None
    if _injective(key):  # equal hashes are equal keys: the first of each run of equal hashes wins
        first = np.ones(len(order), bool)
        first[1:] = ordered[1:] != ordered[:-1]
        keep = order[first]
    else:
        parts = [s.keys for s in newest_first]  # a hash that does not give keys back: every segment stores them
        if any(p is None for p in parts):
            raise LineageMetadataError("internal: a key index segment of a key the hash does not give back stores no keys")
        keys = pa.Table.from_arrays([pa.concat_arrays([_combined(p.column(k.name)) for p in parts]) for k in key],  # type: ignore[union-attr]
                                    schema=key_schema(key))
        rank = np.concatenate([np.full(s.n, i, np.int64) for i, s in enumerate(newest_first)])
        keep = _newest_per_key(hashes, keys, rank, order)
    if base:
        keep = keep[file[keep] >= 0]
    store = ArrayStore(hashes[keep], file[keep], list(paths), _gather_all(ints, keep),
                       None if keys is None else keys.take(pa.array(keep)))
    return Segment(store, key, level, base, hash_name())


def _combined(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _newest_per_key(hashes: np.ndarray, keys: pa.Table, rank: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Record numbers to keep, in hash order: for every key its lowest-rank (newest) record."""
    h = hashes[order]
    same = np.zeros(len(h), bool)
    same[1:] = h[1:] == h[:-1]
    grouped = same.copy()
    grouped[:-1] |= same[1:]
    if not grouped.any():
        return order
    # Records sharing a hash: mostly one key in several segments, rarely a collision.
    # Sort them by (hash, key, rank) so equal keys are adjacent, newest first.
    sub = order[grouped]
    plain = pa.Table.from_arrays([_storage(keys.column(n)) for n in keys.column_names], names=keys.column_names)
    table = plain.take(pa.array(sub)).append_column("__h", pa.array(hashes[sub], pa.uint64())).append_column("__r", pa.array(rank[sub]))
    table = table.append_column("__i", pa.array(sub))
    sort_keys = [("__h", "ascending")] + [(n, "ascending") for n in keys.column_names] + [("__r", "ascending")]
    table = table.take(pc.sort_indices(table, sort_keys=sort_keys))
    sub_sorted = table.column("__i").to_numpy()
    first = np.ones(len(sub_sorted), bool)
    prev, cur = np.arange(len(sub_sorted) - 1), np.arange(1, len(sub_sorted))
    dup = (table.column("__h").to_numpy()[1:] == table.column("__h").to_numpy()[:-1]) & keys_equal(table, prev, table, cur, keys.column_names)
    first[1:] = ~dup
    kept = np.concatenate([order[~grouped], sub_sorted[first]])
    return kept[np.argsort(hashes[kept], kind="stable")]


def distinct_keys(keys: pa.Table) -> pa.Table:
    """``keys`` with every repeated key dropped (first occurrence kept, in hash order)."""
    if keys.num_rows < 2:
        return keys
    hashes = key_hash(keys)
    keep = _newest_per_key(hashes, keys, np.zeros(keys.num_rows, np.int64), np.argsort(hashes, kind="stable"))
    return keys.take(pa.array(keep))


# ---------------------------------------------------------------- files


def write_key_segment(fileio: FileIO, path: str, segment: Segment, version: int, *, format_version: int = SEGMENT_FORMAT_VERSION) -> int:
    """Write ``segment`` (format 3; 2 on request, for tests of tables that mix formats); return its size in bytes."""
    meta = {
        "lineage.format": SEGMENT_FORMAT,
        "lineage.format-version": str(format_version),
        "key-index.hash": segment.hash,
        "key-index.key": json.dumps([k.to_json() for k in segment.key]),
        "key-index.level": str(segment.level),
        "key-index.base": "true" if segment.base else "false",
        "key-index.version": str(version),
    }
    if segment.hash_range is not None:  # readers that do not know the field stay right: a piece is a segment like any other
        meta["key-index.range"] = f"{segment.hash_range[0]},{segment.hash_range[1]}"
    parts: Iterable[bytes | memoryview]
    if format_version == SEGMENT_FORMAT_VERSION and isinstance(segment.store, SpooledStore):  # a bounded build: copied
        parts = segment.store.parts(meta)
    elif format_version == SEGMENT_FORMAT_VERSION:
        parts = encode(to_arrays(segment.store), segment.key, meta, keep_keys=not _injective(segment.key))
    elif format_version == 2:
        batch = legacy_batch(to_arrays(segment.store), segment.key).replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        parts = [sink.getvalue().to_pybytes()]
    else:
        raise ValueError(f"cannot write key index segment format {format_version}")
    if overwrite_allowed():  # a deterministic name written again: replace the file whole (see fileio.write_bytes)
        return write_bytes(fileio, path, b"".join(parts))
    with fileio.new_output(path).create(overwrite=False) as out:
        for part in parts:
            out.write(part)
        size = out.tell()
    return int(size)


def _is_local(path: str) -> bool:
    return path.startswith("file:") or "://" not in path


def _map(path: str) -> tuple[pa.Buffer, mmap.mmap | None]:
    """A local file's bytes, memory-mapped (the map, to release its pages; None for an empty file)."""
    with open(local_path(path), "rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return pa.py_buffer(b""), None
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return pa.py_buffer(mapping), mapping


def _open(fileio: FileIO, path: str) -> Segment:
    mapping = None
    try:
        buf, mapping = _map(path) if _is_local(path) else (pa.py_buffer(read_bytes(fileio, path)), None)
    except FileNotFoundError:
        raise LineageMetadataError(
            f"key index segment {path} is missing (deleted by hand or by a foreign vacuum?); rebuild the index with "
            "`lineage reindex TABLE` or Table.reindex()"
        ) from None
    if buf.size >= len(MAGIC) and buf.slice(0, len(MAGIC)).to_pybytes() == MAGIC:
        return replace(_open_packed(buf, path), mapping=mapping)
    try:
        if buf.slice(0, len(_ARROW_MAGIC)).to_pybytes() != _ARROW_MAGIC:
            raise ValueError("neither a packed segment nor an Arrow file")
        reader = pa.ipc.open_file(pa.BufferReader(buf))
        meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise LineageMetadataError(f"key index segment {path} is unreadable ({exc}); rebuild it with `lineage reindex TABLE`") from None
    check_segment_format(meta, path)
    try:
        if reader.num_record_batches != 1:
            raise ValueError(f"{reader.num_record_batches} record batches, expected 1")
        batch = reader.get_batch(0)
        key = tuple(KeyField(int(k["id"]), str(k["name"]), batch.schema.field(str(k["name"])).type) for k in json.loads(meta["key-index.key"]))
        check_columns(batch)
        return Segment(ArrowStore(batch.replace_schema_metadata(None), tuple(k.name for k in key)), key, int(meta["key-index.level"]),
                       meta["key-index.base"] == "true", meta["key-index.hash"], path, int(meta["lineage.format-version"]), mapping)
    except Exception as exc:
        raise LineageMetadataError(f"key index segment {path} has damaged content ({exc!r}); rebuild it with `lineage reindex TABLE`") from None


def _open_packed(buf: pa.Buffer, path: str) -> Segment:
    try:
        header = read_header(buf)
        meta = {k: str(v) for k, v in header.items() if k.startswith("lineage.")}
    except Exception as exc:
        raise LineageMetadataError(f"key index segment {path} is unreadable ({exc}); rebuild it with `lineage reindex TABLE`") from None
    check_segment_format(meta, path)
    try:
        store, schema = PackedStore.of(buf, header)
        key = tuple(KeyField(int(k["id"]), str(k["name"]), schema.field(str(k["name"])).type) for k in json.loads(str(header["key-index.key"])))
        if store.keys is None and not hash_is_injective([k.type for k in key]) and header["key-index.hash"] == hash_name():
            raise ValueError("the keys are neither stored nor recoverable from the hash")
        return Segment(store, key, int(str(header["key-index.level"])), header["key-index.base"] == "true", str(header["key-index.hash"]),
                       path, int(meta["lineage.format-version"]), hash_range=_range(header.get("key-index.range")))
    except Exception as exc:
        raise LineageMetadataError(f"key index segment {path} has damaged content ({exc!r}); rebuild it with `lineage reindex TABLE`") from None


def _range(value: object) -> tuple[int, int] | None:
    """A piece's hash range from its header (``"lo,hi"``), None for any other segment."""
    if value is None:
        return None
    lo, hi = (int(x) for x in str(value).split(","))
    if not 0 <= lo < hi <= 1 << 64:
        raise ValueError(f"hash range {value!r} is empty or outside the 64-bit hashes")
    return lo, hi


def check_segment_format(meta: dict[str, str], path: str) -> None:
    """Refuse a file that is not a key index segment, or one of a newer format version."""
    if meta.get("lineage.format") != SEGMENT_FORMAT:
        raise LineageMetadataError(f"{path} is not a {SEGMENT_FORMAT} file (format tag {meta.get('lineage.format')!r})")
    try:
        version = int(meta.get("lineage.format-version", ""))
    except ValueError:
        raise LineageMetadataError(f"{path} has no readable format version ({meta.get('lineage.format-version')!r})") from None
    if version > SEGMENT_FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path} uses {SEGMENT_FORMAT} format version {version}, but this release reads up to {SEGMENT_FORMAT_VERSION}; "
            "upgrade the library"
        )


_CACHE: ImmutableFileCache[Segment] = ImmutableFileCache(256)


def read_key_segment(fileio: FileIO, path: str) -> Segment:
    """Open a segment (memory-mapped when local; cached by path: segments are immutable)."""
    return _CACHE.get(path, lambda: _open(fileio, path))


def remember_written(segment: Segment) -> None:
    """Keep a segment this process wrote to an object store (its ``path`` set) as if it had been read back, so that
    the next commit of a long-lived writer opens it without a GET (a base segment of 1M keys is 12 MB, past what
    :mod:`lineage.storage.objects` keeps). Local segments are memory-mapped when opened instead, and a bounded
    build's segment (a temporary file) is not kept."""
    if segment.path is not None and not _is_local(segment.path) and not isinstance(segment.store, SpooledStore):
        _CACHE.put(segment.path, segment)


def with_path(segment: Segment, path: str) -> Segment:
    """The same segment, now known to live at ``path``."""
    return replace(segment, path=path)
