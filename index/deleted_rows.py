"""Deleted-rows index segments: pointers to the row images a commit removed, and optionally their values.

Every commit that removes row images (a delete, or the old side of an update
or upsert) writes one immutable segment (Parquet, ``deleted-rows-segment``).
One row per data file holds the removed positions as a serialized roaring
bitmap plus, in position order, the images' row ids, created versions and
valid-from versions (run-length encoded); the removing version is the
commit's own.

Format 2 (written now) adds the **captured values** of tables with pre-image
capture on (table property ``lineage.cdf.capture-preimages``): one list
column per data column, named ``value.<Iceberg field id>``, holding the
removed images' values in position order. A change feed then reads the
pre-images from the segment instead of the data files, and the data files are
not pinned for them. Without capture a format-2 segment has no value columns
and the pointed-to data files stay pinned while the retention window needs
them. Format 1 (the same columns, never values) is still read.
"""

from __future__ import annotations

import io as _io
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyroaring import BitMap64

from lineage.arrays import list_array
from lineage.errors import LineageMetadataError
from lineage.storage.fileio import ImmutableFileCache, write_bytes
from lineage.storage.metadata import open_tagged_parquet
from lineage.storage.rle import encode_values

INDEX_FORMAT = "deleted-rows-segment"
INDEX_FORMAT_VERSION = 2  # 1: pointers only; 2: pointers and, with capture, the removed images' values
VALUE_PREFIX = "value."

_POINTER_FIELDS = [
    pa.field("file_path", pa.string(), nullable=False),
    pa.field("positions", pa.binary(), nullable=False),
    pa.field("row_ids", pa.list_(pa.int64()), nullable=False),
    pa.field("created_values", pa.list_(pa.int64()), nullable=False),
    pa.field("created_lengths", pa.list_(pa.int64()), nullable=False),
    pa.field("valid_from_values", pa.list_(pa.int64()), nullable=False),
    pa.field("valid_from_lengths", pa.list_(pa.int64()), nullable=False),
    pa.field("valid_to", pa.int64(), nullable=False),
]
POINTER_COLUMNS = [f.name for f in _POINTER_FIELDS]


@dataclass(frozen=True)
class RemovedImages:
    """The images of one data file that one commit removed (sorted by position).

    ``values`` holds the captured values (one row per position; one column
    per data column, named by its Iceberg field id as a decimal string) when
    the segment was written with pre-image capture, else None.
    """

    file_path: str
    positions: np.ndarray
    row_ids: np.ndarray
    created: np.ndarray
    valid_from: np.ndarray
    valid_to: int
    values: pa.Table | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def take(self, indices: np.ndarray, file_path: str | None = None, positions: np.ndarray | None = None) -> RemovedImages:
        """The entries at ``indices`` (values included), optionally moved to another file and positions."""
        return RemovedImages(
            self.file_path if file_path is None else file_path,
            self.positions[indices] if positions is None else positions,
            self.row_ids[indices],
            self.created[indices],
            self.valid_from[indices],
            self.valid_to,
            None if self.values is None else self.values.take(pa.array(indices, pa.int64())),
        )


@dataclass(frozen=True)
class WrittenIndex:
    """An index segment written before the commit (by Spark executors): its path, size, image count and ``valid_to``."""

    path: str
    size: int
    images: int
    valid_to: int


def captured_values(values: pa.Table, field_ids: dict[str, int]) -> pa.Table:
    """Values named by data column, renamed to their Iceberg field ids (the form :class:`RemovedImages` keeps)."""
    return pa.Table.from_arrays(list(values.columns), names=[str(field_ids[n]) for n in values.column_names])


@dataclass(frozen=True)
class IndexSegment:
    """One segment's entries as flat arrays in (file, position) order: what a change feed needs in one piece.

    ``file_index`` indexes ``files``. ``captured`` says whether the file holds
    the removed images' values; ``values`` has them (one row per entry,
    columns named by field id) when they were asked for.
    """

    path: str
    files: tuple[str, ...]
    file_index: np.ndarray
    positions: np.ndarray
    row_ids: np.ndarray
    created: np.ndarray
    valid_from: np.ndarray
    valid_to: np.ndarray
    values: pa.Table | None
    captured: bool = False

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays and captured values (what a cache of segments holds)."""
        arrays = (self.file_index, self.positions, self.row_ids, self.created, self.valid_from, self.valid_to)
        return sum(a.nbytes for a in arrays) + (0 if self.values is None else self.values.nbytes)

    def entries(self) -> tuple[RemovedImages, ...]:
        """The same entries grouped by data file."""
        bounds = np.flatnonzero(np.diff(self.file_index)) + 1
        starts = np.concatenate(([0], bounds)).astype(np.int64)
        ends = np.concatenate((bounds, [len(self)])).astype(np.int64)
        out = []
        for s, e in zip(starts, ends, strict=True):
            if s == e:
                continue
            out.append(
                RemovedImages(
                    self.files[int(self.file_index[s])], self.positions[s:e], self.row_ids[s:e], self.created[s:e],
                    self.valid_from[s:e], int(self.valid_to[s]), None if self.values is None else self.values.slice(s, e - s),
                )
            )
        return tuple(out)


def write_index_segment(fileio: FileIO, path: str, removed: list[RemovedImages]) -> int:
    """Write one commit's removed images (with their values if every entry has them); return the file size.

    Entries either all carry captured values or none do.
    """
    size = write_index_table(fileio, path, index_rows(removed))
    written = _segment_from_parts(path, removed)  # the writer knows what it wrote
    _CACHE.get(path, lambda: without_values(written))
    if written.captured:
        _VALUE_CACHE.get(path, lambda: written)
    return size


def index_rows(removed: list[RemovedImages]) -> pa.Table:
    """The rows of an index segment for ``removed`` (one per data file), as :func:`write_index_table` stores them.

    Spark executors build them for their share of a commit's files; one task
    concatenates and writes them (:mod:`lineage.writes.spark_removed`).
    """
    captured = [r.values is not None for r in removed]
    if any(captured) and not all(captured):
        raise ValueError("an index segment holds the values of all its entries or of none")
    cols: dict[str, list[Any]] = {f.name: [] for f in _POINTER_FIELDS}
    value_parts: list[pa.Table] = []
    for r in removed:
        order = np.argsort(r.positions, kind="stable")
        bitmap = BitMap64(r.positions[order].tolist())
        if len(bitmap) != len(r.positions):
            raise ValueError(f"duplicate positions for {r.file_path}")
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
        if r.values is not None:
            value_parts.append(r.values.take(pa.array(order, pa.int64())))
    schema = pa.schema(_POINTER_FIELDS)
    table = pa.Table.from_arrays([list_array(cols[f.name]) if pa.types.is_list(f.type) else pa.array(cols[f.name], f.type) for f in schema],
                                 schema=schema)
    if value_parts:
        table = _with_value_columns(table, value_parts, [len(r) for r in removed])
    return table


def _with_value_columns(table: pa.Table, parts: list[pa.Table], lengths: list[int]) -> pa.Table:
    fids: list[str] = []
    types: dict[str, pa.DataType] = {}
    for p in parts:
        for f in p.schema:
            if f.name not in types:
                fids.append(f.name)
                types[f.name] = f.type
    offsets = pa.array(np.concatenate(([0], np.cumsum(lengths))).astype(np.int32), pa.int32())
    for fid in fids:
        flat = pa.concat_arrays(
            [(p.column(fid).combine_chunks() if fid in p.column_names else pa.nulls(p.num_rows, types[fid])).cast(types[fid]) for p in parts]
        )
        table = table.append_column(pa.field(VALUE_PREFIX + fid, pa.list_(types[fid])), pa.ListArray.from_arrays(offsets, flat))
    return table


def write_index_table(fileio: FileIO, path: str, table: pa.Table) -> int:
    """Write rows of :func:`index_rows` (of one commit) as an index segment at ``path``; return the file size."""
    tagged = table.replace_schema_metadata({"lineage.format": INDEX_FORMAT, "lineage.format-version": str(INDEX_FORMAT_VERSION)})
    sink = _io.BytesIO()
    pq.write_table(tagged, sink, compression="zstd", use_dictionary=False)  # a dictionary of 1M row ids cost ~170 MB, for no smaller file
    return write_bytes(fileio, path, sink.getvalue())


# Parsed segments, cached by path (segments are immutable) within a byte budget each for pointers and for
# captured values: a feed over a table's recent commits rereads none of them, and a process that reads
# long ranges of a large table does not keep them all (a 1M-row delete makes a 65 MB segment).
CACHE_BYTES = 256 << 20
_CACHE: ImmutableFileCache[IndexSegment] = ImmutableFileCache(CACHE_BYTES, weigh=lambda s: s.nbytes, max_share=0.25)
_VALUE_CACHE: ImmutableFileCache[IndexSegment] = ImmutableFileCache(CACHE_BYTES, weigh=lambda s: s.nbytes, max_share=0.25)


# per segment whose values are parsed: (those values, the same with string columns dictionary-encoded)
_ENCODED: ImmutableFileCache[tuple[pa.Table, pa.Table]] = ImmutableFileCache(CACHE_BYTES, weigh=lambda v: v[1].nbytes, max_share=0.25)


def forget_captured_values() -> None:
    """Drop the captured values this process keeps parsed (a purge calls it: they may hold erased values)."""
    _VALUE_CACHE.clear()
    _ENCODED.clear()


def dictionary_values(segment: IndexSegment) -> pa.Table | None:
    """``segment.values`` with its string columns dictionary-encoded (``dictionary<int32, string>``), as Parquet
    data files read them: a change feed then takes, orders and compares them by index, as the values of data files.

    Encoded once per parsed segment and kept (dropped with the parsed values by :func:`forget_captured_values`).
    """
    values = segment.values
    if values is None or not any(_encodable(c) for c in values.columns):
        return values
    key = (segment.path, id(values))
    hit = _ENCODED.peek(key)
    if hit is not None and hit[0] is values:
        return hit[1]
    cols = [_encoded(c) if _encodable(c) else c for c in values.columns]
    encoded = pa.Table.from_arrays(cols, names=values.column_names)
    _ENCODED.put(key, (values, encoded))  # the values are held with it: their id names no other table meanwhile
    return encoded


def _encoded(col: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A string column as a dictionary, if it has few distinct values (at most one in eight rows, as
    :func:`lineage.read.values.take_rows` keeps them); else as it is (no copy of strings that would be decoded anyway)."""
    encoded = pc.dictionary_encode(col.combine_chunks().cast(pa.string()))
    return encoded if len(encoded.dictionary) <= max(len(col), 1) // 8 else col


def _encodable(col: pa.ChunkedArray) -> bool:
    t = col.type
    return (pa.types.is_string(t) or pa.types.is_large_string(t)) and col.nbytes < (1 << 31) - 1


def read_index(fileio: FileIO, path: str, with_values: bool = False) -> IndexSegment:
    """Read one index segment as flat arrays; its captured values too if ``with_values`` (and it has any)."""
    if with_values:
        if not _CACHE.get(path, lambda: _read(fileio, path, False)).captured:
            return _CACHE.get(path, lambda: _read(fileio, path, False))
        return _VALUE_CACHE.get(path, lambda: _read(fileio, path, True))
    return _CACHE.get(path, lambda: _read(fileio, path, False))


def read_index_segment(fileio: FileIO, path: str, with_values: bool = False) -> tuple[RemovedImages, ...]:
    """Read one index segment grouped by data file (with captured values if ``with_values``)."""
    return read_index(fileio, path, with_values).entries()


def _segment_from_parts(path: str, removed: list[RemovedImages]) -> IndexSegment:
    parts = [r.take(np.argsort(r.positions, kind="stable")) for r in removed]
    files = tuple(r.file_path for r in parts)
    n = [len(r) for r in parts]
    values = None
    if parts and parts[0].values is not None:
        values = pa.concat_tables([p.values for p in parts], promote_options="permissive")
    cat = (lambda xs: np.concatenate(xs).astype(np.int64)) if parts else (lambda xs: np.zeros(0, np.int64))
    return IndexSegment(
        path, files, np.repeat(np.arange(len(parts), dtype=np.int32), n), cat([r.positions for r in parts]),
        cat([r.row_ids for r in parts]), cat([r.created for r in parts]), cat([r.valid_from for r in parts]),
        np.repeat(np.array([r.valid_to for r in parts], np.int64), n), values, values is not None,
    )


def _flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list<int64> column's values as one array, and each row's element count."""
    col = table.column(name).combine_chunks()
    if col.null_count:
        raise ValueError(f"{name} has nulls")
    counts = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    return col.flatten().to_numpy(zero_copy_only=False).astype(np.int64), counts


def _read(fileio: FileIO, path: str, with_values: bool) -> IndexSegment:
    pf = open_tagged_parquet(fileio, path, INDEX_FORMAT, "deleted-rows index segment", INDEX_FORMAT_VERSION)
    try:
        value_columns = [n for n in pf.schema_arrow.names if n.startswith(VALUE_PREFIX)]
        table = pf.read(columns=None if with_values else [n for n in pf.schema_arrow.names if n not in value_columns], use_threads=False)
    except Exception as exc:  # a corrupt file
        raise LineageMetadataError(f"deleted-rows index segment {path} has damaged content: {exc!r}") from None
    return decode_index(path, table, with_values, bool(value_columns))


def decode_index(path: str, table: pa.Table, with_values: bool, captured: bool) -> IndexSegment:
    """The rows ``table`` of the index segment at ``path`` (all of it, or some of its data files) as flat arrays."""
    try:
        files = table.column("file_path").to_pylist()
        bitmaps = table.column("positions").to_pylist()
        if any(f is None for f in files) or any(b is None for b in bitmaps):
            raise ValueError("file_path or positions has nulls")
        positions = [np.frombuffer(BitMap64.deserialize(b).to_array(), dtype=np.uint64).astype(np.int64) for b in bitmaps]
        n = np.array([len(p) for p in positions], np.int64)
        row_ids, rid_counts = _flat(table, "row_ids")
        versions = {}
        for name in ("created", "valid_from"):
            values, value_counts = _flat(table, f"{name}_values")
            lengths, length_counts = _flat(table, f"{name}_lengths")
            if not np.array_equal(value_counts, length_counts) or (lengths < 0).any():
                raise ValueError(f"{name} runs are malformed")
            covered = np.concatenate(([0], np.cumsum(lengths)))
            ends = np.cumsum(length_counts)
            per_file = covered[ends] - covered[ends - length_counts]
            if not np.array_equal(per_file, n):
                raise ValueError(f"{name} runs cover {per_file.tolist()} rows, positions {n.tolist()}")
            versions[name] = np.repeat(values, lengths)
        if not np.array_equal(rid_counts, n):
            raise ValueError(f"row ids {rid_counts.tolist()} disagree with positions {n.tolist()}")
        valid_to = table.column("valid_to").to_numpy()
        values_table = _values(table, n) if with_values else None
    except LineageMetadataError:
        raise
    except Exception as exc:  # missing columns, nulls, corrupt bitmaps
        raise LineageMetadataError(f"deleted-rows index segment {path} has damaged content: {exc!r}") from None
    return IndexSegment(
        path, tuple(files), np.repeat(np.arange(len(files), dtype=np.int32), n),
        np.concatenate(positions) if positions else np.zeros(0, np.int64), row_ids, versions["created"], versions["valid_from"],
        np.repeat(valid_to.astype(np.int64), n), values_table, captured,
    )


def _values(table: pa.Table, n: np.ndarray) -> pa.Table | None:
    names = [c for c in table.column_names if c.startswith(VALUE_PREFIX)]
    if not names:
        return None
    cols = []
    for name in names:
        col = table.column(name).combine_chunks()
        counts = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False)
        if col.null_count or not np.array_equal(counts, n):
            raise ValueError(f"{name} holds {counts.tolist()} values, positions {n.tolist()}")
        cols.append(col.flatten())
    return pa.Table.from_arrays(cols, names=[c[len(VALUE_PREFIX):] for c in names])


def without_values(segment: IndexSegment) -> IndexSegment:
    """The same segment with its captured values dropped (for callers that only need pointers)."""
    return replace(segment, values=None)
