"""One Iceberg commit carrying data files, position delete files and lineage.

pyiceberg 0.12 writes data manifests only. This producer also writes a delete
manifest (content ``deletes``) for added position delete files, takes the
snapshot timestamp from the caller (so the lineage commit log written before
the commit knows it), and never retries on its own: a lost race is reported
to the writer, which re-plans against the new snapshot and reassigns row ids.
A catalog call that fails otherwise is settled by :mod:`lineage.outcome`.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, ManifestWriterV2
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.table.update.snapshot import _new_manifest_list_file_name, _OverwriteFiles
from pyiceberg.manifest import write_manifest_list
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType

from index.deleted_rows import RemovedImages, write_index_segment
from index.key_index import KeyIndexChange, next_key_index
from lineage.metadata import (
    FORMAT_VERSION,
    SUMMARY_FORMAT_VERSION,
    SUMMARY_LIST,
    SUMMARY_NEXT_ROW_ID,
    SUMMARY_OPERATION,
    SUMMARY_VERSION,
    CommitEntry,
    FileLineage,
    LineageList,
    read_segment,
    write_list,
    write_segment,
)
from lineage.outcome import Attempt, has_commit, send
from lineage.rle import Runs, encode_sequence, encode_values, sequence_run, value_run
from lineage.state import TableState
from lineage.writer import WrittenFile


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest writer for delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def _without_bounds(entry: ManifestEntry) -> ManifestEntry:
    """A copy of ``entry`` whose data file has no lower/upper bounds (they may hold erased values)."""
    df = copy.copy(entry.data_file)
    df._data = list(df._data)  # DataFile exposes no setters; positions 10/11 are lower/upper bounds
    df._data[10], df._data[11] = {}, {}
    return ManifestEntry.from_args(
        status=entry.status,
        snapshot_id=entry.snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=df,
    )


class _Transaction(Transaction):
    """A transaction that hands out the base metadata while nothing is staged.

    pyiceberg's ``Transaction.table_metadata`` re-applies the staged updates to
    a deep copy of the whole table metadata on every access; the snapshot
    producer reads it a dozen times before it stages anything, so each commit
    paid a dozen copies of a document that grows with every snapshot.
    """

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:
            return self._table.metadata
        return super().table_metadata


class _LineageSnapshotProducer(_OverwriteFiles):
    """Adds data and delete files and removes data or delete files, in one snapshot."""

    strip_removed_stats = False

    def __init__(  # type: ignore[no-untyped-def]
        self, operation: Operation, transaction, io, properties: dict[str, str], timestamp_ms: int, snapshot_id: int, data_sequence_number: int | None
    ) -> None:
        super().__init__(operation, transaction, io, snapshot_properties=properties, branch=MAIN_BRANCH)
        self._timestamp_ms = timestamp_ms
        self._snapshot_id = snapshot_id
        self._data_sequence_number = data_sequence_number

    def _manifests(self) -> list[ManifestFile]:
        spec = self._transaction.table_metadata.spec()
        data = [f for f in self._added_data_files if f.content == DataFileContent.DATA]
        deletes = [f for f in self._added_data_files if f.content != DataFileContent.DATA]
        manifests: list[ManifestFile] = []
        if data:
            with self.new_manifest_writer(spec) as writer:
                for f in data:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=self._data_sequence_number,
                            data_file=f,
                        )
                    )
            manifests.append(writer.to_manifest_file())
        if deletes:
            with self._delete_writer(spec) as writer:
                for f in deletes:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=f))
            manifests.append(writer.to_manifest_file())
        return manifests + self._carried_manifests()

    def _delete_writer(self, spec):  # type: ignore[no-untyped-def]
        return _DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression)

    def _carried_manifests(self) -> list[ManifestFile]:
        """The parent's manifests; those holding a removed file are rewritten with it marked DELETED."""
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id else None
        if parent is None:
            return []
        removed = self._deleted_data_files
        out: list[ManifestFile] = []
        found: set[str] = set()
        for manifest in parent.manifests(io=self._io):
            live_count = (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)
            if manifest.added_files_count is not None and manifest.existing_files_count is not None and live_count == 0:
                continue  # only DELETED entries of an earlier commit: nothing to carry
            stale = self.strip_removed_stats and bool(manifest.deleted_files_count)
            if not removed and not stale:
                out.append(manifest)
                continue
            entries = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
            hit = [e for e in entries if e.data_file in removed]
            if not hit and not stale:
                out.append(manifest)
                continue
            spec = self.spec(manifest.partition_spec_id)
            writer = self._delete_writer(spec) if manifest.content == ManifestContent.DELETES else self.new_manifest_writer(spec)
            with writer:
                for e in entries:
                    if e.data_file in removed:
                        writer.delete(_without_bounds(e) if self.strip_removed_stats else e)
                        found.add(e.data_file.file_path)
                    else:
                        writer.existing(e)
            if entries:
                out.append(writer.to_manifest_file())
        missing = [f.file_path for f in removed if f.file_path not in found]
        if missing:
            raise CommitFailedException(f"files to remove are no longer in the snapshot: {missing[:3]}")
        return out

    def updates_and_requirements(self) -> tuple[tuple, tuple]:
        """Build the snapshot (like pyiceberg's ``_commit``, with our timestamp)."""
        metadata = self._transaction.table_metadata
        new_manifests = self._manifests()
        sequence_number = metadata.next_sequence_number()
        if self._operation == Operation.REPLACE:
            # pyiceberg only totals append/overwrite/delete summaries; totals are the same for a replace.
            self._operation = Operation.OVERWRITE
            totals = self._summary(self.snapshot_properties)
            self._operation = Operation.REPLACE
            summary = Summary(operation=Operation.REPLACE, **totals.additional_properties)
        else:
            summary = self._summary(self.snapshot_properties)
        location = self._transaction._table.location_provider().new_metadata_location(
            _new_manifest_list_file_name(snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid)
        )
        self._written_manifest_lists.append(location)
        with write_manifest_list(
            format_version=metadata.format_version,
            output_file=self._io.new_output(location),
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            sequence_number=sequence_number,
            avro_compression=self._compression,
        ) as writer:
            writer.add_manifests(new_manifests)
        snapshot = Snapshot(
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=location,
            sequence_number=sequence_number,
            timestamp_ms=self._timestamp_ms,
            summary=summary,
            schema_id=metadata.current_schema_id,
        )
        return (
            (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(
                    snapshot_id=self._snapshot_id,
                    parent_snapshot_id=self._parent_snapshot_id,
                    ref_name=MAIN_BRANCH,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (AssertRefSnapshotId(snapshot_id=self._parent_snapshot_id, ref=MAIN_BRANCH),),
        )

    def written_files(self) -> list[str]:
        """Manifests and manifest lists this producer wrote (to clean up after a lost race)."""
        return list(self._written_manifests) + list(self._written_manifest_lists)


def commit_files(
    iceberg: IcebergTable,
    *,
    operation: Operation,
    added: list[DataFile],
    removed: list[DataFile],
    properties: dict[str, str],
    timestamp_ms: int,
    snapshot_id: int,
    attempt: Attempt,
    data_sequence_number: int | None = None,
    strip_removed_stats: bool = False,
) -> None:
    """Commit snapshot ``snapshot_id`` on ``main``, based on ``iceberg``'s current metadata.

    Paths of the manifests and manifest lists written are added to
    ``attempt.files`` before the catalog is called. Raises
    ``CommitFailedException`` when the branch moved (the caller re-plans);
    when the catalog call fails otherwise, the outcome is established by
    :func:`lineage.outcome.send` (landed: returns; not in the table:
    ``CommitPending``; unknown: ``CommitStateUnknownError``).
    """
    tx = _Transaction(iceberg)
    producer = _LineageSnapshotProducer(operation, tx, iceberg.io, properties, timestamp_ms, snapshot_id, data_sequence_number)
    producer.strip_removed_stats = strip_removed_stats
    for f in added:
        producer.append_data_file(f)
    for f in removed:
        producer.delete_data_file(f)
    try:
        updates = producer.updates_and_requirements()
    finally:
        attempt.files.extend(producer.written_files())
    tx._apply(*updates)
    attempt.snapshot_id, attempt.parent_id, attempt.sent = snapshot_id, producer._parent_snapshot_id, True
    send(iceberg, tx.commit_transaction, lambda ice: has_commit(ice, snapshot_id), f"commit of snapshot {snapshot_id}")


@dataclass
class CommitRequest:
    """Everything one commit changes, as planned against one table state."""

    operation: str  # our name: append, delete, update, upsert, compact, rewrite-deletes, ...
    iceberg_operation: Operation
    written: list[WrittenFile] = field(default_factory=list)  # new data files (lineage known or assigned here)
    delete_files: list[DataFile] = field(default_factory=list)  # new position delete files
    removed_files: list[DataFile] = field(default_factory=list)  # data or delete files leaving the snapshot
    removed_images: list[RemovedImages] = field(default_factory=list)  # for this commit's index segment
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    data_sequence_number: int | None = None  # keep an older data sequence number for added data files (compaction)
    transform_list: Callable[[LineageList], LineageList] | None = None  # maintenance edits of the list (index re-pointing)
    properties: dict[str, str] = field(default_factory=dict)  # caller's checkpoint etc.: summary + commit log
    strip_removed_stats: bool = False  # purge: DELETED manifest entries carry no column bounds
    key_index: KeyIndexChange | None = None  # keyed tables: how the commit changes the key index (index.key_index)


@dataclass(frozen=True)
class CommitResult:
    """What :func:`commit_change` committed."""

    version: int
    snapshot_id: int
    timestamp_ms: int
    bytes_written: int


def _version_runs(values: Runs | np.ndarray | None, version: int, n: int) -> Runs:
    """Encoded versions of a new file's rows; None means every row gets the commit's version."""
    if values is None:
        return value_run(version, n)
    return values if isinstance(values, Runs) else encode_values(values)


def commit_change(iceberg: IcebergTable, state: TableState, req: CommitRequest, attempt: Attempt) -> CommitResult:
    """Write the lineage segment, index segment and lineage list, then commit the Iceberg snapshot.

    ``state`` must be the state ``iceberg``'s metadata describes (the base of
    the commit). Paths of every file written are added to ``attempt.files``
    and the result is stored in ``attempt.result`` before the catalog is
    called, so a :class:`~lineage.outcome.CommitLoop` can clean up an attempt
    known to be lost and report one that landed late. Raises
    CommitFailedException when another writer committed first; see
    :func:`commit_files` for a failing catalog call.
    """
    created = attempt.files
    version = iceberg.metadata.next_sequence_number()
    next_row_id = state.lineage.next_row_id
    lineages = []
    for w in req.written:
        n = w.data_file.record_count
        if w.row_ids is None:
            rids = sequence_run(next_row_id, n)
            next_row_id += n
        else:
            rids = w.row_ids if isinstance(w.row_ids, Runs) else encode_sequence(w.row_ids)
        lineages.append(FileLineage(w.data_file.file_path, n, rids, _version_runs(w.created, version, n), _version_runs(w.updated, version, n)))
    removed_images = [
        r if r.valid_to == version else RemovedImages(r.file_path, r.positions, r.row_ids, r.created, r.valid_from, version)
        for r in req.removed_images
    ]

    snapshot_id = iceberg.metadata.new_snapshot_id()
    last_ts = state.snapshot.timestamp_ms if state.snapshot else 0
    timestamp_ms = max(int(time.time() * 1000), last_ts + 1)
    meta_dir = f"{iceberg.metadata.location}/metadata"
    tag = f"{version:09d}-{uuid.uuid4()}"
    bytes_written = sum(w.data_file.file_size_in_bytes for w in req.written) + sum(f.file_size_in_bytes for f in req.delete_files)
    segment_path = index_path = None
    if lineages:
        segment_path = f"{meta_dir}/lineage/{tag}-segment.parquet"
        created.append(segment_path)
        bytes_written += write_segment(iceberg.io, segment_path, lineages)
    if removed_images:
        index_path = f"{meta_dir}/index/{tag}-deleted-rows.parquet"
        created.append(index_path)
        bytes_written += write_index_segment(iceberg.io, index_path, removed_images)
    removed_data = [f for f in req.removed_files if f.content == DataFileContent.DATA]
    key_index, key_bytes = next_key_index(
        state, req.key_index, lineages, req.delete_files, sum(len(r) for r in removed_images), len(removed_data), version, created
    )
    bytes_written += key_bytes
    segments = surviving_segments(state, removed_data)
    if segment_path:
        segments.append(segment_path)
    entry = CommitEntry(
        version=version,
        snapshot_id=snapshot_id,
        timestamp_ms=timestamp_ms,
        operation=req.operation,
        inserted=req.inserted,
        updated=req.updated,
        deleted=req.deleted,
        segment=segment_path,
        index=index_path,
        properties=dict(req.properties),
    )
    base_list = req.transform_list(state.lineage) if req.transform_list else state.lineage
    new_list = dataclasses.replace(base_list.with_commit(entry, tuple(segments), next_row_id), key_index=key_index)
    list_path = f"{meta_dir}/lineage/{tag}-list.json"
    created.append(list_path)
    bytes_written += write_list(iceberg.io, list_path, new_list)
    properties = {
        SUMMARY_LIST: list_path,
        SUMMARY_VERSION: str(version),
        SUMMARY_NEXT_ROW_ID: str(next_row_id),
        SUMMARY_OPERATION: req.operation,
        SUMMARY_FORMAT_VERSION: str(FORMAT_VERSION),
        **req.properties,
    }
    attempt.result = CommitResult(version, snapshot_id, timestamp_ms, bytes_written)
    commit_files(
        iceberg,
        operation=req.iceberg_operation,
        added=[w.data_file for w in req.written] + req.delete_files,
        removed=req.removed_files,
        properties=properties,
        timestamp_ms=timestamp_ms,
        snapshot_id=snapshot_id,
        attempt=attempt,
        data_sequence_number=req.data_sequence_number,
        strip_removed_stats=req.strip_removed_stats,
    )
    return attempt.result


def surviving_segments(state: TableState, removed_data_files: list[DataFile]) -> list[str]:
    """Segments of the base list that still describe at least one live data file."""
    segments = list(state.lineage.segments)
    if not removed_data_files:
        return segments
    live = state.all_data_file_paths() - {f.file_path for f in removed_data_files}
    return [s for s in segments if any(fl.file_path in live for fl in read_segment(state.iceberg.io, s))]
