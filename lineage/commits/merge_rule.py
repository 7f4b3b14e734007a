"""When to merge small metadata files on commit: Iceberg's merge-append rule.

Every commit adds a manifest (two with deletes) and a lineage segment; left
alone, a snapshot names one more of each per commit and planning reads them
all. Iceberg's ``MergingSnapshotProducer`` bounds this by merging on commit,
and this module decides the same way for manifests (content by content,
partition spec by spec) and for lineage segments:

* the items are ordered newest first; the first one is the commit's new item
  (or the newest existing one when the commit adds none);
* they are packed into bins of at most ``target-size-bytes`` from the *oldest*
  end, one open bin at a time, so order is kept and the bin left under-filled
  is the newest one;
* a bin of one item is kept as it is; the bin holding the first item is merged
  only once it holds at least ``min-count-to-merge`` items; any other bin
  (full, made of older items) is merged.

The properties are Iceberg's for manifests (``commit.manifest-merge.enabled``,
``commit.manifest.min-count-to-merge``, ``commit.manifest.target-size-bytes``,
same defaults and meaning) and ``lineage.segment-merge.enabled``,
``lineage.segment.min-count-to-merge``, ``lineage.segment.target-size-bytes``
for lineage segments. This module only decides; the callers read and write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import lineage.properties as properties
from lineage.properties import read

T = TypeVar("T")

PROP_MANIFEST_MERGE_ENABLED = properties.MANIFEST_MERGE_ENABLED
PROP_MANIFEST_MIN_COUNT = properties.MANIFEST_MIN_COUNT
PROP_MANIFEST_TARGET_BYTES = properties.MANIFEST_TARGET_BYTES
PROP_SEGMENT_MERGE_ENABLED = properties.SEGMENT_MERGE_ENABLED
PROP_SEGMENT_MIN_COUNT = properties.SEGMENT_MIN_COUNT
PROP_SEGMENT_TARGET_BYTES = properties.SEGMENT_TARGET_BYTES


@dataclass(frozen=True)
class MergeSettings:
    """The three knobs of merge-on-commit."""

    enabled: bool = True
    min_count: int = properties.registry[PROP_MANIFEST_MIN_COUNT].default
    target_bytes: int = properties.registry[PROP_MANIFEST_TARGET_BYTES].default

    @staticmethod
    def for_manifests(properties: Mapping[str, str]) -> MergeSettings:
        """Settings from Iceberg's ``commit.manifest*`` table properties."""
        return _settings(properties, PROP_MANIFEST_MERGE_ENABLED, PROP_MANIFEST_MIN_COUNT, PROP_MANIFEST_TARGET_BYTES)

    @staticmethod
    def for_segments(properties: Mapping[str, str]) -> MergeSettings:
        """Settings from the ``lineage.segment*`` table properties."""
        return _settings(properties, PROP_SEGMENT_MERGE_ENABLED, PROP_SEGMENT_MIN_COUNT, PROP_SEGMENT_TARGET_BYTES)


def _settings(props: Mapping[str, str], enabled: str, min_count: str, target: str) -> MergeSettings:
    return MergeSettings(bool(read(props, enabled)), int(read(props, min_count)), int(read(props, target)))


def pack_from_end(items: Sequence[T], weight: Callable[[T], int], target: int) -> list[list[T]]:
    """Split ``items`` into consecutive bins of total weight at most ``target``, filled from the end.

    One bin is open at a time (Iceberg's look-back of 1), so the order of
    items is kept and only the first bin may be under-filled. An item heavier
    than ``target`` gets a bin of its own.
    """
    bins: list[list[T]] = []
    current: list[T] = []
    load = 0
    for item in reversed(items):
        w = max(0, int(weight(item)))
        if current and load + w > target:
            bins.append(current)
            current, load = [], 0
        current.append(item)
        load += w
    if current:
        bins.append(current)
    return [list(reversed(b)) for b in reversed(bins)]


def plan_merge(items: Sequence[T], weight: Callable[[T], int], settings: MergeSettings, first: T | None = None) -> list[tuple[list[T], bool]]:
    """Bins of ``items`` (newest first) and, for each, whether to merge it into one item.

    ``first`` is the commit's new item (default: ``items[0]``). With merging
    disabled every item is its own bin, kept.
    """
    if not items:
        return []
    if not settings.enabled:
        return [([item], False) for item in items]
    first = items[0] if first is None else first
    out = []
    for b in pack_from_end(items, weight, settings.target_bytes):
        if len(b) == 1:
            out.append((b, False))
        elif any(item is first for item in b) and len(b) < settings.min_count:
            out.append((b, False))
        else:
            out.append((b, True))
    return out


def plan_rewrite(items: Sequence[T], weight: Callable[[T], int], target: int) -> list[tuple[list[T], bool]]:
    """Bins for an explicit rewrite: every bin of two or more items is merged, whatever its count."""
    return [(b, len(b) > 1) for b in pack_from_end(items, weight, target)]
