"""When the key index's segments merge: the tiered policy and its table properties.

Deltas are level 0. When more than ``merge-fanout`` segments of the lowest
level sit at the tail, they merge into one segment of the next level (each
entry is rewritten O(log) times). When the segments after the base hold more
than ``base-fraction`` of the base's entries, or there are more than
``max-segments``, everything merges into a new base. Writers do merges of at
most ``writer-merge-limit`` records; maintenance does the rest.

A merge into a new base that the segment count forces (``max-segments``) but
that is too large for one writer is *sliced* (:func:`writer_slice`), where it was
done whole in one commit: each writer commit merges every segment older than the slicing's first piece
over one range of the key hashes into a base *piece* (a segment that holds
every live key of its hash range), about :data:`SLICE_ENTRIES` records a
commit; the piece covering the last range retires the segments it merged, and
the pieces are the new base. Meanwhile deltas go on arriving after the pieces
and merging in tiers, so a lookup touches the base (one piece per key), at
most ``merge-fanout`` segments per tier and, while a slicing runs, the segments
it merges. Pure functions over :class:`SegmentInfo`, so the policy is tested
without files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lineage.properties import KEY_INDEX_BASE_FRACTION, KEY_INDEX_FANOUT, KEY_INDEX_MAX_SEGMENTS, KEY_INDEX_WRITER_LIMIT, read, registry

PROP_FANOUT = KEY_INDEX_FANOUT
PROP_BASE_FRACTION = KEY_INDEX_BASE_FRACTION
PROP_WRITER_LIMIT = KEY_INDEX_WRITER_LIMIT
PROP_MAX_SEGMENTS = KEY_INDEX_MAX_SEGMENTS

WRITER, MAINTENANCE, FULL = "writer", "maintenance", "full"
HASHES = 1 << 64  # the end of the last hash range
SLICE_ENTRIES = 1 << 18  # records a writer merges per commit into a piece of a sliced base merge (at most the writer limit)
MAX_PIECES = 1 << 10


@dataclass(frozen=True)
class MergePolicy:
    """When segments merge (table properties ``lineage.key-index.*``)."""

    fanout: int = registry[KEY_INDEX_FANOUT].default
    base_fraction: float = registry[KEY_INDEX_BASE_FRACTION].default
    writer_limit: int = registry[KEY_INDEX_WRITER_LIMIT].default
    max_segments: int = registry[KEY_INDEX_MAX_SEGMENTS].default

    @staticmethod
    def of(props: Mapping[str, str]) -> MergePolicy:
        """The policy a table's properties ask for (defaults where unset)."""
        return MergePolicy(
            fanout=read(props, KEY_INDEX_FANOUT),
            base_fraction=read(props, KEY_INDEX_BASE_FRACTION),
            writer_limit=read(props, KEY_INDEX_WRITER_LIMIT),
            max_segments=read(props, KEY_INDEX_MAX_SEGMENTS),
        )


@dataclass(frozen=True)
class SegmentInfo:
    """What the merge policy knows of a segment."""

    level: int
    base: bool
    entries: int
    hash_range: tuple[int, int] | None = None  # a base piece's hashes [lo, hi)


@dataclass(frozen=True)
class Slice:
    """The next piece of a sliced merge: segments ``[0, inputs)`` merged over hashes ``[lo, hi)`` into a base piece
    inserted at ``at``; the piece that reaches the last hash (``hi == HASHES``) retires the inputs."""

    inputs: int
    at: int
    lo: int
    hi: int


def base_end(segs: Sequence[SegmentInfo]) -> int:
    """How many leading segments make the base: the pieces of a finished slicing, else the oldest segment."""
    end, reach = 0, 0
    while end < len(segs) and segs[end].hash_range is not None and segs[end].hash_range[0] == reach and reach < HASHES:  # type: ignore[index]
        reach = segs[end].hash_range[1]  # type: ignore[index]
        end += 1
    return end if end and reach == HASHES else min(1, len(segs))


def open_slicing(segs: Sequence[SegmentInfo]) -> tuple[int, int] | None:
    """``(first, stop)`` of the pieces of a sliced merge in progress (after the base; they cover the hashes from 0 up to
    less than all of them), or None."""
    start = base_end(segs)
    while start < len(segs) and segs[start].hash_range is None:
        start += 1
    if start == len(segs) or segs[start].hash_range[0] != 0:  # type: ignore[index]
        return None
    stop, reach = start, 0
    while stop < len(segs) and segs[stop].hash_range is not None and segs[stop].hash_range[0] == reach:  # type: ignore[index]
        reach = segs[stop].hash_range[1]  # type: ignore[index]
        stop += 1
    return start, stop


def next_merge(segs: Sequence[SegmentInfo], policy: MergePolicy, mode: str) -> tuple[int, int] | None:
    """The next merge to do, as (first segment index, level of the result), or None.

    The merge always covers the segments from that index to the newest.
    ``mode`` is ``writer`` (merges bounded by ``writer_limit`` unless the
    segment count exceeds ``max_segments``), ``maintenance`` (unbounded) or
    ``full`` (everything into one base).
    """
    if not segs:
        return None
    if mode == FULL:
        return (0, 0) if len(segs) > 1 or not segs[0].base else None
    slicing = open_slicing(segs)
    floor = slicing[1] if slicing else 0  # a tier merge never reaches into a slicing (its pieces and inputs keep their places)

    def allowed(start: int) -> bool:
        return mode != WRITER or sum(s.entries for s in segs[start:]) <= policy.writer_limit

    last = segs[-1]
    if not last.base:
        start = len(segs)
        while start > floor and not segs[start - 1].base and segs[start - 1].level == last.level:
            start -= 1
        if len(segs) - start > policy.fanout and allowed(start):
            return start, 0 if start == 0 else last.level + 1
    if slicing is not None:  # writers go on slicing (writer_slice); maintenance merges everything
        return None if mode == WRITER else (0, 0)
    base = base_end(segs)
    if len(segs) > base:  # the oldest segment stands for the base until a merge makes one
        rest = sum(s.entries for s in segs[base:])
        if rest > policy.base_fraction * sum(s.entries for s in segs[:base]) and allowed(0):
            return 0, 0
    if len(segs) - base + 1 > policy.max_segments and (mode != WRITER or allowed(0) or _slice_entries(policy) == 0):
        return 0, 0
    return None


def _slice_entries(policy: MergePolicy) -> int:
    return min(SLICE_ENTRIES, policy.writer_limit)


def writer_slice(segs: Sequence[SegmentInfo], policy: MergePolicy) -> Slice | None:
    """The piece a writer merges in its commit, after :func:`next_merge` has nothing more: the next one of a slicing in
    progress, or the first of a new one when the index has more than ``max-segments`` segments (the base's pieces
    counting as one) and merging them whole is past the writer limit."""
    slicing = open_slicing(segs)
    if slicing is not None:
        start, stop = slicing
        first, last = segs[start].hash_range, segs[stop - 1].hash_range
        assert first is not None and last is not None
        return Slice(start, stop, last[1], min(HASHES, last[1] + first[1] - first[0]))
    base = base_end(segs)
    if len(segs) <= base or not _slice_entries(policy):
        return None
    if len(segs) - base + 1 <= policy.max_segments:  # a base merely due by base-fraction is left to maintenance
        return None
    base_entries, rest = sum(s.entries for s in segs[:base]), sum(s.entries for s in segs[base:])
    pieces = min(MAX_PIECES, 1 << max(0, -(-(base_entries + rest) // _slice_entries(policy)) - 1).bit_length())
    return Slice(len(segs), len(segs), 0, HASHES // pieces)
