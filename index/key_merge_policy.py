"""When the key index's segments merge: the tiered policy and its table properties.

Deltas are level 0. When more than ``merge-fanout`` segments of the lowest
level sit at the tail, they merge into one segment of the next level (each
entry is rewritten O(log) times). When the segments after the base hold more
than ``base-fraction`` of the base's entries, or there are more than
``max-segments``, everything merges into a new base. Writers do merges of at
most ``writer-merge-limit`` records; maintenance does the rest. Pure
functions over :class:`SegmentInfo`, so the policy is tested without files.
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

    def allowed(start: int) -> bool:
        return mode != WRITER or sum(s.entries for s in segs[start:]) <= policy.writer_limit

    last = segs[-1]
    if not last.base:
        start = len(segs)
        while start > 0 and not segs[start - 1].base and segs[start - 1].level == last.level:
            start -= 1
        if len(segs) - start > policy.fanout and allowed(start):
            return start, 0 if start == 0 else last.level + 1
    if len(segs) > 1:  # the oldest segment stands for the base until a merge makes one
        rest = sum(s.entries for s in segs[1:])
        if rest > policy.base_fraction * segs[0].entries and allowed(0):
            return 0, 0
    if len(segs) > policy.max_segments:
        return 0, 0
    return None
