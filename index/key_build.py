"""A key index base segment built in bounded memory: the keys partitioned by hash range, then written in order.

A format 3 segment (:mod:`index.key_packed`) is a list of records sorted by
key hash, so it can be written one hash range after another. The build makes
two passes:

1. **Partition.** The live rows come in chunks (a group of data files at a
   time). Each chunk's keys are hashed and every row becomes a fixed-width
   record (hash, data file ordinal, position, row id, both versions: 32
   bytes; 48 past 2**31 positions or versions), put into one of ``2**bits`` hash ranges by the hash's top
   bits. Records wait in memory until they reach the budget
   (``lineage.key-index.build-memory-bytes``), then all of them are written
   to one *run* file, range after range (a key column the hash does not give
   back, such as a string or a composite key, goes beside them in an Arrow
   IPC file, one batch per range). The pass also keeps the few facts the
   record layout needs: the number of records, the smallest and largest
   value of each integer column, and which data files have a live row.
2. **Write.** Range by range, in hash order: the range's records from every
   run and from memory, sorted by hash (stably: equal hashes keep the
   order of the rows), checked for duplicate keys, packed with the layout of
   the whole segment and appended to a local temporary file, whose hash
   directory is filled in range by range.

The result is the same file, byte for byte, as the in-memory build writes
for the same rows (when the keys are stored, their Arrow stream is cut into
one batch per range instead of one, with the same values). The segment is
memory-mapped from the temporary file, so the writes that build an index
look keys up in it at once; the commit copies it to its place in the table.

Memory: the budget, plus one chunk of rows being read (about a million rows),
plus one range being sorted (the ranges are cut at a sixteenth of the
budget), plus a few bytes per data file. Nothing grows with the table's row
count except the number of ranges and runs (a record of 8 bytes per range
per run). Disk: about 32 bytes per key in the system's temporary directory
(``TMPDIR``) beyond the budget, deleted when the build ends, and the segment
itself (about 14 bytes per key) until the commit has copied it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from index.key_hash import hash_is_injective, hash_name, key_hash
from index.key_packed import PADDING, Layout, SpooledStore, directory_type, header_fields, offsets, pack_records, record_layout, section_offsets
from index.key_segment import SEGMENT_FORMAT_VERSION, Segment, hash_order, keys_equal
from index.key_store import CREATED, INT_ENTRIES, POS, ROW_ID, UPDATED, ArrayStore, KeyField, key_schema
from lineage.errors import KeyViolationError, LineageMetadataError

TOMBSTONE_FILE = -1  # the data file ordinal of a tombstone in an EntryChunk (a delta segment's)
MAX_RANGE_BITS = 16  # at most 65,536 hash ranges
RANGE_SHARE = 16  # a range holds at most this share of the budget (its sort needs a few times its size)
_WRITE = 8 << 20  # bytes copied per step


@dataclass(frozen=True)
class EntryChunk:
    """Entries of some live rows: key columns, ordinals into the build's list of data files, integer columns."""

    keys: pa.Table
    file: np.ndarray
    ints: dict[str, np.ndarray]


def entry_chunk(entries: pa.Table, names: Sequence[str], first_file: int) -> EntryChunk:
    """The chunk of an entry table (key + entry columns, the file path dictionary-encoded over consecutive files
    of the build's list, the first of them at ``first_file``)."""
    files = entries.column("__file_path").combine_chunks()
    ordinals = files.indices.to_numpy(zero_copy_only=False).astype(np.int32) + np.int32(first_file)
    ints = {c: entries.column(c).to_numpy() for c in INT_ENTRIES}
    return EntryChunk(entries.select(list(names)), ordinals, ints)


def record_dtype(max_pos: int, max_version: int) -> np.dtype:
    """The spilled record: int32 positions and versions where the table's sizes allow; a multiple of 8 bytes."""
    narrow = np.iinfo(np.int32).max
    pos = "<i4" if max_pos <= narrow else "<i8"
    version = "<i4" if max_version <= narrow else "<i8"
    fields = [("hash", "<u8"), (ROW_ID, "<i8"), (POS, pos), (CREATED, version), (UPDATED, version), ("file", "<i4")]
    size = sum(np.dtype(t).itemsize for _, t in fields)
    if size % 8:
        fields.append(("pad", "<i4"))
    return np.dtype(fields)


def take(records: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``records[order]``: the records as rows of 64-bit words, gathered a row at a time (numpy gathers
    structured values field by field, several times slower)."""
    words = records.view(np.uint64).reshape(len(records), records.dtype.itemsize // 8)
    return np.take(words, order, axis=0).reshape(-1).view(records.dtype)


def duplicate_keys(segment: Segment) -> list[dict[str, object]]:
    """Up to three keys that occur more than once in a (just built) segment."""
    h = segment.hashes
    if len(h) < 2:
        return []
    same = np.flatnonzero(h[1:] == h[:-1])
    if not len(same):
        return []
    names = segment.names
    if hash_is_injective([k.type for k in segment.key]):  # equal hashes are equal keys
        return segment.keys(same[:3]).to_pylist()
    # Equal hashes are adjacent, equal keys need not be (collisions): compare every pair of a hash group.
    starts = np.concatenate(([0], np.flatnonzero(h[1:] != h[:-1]) + 1))
    ends = np.append(starts[1:], len(h))
    left, right = [], []
    for s, e in zip(starts[ends - starts > 1], ends[ends - starts > 1], strict=True):
        for i in range(s, e):
            for j in range(i + 1, e):
                left.append(i)
                right.append(j)
    keys = segment.keys()
    eq = keys_equal(keys, np.array(left, np.int64), keys, np.array(right, np.int64), names)
    hits = np.array(left, np.int64)[eq][:3]
    return keys.take(pa.array(hits)).to_pylist() if len(hits) else []


def duplicate_error(dup: list[dict[str, object]]) -> KeyViolationError:
    """The error of a build that found several live rows with the same key."""
    return KeyViolationError(
        f"the table holds several live rows with the same key, e.g. {dup}; the key index needs unique keys "
        "(delete the duplicates, or keep lineage.key.enforce=false)"
    )


class _Runs:
    """Records partitioned into ``2**bits`` hash ranges: in memory up to the budget, then spilled (one run file per spill)."""

    def __init__(self, dtype: np.dtype, bits: int, budget: int, folder: str, schema: pa.Schema | None) -> None:
        self.dtype, self.bits, self.budget, self.folder, self.schema = dtype, bits, budget, folder, schema
        self.pending: list[tuple[np.ndarray, np.ndarray, pa.Table | None]] = []
        self.pending_bytes = 0
        self.runs: list[tuple[str, np.ndarray, str | None]] = []  # records file, first record of every range, keys file

    def add(self, rec: np.ndarray, keys: pa.Table | None) -> None:
        """Add a chunk's records (and stored keys, row for row)."""
        ranges = 1 << self.bits
        if self.bits:
            bucket = (rec["hash"] >> np.uint64(64 - self.bits)).astype(np.uint16)
            order = np.argsort(bucket, kind="stable")
            rec = take(rec, order)
            keys = None if keys is None else keys.take(pa.array(order))
            bounds = np.concatenate(([0], np.cumsum(np.bincount(bucket, minlength=ranges))))
        else:
            bounds = np.array([0, len(rec)])
        size = rec.nbytes + (0 if keys is None else keys.nbytes)
        if self.pending_bytes + size > self.budget:
            self.spill()
        self.pending.append((rec, bounds, keys))
        self.pending_bytes += size
        if self.pending_bytes > self.budget:  # a chunk larger than the budget on its own
            self.spill()

    def spill(self) -> None:
        """Write the records in memory to a new run file, range after range."""
        if not self.pending:
            return
        ranges = 1 << self.bits
        path = os.path.join(self.folder, f"run-{len(self.runs)}.records")
        starts = np.zeros(ranges + 1, np.int64)
        with open(path, "wb") as f:
            for k in range(ranges):
                for rec, bounds, _ in self.pending:
                    if bounds[k + 1] > bounds[k]:
                        f.write(rec[bounds[k] : bounds[k + 1]].view(np.uint8))
                starts[k + 1] = starts[k] + sum(int(b[k + 1] - b[k]) for _, b, _ in self.pending)
        keys_path = None
        if self.schema is not None:
            keys_path = os.path.join(self.folder, f"run-{len(self.runs)}.keys")
            with pa.OSFile(keys_path, "wb") as sink, pa.ipc.new_file(sink, self.schema) as writer:
                for k in range(ranges):
                    writer.write_batch(_one_batch([t.slice(b[k], b[k + 1] - b[k]) for _, b, t in self.pending if t is not None], self.schema))
        self.runs.append((path, starts, keys_path))
        self.pending, self.pending_bytes = [], 0

    def take(self, first: int, stop: int) -> tuple[np.ndarray, pa.Table | None]:
        """The records of ranges ``first`` .. ``stop - 1`` (and their stored keys) in the order they were added."""
        parts: list[np.ndarray] = []
        key_parts: list[pa.RecordBatch] = []
        for path, starts, keys_path in self.runs:
            count = int(starts[stop] - starts[first])
            if count:
                parts.append(np.fromfile(path, self.dtype, count=count, offset=int(starts[first]) * self.dtype.itemsize))
            if keys_path is not None:
                with pa.OSFile(keys_path) as source:
                    reader = pa.ipc.open_file(source)
                    key_parts.extend(reader.get_batch(k) for k in range(first, stop))
        for rec, bounds, keys in self.pending:
            parts.append(rec[bounds[first] : bounds[stop]])
            if keys is not None:
                key_parts.extend(keys.slice(bounds[first], bounds[stop] - bounds[first]).to_batches())
        records = np.concatenate(parts) if parts else np.zeros(0, self.dtype)
        if self.schema is None:
            return records, None
        return records, pa.Table.from_batches(key_parts, schema=self.schema)


def _one_batch(tables: list[pa.Table], schema: pa.Schema) -> pa.RecordBatch:
    """The rows of ``tables`` as one record batch (an empty one when there are none)."""
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return pa.RecordBatch.from_arrays([table.column(i).combine_chunks() for i in range(table.num_columns)], schema=schema)


def range_bits(rows: int, bytes_per_row: int, budget: int) -> int:
    """How many top hash bits cut ``rows`` records into ranges of at most a sixteenth of the budget each."""
    share = max(1, budget // RANGE_SHARE)
    ranges = -(-rows * bytes_per_row // share)
    return min(MAX_RANGE_BITS, max(0, (ranges - 1).bit_length()))


def spooled_base(
    key: tuple[KeyField, ...], paths: Sequence[str], chunks: Iterable[EntryChunk], *, rows: int, max_pos: int, max_version: int, budget: int,
    level: int = 0, base: bool = True,
) -> Segment | None:
    """A base segment of the entries of ``chunks`` (ordinals into ``paths``), built within ``budget`` bytes.

    ``rows`` bounds the number of entries (it sizes the hash ranges),
    ``max_pos`` and ``max_version`` the positions and versions; ``level``
    is the segment's merge level. None when the chunks hold no entry.
    KeyViolationError when a key occurs twice. With ``base`` False the
    segment is a commit's delta (not a base): an entry whose ordinal is
    :data:`TOMBSTONE_FILE` is a tombstone (its integer columns are ignored),
    and a key may not be both an entry and a tombstone either.
    """
    dtype = record_dtype(max_pos, max_version)
    stored = not hash_is_injective([k.type for k in key])
    schema = key_schema(key) if stored else None
    with tempfile.TemporaryDirectory(prefix="lineage-key-index-") as folder:
        runs: _Runs | None = None
        n = 0
        ranges = {c: (np.iinfo(np.int64).max, np.iinfo(np.int64).min) for c in INT_ENTRIES}
        per_file = np.zeros(len(paths), np.int64)
        for chunk in chunks:
            m = chunk.keys.num_rows
            if not m:
                continue
            keys = pa.Table.from_arrays([chunk.keys.column(k.name) for k in key], schema=key_schema(key))
            if runs is None:  # sized from the first chunk: the stored keys' bytes per row are known then
                extra = -(-keys.nbytes // m) if stored else 0
                runs = _Runs(dtype, range_bits(rows, dtype.itemsize + extra, budget), budget, folder, schema)
            rec = np.empty(m, dtype)
            rec["hash"] = key_hash(keys)
            rec["file"] = chunk.file
            live = chunk.file != TOMBSTONE_FILE
            for c in INT_ENTRIES:
                v = np.where(live, chunk.ints[c], 0)
                if not live.any():
                    rec[c] = v
                    continue
                lo, hi = int(v[live].min()), int(v[live].max())
                limits = np.iinfo(dtype[c])
                if lo < limits.min or hi > limits.max:
                    raise LineageMetadataError(f"internal: {c} of a key index entry is out of the range {limits.min}..{limits.max}")
                rec[c] = v
                ranges[c] = (min(ranges[c][0], lo), max(ranges[c][1], hi))
            per_file += np.bincount(chunk.file[live], minlength=len(paths))
            n += m
            runs.add(rec, keys if stored else None)
            del rec, keys, chunk
        if runs is None:
            return None
        used = np.flatnonzero(per_file)
        remap = np.zeros(len(paths) + 1, np.uint64)  # the last one, read for TOMBSTONE_FILE (-1): one past the last file used
        remap[used] = np.arange(len(used), dtype=np.uint64)
        remap[-1] = len(used)
        ranges = {c: (lo, hi) if lo <= hi else (0, 0) for c, (lo, hi) in ranges.items()}  # (0, 0): tombstones only
        layout = record_layout(n, len(used), ranges)
        fields = header_fields({}, n, layout, [paths[i] for i in used])
        body = os.path.join(folder, "segment.kix")
        lengths = _write_body(body, runs, key, layout, remap, n)
        store = SpooledStore.open(body, fields, lengths)
    return Segment(store, key, level, base, hash_name(), None, SEGMENT_FORMAT_VERSION)


def _write_body(path: str, runs: _Runs, key: tuple[KeyField, ...], layout: Layout, remap: np.ndarray, n: int) -> list[tuple[str, int]]:
    """Write the sections of the segment to ``path`` (laid out from 0) range by range; return their lengths."""
    p = layout.prefix_bits
    schema_bytes = key_schema(key).serialize().to_pybytes()
    dir_type = directory_type(n).newbyteorder("<")
    lengths: list[tuple[str, int]] = [("schema", len(schema_bytes)), ("directory", ((1 << p) + 1) * dir_type.itemsize),
                                      ("records", n * layout.record_bytes), ("padding", len(PADDING))]
    where = section_offsets(lengths, 0)
    group_bits = min(runs.bits, p)
    keys_path = path + ".keys"
    keys_sink = pa.OSFile(keys_path, "wb") if runs.schema is not None else None
    keys_writer = pa.ipc.new_stream(keys_sink, runs.schema) if keys_sink is not None else None
    with open(path, "wb", buffering=0) as f:
        f.write(schema_bytes)
        fd = f.fileno()
        f.seek(where["records"][0])
        written = 0
        for g in range(1 << group_bits):
            rec, keys = runs.take(g << (runs.bits - group_bits), (g + 1) << (runs.bits - group_bits))
            order, hashes = hash_order(rec["hash"])
            rec = take(rec, order)
            if keys is not None:
                keys = keys.take(pa.array(order))
            if len(hashes) > 1 and (hashes[1:] == hashes[:-1]).any():
                dup = duplicate_keys(Segment(ArrayStore(hashes, rec["file"], [], {}, keys), key, 0, True, hash_name()))
                if dup:
                    raise duplicate_error(dup)
            values = {"file": remap[rec["file"]], "hash": hashes & np.uint64((1 << (64 - p)) - 1) if p else hashes.copy()}
            dead = rec["file"] == TOMBSTONE_FILE
            for c in INT_ENTRIES:
                if layout.fields[c][2]:
                    values[c] = offsets(rec[c], layout.fields[c][3])
                    values[c][dead] = 0  # a tombstone's fields are zero (as the in-memory writer stores them)
            m = len(rec)
            del rec
            if m:
                f.write(pack_records(layout, values, m).reshape(-1))
            first, stop = g << (p - group_bits), (g + 1) << (p - group_bits)
            if p:
                counts = np.bincount((hashes >> np.uint64(64 - p)).astype(np.int64) - first, minlength=stop - first)
            else:
                counts = np.array([m])
            piece = (written + np.cumsum(counts) - counts).astype(dir_type)
            os.pwrite(fd, piece.tobytes(), where["directory"][0] + first * dir_type.itemsize)
            written += m
            if keys_writer is not None and keys is not None and keys.num_rows:
                keys_writer.write_table(keys)
        if written != n:
            raise LineageMetadataError(f"internal: the key index build wrote {written} records of {n}")
        os.pwrite(fd, np.array([n], dir_type).tobytes(), where["directory"][0] + (1 << p) * dir_type.itemsize)
        f.write(PADDING)
        if keys_writer is not None and keys_sink is not None:
            keys_writer.close()
            keys_sink.close()
            size = os.path.getsize(keys_path)
            lengths.append(("keys", size))
            f.seek(section_offsets(lengths, 0)["keys"][0])
            with open(keys_path, "rb") as source:
                for chunk in _read_chunks(source):
                    f.write(chunk)
            os.unlink(keys_path)
    return lengths


def _read_chunks(source: object) -> Iterator[bytes]:
    while chunk := source.read(_WRITE):  # type: ignore[attr-defined]
        yield chunk
