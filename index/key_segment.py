"""Key index segments: the on-disk format, point lookups and merges.

A segment (``key-index-segment`` format 2) is one **uncompressed Arrow IPC
file** holding one record batch sorted by the 64-bit key hash
(:mod:`index.key_hash`). Columns:

=================================  ==========================================
``__hash``                         uint64, ascending
*the key columns*                  the table's key columns, in the table's types
``__tombstone``                    bool: the key has no live image (as of this segment)
``_row_id``                        int32 or int64 (0 for a tombstone)
``__file_path``                    dictionary<int16 or int32, string>: data file (null for a tombstone)
``__pos``                          int32 or int64: position in the data file
``_row_created_at_version``        int32 or int64
``_row_last_updated_at_version``   int32 or int64
=================================  ==========================================

Format 2 stores each integer entry column as int32 when all its values fit
(most tables: row ids, positions and versions under 2**31) and the file
dictionary's indices as int16 when the segment names fewer than 32,768
files: an entry of a 64-bit key takes about 34 bytes instead of format 1's
52 (every entry column int64, indices int32). Readers accept both formats
and widen to int64; writers write format 2.

The schema metadata carries ``lineage.format`` / ``lineage.format-version``
(a newer version is refused with :class:`UnsupportedFormatError`), the hash
function's name, the key fields (Iceberg field id, name, Arrow type), the
segment's merge level, whether it is a *base* (holds every live key, no
tombstones) and the version of the commit that wrote it.

Being uncompressed, a local segment is memory-mapped and read zero-copy: a
lookup of k keys binary-searches the hash column (``numpy.searchsorted``) and
touches O(k log n) pages, never the whole file. Segments on other storage are
read whole through the table's FileIO once and cached. Equal hashes are
resolved by comparing the stored key values, so a collision never gives a
wrong answer. Within one segment a key appears at most once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from index.key_hash import hash_name, key_hash
import lineage.columns as columns
from lineage.errors import LineageMetadataError, UnsupportedFormatError
from lineage.storage.fileio import ImmutableFileCache, local_path, overwrite_allowed, read_bytes, write_bytes

SEGMENT_FORMAT = "key-index-segment"
SEGMENT_FORMAT_VERSION = 2  # 2: entry columns int32 where the values fit, file indices int16 (1: all int64 / int32)

HASH = "__hash"
TOMBSTONE = "__tombstone"
ROW_ID = columns.ROW_ID
FILE_PATH = "__file_path"
POS = "__pos"
CREATED = columns.CREATED_AT
UPDATED = columns.UPDATED_AT
ENTRY_COLUMNS = (ROW_ID, FILE_PATH, POS, CREATED, UPDATED)
_INT_ENTRIES = (ROW_ID, POS, CREATED, UPDATED)


@dataclass(frozen=True)
class KeyField:
    """One key column as the index records it: Iceberg field id, name and Arrow type."""

    field_id: int
    name: str
    type: pa.DataType

    def to_json(self) -> dict[str, object]:
        """The JSON object stored in segment metadata."""
        return {"id": self.field_id, "name": self.name, "type": str(self.type)}


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


@dataclass(frozen=True)
class Segment:
    """One segment, memory-mapped from its file or (before it is written) in memory."""

    batch: pa.RecordBatch = field(repr=False)
    key: tuple[KeyField, ...]
    level: int
    base: bool
    hash: str
    path: str | None = None

    @property
    def entries(self) -> int:
        """Number of records (entries and tombstones)."""
        return self.batch.num_rows

    @property
    def names(self) -> list[str]:
        """The key column names."""
        return [k.name for k in self.key]

    @property
    def hashes(self) -> np.ndarray:
        """The sorted hash column (zero-copy)."""
        return self.batch.column(HASH).to_numpy()

    @property
    def tombstones(self) -> np.ndarray:
        """The tombstone flags."""
        return self.batch.column(TOMBSTONE).to_numpy(zero_copy_only=False)

    def probe(self, hashes: np.ndarray, keys: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Match rows ``rows`` of ``keys`` (whose hashes are ``hashes[rows]``) with this segment.

        Returns (matched rows of ``keys``, their record numbers here).
        """
        h = self.hashes
        wanted = hashes[rows]
        lo = np.searchsorted(h, wanted, side="left")
        hi = np.searchsorted(h, wanted, side="right")
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cand_rows = np.repeat(rows, counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        cand = np.repeat(lo, counts) + offsets
        eq = keys_equal(keys, cand_rows, self.batch, cand, self.names)
        return cand_rows[eq], cand[eq]

    def take(self, records: np.ndarray) -> pa.Table:
        """Key and entry columns of ``records`` (file paths decoded)."""
        cols = {k.name: self.batch.column(k.name).take(pa.array(records)) for k in self.key}
        for name in _INT_ENTRIES:
            cols[name] = self.batch.column(name).take(pa.array(records)).cast(pa.int64())
        cols[FILE_PATH] = self.batch.column(FILE_PATH).take(pa.array(records)).cast(pa.string())
        return pa.table({f.name: cols[f.name] for f in entry_schema(self.key)}, schema=entry_schema(self.key))

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
    dead = tombstones if tombstones is not None else pa.table({k.name: pa.array([], k.type) for k in key})
    n_live, n_dead = entries.num_rows, dead.num_rows
    keys = pa.concat_tables([entries.select(names).cast(_key_schema(key)), dead.select(names).cast(_key_schema(key))])
    files = entries.column(FILE_PATH)
    files = files.combine_chunks() if isinstance(files, pa.ChunkedArray) else files
    dictionary = files.dictionary if pa.types.is_dictionary(files.type) else None
    if dictionary is None:
        files = files.dictionary_encode() if n_live else pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
        dictionary = files.dictionary
    indices = _padded(files.indices.to_numpy(zero_copy_only=False), np.int32, n_dead)
    ints = {c: _padded(entries.column(c).to_numpy(), np.int64, n_dead) for c in _INT_ENTRIES}
    tomb = np.concatenate([np.zeros(n_live, bool), np.ones(n_dead, bool)])
    order, hashes = hash_order(key_hash(keys))
    return _assemble(key, hashes, keys.take(pa.array(order)), tomb[order], indices[order], dictionary.cast(pa.string()),
                     {c: _gather(_narrowed(v), order) for c, v in ints.items()}, level, base)


def hash_order(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stable order that sorts ``hashes`` (equal hashes keep their input order), and the sorted hashes.

    A plain sort of 64-bit values is several times faster than an argsort, so the row number is packed
    into the hash's low bits and the packed values are sorted; that orders by the high bits exactly and
    breaks ties by row number. Rows whose hashes differ only in the low bits (rare) may come out of
    order; one stable pass over the nearly sorted result (linear for timsort) puts them right.
    """
    n = len(hashes)
    bits = max(1, (n - 1).bit_length())
    if n < 2 or bits > 40:
        order = np.argsort(hashes, kind="stable")
        return order, hashes[order]
    mask = np.uint64((1 << bits) - 1)
    packed = hashes & ~mask
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & mask).astype(np.int64)
    ordered = hashes[order]
    if n > 1 and bool((ordered[1:] < ordered[:-1]).any()):
        fix = np.argsort(ordered, kind="stable")
        order, ordered = order[fix], ordered[fix]
    return order, ordered


def _narrowed(values: np.ndarray) -> np.ndarray:
    """``values`` as int32 when they all fit (format 2 stores them so; a gather of half the bytes), else int64."""
    if len(values) and values.dtype != np.int32 and np.iinfo(np.int32).min <= values.min() and values.max() <= np.iinfo(np.int32).max:
        return values.astype(np.int32)
    return values


def _gather(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values[order]``; a constant column (the versions of a bulk load) without the random gather."""
    if len(values) and values[0] == values.min() == values.max():
        return np.full(len(order), values[0], values.dtype)
    return np.take(values, order)


def drop_tombstones(segment: Segment) -> Segment:
    """``segment`` without its tombstones (still sorted; the same segment when it has none)."""
    tomb = segment.tombstones
    if not tomb.any():
        return segment
    return replace(segment, batch=segment.batch.filter(pa.array(~tomb)))


def _padded(values: np.ndarray, dtype: type, zeros: int) -> np.ndarray:
    """``values`` as ``dtype`` followed by ``zeros`` zeros (no copy when there is nothing to add or convert)."""
    values = values if values.dtype == dtype else values.astype(dtype)
    return np.concatenate([values, np.zeros(zeros, dtype)]) if zeros else values


def _key_schema(key: Sequence[KeyField]) -> pa.Schema:
    return pa.schema([pa.field(k.name, k.type, nullable=False) for k in key])


def _assemble(
    key: Sequence[KeyField],
    hashes: np.ndarray,
    keys: pa.Table,
    tomb: np.ndarray,
    file_indices: np.ndarray,
    dictionary: pa.Array,
    ints: dict[str, np.ndarray],
    level: int,
    base: bool,
) -> Segment:
    """Build the record batch of a segment from sorted parts (unused dictionary entries dropped)."""
    live = ~tomb
    used = np.unique(file_indices[live])
    index_type = np.int16 if len(used) <= np.iinfo(np.int16).max else np.int32  # format 2: the narrowest that holds them
    remap = np.zeros(max(len(dictionary), 1), index_type)
    remap[used] = np.arange(len(used), dtype=index_type)
    files = pa.DictionaryArray.from_arrays(
        pa.array(remap[file_indices] if len(file_indices) else np.zeros(0, index_type), pa.from_numpy_dtype(index_type), mask=tomb),
        dictionary.take(pa.array(used, pa.int64())) if len(used) else pa.array([], pa.string()),
    )
    arrays = [pa.array(hashes, pa.uint64())]
    fields = [pa.field(HASH, pa.uint64(), nullable=False)]
    for k in key:
        col = keys.column(k.name)
        arrays.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
        fields.append(pa.field(k.name, k.type, nullable=False))
    arrays.append(pa.array(tomb, pa.bool_()))
    fields.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
    for name in ENTRY_COLUMNS:
        if name == FILE_PATH:
            arrays.append(files)
            fields.append(pa.field(FILE_PATH, files.type, nullable=True))
        else:
            arrays.append(_narrow(ints[name]))
            fields.append(pa.field(name, arrays[-1].type, nullable=False))
    batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
    return Segment(batch, tuple(key), level, base, hash_name())


def _narrow(values: np.ndarray) -> pa.Array:
    """An entry column as int32 when every value fits (format 2: most tables' row ids, positions and
    versions do), else int64. Readers widen to int64."""
    values = _narrowed(values)
    return pa.array(values, pa.int32() if values.dtype == np.int32 else pa.int64())


def merge_segments(segments: Sequence[Segment], *, base: bool, level: int) -> Segment:
    """Merge segments (oldest first) into one: per key the newest record wins.

    With ``base`` (the merge includes the oldest segment of the index) tombstones
    are dropped: nothing older is left for them to hide.
    """
    key = segments[0].key
    newest_first = list(reversed(segments))
    paths: dict[str, int] = {}
    index_parts = []
    for s in newest_first:
        col = s.batch.column(FILE_PATH)
        remap = np.array([paths.setdefault(p, len(paths)) for p in col.dictionary.to_pylist()] or [0], np.int32)
        raw = col.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        index_parts.append(remap[raw] if len(col.dictionary) else np.zeros(len(raw), np.int32))
    hashes = np.concatenate([s.hashes for s in newest_first])
    tomb = np.concatenate([s.tombstones for s in newest_first])
    indices = np.concatenate(index_parts).astype(np.int32)
    ints = {c: np.concatenate([s.batch.column(c).to_numpy().astype(np.int64, copy=False) for s in newest_first]) for c in _INT_ENTRIES}
    names = [k.name for k in key]
    keys = pa.Table.from_arrays(
        [pa.concat_arrays([_combined(s.batch.column(n)) for s in newest_first]) for n in names], schema=_key_schema(key)
    )
    rank = np.concatenate([np.full(s.entries, i, np.int64) for i, s in enumerate(newest_first)])
    order, _ = hash_order(hashes)  # stable: newest first within equal hashes
    keep = _newest_per_key(hashes, keys, rank, order)
    if base:
        keep = keep[~tomb[keep]]
    return _assemble(key, hashes[keep], keys.take(pa.array(keep)), tomb[keep], indices[keep],
                     pa.array(list(paths), pa.string()), {c: v[keep] for c, v in ints.items()}, level, base)


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


def write_key_segment(fileio: FileIO, path: str, segment: Segment, version: int) -> int:
    """Write ``segment`` as an uncompressed Arrow IPC file; return its size in bytes."""
    meta = {
        "lineage.format": SEGMENT_FORMAT,
        "lineage.format-version": str(SEGMENT_FORMAT_VERSION),
        "key-index.hash": segment.hash,
        "key-index.key": json.dumps([k.to_json() for k in segment.key]),
        "key-index.level": str(segment.level),
        "key-index.base": "true" if segment.base else "false",
        "key-index.version": str(version),
    }
    batch = segment.batch.replace_schema_metadata(meta)
    if overwrite_allowed():  # a deterministic name written again: replace the file whole (see fileio.write_bytes)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return write_bytes(fileio, path, sink.getvalue().to_pybytes())
    with fileio.new_output(path).create(overwrite=False) as out:
        with pa.ipc.new_file(out, batch.schema) as writer:
            writer.write_batch(batch)
        size = out.tell()
    return int(size)


def _is_local(path: str) -> bool:
    return path.startswith("file:") or "://" not in path


def _open(fileio: FileIO, path: str) -> Segment:
    try:
        source = pa.memory_map(local_path(path)) if _is_local(path) else pa.BufferReader(pa.py_buffer(read_bytes(fileio, path)))
    except FileNotFoundError:
        raise LineageMetadataError(
            f"key index segment {path} is missing (deleted by hand or by a foreign vacuum?); rebuild the index with "
            "`lineage reindex TABLE` or Table.reindex()"
        ) from None
    try:
        reader = pa.ipc.open_file(source)
        meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise LineageMetadataError(f"key index segment {path} is unreadable ({exc}); rebuild it with `lineage reindex TABLE`") from None
    check_segment_format(meta, path)
    try:
        if reader.num_record_batches != 1:
            raise ValueError(f"{reader.num_record_batches} record batches, expected 1")
        batch = reader.get_batch(0)
        key = tuple(KeyField(int(k["id"]), str(k["name"]), batch.schema.field(str(k["name"])).type) for k in json.loads(meta["key-index.key"]))
        for name in (HASH, TOMBSTONE, *ENTRY_COLUMNS):
            batch.schema.field(name)
        for name in _INT_ENTRIES:  # int64 in format 1; int32 or int64 in format 2
            if not pa.types.is_integer(batch.schema.field(name).type):
                raise ValueError(f"column {name} has type {batch.schema.field(name).type}, expected an integer type")
        return Segment(batch.replace_schema_metadata(None), key, int(meta["key-index.level"]), meta["key-index.base"] == "true",
                       meta["key-index.hash"], path)
    except Exception as exc:
        raise LineageMetadataError(f"key index segment {path} has damaged content ({exc!r}); rebuild it with `lineage reindex TABLE`") from None


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


def with_path(segment: Segment, path: str) -> Segment:
    """The same segment, now known to live at ``path``."""
    return replace(segment, path=path)
