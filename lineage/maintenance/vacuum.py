"""Snapshot expiry and vacuum that never lose change-feed history inside the retention window.

``vacuum`` keeps every file that is referenced by a retained snapshot (its
metadata, manifests, data and delete files, lineage list and segments, key
index segments), by
the deleted-rows index inside the retention window (index segments and every
data or archive file they point into: *pinned* files; a segment that captured
its images' values pins none), or that is younger
than ``older_than`` (it may belong to a commit in flight). Everything else
under the table's location is removed.
"""

from __future__ import annotations

import datetime as _dt
import time

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertTableUUID, RemoveSnapshotsUpdate

from index.deleted_rows import read_index
import lineage.catalog as catalog
from lineage.context import HasContext, TableContext, context_of
from lineage.errors import CommitConflictError, InvalidArgumentError, LineageError
from lineage.storage.fileio import local_path
import lineage.storage.files as store
from lineage.maintenance._common import MaintenanceResult, log
from lineage.storage.metadata import SUMMARY_LIST, read_list, segment_object
from lineage.outcome import backoff, commit_metadata
from lineage.reconcile import foreign_list, reconcile_table, reconciled_list_path
from lineage.retention import window
from lineage.state import TableState, main_branch_snapshots, state_at

DEFAULT_ORPHAN_AGE = _dt.timedelta(hours=1)


def expire_snapshots(
    table: TableContext | HasContext, older_than: _dt.datetime | _dt.timedelta | None = None, retain_last: int = 1, dry_run: bool = False
) -> MaintenanceResult:
    """Expire main-branch snapshots beyond the last ``retain_last`` (and older than ``older_than``).

    The change feed does not need old snapshots (it reads the deleted-rows
    index); ``scan(as_of=v)`` does, so expired versions can no longer be
    time-travelled to. Run :func:`vacuum` afterwards to delete the files.
    ``dry_run`` only counts them.
    """
    table = context_of(table)
    if not isinstance(retain_last, int) or isinstance(retain_last, bool) or retain_last < 1:
        raise InvalidArgumentError(f"retain_last must be an integer >= 1, got {retain_last!r}")
    if isinstance(older_than, _dt.timedelta):
        older_than = _dt.datetime.now(_dt.timezone.utc) - older_than
    if older_than is not None and not isinstance(older_than, _dt.datetime):
        raise InvalidArgumentError(f"older_than must be a datetime or timedelta, got {older_than!r}")
    cutoff_ms = int(older_than.timestamp() * 1000) if older_than else None

    def due() -> list[int]:
        meta = table.iceberg.metadata
        keep = {s.snapshot_id for s in main_branch_snapshots(table.iceberg)[-retain_last:]}
        keep |= {ref.snapshot_id for ref in meta.refs.values()}  # heads of branches and tags stay
        return [s.snapshot_id for s in meta.snapshots if s.snapshot_id not in keep and (cutoff_ms is None or s.timestamp_ms < cutoff_ms)]

    table.refresh()
    expire = due()
    if not expire:
        return MaintenanceResult("expire", None, detail="no snapshot to expire")
    if dry_run:
        return MaintenanceResult("expire", None, detail=f"would expire {len(expire)} snapshot(s)")
    try:
        reconcile_table(table.iceberg)  # persist foreign commits' lineage while their snapshots are still there
    except LineageError as exc:
        log.warning("expiring snapshots of %s whose foreign commits cannot be reconciled: %s", table.name, exc)
    expire_ids(table, expire)
    table.refresh()
    return MaintenanceResult("expire", None, files_removed=0, detail=f"expired {len(expire)} snapshot(s)")


def expire_ids(table: TableContext, ids: list[int]) -> None:
    """Expire the snapshots ``ids`` of ``table`` in one commit (the ones still there on a retry).

    Expiry writes no file of ours and is idempotent, so a failing catalog
    call is settled by reading the table back (see :mod:`lineage.outcome`);
    a commit that lost a race to another writer is made again on the new
    metadata.
    """
    wanted = list(ids)

    def apply(ice) -> None:  # type: ignore[no-untyped-def]
        left = [i for i in wanted if ice.metadata.snapshot_by_id(i) is not None]
        if left:
            # Straight to the catalog (lineage.catalog.commit_metadata): pyiceberg's ExpireSnapshots goes
            # through a Transaction, which copies the whole metadata several times.
            requirements = (AssertTableUUID(uuid=ice.metadata.table_uuid),)
            catalog.commit_metadata(ice, (RemoveSnapshotsUpdate(snapshot_ids=left),), requirements)

    def landed(ice) -> bool:  # type: ignore[no-untyped-def]
        return all(ice.metadata.snapshot_by_id(i) is None for i in wanted)

    retries = table.commit_retries
    for attempt in range(retries + 1):
        try:
            commit_metadata(table.iceberg, apply, landed, f"expiring {len(wanted)} snapshot(s) of {table.name}")
            return
        except CommitFailedException:
            backoff(attempt + 1)
            table.refresh()
    raise CommitConflictError(f"expiring snapshots gave up after {retries + 1} attempts: writers kept committing to {table.name}")


def _snapshot_refs(table: TableContext, snap: Snapshot, refs: set[str]) -> None:
    io = table.iceberg.io
    refs.add(local_path(snap.manifest_list))
    for manifest in snap.manifests(io):
        path = local_path(manifest.manifest_path)
        if path in refs:
            continue  # manifests are immutable and shared by snapshots: its files are in already
        refs.add(path)
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            refs.add(local_path(entry.data_file.file_path))
    summary = snap.summary.additional_properties if snap.summary else {}
    # A foreign snapshot's lineage is its reconciled list (derived now if no reader has done so yet).
    list_path = summary.get(SUMMARY_LIST) or reconciled_list_path(table.iceberg, snap.snapshot_id)
    try:
        lst = read_list(io, list_path) if SUMMARY_LIST in summary else foreign_list(table.iceberg, snap, persist=True)
    except LineageError as exc:
        if SUMMARY_LIST in summary:
            raise
        log.warning("keeping whatever lineage snapshot %s has: it cannot be reconciled (%s)", snap.snapshot_id, exc)
        refs.add(local_path(list_path))
        lst = None
    if lst is not None:
        refs.add(local_path(list_path))
        refs.update(local_path(p) for p in lst.resolved_deletes or ())
        refs.update(local_path(segment_object(seg)) for seg in lst.segments)  # a segment inside a list keeps the list
        # chunks of the commit log; lists share older chunks, so stop where an earlier list's walk went
        refs.update(local_path(p) for p in lst.log.chunk_paths(stop=lambda p: local_path(p) in refs))
        if lst.purged:
            refs.add(local_path(lst.purged))
        refs.update(local_path(seg) for seg in lst.key_index or ())


def pinned_files(state: TableState) -> tuple[set[str], set[str]]:
    """(index segments, pointed-to files) the retention window needs, as local paths.

    A segment that captured its images' values pins no file.
    """

    oldest = window(state).oldest
    segments, files = set(), set()
    for c in state.lineage.log.since(oldest):
        if c.index:
            segments.add(local_path(c.index))
            seg = read_index(state.iceberg.io, c.index)
            if not seg.captured:
                files.update(local_path(f) for f in seg.files)
    return segments, files


def referenced_files(table: TableContext | HasContext) -> set[str]:
    """Every file the table still needs, as local paths."""
    table = context_of(table)
    table.refresh()
    reconcile_table(table.iceberg)  # the current state below must name persisted files, not a reader's scratch copies
    meta = table.iceberg.metadata
    refs = {local_path(table.iceberg.metadata_location)}
    refs.update(local_path(m.metadata_file) for m in meta.metadata_log)
    for snap in meta.snapshots:
        _snapshot_refs(table, snap, refs)
    state = state_at(table.iceberg)
    segments, files = pinned_files(state)
    return refs | segments | files


def vacuum(table: TableContext | HasContext, older_than: _dt.timedelta = DEFAULT_ORPHAN_AGE, dry_run: bool = False) -> MaintenanceResult:
    """Delete files under the table that nothing needs any more (see the module docstring)."""
    table = context_of(table)
    if not isinstance(older_than, _dt.timedelta) or older_than < _dt.timedelta(0):
        raise InvalidArgumentError(f"older_than must be a non-negative timedelta, got {older_than!r}")
    started = time.time()
    refs = referenced_files(table)
    root = local_path(table.iceberg.metadata.location)
    cutoff = started - older_than.total_seconds()
    removed, removed_bytes = [], 0
    for found in store.list_files(root):  # through the store: an object store has no folders to walk
        if found.location in refs or found.mtime_ns / 1e9 > cutoff:
            continue
        removed.append(found.location)
        removed_bytes += found.size
    if not dry_run:
        store.delete_many(removed)
    log.info("vacuum removed %d files (%d bytes)%s", len(removed), removed_bytes, " (dry run)" if dry_run else "")
    return MaintenanceResult("vacuum", None, files_removed=len(removed), bytes_removed=removed_bytes,
                             detail="\n".join(sorted(removed)) if dry_run else f"removed {len(removed)} file(s)")
