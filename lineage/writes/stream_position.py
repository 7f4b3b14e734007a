"""Exactly-once positions of change streams, committed atomically with the data.

A stream writer (e.g. a Spark Structured Streaming query) tags each commit
with its stream id and batch id (snapshot summary and commit log properties
``lineage.user.stream-id`` / ``lineage.user.stream-batch-id``). Before a batch
is planned, the table's commit log is read newest first for the stream's
last batch id; a batch at or below it was applied already and is skipped.
The check runs inside the write's plan step, against the very snapshot the
commit requires as its parent, so "not applied yet" and "now applied" are
decided atomically by the Iceberg commit.

Positions outlive expiry: the commit log's floor keeps the newest entry of
every stream (:mod:`lineage.storage.commit_log`), reconciled snapshots keep their
summaries' positions in the log, and commits without a lineage list (the
equality strategy) carry a digest of every position above the newest list
(:class:`StreamDigest`). Where a position cannot be known any more (another
engine expired snapshots this library never recorded), the write raises
:class:`~lineage.errors.StreamPositionLostError` instead of guessing; an
operator who knows how far the stream got records it with
``Table.reset_stream_position`` (:func:`reset_stream_position`).

This module is the one place that answers "did batch N of stream S land?",
also after an ambiguous catalog error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID, SetPropertiesUpdate

import lineage.catalog as catalog

from lineage.storage.commit_log import PROP_STREAM_ID, CommitEntry
from lineage.errors import CommitConflictError, InvalidArgumentError, LineageError, StreamPositionLostError
from lineage.storage.metadata import SUMMARY_LIST, read_list
from lineage.reconcile.snapshot import reconciled_list_path
from lineage.properties import STREAM_BASE, STREAM_LOST, STREAM_POSITIONS, STREAM_RESET_PREFIX
from lineage.state import TableState

PROP_STREAM_BATCH = "lineage.user.stream-batch-id"
# Summary properties of commits without a lineage list (StreamDigest), and the operator's reset (a table property).
PROP_STREAM_POSITIONS = STREAM_POSITIONS
PROP_STREAM_BASE = STREAM_BASE
PROP_STREAM_LOST = STREAM_LOST
PROP_STREAM_RESET = STREAM_RESET_PREFIX  # + stream id = "<batch id>@<version>"


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

    The log is searched newest first and stops at the stream's first hit, so
    a stream that commits often finds its position among the last few
    entries. It is the log of ``state``, not of the catalog's newest
    snapshot: a write's plan step must decide against the snapshot it
    commits on. Raises StreamPositionLostError where a gap in the log may
    hide it.
    """
    return _find(state.lineage.log.newest_first(), stream_id, _reset(state.iceberg, stream_id), state.iceberg)


@dataclass(frozen=True)
class _Reset:
    """An operator's word: the stream had applied ``batch_id`` (-1: nothing) when the table was at ``version``."""

    batch_id: int
    version: int

    def committed(self, stream_id: str) -> CommittedBatch | None:
        """The reset as a committed batch (None: the stream applied nothing)."""
        return None if self.batch_id < 0 else CommittedBatch(stream_id, self.batch_id, self.version)


def reset_stream_position(iceberg: IcebergTable, stream_id: str, batch_id: int | None) -> None:
    """Commit the table property :data:`PROP_STREAM_RESET` for the stream at the table's current version.

    ``batch_id`` None records that the stream applied nothing yet.
    The commit asserts that ``main`` has not moved since ``iceberg`` was
    loaded, so the version recorded is the one the operator looked at;
    otherwise CommitConflictError asks to look again.
    """
    StreamPosition.parse((stream_id, 0 if batch_id is None else batch_id))
    snap = iceberg.metadata.current_snapshot()
    version = snap.sequence_number if snap is not None else 0
    updates = (SetPropertiesUpdate(updates={PROP_STREAM_RESET + stream_id: f"{-1 if batch_id is None else batch_id}@{version}"}),)
    requirements = (
        AssertTableUUID(uuid=iceberg.metadata.table_uuid),
        AssertRefSnapshotId(ref="main", snapshot_id=snap.snapshot_id if snap is not None else None),
    )
    try:
        catalog.commit_metadata(iceberg, updates, requirements)
    except CommitFailedException as exc:
        raise CommitConflictError(
            f"the table moved on while the position of stream {stream_id!r} was being recorded ({exc}); nothing was recorded: check "
            "the stream's batches in the new version and try again"
        ) from None


def _reset(iceberg: IcebergTable, stream_id: str) -> _Reset | None:
    raw = iceberg.metadata.properties.get(PROP_STREAM_RESET + stream_id)
    if raw is None:
        return None
    batch, _, version = raw.partition("@")
    try:
        return _Reset(max(-1, int(batch)), int(version))
    except ValueError:
        raise InvalidArgumentError(
            f"table property {PROP_STREAM_RESET + stream_id} is {raw!r}; it must be '<batch id>@<version>' (set it with "
            "Table.reset_stream_position)"
        ) from None


def _find(newest_first: Iterable[CommitEntry], stream_id: str, reset: _Reset | None, iceberg: IcebergTable) -> CommittedBatch | None:
    """The stream's position in a commit log read newest first, else the operator's reset, else None.

    A ``gap`` entry folds snapshots another engine expired before they were
    recorded: reaching it without a hit (and without a reset at or above it)
    means the position is unknown.
    """
    for c in newest_first:
        if reset is not None and c.version <= reset.version:
            break
        props = c.properties
        if props.get(PROP_STREAM_ID) == stream_id and PROP_STREAM_BATCH in props:
            return CommittedBatch(stream_id, int(props[PROP_STREAM_BATCH]), c.version)
        if c.gap:
            raise _lost(iceberg, stream_id, f"the commits before version {c.version} were expired by another engine before this library recorded them")
    return None if reset is None else reset.committed(stream_id)


def _lost(iceberg: IcebergTable, stream_id: str, why: str) -> StreamPositionLostError:
    name = ".".join(iceberg.name()[-2:])
    return StreamPositionLostError(
        f"the last committed batch of change stream {stream_id!r} on {name} cannot be established: {why}, and they may have held "
        "its position. Nothing was applied: the batch could otherwise be applied twice. Check which batches of the stream the "
        f"table holds, then record the last one with Table.reset_stream_position({stream_id!r}, <batch id>)"
    )


@dataclass(frozen=True)
class StreamDigest:
    """Every stream position recorded above the newest lineage list, and that list.

    A commit without a lineage list of its own (the equality strategy)
    stores the digest as it stands after its own batch in its summary, so the
    head snapshot alone answers for every stream, however many snapshots
    below it are expired since, by this library or another engine.
    ``positions`` maps a stream id to its batch id and the version that
    committed it; ``lost_below`` is set when a snapshot was expired before
    its positions were recorded: positions of older versions are unknown.
    """

    positions: dict[str, tuple[int, int]]
    base_list: str | None  # the newest lineage list below (None: the table has none)
    lost_below: int | None = None

    def last_batch(self, iceberg: IcebergTable, stream_id: str) -> int | None:
        """The stream's newest committed batch id (None if it never committed); StreamPositionLostError if unknown."""
        reset = _reset(iceberg, stream_id)
        hit = self.positions.get(stream_id)
        if hit is not None and (reset is None or hit[1] > reset.version):
            return hit[0]
        if reset is not None and (hit is not None or (self.lost_below is not None and reset.version >= self.lost_below - 1)):
            return None if reset.batch_id < 0 else reset.batch_id
        if self.lost_below is not None:
            raise _lost(iceberg, stream_id, f"snapshots older than version {self.lost_below} were expired before this library recorded "
                        "the stream positions they carried")
        if self.base_list is None:
            return None if reset is None or reset.batch_id < 0 else reset.batch_id
        try:
            log_ = read_list(iceberg.io, self.base_list).log
        except (OSError, LineageError) as exc:
            raise StreamPositionLostError(
                f"the position of change stream {stream_id!r} cannot be read: lineage list {self.base_list} is unreadable ({exc}); "
                "nothing was applied. Run verify on the table"
            ) from exc
        found = _find(log_.newest_first(), stream_id, reset, iceberg)
        return None if found is None else found.batch_id

    def after(self, position: StreamPosition | None, version: int) -> dict[str, str]:
        """The summary properties of a commit at ``version`` that adds ``position`` (if any) to this digest."""
        positions = dict(self.positions)
        if position is not None:
            positions[position.stream_id] = (position.batch_id, version)
        out = {PROP_STREAM_POSITIONS: json.dumps({k: list(v) for k, v in positions.items()}, sort_keys=True, separators=(",", ":"))}
        if self.base_list:
            out[PROP_STREAM_BASE] = self.base_list
        if self.lost_below is not None:
            out[PROP_STREAM_LOST] = str(self.lost_below)
        return out


def stream_digest(iceberg: IcebergTable) -> StreamDigest:
    """The stream positions of ``main`` of ``iceberg`` as loaded (see :class:`StreamDigest`).

    Walks snapshot summaries newest first until one answers for everything
    below it: a digest or a lineage list. Snapshots another engine committed
    carry neither and are stepped over; an expired parent ends the walk with
    ``lost_below`` set.
    """
    positions: dict[str, tuple[int, int]] = {}
    snap = iceberg.metadata.current_snapshot()
    while snap is not None:
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get(PROP_STREAM_ID) and PROP_STREAM_BATCH in props:
            positions.setdefault(props[PROP_STREAM_ID], (int(props[PROP_STREAM_BATCH]), snap.sequence_number))
        if PROP_STREAM_POSITIONS in props:
            for sid, (bid, version) in json.loads(props[PROP_STREAM_POSITIONS]).items():
                positions.setdefault(str(sid), (int(bid), int(version)))
            lost = props.get(PROP_STREAM_LOST)
            return StreamDigest(positions, props.get(PROP_STREAM_BASE), int(lost) if lost is not None else None)
        if SUMMARY_LIST in props:
            return StreamDigest(positions, props[SUMMARY_LIST])
        reconciled = _reconciled_list(iceberg, snap)
        if reconciled is not None:  # another engine's snapshot (or ours without a list) that a writer of ours reconciled
            return StreamDigest(positions, reconciled)
        parent = snap.parent_snapshot_id
        if parent is None and snap.sequence_number <= 1:
            break  # the table's first snapshot
        below = iceberg.metadata.snapshot_by_id(parent) if parent is not None else None
        if below is None:  # expired (pyiceberg also clears the id)
            return StreamDigest(positions, None, snap.sequence_number)
        snap = below
    return StreamDigest(positions, None)


def _reconciled_list(iceberg: IcebergTable, snapshot: Snapshot) -> str | None:
    """The path of ``snapshot``'s persisted reconciled lineage list, if a writer of ours made it."""
    path = reconciled_list_path(iceberg, snapshot.snapshot_id)
    try:
        return path if read_list(iceberg.io, path).version == snapshot.sequence_number else None
    except (OSError, LineageError):
        return None


def last_stream_batch(iceberg: IcebergTable, stream_id: str) -> int | None:
    """The stream's newest committed batch id on ``main`` of ``iceberg`` as loaded (None if it never committed).

    For writers that commit without a lineage list (the equality strategy)
    and the Spark sink's early check; see :func:`stream_digest`.
    """
    return stream_digest(iceberg).last_batch(iceberg, stream_id)
