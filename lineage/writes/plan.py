"""What a write plans (:class:`Plan`) and what it returns to the caller (:class:`CommitInfo`, public as ``lineage.CommitInfo``).

Every write method of :class:`lineage.Table` hands the write loop
(:func:`lineage.writes.loop.run_write`) a function that returns a ``Plan``
for the table state of each attempt; the loop writes and commits it and
returns a ``CommitInfo``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field

import pyarrow as pa

from pyiceberg.manifest import DataFile

from index.deleted_rows import WrittenIndex
from index.key_index import KeyIndexChange
from lineage.state import LiveFile
from lineage.storage.writer import WrittenFile


@dataclass(frozen=True)
class CommitInfo:
    """What one write did. ``committed`` is False for a write that matched nothing."""

    version: int
    snapshot_id: int | None
    timestamp: _dt.datetime
    operation: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    data_files_added: int = 0
    delete_files_added: int = 0
    data_files_removed: int = 0
    bytes_written: int = 0
    attempts: int = 1
    committed: bool = True
    properties: dict[str, str] = field(default_factory=dict)
    foreign: str | None = None  # another engine made this commit (its name, or "unknown"); see lineage.reconcile
    gap: bool = False  # the net change of snapshots another engine expired before we reconciled them (no feed across it)
    ignored: int = 0  # change-stream events with no effect (upsert mode: -U/-D of an absent key)


@dataclass
class Plan:
    """What a write does to the state it was planned against."""

    operation: str
    files: list[LiveFile] = field(default_factory=list)
    removed: pa.Table | None = None  # __file_id, __pos, _row_id, _row_created_at_version, _row_last_updated_at_version
    removed_values: pa.Table | None = None  # the removed images' data columns (row for row), for pre-image capture
    new_images: pa.Table | None = None  # data columns + HIDDEN_ROW_ID, HIDDEN_CREATED: updated images of existing rows
    inserts: pa.Table | None = None  # data columns: rows with fresh ids
    prewritten: list[WrittenFile] = field(default_factory=list)  # files an engine (Spark) already wrote
    prewritten_deletes: list[DataFile] = field(default_factory=list)  # position delete files an engine (Spark) already wrote
    prewritten_index: WrittenIndex | None = None  # the index segment of those deletes' images, already written
    prewritten_replaced: list[DataFile] = field(default_factory=list)  # v3: the vectors those new vectors replace
    reusable: bool = False  # prewritten files stay valid on a retry (appends): never cleaned up between attempts
    properties: dict[str, str] = field(default_factory=dict)  # extra snapshot summary / commit log properties
    key_index: KeyIndexChange | None = None  # keyed tables: the keys of removed images (and the index planned with)
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    ignored: int = 0  # see CommitInfo.ignored

    @property
    def is_empty(self) -> bool:
        return not self.prewritten and not self.prewritten_deletes and not any(t is not None and t.num_rows for t in (self.removed, self.new_images, self.inserts))


def ms_to_datetime(ms: int) -> _dt.datetime:
    """A commit timestamp (epoch milliseconds) as an aware UTC datetime."""
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)
