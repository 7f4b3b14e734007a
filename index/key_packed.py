"""Key index segment file format 3: hashes and locations bit-packed in fixed-width records.

Layout (little-endian)::

    b"KEYINDEX"  uint32 header length  header (JSON, UTF-8)  padding
    sections at the offsets the header names (each 64-byte aligned):
      schema     the key columns' Arrow schema (IPC-serialised)
      directory  uint32 (uint64 past 2**32 records) x (2**p + 1): first record of every hash prefix
      records    n fixed-width records of ``record-bytes`` bytes, then 8 zero bytes
      keys       optional: the key columns in record order, one Arrow IPC stream

The ``p`` high bits of a record's hash are implied by the directory (the
records of prefix b are ``directory[b] .. directory[b+1]``, about 32 per
prefix), so a record keeps the other ``64 - p`` bits. With them it packs the
file ordinal (tombstone: the ordinal one past the last file), the position,
the row id and both versions, each as an offset from the segment's minimum in
as few bits as the segment's largest offset needs. The fields are grouped
into 64-bit *lanes* (first fit, widest first), and a lane is stored in the
bytes it needs: about 14 bytes per key for 10M keys (hash 46 bits, position
20, row id 24, versions and file a few bits), against 34 in format 2.

The keys section is present only when the hash cannot give the key back
(:func:`index.key_hash.hash_is_injective`: composite, string, binary,
decimal keys, or a narrowed test hash); lookups then compare stored keys.

A local file is memory-mapped; a lookup of k keys reads the directory
entries and the ~32 records of each wanted prefix, so it touches O(k)
pages, never the whole file.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from index.key_store import INT_ENTRIES, ArrayStore, KeyField, key_schema, match_sorted

MAGIC = b"KEYINDEX"
_ALIGN = 64
_BUCKET = 5  # log2 of the records per hash prefix (a directory entry per 32 records: 1 bit per key)
_FIELDS = ("hash", "file", *INT_ENTRIES)
# Segments of at most this many records keep their hashes decoded after a first lookup (8 bytes a record): a lookup
# then costs two binary searches over them, where the in-place search decodes a lane per step of each probe. Deltas
# and tiers are this small; a large base is searched in place (its pages touched per probe, never all of it).
DECODED_HASHES = 1 << 18


def _bits(x: int) -> int:
    return int(x).bit_length()


def _le(a: np.ndarray) -> np.ndarray:
    return a if sys.byteorder == "little" else a.byteswap()


@dataclass(frozen=True)
class Layout:
    """Where each field sits: ``fields[name] = (lane, shift, bits, base)``; ``lanes`` are byte widths."""

    prefix_bits: int
    fields: dict[str, tuple[int, int, int, int]]
    lanes: list[int]

    @property
    def record_bytes(self) -> int:
        """Bytes per record."""
        return sum(self.lanes)

    def lane_offset(self, lane: int) -> int:
        """The byte offset of ``lane`` within a record."""
        return sum(self.lanes[:lane])

    def to_json(self) -> dict[str, object]:
        """The header's description of the records."""
        return {"prefix-bits": self.prefix_bits, "fields": {k: list(v) for k, v in self.fields.items()}, "lanes": self.lanes}

    @staticmethod
    def of(obj: dict[str, object]) -> Layout:
        """The layout a header describes."""
        fields = {str(k): tuple(int(x) for x in v) for k, v in obj["fields"].items()}  # type: ignore[union-attr]
        return Layout(int(obj["prefix-bits"]), fields, [int(x) for x in obj["lanes"]])  # type: ignore[arg-type, union-attr]


def _plan(widths: dict[str, int], bases: dict[str, int], prefix_bits: int) -> Layout:
    """First-fit-decreasing packing of the fields into 64-bit lanes."""
    used: list[int] = []
    fields: dict[str, tuple[int, int, int, int]] = {}
    for name in sorted(widths, key=lambda k: (-widths[k], _FIELDS.index(k))):
        w = widths[name]
        if w == 0:
            fields[name] = (-1, 0, 0, bases[name])
            continue
        lane = next((i for i, u in enumerate(used) if u + w <= 64), len(used))
        if lane == len(used):
            used.append(0)
        fields[name] = (lane, used[lane], w, bases[name])
        used[lane] += w
    return Layout(prefix_bits, fields, [(u + 7) // 8 for u in used])


def prefix_bits(n: int) -> int:
    """Hash prefix bits of the directory for ``n`` records (about 32 records per prefix)."""
    return max(0, min(40, _bits(n) - 1 - _BUCKET))


def record_layout(n: int, files: int, ranges: dict[str, tuple[int, int]]) -> Layout:
    """The layout of ``n`` records naming ``files`` data files, whose integer columns span ``ranges`` (lo, hi)."""
    p = prefix_bits(n)
    widths = {"hash": 64 - p, "file": _bits(files)}
    bases = {"hash": 0, "file": 0}
    for name in INT_ENTRIES:
        lo, hi = ranges[name]
        bases[name] = lo
        widths[name] = _bits(hi - lo)
    return _plan(widths, bases, p)


def offsets(values: np.ndarray, base: int) -> np.ndarray:
    """``values - base`` as uint64 (sign-extended: the offset wraps modulo 2**64, exact for any range)."""
    off = values.astype(np.uint64)
    off -= np.uint64(base & 0xFFFFFFFFFFFFFFFF)
    return off


def pack_records(layout: Layout, values: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The ``n`` records (uint8, ``n`` x ``record_bytes``) of the field values (uint64 offsets; shifted in place)."""
    records = np.empty((n, layout.record_bytes), np.uint8)
    for lane, nbytes in enumerate(layout.lanes):
        acc: np.ndarray | None = None
        for name, (ln, shift, _, _) in layout.fields.items():
            if ln == lane:
                v = values[name]
                if shift:
                    np.left_shift(v, np.uint64(shift), out=v)
                if acc is None:
                    acc = v
                else:
                    acc |= v
        assert acc is not None
        start = layout.lane_offset(lane)
        records[:, start : start + nbytes] = _le(acc).view(np.uint8).reshape(n, 8)[:, :nbytes]
    return records


def directory_type(n: int) -> np.dtype:
    """The integer type of the hash directory of ``n`` records."""
    return np.dtype(np.uint32 if n < 2**32 else np.uint64)


def header_fields(meta: dict[str, object], n: int, layout: Layout, files: list[str]) -> dict[str, object]:
    """The header of a file of ``n`` records (without its sections): ``meta``, then what the records need."""
    return dict(meta, **{"entries": n, "record-bytes": layout.record_bytes, "directory-type": str(directory_type(n)),
                         "files": files, "layout": layout.to_json()})


def section_offsets(lengths: list[tuple[str, int]], start: int) -> dict[str, list[int]]:
    """Where the sections of these lengths go from ``start`` (each 64-byte aligned; ``padding`` extends the records)."""
    where: dict[str, list[int]] = {}
    offset = start
    for name, length in lengths:
        if name == "padding":  # right after the records, counted in their section
            where["records"][1] += length
            offset = _aligned(where["records"][0] + where["records"][1])
            continue
        where[name] = [offset, length]
        offset = _aligned(offset + length)
    return where


def frame(header: dict[str, object], lengths: list[tuple[str, int]]) -> bytes:
    """The bytes before the first section: magic, header length, the header naming the sections, zero padding.

    The sections then follow as :func:`section_offsets` lays them out from 0, shifted by the returned length
    (a multiple of the alignment), so a body laid out from 0 is appended to the frame unchanged.
    """
    # Offsets depend on the header's length and the header names them: lay out with a fixed-width placeholder.
    placeholder = {name: [10**15, 10**15] for name, _ in lengths if name != "padding"}
    head_len = len(json.dumps(dict(header, sections=placeholder)).encode())
    start = _aligned(len(MAGIC) + 4 + head_len)
    head = json.dumps(dict(header, sections=section_offsets(lengths, start))).encode()
    head += b" " * (head_len - len(head))
    size = np.uint32(head_len).tobytes() if sys.byteorder == "little" else np.uint32(head_len).byteswap().tobytes()
    return MAGIC + size + head + b"\x00" * (start - len(MAGIC) - 4 - head_len)


def encode(store: ArrayStore, key: tuple[KeyField, ...], meta: dict[str, object], keep_keys: bool) -> list[bytes | memoryview]:
    """The bytes of a format 3 file (in parts, to be written one after another)."""
    n = store.n
    hashes = store.hash_values
    file, ints = store.file, store.ints  # file ordinals as stored (int32 or int64)
    live = file >= 0
    every = bool(live.all())
    used = np.flatnonzero(np.bincount(file[live] if not every else file, minlength=len(store.files))) if n else np.zeros(0, np.int64)
    if every and np.array_equal(used, np.arange(len(store.files))):  # the common case: no remap, no tombstone
        values: dict[str, np.ndarray] = {"file": file.astype(np.uint64)}
    else:
        remap = np.zeros(int(used.max()) + 1 if len(used) else 1, np.int64)
        remap[used] = np.arange(len(used))
        values = {"file": np.where(live, remap[np.where(live, file, 0)], len(used)).astype(np.uint64)}
    ranges = {}
    for name in INT_ENTRIES:
        v = ints[name]
        ranges[name] = (int(v.min()), int(v.max())) if every and n else ((int(v[live].min()), int(v[live].max())) if live.any() else (0, 0))
    layout = record_layout(n, len(used), ranges)
    p = layout.prefix_bits
    values["hash"] = hashes & np.uint64((1 << (64 - p)) - 1) if p else hashes.copy()
    for name in INT_ENTRIES:
        if layout.fields[name][2]:
            off = offsets(ints[name], ranges[name][0])
            if not every:
                off[~live] = 0
            values[name] = off
    records = pack_records(layout, values, n)
    counts = np.bincount((hashes >> np.uint64(64 - p)).astype(np.int64), minlength=1 << p) if p else np.array([n])
    directory = np.concatenate(([0], np.cumsum(counts))).astype(directory_type(n))
    sections: list[tuple[str, bytes | memoryview]] = [
        ("schema", key_schema(key).serialize().to_pybytes()),
        ("directory", memoryview(_le(directory).view(np.uint8))),
        ("records", memoryview(records.reshape(-1))),
        ("padding", PADDING),  # a record's last lane is read as 8 bytes (see PackedStore): never past the file's end
    ]
    if keep_keys and store.keys is not None:
        sink = pa.BufferOutputStream()
        keys = pa.Table.from_arrays([store.keys.column(k.name) for k in key], schema=key_schema(key))
        with pa.ipc.new_stream(sink, keys.schema) as writer:
            writer.write_table(keys)
        sections.append(("keys", sink.getvalue().to_pybytes()))
    lengths = [(name, len(data)) for name, data in sections]
    header = header_fields(meta, n, layout, [store.files[i] for i in used])
    parts: list[bytes | memoryview] = [frame(header, lengths)]
    where = section_offsets(lengths, 0)
    pos = 0
    for name, data in sections:
        start = pos if name == "padding" else where[name][0]
        parts.append(b"\x00" * (start - pos))
        parts.append(data)
        pos = start + len(data)
    return parts


PADDING = b"\x00" * 8


def _aligned(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def read_header(buf: pa.Buffer) -> dict[str, object]:
    """The JSON header of a format 3 file (ValueError when it is not one)."""
    if buf.size < len(MAGIC) + 4 or buf.slice(0, len(MAGIC)).to_pybytes() != MAGIC:
        raise ValueError("not a packed key index segment")
    head_len = int(np.frombuffer(buf.slice(len(MAGIC), 4), "<u4")[0])
    return json.loads(buf.slice(len(MAGIC) + 4, head_len).to_pybytes())


@dataclass(frozen=True)
class PackedStore:
    """A format 3 file's records, read in place (memory-mapped when local)."""

    n: int
    files: list[str]
    layout: Layout
    directory: np.ndarray = field(repr=False)
    lanes: list[np.ndarray] = field(repr=False)  # per lane: its 8 bytes at each record, a strided uint64 view of the file
    keys: pa.Table | None = field(default=None, repr=False)

    @staticmethod
    def of(buf: pa.Buffer, header: dict[str, object]) -> tuple[PackedStore, pa.Schema]:
        """The store over ``buf`` (the whole file) and the key schema; ValueError when the sections disagree."""
        sections = header["sections"]
        assert isinstance(sections, dict)

        def part(name: str) -> pa.Buffer:
            start, length = (int(x) for x in sections[name])
            if start < 0 or start + length > buf.size:
                raise ValueError(f"section {name} [{start}, {start + length}) lies outside the file ({buf.size} bytes)")
            return buf.slice(start, length)

        n = int(header["entries"])  # type: ignore[arg-type]
        layout = Layout.of(header["layout"])  # type: ignore[arg-type]
        rb = int(header["record-bytes"])  # type: ignore[arg-type]
        if rb != layout.record_bytes or not 0 <= layout.prefix_bits <= 40:
            raise ValueError("record layout disagrees with the record size")
        schema = pa.ipc.read_schema(part("schema"))
        directory = np.frombuffer(part("directory"), np.dtype(str(header["directory-type"])).newbyteorder("<"))
        if len(directory) != (1 << layout.prefix_bits) + 1 or int(directory[-1]) != n or int(directory[0]) != 0:
            raise ValueError("the hash directory does not cover the records")
        records = part("records")
        if records.size != n * rb + 8:
            raise ValueError(f"{records.size} record bytes, expected {n} x {rb} + 8")
        # Lane j of record i is read as the 8 bytes at i * rb + offset(j) (its own bytes, then the next
        # lane's or the padding, which the field masks drop): one gather per lane, no copy of the records.
        lanes = [np.ndarray((n,), np.dtype("<u8"), buffer=records, offset=layout.lane_offset(j), strides=(rb,)) if n else np.zeros(0, np.uint64)
                 for j in range(len(layout.lanes))]
        keys = None
        if sections.get("keys") is not None:
            keys = pa.ipc.open_stream(part("keys")).read_all()
            if keys.num_rows != n:
                raise ValueError(f"{keys.num_rows} stored keys for {n} records")
        files = [str(f) for f in header["files"]]  # type: ignore[union-attr]
        return PackedStore(n, files, layout, directory, lanes, keys), schema

    def _lane(self, rows: np.ndarray | None, lane: int) -> np.ndarray:
        view = self.lanes[lane]
        return view.astype(np.uint64) if rows is None else view[rows].astype(np.uint64, copy=False)

    def _field(self, rows: np.ndarray | None, name: str, lanes: dict[int, np.ndarray]) -> np.ndarray:
        lane, shift, bits, _ = self.layout.fields[name]
        count = self.n if rows is None else len(rows)
        if lane < 0:
            return np.zeros(count, np.uint64)
        if lane not in lanes:
            lanes[lane] = self._lane(rows, lane)
        return (lanes[lane] >> np.uint64(shift)) & np.uint64((1 << bits) - 1)

    def _buckets(self, records: np.ndarray) -> np.ndarray:
        return (np.searchsorted(self.directory, records, side="right") - 1).astype(np.uint64)

    def hashes(self) -> np.ndarray:
        """Every hash (decoded: O(n))."""
        low = self._field(None, "hash", {})
        p = self.layout.prefix_bits
        if not p:
            return low
        buckets = np.repeat(np.arange(1 << p, dtype=np.uint64), np.diff(self.directory.astype(np.int64)))
        return (buckets << np.uint64(64 - p)) | low

    def hashes_at(self, records: np.ndarray) -> np.ndarray:
        """The hashes of ``records``."""
        low = self._field(records, "hash", {})
        p = self.layout.prefix_bits
        return (self._buckets(records) << np.uint64(64 - p)) | low if p else low

    @functools.cached_property
    def _decoded(self) -> np.ndarray:
        return self.hashes()

    def match(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Records with the wanted hashes: a binary search among the ~32 records of each wanted prefix."""
        p = self.layout.prefix_bits
        if not len(wanted) or not self.n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.n <= DECODED_HASHES:
            return match_sorted(self._decoded, wanted)
        if len(wanted) > self.n // 64:  # a large part of the segment: one decode of every hash
            return match_sorted(self.hashes(), wanted)
        buckets = (wanted >> np.uint64(64 - p)).astype(np.int64) if p else np.zeros(len(wanted), np.int64)
        start = self.directory[buckets].astype(np.int64)
        end = self.directory[buckets + 1].astype(np.int64)
        low = wanted & np.uint64((1 << (64 - p)) - 1) if p else wanted
        first = self._bound(start, end.copy(), low, upper=False)
        if self.keys is None:  # a hash that gives keys back: at most one record per hash
            last = np.minimum(first + 1, end)
        else:  # a stored key: several keys may share a hash
            last = self._bound(first.copy(), end.copy(), low, upper=True)
        inside = first < last
        if self.keys is None:
            inside[inside] = self._field(first[inside], "hash", {}) == low[inside]
        counts = np.where(inside, last - first, 0)
        total = int(counts.sum())
        which = np.repeat(np.arange(len(wanted), dtype=np.int64), counts)
        records = np.repeat(first, counts) + (np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts))
        return which, records

    def _bound(self, lo: np.ndarray, hi: np.ndarray, low: np.ndarray, *, upper: bool) -> np.ndarray:
        """Per probe, the first record in [lo, hi) whose hash suffix is >= ``low`` (> with ``upper``)."""
        active = np.flatnonzero(lo < hi)
        while len(active):
            mid = (lo[active] + hi[active]) >> 1
            v = self._field(mid, "hash", {})
            right = v <= low[active] if upper else v < low[active]
            lo[active] = np.where(right, mid + 1, lo[active])
            hi[active] = np.where(right, hi[active], mid)
            active = active[lo[active] < hi[active]]
        return lo

    def fields(self, records: np.ndarray | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """File ordinals (-1: tombstone) and integer columns of ``records`` (None: all)."""
        lanes: dict[int, np.ndarray] = {}
        file = self._field(records, "file", lanes).astype(np.int64)
        file[file == len(self.files)] = -1
        ints = {}
        for name in INT_ENTRIES:
            base = np.uint64(self.layout.fields[name][3] & 0xFFFFFFFFFFFFFFFF)
            ints[name] = (self._field(records, name, lanes) + base).view(np.int64)
        dead = file < 0
        if dead.any():
            for v in ints.values():
                v[dead] = 0
        return file, ints

    def stored_keys(self, records: np.ndarray | None) -> pa.Table | None:
        """The stored key columns (None when the hash gives the keys back)."""
        if self.keys is None or records is None:
            return self.keys
        return self.keys.take(pa.array(records, pa.int64()))


@dataclass(frozen=True)
class Spool:
    """A format 3 file's sections, laid out from offset 0 in a local temporary file that is already unlinked.

    Written by a bounded build (:mod:`index.key_build`) before the commit knows the segment's metadata
    (its version); :meth:`SpooledStore.parts` frames it with the final header. The file's space is freed
    when the descriptor is closed, which happens when the spool is garbage-collected.
    """

    fd: int
    size: int
    fields: dict[str, object]  # the header without the metadata and the sections (see header_fields)
    lengths: list[tuple[str, int]]

    def __post_init__(self) -> None:
        weakref.finalize(self, os.close, self.fd)

    def chunks(self, size: int = 8 << 20) -> Iterator[bytes]:
        """The file's bytes, ``size`` at a time (read, not mapped: the pages do not count as this process's memory)."""
        for start in range(0, self.size, size):
            yield os.pread(self.fd, min(size, self.size - start), start)


@dataclass(frozen=True)
class SpooledStore(PackedStore):
    """The records of a spool, memory-mapped for lookups before the segment is written (the same answers as a
    :class:`PackedStore` of the written file)."""

    spool: Spool | None = field(default=None, repr=False)

    @staticmethod
    def open(path: str, fields: dict[str, object], lengths: list[tuple[str, int]]) -> SpooledStore:
        """The store of the spool at ``path`` (closed and complete); the path may be unlinked once this returns."""
        where = section_offsets(lengths, 0)
        buf = pa.memory_map(path).read_buffer()
        fd = os.open(path, os.O_RDONLY)
        try:
            store, _ = PackedStore.of(buf, dict(fields, sections=where))
        except BaseException:
            os.close(fd)
            raise
        spool = Spool(fd, max(start + length for start, length in where.values()), fields, lengths)
        return SpooledStore(store.n, store.files, store.layout, store.directory, store.lanes, store.keys, spool)

    def parts(self, meta: dict[str, object]) -> Iterator[bytes]:
        """The bytes of the format 3 file with ``meta`` in its header: the frame, then the spool as it is."""
        assert self.spool is not None
        yield frame(dict(meta, **self.spool.fields), self.spool.lengths)
        yield from self.spool.chunks()
