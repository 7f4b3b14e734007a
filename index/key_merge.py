"""A merge of key index segments into a new base in bounded memory: hash range by hash range.

Every segment is sorted by key hash, so the records of one hash range are a
contiguous run of records in each of them (found through a format 3
segment's hash directory, or by a binary search of the hashes of the older
formats). The merge walks the ranges in hash order, decodes each segment's
run of the range, merges them as :func:`index.key_segment.merge_segments`
does (per key the newest record wins; tombstones are dropped, as in every
merge into a base) and hands the merged entries, a range at a time, to the
bounded build (:func:`index.key_build.spooled_base`), which packs them into
one segment within the build budget. The result is the segment the
in-memory merge writes (byte for byte when the hash gives the keys back).

Memory: one range of the inputs at a time (about ``chunk_rows`` records)
plus the build's budget, whatever the segments' sizes.

:func:`sliced` does one step of a writer's sliced merge
(:func:`index.key_merge_policy.writer_slice`): the same merge over one hash
range only, giving a base piece.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from index.key_build import EntryChunk, spooled_base
from index.key_merge_policy import HASHES, Slice
from index.key_packed import PackedStore
from index.key_segment import Segment, entry_schema, make_segment, merge_segments
from index.key_store import CREATED, INT_ENTRIES, POS, UPDATED, ArrayStore, Store

_WIDE = 1 << 62  # a bound that selects 64-bit spilled fields


def bounded_base_merge(segments: Sequence[Segment], *, level: int, budget: int, chunk_rows: int) -> Segment:
    """``merge_segments(segments, base=True, level=level)`` (oldest first), built range by range."""
    key = segments[0].key
    paths: dict[str, int] = {}
    for s in reversed(segments):  # the order merge_segments numbers the data files in
        for p in s.store.files:
            paths.setdefault(p, len(paths))
    rows = sum(s.entries for s in segments)
    bits = max(0, (-(-rows // max(1, chunk_rows)) - 1).bit_length())
    built = spooled_base(key, list(paths), _merged_ranges(segments, bits, list(paths), level), rows=rows, budget=budget, level=level,
                         max_pos=max(_largest(s.store, [POS]) for s in segments),
                         max_version=max(_largest(s.store, [CREATED, UPDATED]) for s in segments))
    return built or make_segment(key, entry_schema(key).empty_table(), level=level, base=True)


def _merged_ranges(segments: Sequence[Segment], bits: int, paths: list[str], level: int) -> Iterator[EntryChunk]:
    """The merged entries of each of the ``2**bits`` hash ranges, in hash order (file ordinals into ``paths``)."""
    ordinal = {p: i for i, p in enumerate(paths)}
    where = [np.array([ordinal[p] for p in s.store.files] + [0], np.int64) for s in segments]
    starts = [0] * len(segments)
    for k in range(1 << bits):
        stops = [s.entries if k + 1 == 1 << bits else first_record(s.store, (k + 1) << (64 - bits)) for s in segments]
        parts = [Segment(_run(s.store, a, b, w, paths), s.key, s.level, s.base, s.hash)
                 for s, a, b, w in zip(segments, starts, stops, where, strict=True)]
        starts = stops
        if not any(p.entries for p in parts):
            continue
        merged = merge_segments(parts, base=True, level=level).store
        assert isinstance(merged, ArrayStore)
        yield EntryChunk(merged.keys if merged.keys is not None else Segment(merged, segments[0].key, level, True, segments[0].hash).keys(),
                         merged.file.astype(np.int32), merged.ints)


def _run(store: Store, first: int, stop: int, where: np.ndarray, paths: list[str]) -> ArrayStore:
    """Records ``first`` .. ``stop - 1`` of ``store``, decoded; file ordinals mapped by ``where`` into ``paths``."""
    records = np.arange(first, stop, dtype=np.int64)
    file, ints = store.fields(records)
    file = np.where(file >= 0, where[np.maximum(file, 0)], -1)
    return ArrayStore(store.hashes_at(records), file, paths, {c: ints[c].astype(np.int64, copy=False) for c in INT_ENTRIES},
                      store.stored_keys(records))


def sliced(segments: Sequence[Segment], step: Slice) -> list[Segment]:
    """``segments`` (oldest first) after ``step``: the piece of ``segments[:step.inputs]`` merged over hashes
    ``[step.lo, step.hi)`` (tombstones dropped, per key the newest record) inserted at ``step.at``; a piece that
    reaches the last hash retires the inputs, and the pieces before it are the base."""
    parts = [restricted(s, step.lo, step.hi) for s in segments[: step.inputs]]
    piece = replace(merge_segments(parts, base=True, level=0), hash_range=(step.lo, step.hi))
    out = [*segments[: step.at], piece, *segments[step.at :]]
    return out[step.inputs :] if step.hi == HASHES else out


def restricted(segment: Segment, lo: int, hi: int) -> Segment:
    """The records of ``segment`` whose hash is in ``[lo, hi)``, decoded into memory (the same level and flags)."""
    store = segment.store
    first = first_record(store, lo) if lo else 0
    stop = store.n if hi >= HASHES else first_record(store, hi)
    records = np.arange(first, stop, dtype=np.int64)
    file, ints = store.fields(records)
    kept = ArrayStore(store.hashes_at(records), file, list(store.files), ints, store.stored_keys(records))
    return Segment(kept, segment.key, segment.level, segment.base, segment.hash)


def first_record(store: Store, h: int) -> int:
    """The first record of ``store`` whose hash is at least ``h``."""
    if isinstance(store, PackedStore):
        p = store.layout.prefix_bits
        bucket = h >> (64 - p) if p else 0
        start, end = int(store.directory[bucket]), int(store.directory[bucket + 1])
        if start == end:
            return start
        return start + int(np.searchsorted(store.hashes_at(np.arange(start, end, dtype=np.int64)), np.uint64(h)))
    return int(np.searchsorted(store.hashes(), np.uint64(h)))


def _largest(store: Store, names: list[str]) -> int:
    """An upper bound of the values of integer columns ``names`` (from a packed segment's layout; wide otherwise)."""
    if not isinstance(store, PackedStore):
        return _WIDE
    out = 0
    for name in names:
        _, _, bits, base = store.layout.fields[name]
        out = max(out, base + (1 << bits) - 1)
    return out
