"""The state of a table at one version: its snapshot, live files and lineage."""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from lineage.errors import LineageMetadataError, UnknownVersionError
from lineage.metadata import SUMMARY_LIST, FileLineage, LineageList, read_list, read_segment


@dataclass(frozen=True)
class LiveFile:
    """A data file of the snapshot, the delete files that apply to it, and its lineage."""

    data_file: DataFile
    deletes: tuple[DataFile, ...]
    lineage: FileLineage

    @property
    def path(self) -> str:
        """The data file's location as Iceberg records it."""
        return self.data_file.file_path


@dataclass(frozen=True)
class TableState:
    """One snapshot of a table seen through its lineage."""

    iceberg: IcebergTable
    snapshot: Snapshot | None
    lineage: LineageList

    @property
    def version(self) -> int:
        """The snapshot's sequence number (0 before the first commit)."""
        return self.snapshot.sequence_number if self.snapshot else 0

    def lineage_by_file(self) -> dict[str, tuple[str, FileLineage]]:
        """Map every data file path described by the list to (segment path, lineage)."""
        out: dict[str, tuple[str, FileLineage]] = {}
        for seg in self.lineage.segments:
            for fl in read_segment(self.iceberg.io, seg):
                out[fl.file_path] = (seg, fl)
        return out

    def live_files(self, prune: BooleanExpression | None = None) -> list[LiveFile]:
        """Data files of the snapshot that may hold rows matching ``prune``, with deletes and lineage."""
        if self.snapshot is None:
            return []
        tasks = _plan(self.iceberg, self.snapshot.snapshot_id, prune)
        by_file = self.lineage_by_file()
        out = []
        for task in tasks:
            hit = by_file.get(task.file.file_path)
            if hit is None:
                raise LineageMetadataError(
                    f"data file {task.file.file_path} of version {self.version} has no lineage: it was written by a "
                    "writer that does not maintain row lineage; rewrite the table through this library"
                )
            if hit[1].record_count != task.file.record_count:
                raise LineageMetadataError(
                    f"lineage of {task.file.file_path} covers {hit[1].record_count} rows but the file has {task.file.record_count}"
                )
            out.append(LiveFile(task.file, tuple(task.delete_files), hit[1]))
        return out

    def all_data_file_paths(self) -> set[str]:
        """Paths of every live data file of the snapshot (no pruning, deletes ignored)."""
        if self.snapshot is None:
            return set()
        paths = set()
        for manifest in self.snapshot.manifests(self.iceberg.io):
            if manifest.content != 0:  # delete manifests
                continue
            for entry in manifest.fetch_manifest_entry(self.iceberg.io, discard_deleted=True):
                paths.add(entry.data_file.file_path)
        return paths


def _plan(table: IcebergTable, snapshot_id: int, prune: BooleanExpression | None) -> list:
    if prune is not None and not isinstance(prune, AlwaysTrue):
        try:
            return list(table.scan(row_filter=prune, snapshot_id=snapshot_id, case_sensitive=False).plan_files())
        except Exception:
            pass  # the expression did not bind (e.g. it uses lineage columns); plan without pruning
    return list(table.scan(snapshot_id=snapshot_id).plan_files())


def lineage_list_of(table: IcebergTable, snapshot: Snapshot | None) -> LineageList:
    """Read the lineage list a snapshot points at (the empty list for no snapshot)."""
    if snapshot is None:
        return LineageList.empty()
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    path = summary.get(SUMMARY_LIST)
    if path is None:
        raise LineageMetadataError(
            f"snapshot {snapshot.snapshot_id} (version {snapshot.sequence_number}) was committed by a writer that does not "
            "maintain row lineage; only this library may write to a lineage table"
        )
    return read_list(table.io, path)


def main_branch_snapshots(table: IcebergTable) -> list[Snapshot]:
    """Snapshots of the main branch, oldest first."""
    out = []
    snap = table.metadata.current_snapshot()
    while snap is not None:
        out.append(snap)
        snap = table.metadata.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return list(reversed(out))


def state_at(table: IcebergTable, version: int | None = None) -> TableState:
    """The table's state at ``version`` (the current one if None)."""
    current = table.metadata.current_snapshot()
    if version is None:
        return TableState(table, current, lineage_list_of(table, current))
    if isinstance(version, bool) or not isinstance(version, int):
        raise UnknownVersionError(f"as_of must be an integer version, got {version!r}")
    if version == 0:
        return TableState(table, None, LineageList.empty())
    for snap in main_branch_snapshots(table):
        if snap.sequence_number == version:
            return TableState(table, snap, lineage_list_of(table, snap))
    available = [s.sequence_number for s in main_branch_snapshots(table)]
    raise UnknownVersionError(
        f"version {version} is not a snapshot of this table; available versions: "
        + (f"{available[0]}..{available[-1]}" if available else "none (the table is empty)")
    )
