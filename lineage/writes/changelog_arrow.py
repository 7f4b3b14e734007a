"""The position strategy's collapse of a change-stream batch in Arrow and numpy, for the common batch.

:mod:`lineage.writes.changelog_sql` defines how a batch collapses into per-key
net effects, as two window queries. Planning them in DuckDB costs a few
milliseconds per query, a large share of a commit of a few thousand events.
For a batch with one integer key column, events in batch order (no
``order_by``) and flat data columns, this module computes the same results
with one stable sort of the key column:

* events are grouped by key, in batch order inside a key; the state before
  an event is the previous event's (a positive one makes the key live) or,
  for a key's first event, whether the key had a live image;
* problems are counted by the same rules; a batch with any strict-mode
  problem is left to the SQL path, which raises with examples
  (:func:`collapse` returns None), so the error text has one definition;
* ``-U`` images are compared with the live image (a key's first event) or
  the previous event's image, with SQL's ``IS NOT DISTINCT FROM``
  (nulls equal, and NaN equals NaN as in DuckDB);
* the net effect of a key is its last event against its start image.

The caller checks :func:`applies` first; anything else (several key columns,
``order_by``, nested columns) is planned in SQL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lineage.columns import CREATED_AT, HIDDEN_CREATED, HIDDEN_ROW_ID, REMOVED_COLUMNS, ROW_ID
from lineage.writes.changelog_batch import SEQ, ChangelogBatch
from lineage.writes.changelog_sql import DELETE, INSERT, NEGATIVE, POSITIVE, UPDATE, UPDATE_AFTER, UPDATE_BEFORE


def applies(batch: ChangelogBatch) -> bool:
    """Whether :func:`collapse` plans this batch: events, one integer key column without nulls, batch order, flat columns."""
    if len(batch.key) != 1 or batch.explicit_order or batch.order != (SEQ,) or batch.events.num_rows == 0:
        return False
    key = batch.events.column(batch.key[0])
    if not pa.types.is_integer(key.type) or key.null_count:
        return False
    return not any(pa.types.is_nested(batch.events.schema.field(c).type) for c in batch.columns)


@dataclass(frozen=True)
class EventGroups:
    """A batch's events grouped by key: ``order`` sorts events by key, then batch position."""

    order: np.ndarray  # event rows, grouped by key
    first: np.ndarray  # per sorted event: the first of its key
    group: np.ndarray  # per sorted event: its key's group number
    keys: np.ndarray  # per group: the key value (ascending)
    last_rows: np.ndarray  # per group: the event row of the key's last event

    @classmethod
    def of(cls, batch: ChangelogBatch) -> EventGroups:
        """Group ``batch``'s events by its one key column."""
        k = batch.events.column(batch.key[0]).to_numpy()
        order = np.argsort(k, kind="stable")  # stable: batch order inside a key
        ks = k[order]
        change = ks[1:] != ks[:-1]
        first = np.concatenate(([True], change))
        last = np.concatenate((change, [True]))
        return cls(order, first, np.cumsum(first) - 1, ks[first], order[last])

    def keys_table(self, batch: ChangelogBatch) -> pa.Table:
        """The batch's distinct keys, as the key lookup takes them."""
        name = batch.key[0]
        return pa.table({name: pa.array(self.keys, batch.events.schema.field(name).type)})

    def start_rows(self, start: pa.Table, key: str) -> np.ndarray:
        """Per group, the row of ``start`` holding the key's live image, or -1 (none)."""
        if start.num_rows == 0:
            return np.full(len(self.keys), -1, np.int64)
        sk = start.column(key).to_numpy()
        by = np.argsort(sk, kind="stable")
        at = np.minimum(np.searchsorted(sk[by], self.keys), len(sk) - 1)
        return np.where(sk[by[at]] == self.keys, by[at], -1)


@dataclass(frozen=True)
class NetEffects:
    """What a batch does to its keys: removed images, new images of updated keys, inserted rows, ignored events."""

    removed: pa.Table  # REMOVED_COLUMNS and the key column: keys live before the batch
    images: pa.Table  # data columns, HIDDEN_ROW_ID, HIDDEN_CREATED: keys live before and after
    inserts: pa.Table  # data columns: keys live only after
    ignored: int


def collapse(batch: ChangelogBatch, groups: EventGroups, start: pa.Table, upsert: bool, check_images: bool) -> NetEffects | None:
    """The net effects of ``batch`` (grouped as ``groups``) against the live images ``start`` (one row per live key,
    as the key lookup returns them), or None when a strict-mode rule is broken (the SQL path reports it)."""
    rows = groups.start_rows(start, batch.key[0])
    ops = batch.events.column("__op").to_numpy()[groups.order]
    prev = np.concatenate(([-1], ops[:-1]))
    prev_live = np.where(groups.first, rows[groups.group] >= 0, np.isin(prev, POSITIVE))
    if upsert:
        ignored = int(np.count_nonzero(np.isin(ops, NEGATIVE) & ~prev_live))
    else:
        ignored = 0
        if np.any(np.isin(ops, (INSERT, UPDATE_AFTER)) & prev_live) or np.any(np.isin(ops, (UPDATE_BEFORE, DELETE, UPDATE)) & ~prev_live):
            return None
        if check_images and not _images_match(batch, start, groups, rows, ops == UPDATE_BEFORE):
            return None
    last_ops = batch.events.column("__op").to_numpy()[groups.last_rows]
    start_live = rows >= 0
    end_live = np.isin(last_ops, POSITIVE)
    data = batch.events.select(list(batch.columns))
    both = start_live & end_live
    lineage = start.take(pa.array(rows[both], pa.int64()))
    images = data.take(pa.array(groups.last_rows[both], pa.int64()))
    images = images.append_column(HIDDEN_ROW_ID, lineage.column(ROW_ID)).append_column(HIDDEN_CREATED, lineage.column(CREATED_AT))
    removed = start.take(pa.array(rows[start_live], pa.int64())).select([*REMOVED_COLUMNS, batch.key[0]])
    inserts = data.take(pa.array(groups.last_rows[~start_live & end_live], pa.int64()))
    return NetEffects(removed, images, inserts, ignored)


def _images_match(batch: ChangelogBatch, start: pa.Table, groups: EventGroups, rows: np.ndarray, retracts: np.ndarray) -> bool:
    """Whether every ``-U`` image equals the key's image before it (the live row, or the previous event's image)."""
    at = np.flatnonzero(retracts)  # sorted positions; every one has a live state before it (checked first)
    if len(at) == 0:
        return True
    first = groups.first[at]
    events = batch.events.select(list(batch.columns))
    mine = events.take(pa.array(groups.order[at], pa.int64()))
    before_event = events.take(pa.array(groups.order[at[~first] - 1], pa.int64()))
    before_live = start.select(list(batch.columns)).take(pa.array(rows[groups.group[at[first]]], pa.int64()))
    # ``mine`` in the order: first events, then later ones, as the two references are stacked
    reorder = np.concatenate((np.flatnonzero(first), np.flatnonzero(~first)))
    mine = mine.take(pa.array(reorder, pa.int64()))
    reference = pa.concat_tables([before_live.cast(events.schema), before_event])
    return all(_not_distinct(mine.column(c), reference.column(c)) for c in batch.columns)


def _not_distinct(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Whether ``a`` and ``b`` agree row by row as SQL's ``IS NOT DISTINCT FROM`` (and DuckDB's NaN = NaN)."""
    same = pc.fill_null(pc.equal(a, b), False)
    same = pc.or_(same, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return bool(pc.all(same).as_py())
