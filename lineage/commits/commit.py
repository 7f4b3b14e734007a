"""One Iceberg commit carrying data files, position delete files and lineage.

pyiceberg 0.12 writes data manifests only. This producer also writes a delete
manifest (content ``deletes``) for added position delete files, takes the
snapshot timestamp from the caller (so the lineage commit log written before
the commit knows it), and never retries on its own: a lost race is reported
to the writer, which re-plans against the new snapshot and reassigns row ids.
A catalog call that fails otherwise is settled by :mod:`lineage.outcome`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import AssertTableUUID

from index.deleted_rows import RemovedImages, WrittenIndex, write_index_segment
from index.key_index import KeyIndexChange, next_key_index
from lineage.storage.metadata import (
    LIST_FORMAT_VERSION,
    SUMMARY_FORMAT_VERSION,
    SUMMARY_LIST,
    SUMMARY_NEXT_ROW_ID,
    SUMMARY_OPERATION,
    SUMMARY_VERSION,
    CommitEntry,
    FileLineage,
    LineageList,
    fits_in_list,
    index_dir,
    inline_segment,
    inline_segment_path,
    lineage_dir,
    read_list,
    remember_list,
    write_list,
    write_segment,
)
from lineage.memory import release_within
from lineage.outcome import Attempt, has_commit, send
import lineage.catalog as catalog
from lineage.storage.rle import Runs, encode_sequence, encode_values, sequence_run, value_run
from lineage.commits.segment_list import next_segments
from lineage.state import SnapshotFiles, TableState, own_list_path, writable_state
from lineage.storage.writer import FRESH, WrittenFile
import lineage.storage.puts as puts
import lineage.storage.removals as removals
import lineage.storage.manifests_v3 as v3
import lineage.commits.v3_commit as v3_commit


from lineage.commits.producer import BaseMetadata, LineageSnapshotProducer


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
    rewrite_manifests: bool = False,
    delete_sequence_numbers: dict[str, int] | None = None,
    metadata_updates: tuple = (),
    metadata_requirements: tuple = (),
    first_row_ids: dict[str, int] | None = None,
) -> None:
    """Commit snapshot ``snapshot_id`` on ``main``, based on ``iceberg``'s current metadata.

    Paths of the manifests and manifest lists written are added to
    ``attempt.files`` before the catalog is called. Raises
    ``CommitFailedException`` when the branch moved (the caller re-plans);
    when the catalog call fails otherwise, the outcome is established by
    :func:`lineage.outcome.send` (landed: returns; not in the table:
    ``CommitPending``; unknown: ``CommitStateUnknownError``).
    ``delete_sequence_numbers`` gives added delete files (by path) an
    explicit data sequence number (the others inherit the snapshot's).
    ``metadata_updates`` (schema, properties: e.g. a pyiceberg transaction's
    staged updates, checked by ``metadata_requirements``) land in the same
    catalog commit, before the snapshot.
    """
    base = BaseMetadata(iceberg)
    producer = LineageSnapshotProducer(operation, base, iceberg.io, properties, timestamp_ms, snapshot_id, data_sequence_number)
    producer.strip_removed_stats = strip_removed_stats
    producer.rewrite_all = rewrite_manifests
    producer.delete_sequence_numbers = dict(delete_sequence_numbers or {})
    producer.first_row_ids = dict(first_row_ids) if first_row_ids is not None else None
    for f in added:
        producer.append_data_file(f)
    for f in removed:
        if v3_commit.names_one_vector(f):
            producer.removed_vectors.add((f.file_path, v3.referenced_data_file(f)))  # type: ignore[arg-type]
            continue
        producer.delete_data_file(f)
    prepared = None
    try:
        # manifests, the manifest list and the metadata file in flight at once (and with the caller's files)
        with puts.parallel_puts():
            updates, requirements = producer.updates_and_requirements()
            updates = tuple(metadata_updates) + tuple(updates)
            requirements = tuple(metadata_requirements) + requirements + (AssertTableUUID(uuid=base.table_metadata.table_uuid),)
            prepared = catalog.prepare_metadata(iceberg, updates, requirements)
            if prepared is not None:
                attempt.files.append(prepared.location)
                catalog.write_metadata(iceberg, prepared)
            removals.send_with_room(0 if prepared is not None else 1)  # with the last PUTs (another catalog: one more)
    finally:
        attempt.files.extend(producer.written_files())
    attempt.snapshot_id, attempt.parent_id, attempt.sent = snapshot_id, producer._parent_snapshot_id, True
    with puts.suspended():  # every file above has landed; a catalog of another kind writes its metadata file now
        send(
            iceberg,
            (lambda: catalog.swap_metadata(iceberg, prepared)) if prepared is not None
            else (lambda: catalog.commit_metadata(iceberg, updates, requirements)),
            lambda ice: has_commit(ice, snapshot_id),
            f"commit of snapshot {snapshot_id}",
        )


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
    delete_sequence_numbers: dict[str, int] | None = None  # explicit data sequence numbers of added delete files (CONVERT)
    transform_list: Callable[[LineageList], LineageList] | None = None  # maintenance edits of the list (index re-pointing)
    properties: dict[str, str] = field(default_factory=dict)  # caller's checkpoint etc.: summary + commit log
    strip_removed_stats: bool = False  # purge: DELETED manifest entries carry no column bounds
    key_index: KeyIndexChange | None = None  # keyed tables: how the commit changes the key index (index.key_index)
    rewrite_manifests: bool = False  # merge every bin of the snapshot's manifests (Table.rewrite_manifests)
    metadata_updates: tuple = ()  # table metadata changes committed with the snapshot (adoption: key, properties)
    metadata_requirements: tuple = ()
    foreign: str | None = None  # reconciliation of another engine's snapshot: its name (lineage.reconcile)
    next_row_id: int | None = None  # at least this high-water mark after the commit (reconciliation assigns ids itself)
    gap: bool = False  # reconciliation across expired foreign snapshots (lineage.reconcile.gap)
    written_index: WrittenIndex | None = None  # the index segment, written already (Spark executors; no removed_images then)
    first_row_ids: dict[str, int] | None = None  # upgrade to v3: explicit first_row_id of data files kept (lineage.maintenance.upgrade)


@dataclass(frozen=True)
class CommitResult:
    """What :func:`commit_change` committed."""

    version: int
    snapshot_id: int
    timestamp_ms: int
    bytes_written: int
    files: SnapshotFiles | None = None  # the new snapshot's live files, when derivable from the base's (see lineage.state)


def _version_runs(values: Runs | np.ndarray | None, version: int, n: int) -> Runs:
    """Encoded versions of a new file's rows; None means every row gets the commit's version."""
    if values is None:
        return value_run(version, n)
    if isinstance(values, Runs):
        return values
    values = np.asarray(values, np.int64)
    return encode_values(np.where(values == FRESH, version, values) if (values == FRESH).any() else values)


@dataclass(frozen=True)
class BuiltLineage:
    """The lineage files of one commit, written before the Iceberg commit (see :func:`build_lineage`)."""

    lineage_list: LineageList
    list_path: str
    lineages: list[FileLineage]
    segment_path: str | None
    moved: dict[str, str]
    next_row_id: int
    bytes_written: int


def build_lineage(
    iceberg: IcebergTable, state: TableState, req: CommitRequest, *, version: int, snapshot_id: int, timestamp_ms: int, tag: str,
    created: list[str], inline: bool = False,
) -> BuiltLineage:
    """Write the lineage segment, index segment, key-index change and lineage list of a commit at ``version``.

    Every file is named from ``tag``; paths are appended to ``created``.
    Used by :func:`commit_change` (a fresh tag per attempt) and by the
    reconciliation of foreign snapshots (a tag derived from the snapshot id,
    so reconciling the same snapshot twice writes the same files). With
    ``inline``, a small segment is written inside the list (list format 4,
    :mod:`lineage.storage.metadata`): one object fewer.
    """
    next_row_id = state.lineage.next_row_id
    # On v3 every added data file inherits a first_row_id from the snapshot's first-row-id, in the order added, whether
    # its rows are new or keep their ids (lineage.storage.manifests_v3): number them the same way.
    native = iceberg.metadata.format_version >= 3
    next_row_id = v3_commit.first_row_id(iceberg.metadata, snapshot_id) if native else next_row_id
    # Our own commit's files (a reconciled snapshot's are numbered by its writer): a file whose rows keep their ids
    # holds them in its _row_id column, so its segment need not (format 2, lineage.storage.metadata).
    ours = native and v3_commit.snapshot_of(iceberg.metadata, snapshot_id) is None
    lineages = []
    for w in req.written:
        n = w.data_file.record_count
        first = next_row_id
        if w.row_ids is None:
            rids = sequence_run(next_row_id, n)
            next_row_id += n
        elif isinstance(w.row_ids, Runs):
            rids = w.row_ids
        else:
            ids = np.asarray(w.row_ids, np.int64)
            fresh = ids == FRESH  # rows inserted with updated images in one file: fresh ids assigned at commit
            if fresh.any():
                ids = ids.copy()
                if native:  # written with a null _row_id: they read the file's first_row_id plus their position
                    ids[fresh] = next_row_id + np.flatnonzero(fresh)
                else:  # in file order
                    ids[fresh] = np.arange(next_row_id, next_row_id + int(fresh.sum()), dtype=np.int64)
                    next_row_id += int(fresh.sum())
            rids = encode_sequence(ids)
        if native and w.row_ids is not None:  # the file inherits a first_row_id all the same: it uses up n ids
            next_row_id += n
        in_file = first if ours and isinstance(w.row_ids, np.ndarray) and len(rids) > 1 else None
        lineages.append(FileLineage(w.data_file.file_path, n, rids, _version_runs(w.created, version, n), _version_runs(w.updated, version, n), in_file))
    if req.next_row_id is not None:
        next_row_id = max(next_row_id, req.next_row_id)
    if native and (snap := v3_commit.snapshot_of(iceberg.metadata, snapshot_id)) is not None and snap.added_rows is not None:
        # A reconciled snapshot (ours are not in the metadata yet) sets the table's next-row-id itself; a gap's
        # files were added by expired snapshots and numbered by their own, so counting them here would over-count.
        next_row_id = int(snap.first_row_id or 0) + int(snap.added_rows)
    removed_images = [
        r if r.valid_to == version else RemovedImages(r.file_path, r.positions, r.row_ids, r.created, r.valid_from, version)
        for r in req.removed_images
    ]
    lin_dir, idx_dir = lineage_dir(iceberg.metadata.location), index_dir(iceberg.metadata.location)
    bytes_written = sum(w.data_file.file_size_in_bytes for w in req.written) + sum(f.file_size_in_bytes for f in req.delete_files)
    list_path = f"{lin_dir}/{tag}-list.json"
    segment_path = index_path = None
    segment_size = 0
    in_list = None  # the segment's rows when the list holds them
    if lineages and inline and fits_in_list(lineages):
        segment_path = inline_segment_path(list_path)
        in_list, segment_size = inline_segment(segment_path, lineages)  # its bytes count with the list's
    elif lineages:
        segment_path = f"{lin_dir}/{tag}-segment.parquet"
        created.append(segment_path)
        segment_size = write_segment(iceberg.io, segment_path, lineages)
        bytes_written += segment_size
    n_removed = sum(len(r) for r in removed_images)
    if removed_images:
        index_path = f"{idx_dir}/{tag}-deleted-rows.parquet"
        created.append(index_path)
        bytes_written += write_index_segment(iceberg.io, index_path, removed_images)
    elif req.written_index is not None:
        if req.written_index.valid_to != version:
            raise CommitFailedException(f"the index segment was written for version {req.written_index.valid_to}, the commit is {version}")
        index_path, n_removed = req.written_index.path, req.written_index.images
        bytes_written += req.written_index.size
    removed_data = [f for f in req.removed_files if f.content == DataFileContent.DATA]
    release_within()  # what encoding and writing the segments freed goes back before the key index builds its delta
    key_index, key_bytes = next_key_index(
        state, req.key_index, lineages, req.delete_files, n_removed, len(removed_data), version, created, tag=tag
    )
    bytes_written += key_bytes
    nxt = next_segments(state, removed_data, segment_path, segment_size, lineages, lambda i: f"{lin_dir}/{tag}-{i}-merged-segment.parquet", created)
    bytes_written += nxt.bytes_written
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
        foreign=req.foreign,
        gap=req.gap,
    )
    base_list = req.transform_list(state.lineage) if req.transform_list else state.lineage
    new_list = dataclasses.replace(base_list.with_commit(entry, nxt.segments, next_row_id, nxt.sizes), key_index=key_index,
                                   inline_segment=in_list)
    # the parent's list, already written, becomes the log's head chunk when its tail is full (no chunk file written)
    parent_path = own_list_path(state.snapshot) if state.snapshot is not None and req.transform_list is None else None
    parent = (parent_path, read_list(iceberg.io, parent_path).log) if parent_path is not None else None
    new_list, log_bytes = new_list.sealed_log(iceberg.io, lambda i: f"{lin_dir}/{tag}-{i}-log.json", created, parent)
    created.append(list_path)
    bytes_written += log_bytes + write_list(iceberg.io, list_path, new_list)
    remember_list(list_path, new_list)
    return BuiltLineage(new_list, list_path, lineages, segment_path, nxt.moved, next_row_id, bytes_written)


def commit_change(iceberg: IcebergTable, state: TableState, req: CommitRequest, attempt: Attempt) -> CommitResult:
    """Write the lineage segment, index segment and lineage list, then commit the Iceberg snapshot.

    ``state`` must be the state ``iceberg``'s metadata describes (the base of
    the commit). Paths of every file written are added to ``attempt.files``
    and the result is stored in ``attempt.result`` before the catalog is
    called, so a :class:`~lineage.outcome.CommitLoop` can clean up an attempt
    known to be lost and report one that landed late. Raises
    CommitFailedException when another writer committed first; see
    :func:`commit_files` for a failing catalog call. A foreign base's lineage
    is persisted first (:func:`lineage.state.writable_state`; writers call it
    before planning already), so the list committed names no scratch file.
    """
    with puts.parallel_puts():  # lineage files, manifests, manifest list (and the caller's files) in flight at once
        return _commit_change(iceberg, state, req, attempt)


def _commit_change(iceberg: IcebergTable, state: TableState, req: CommitRequest, attempt: Attempt) -> CommitResult:
    state = writable_state(state)
    version = iceberg.metadata.next_sequence_number()
    snapshot_id = iceberg.metadata.new_snapshot_id()
    last_ts = state.snapshot.timestamp_ms if state.snapshot else 0
    timestamp_ms = max(int(time.time() * 1000), last_ts + 1)
    tag = f"{version:09d}-{uuid.uuid4()}"
    built = build_lineage(iceberg, state, req, version=version, snapshot_id=snapshot_id, timestamp_ms=timestamp_ms, tag=tag,
                          created=attempt.files, inline=True)
    properties = {
        SUMMARY_LIST: built.list_path,
        SUMMARY_VERSION: str(version),
        SUMMARY_NEXT_ROW_ID: str(built.next_row_id),
        SUMMARY_OPERATION: req.operation,
        SUMMARY_FORMAT_VERSION: str(LIST_FORMAT_VERSION),
        **req.properties,
    }
    files = _next_files(state, snapshot_id, req, built.lineages, built.segment_path, built.moved)
    attempt.result = CommitResult(version, snapshot_id, timestamp_ms, built.bytes_written, files)
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
        delete_sequence_numbers=req.delete_sequence_numbers,
        strip_removed_stats=req.strip_removed_stats,
        rewrite_manifests=req.rewrite_manifests,
        metadata_updates=req.metadata_updates,
        metadata_requirements=req.metadata_requirements,
        first_row_ids=req.first_row_ids,
    )
    return attempt.result


def _next_files(
    state: TableState, snapshot_id: int, req: CommitRequest, lineages: list[FileLineage], segment: str | None, moved: dict[str, str]
) -> SnapshotFiles | None:
    """The committed snapshot's live files, derived from the base's when it has them (None: plan afresh)."""
    known = state.files_if_known()
    if known is None:
        return None
    known, removed = v3_commit.without_vectors(known, req.removed_files)
    by_path = {fl.file_path: fl for fl in lineages}
    default_spec = state.iceberg.metadata.default_spec_id
    for f in [w.data_file for w in req.written] + req.delete_files:
        if getattr(f, "_spec_id", None) is None:
            f.spec_id = default_spec  # fresh from the writer; a manifest read sets it, later commits need it
    added = [(w.data_file, by_path[w.data_file.file_path]) for w in req.written]
    return known.advance(snapshot_id, added, segment, req.delete_files, removed, moved)

