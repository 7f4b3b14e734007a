"""Exactly-once positions of change streams, committed atomically with the data.

A stream writer (e.g. a Spark Structured Streaming query) tags each commit
with its stream id and batch id (snapshot summary and commit log properties
``lineage.user.stream-id`` / ``lineage.user.stream-batch-id``). Before a batch
is planned, the table's commit log is read newest first for the stream's
last batch id; a batch at or below it was applied already and is skipped.
The check runs inside the write's plan step, against the very snapshot the
commit requires as its parent, so "not applied yet" and "now applied" are
decided atomically by the Iceberg commit.

This module is the one place that answers "did batch N of stream S land?",
also after an ambiguous catalog error.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.table import Table as IcebergTable

from lineage.errors import InvalidArgumentError
from lineage.metadata import SUMMARY_LIST, read_list
from lineage.outcome import newest_commit
from lineage.state import TableState

PROP_STREAM_ID = "lineage.user.stream-id"
PROP_STREAM_BATCH = "lineage.user.stream-batch-id"


@dataclass(frozen=True)
class StreamPosition:
    """A batch of a stream: ``(stream id, batch id)``; batch ids increase along the stream."""

    stream_id: str
    batch_id: int

    @staticmethod
    def parse(value: object) -> StreamPosition:
        """Accept a ``(stream_id, batch_id)`` pair (or a StreamPosition)."""
        if isinstance(value, StreamPosition):
            return value
        if isinstance(value, tuple) and len(value) == 2:
            sid, bid = value
            if isinstance(sid, str) and sid.strip() and isinstance(bid, int) and not isinstance(bid, bool) and bid >= 0:
                return StreamPosition(sid, bid)
        raise InvalidArgumentError(f"stream must be a (stream id, batch id) pair: a non-empty string and an integer >= 0, got {value!r}")

    def applied_in(self, state: TableState) -> bool:
        """Whether this batch (or a later one of the stream) is committed in ``state``."""
        last = last_committed_batch(state, self.stream_id)
        return last is not None and self.batch_id <= last.batch_id


@dataclass(frozen=True)
class CommittedBatch:
    """The last batch of a stream found in a table's commit log."""

    stream_id: str
    batch_id: int
    version: int


def position_properties(position: StreamPosition) -> dict[str, str]:
    """The commit properties that record ``position``."""
    return {PROP_STREAM_ID: position.stream_id, PROP_STREAM_BATCH: str(position.batch_id)}


def last_committed_batch(state: TableState, stream_id: str) -> CommittedBatch | None:
    """The stream's newest committed batch in ``state``'s commit log (None if it never committed).

    The log is searched newest first (:func:`lineage.outcome.newest_commit`)
    and stops at the stream's first hit, so a stream that commits often finds
    its position among the last few entries. It is the log of ``state``, not
    of the catalog's newest snapshot (:func:`lineage.outcome.find_commit`):
    a write's plan step must decide against the snapshot it commits on.
    """
    c = newest_commit(state.lineage.log.newest_first(), lambda props: props.get(PROP_STREAM_ID) == stream_id and PROP_STREAM_BATCH in props)
    return None if c is None else CommittedBatch(stream_id, int(c.properties[PROP_STREAM_BATCH]), c.version)


def last_stream_batch(iceberg: IcebergTable, stream_id: str) -> int | None:
    """The stream's newest committed batch id on ``main`` of ``iceberg`` as loaded (None if it never committed).

    Equality-strategy commits (and foreign ones) have no lineage list of their
    own, so the walk reads snapshot summaries, newest first, until it meets a
    snapshot with a lineage list, whose commit log answers for everything
    before (for a table only lineage writers write: at once).
    """
    snap = iceberg.metadata.current_snapshot()
    while snap is not None:
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get(PROP_STREAM_ID) == stream_id and PROP_STREAM_BATCH in props:
            return int(props[PROP_STREAM_BATCH])
        if SUMMARY_LIST in props:
            log_ = read_list(iceberg.io, props[SUMMARY_LIST]).log.newest_first()
            hit = newest_commit(log_, lambda p: p.get(PROP_STREAM_ID) == stream_id and PROP_STREAM_BATCH in p)
            return None if hit is None else int(hit.properties[PROP_STREAM_BATCH])
        snap = iceberg.metadata.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return None
