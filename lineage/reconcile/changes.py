"""What one snapshot changed, read from the manifests it wrote.

A snapshot's own changes are the entries with its snapshot id in the
manifests it added (``added_snapshot_id``): ADDED data and delete files and
DELETED files. Manifests carried from its parent are not read, so the cost
is proportional to the snapshot's change, not to the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from lineage.iceberg.equality import EqualityDelete
from lineage.iceberg.planning import manifest_entries, sequence_of, snapshot_manifests


@dataclass
class SnapshotChanges:
    """The files one snapshot added and removed, in manifest order then entry order."""

    snapshot: Snapshot
    added: list[ManifestEntry] = field(default_factory=list)  # data files (entries keep their data sequence number)
    removed: list[DataFile] = field(default_factory=list)  # data files
    position_deletes: list[ManifestEntry] = field(default_factory=list)
    equality_deletes: list[EqualityDelete] = field(default_factory=list)
    removed_deletes: list[DataFile] = field(default_factory=list)


def snapshot_changes(table: IcebergTable, snapshot: Snapshot) -> SnapshotChanges:
    """The data and delete files ``snapshot`` added and removed (read from the manifests it wrote)."""
    out = SnapshotChanges(snapshot)
    sid = snapshot.snapshot_id
    unpartitioned = {spec.spec_id for spec in table.metadata.partition_specs if spec.is_unpartitioned()}
    for manifest in snapshot_manifests(table, snapshot):  # v3: with first_row_id and deletion vector fields
        if manifest.added_snapshot_id != sid:
            continue
        for entry in manifest_entries(table, manifest, discard_deleted=False):
            if entry.snapshot_id != sid or entry.status == ManifestEntryStatus.EXISTING:
                continue
            f = entry.data_file
            added = entry.status == ManifestEntryStatus.ADDED
            if f.content == DataFileContent.DATA:
                (out.added.append(entry) if added else out.removed.append(f))
            elif not added:
                out.removed_deletes.append(f)
            elif f.content == DataFileContent.POSITION_DELETES:
                out.position_deletes.append(entry)
            else:
                out.equality_deletes.append(EqualityDelete(f, sequence_of(entry), (f.spec_id or 0) in unpartitioned))
    return out
