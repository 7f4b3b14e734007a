"""The state of a table at one version: its snapshot, live files and lineage.

Planning a write needs every live data file with its delete files and
lineage. Computed from scratch that reads every manifest and every lineage
segment of the snapshot; :class:`SnapshotFiles` holds the result, and a
commit made by this process derives the next snapshot's files from the
previous ones and its own change (:meth:`SnapshotFiles.advance`), so a
long-lived :class:`lineage.Table` plans a small write in time proportional to
the change. The files belong to one snapshot id: a commit by anyone else
makes the table's cache stale and it is rebuilt from the manifests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from lineage.storage.deletes import delete_identity, path_in_bounds, read_position_deletes, referenced_data_path
from lineage.errors import LineageMetadataError, UnknownVersionError
from lineage.iceberg.planning import PlannedFile, live_entries, plan_snapshot
from lineage.storage.metadata import SUMMARY_LIST, FileLineage, LineageList, read_list, read_segment


@dataclass(frozen=True)
class LiveFile:
    """A data file of the snapshot, the delete files that apply to it, and its lineage."""

    data_file: DataFile
    deletes: tuple[DataFile, ...]  # position delete files
    lineage: FileLineage
    # The data sequence number from the manifests; None for a file a commit of this process
    # added and carried without re-planning (:meth:`SnapshotFiles.advance`).
    sequence_number: int | None = None
    equality_deletes: tuple[DataFile, ...] = ()
    # Resolved-delete files (lineage.iceberg.equality) naming positions of this file that equality deletes remove.
    # Not Iceberg files: commits never add or remove them; readers apply them like position deletes.
    resolved: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """The data file's location as Iceberg records it."""
        return self.data_file.file_path

    @property
    def delete_paths(self) -> list[str]:
        """Every file of (file_path, pos) rows removing positions of this file: position deletes and resolved deletes."""
        return [d.file_path for d in self.deletes] + list(self.resolved)


def sized(files: Sequence[LiveFile]) -> list[tuple[str, int]]:
    """``(location, size)`` of the data files of ``files`` and of their position delete files: what a reader of them
    fetches at once on an object store (:func:`lineage.storage.prefetch.local_copies`)."""
    out = [(f.path, f.data_file.file_size_in_bytes) for f in files]
    return out + [(d.file_path, d.file_size_in_bytes) for f in files for d in f.deletes]


@dataclass
class SnapshotFiles:
    """Every live data file of one snapshot, with its delete files, lineage and lineage segment."""

    snapshot_id: int
    files: dict[str, LiveFile]  # by data file path, in planning order
    segment_of: dict[str, str]  # data file path -> segment describing it

    def live_segments(self) -> set[str]:
        """Segments that describe at least one live data file."""
        return set(self.segment_of.values())

    def advance(
        self,
        snapshot_id: int,
        added: list[tuple[DataFile, FileLineage]],
        segment: str | None,
        added_deletes: list[DataFile],
        removed: list[DataFile],
        moved: dict[str, str],
    ) -> SnapshotFiles | None:
        """The files of the snapshot a commit made on top of this one, or None when they must be planned afresh.

        ``added`` are the new data files with their lineage (described by
        ``segment``), ``added_deletes`` the new delete files, ``removed`` the
        data and delete files leaving the snapshot, ``moved`` maps a merged
        segment to the segment that now describes its files. Position delete
        files are attached to the data files they apply to (each is newer than
        every live file); an equality delete file returns None.
        """
        gone = {f.file_path for f in removed}
        gone_deletes = {delete_identity(f) for f in removed}  # a Puffin file holds the vectors of several data files
        files: dict[str, LiveFile] = {}
        for path, live in self.files.items():
            if path in gone:
                continue
            if live.equality_deletes:
                return None  # equality deletes are matched by sequence number: plan afresh
            if gone and live.deletes and any(delete_identity(d) in gone_deletes for d in live.deletes):
                live = replace(live, deletes=tuple(d for d in live.deletes if delete_identity(d) not in gone_deletes))
            files[path] = live
        segment_of = {p: moved.get(s, s) for p, s in self.segment_of.items() if p in files}
        for data_file, lineage in added:
            if segment is None:
                return None
            files[data_file.file_path] = LiveFile(data_file, (), lineage)
            segment_of[data_file.file_path] = segment
        for d in added_deletes:
            if d.content != DataFileContent.POSITION_DELETES:
                return None  # an equality delete file: plan afresh
            target = referenced_data_path(d)
            if target is not None:
                live = files.get(target)
                if live is not None:
                    files[target] = replace(live, deletes=live.deletes + (d,))
                continue
            # Partition-scoped: it applies to every file of its partition whose path its bounds bracket (the
            # planner's rule, lineage.iceberg.planning.PositionDeleteIndex; the commit's own new files included).
            scope = (d.spec_id or 0, d.partition)
            for path, live in files.items():
                f = live.data_file
                if (f.spec_id or 0, f.partition) == scope and path_in_bounds(d, path):
                    files[path] = replace(live, deletes=live.deletes + (d,))
        return SnapshotFiles(snapshot_id, files, segment_of)


@dataclass(frozen=True)
class TableState:
    """One snapshot of a table seen through its lineage.

    The snapshot's files (:class:`SnapshotFiles`) are planned on first use and
    kept in ``memo``, which a long-lived :class:`lineage.Table` shares between
    the states of one snapshot (see :func:`state_at`).
    """

    iceberg: IcebergTable
    snapshot: Snapshot | None
    lineage: LineageList
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def version(self) -> int:
        """The snapshot's sequence number (0 before the first commit)."""
        return self.snapshot.sequence_number if self.snapshot else 0

    def lineage_by_file(self) -> dict[str, tuple[str, FileLineage]]:
        """Map every data file path described by the list to (segment path, lineage)."""
        if "files" in self.memo:
            known = self.files()
            return {p: (known.segment_of[p], f.lineage) for p, f in known.files.items()}
        out: dict[str, tuple[str, FileLineage]] = {}
        for seg in self.lineage.segments:
            for fl in read_segment(self.iceberg.io, seg):
                out[fl.file_path] = (seg, fl)
        return out

    def files(self) -> SnapshotFiles:
        """Every live data file of the snapshot with deletes, lineage and segment (planned once per state)."""
        if "files" not in self.memo:
            recalled = recall_files(self.iceberg, self.snapshot.snapshot_id) if self.snapshot is not None else None
            if self.snapshot is None:
                self.memo["files"] = SnapshotFiles(0, {}, {})
            elif recalled is not None and _consistent(recalled, self.lineage):
                # (files a reader derived in its scratch directory do not serve a persisted list, nor the reverse)
                self.memo["files"] = recalled
            else:
                by_file = self.lineage_by_file()
                files = _with_resolved(self._attach(_plan(self.iceberg, self.snapshot), by_file), self.lineage.resolved_deletes or ())
                self.memo["files"] = SnapshotFiles(
                    self.snapshot.snapshot_id, {f.path: f for f in files}, {f.path: by_file[f.path][0] for f in files}
                )
        return self.memo["files"]

    def files_if_known(self) -> SnapshotFiles | None:
        """The snapshot's files if this state already has them, without planning."""
        return self.memo.get("files")

    def live_files(self, prune: BooleanExpression | None = None) -> list[LiveFile]:
        """Data files of the snapshot that may hold rows matching ``prune``, with deletes and lineage."""
        if self.snapshot is None:
            return []
        files = list(self.files().files.values())
        if prune is None or isinstance(prune, AlwaysTrue):
            return files
        return _pruned(self.iceberg, files, prune)

    def _attach(self, tasks: list[PlannedFile], by_file: dict[str, tuple[str, FileLineage]]) -> list[LiveFile]:
        out = []
        for task in tasks:
            hit = by_file.get(task.data_file.file_path)
            if hit is None:
                raise LineageMetadataError(
                    f"data file {task.data_file.file_path} of version {self.version} has no lineage: it was written by a "
                    "writer that does not maintain row lineage; rewrite the table through this library"
                )
            if hit[1].record_count != task.data_file.record_count:
                raise LineageMetadataError(
                    f"lineage of {task.data_file.file_path} covers {hit[1].record_count} rows but the file has {task.data_file.record_count}"
                )
            out.append(LiveFile(task.data_file, task.position_deletes, hit[1], task.sequence_number, task.equality_deletes))
        return out

    def all_data_file_paths(self) -> set[str]:
        """Paths of every live data file of the snapshot (no pruning, deletes ignored)."""
        if self.snapshot is None:
            return set()
        if "files" in self.memo:
            return set(self.files().files)
        if "data_paths" not in self.memo:  # a snapshot's files never change: read its manifests once
            data_manifests = [m for m in self.snapshot.manifests(self.iceberg.io) if m.content == 0]
            self.memo["data_paths"] = frozenset(entry.data_file.file_path for entry in live_entries(self.iceberg, data_manifests))
        return set(self.memo["data_paths"])


def _with_resolved(files: list[LiveFile], resolved: tuple[str, ...]) -> list[LiveFile]:
    """``files`` with the resolved-delete files that name positions of each attached."""
    if not resolved:
        return files
    by_path: dict[str, list[str]] = {}
    for path in resolved:
        for data_path in read_position_deletes(path):
            by_path.setdefault(data_path, []).append(path)
    return [replace(f, resolved=tuple(by_path[f.path])) if f.path in by_path else f for f in files]


def _plan(table: IcebergTable, snapshot: Snapshot) -> list[PlannedFile]:
    """Every live data file of the snapshot with its delete files (reads every manifest)."""
    return plan_snapshot(table, snapshot)


def _pruned(table: IcebergTable, files: list[LiveFile], prune: BooleanExpression) -> list[LiveFile]:
    """The files pyiceberg's planning would keep for ``prune`` (partition values and column statistics).

    Uses the evaluators of pyiceberg's planner on files already known. The
    expression comes from :mod:`lineage.sql.pruning` (exact column names, so the
    binding is case sensitive); if it does not bind, every file is kept, as
    planning without a filter does.
    """
    try:
        from pyiceberg.table import ManifestGroupPlanner

        planner = ManifestGroupPlanner(table.metadata, table.io, prune, case_sensitive=True)
        metrics = planner._build_metrics_evaluator()
        partitions: dict[int, Any] = {}
        out = []
        for f in files:
            spec_id = f.data_file.spec_id
            if spec_id not in partitions:
                partitions[spec_id] = planner._build_partition_evaluator(spec_id)
            if partitions[spec_id](f.data_file) and metrics(f.data_file):
                out.append(f)
        return out
    except Exception:
        return files


@dataclass(frozen=True)
class Reconciler:
    """How the lineage of snapshots another engine committed is derived (installed by :mod:`lineage.reconcile`).

    ``derive(table, snapshot, persist)`` returns the snapshot's list; without
    ``persist`` its files go to a process-private scratch directory, with it
    under the table's location. ``persisted_path(table, path)`` maps a
    scratch file to where its persisted twin is.
    """

    derive: Callable[[IcebergTable, Snapshot, bool], LineageList]
    persisted_path: Callable[[IcebergTable, str], str]


# lineage.reconcile registers itself here, so this module, which the reconciler imports, does not import it back.
_RECONCILER: list[Reconciler] = []


def register_reconciler(reconciler: Reconciler) -> None:
    """Install how the lineage list of a foreign snapshot is derived (see :mod:`lineage.reconcile`)."""
    _RECONCILER[:] = [reconciler]


def own_list_path(snapshot: Snapshot) -> str | None:
    """The lineage list a snapshot's summary points at (None: another engine committed it)."""
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    return summary.get(SUMMARY_LIST)


def lineage_list_of(table: IcebergTable, snapshot: Snapshot | None, persist: bool = False) -> LineageList:
    """The lineage list of a snapshot (the empty list for no snapshot).

    A snapshot committed by this library points at its list; one committed
    by another engine gets its list from the reconciler (derived from its
    parent's list and its manifests: in memory for a reader, persisted under
    the table's location with ``persist``).
    """
    if snapshot is None:
        return LineageList.empty()
    path = own_list_path(snapshot)
    if path is None:
        if not _RECONCILER:
            raise LineageMetadataError(
                f"snapshot {snapshot.snapshot_id} (version {snapshot.sequence_number}) was committed by a writer that does not "
                "maintain row lineage, and no reconciler is installed (import lineage)"
            )
        return _RECONCILER[0].derive(table, snapshot, persist)
    return read_list(table.io, path)


def writable_state(state: TableState) -> TableState:
    """``state``, with the lineage of a foreign snapshot persisted under the table's location.

    A writer plans and commits on top of this, so the list it commits never
    names a file of a reader's scratch directory. The state's planned files
    (shared ``memo``) are moved to the persisted twins of their segments and
    resolved-delete files (planned afresh if they do not match). Cheap when
    the snapshot is ours or its lineage is persisted already.
    """
    snap = state.snapshot
    if snap is None or own_list_path(snap) is not None or state.lineage.version != snap.sequence_number:
        return state  # no snapshot, ours, or a list the caller built for it (adoption)
    lst = lineage_list_of(state.iceberg, snap, persist=True)
    files = state.memo.get("files")
    if files is not None and not _consistent(files, lst):
        moved = _persisted_files(state.iceberg, files, lst)
        if moved is None:
            state.memo.pop("files", None)
        else:
            state.memo["files"] = moved
    return state if lst is state.lineage else TableState(state.iceberg, snap, lst, state.memo)


def _persisted_files(table: IcebergTable, files: SnapshotFiles, lst: LineageList) -> SnapshotFiles | None:
    """``files`` with scratch paths moved to their persisted twins; None when they do not match ``lst``."""
    move = _RECONCILER[0].persisted_path
    segment_of = {p: move(table, s) for p, s in files.segment_of.items()}
    out = {p: replace(f, resolved=tuple(move(table, r) for r in f.resolved)) if f.resolved else f for p, f in files.files.items()}
    moved = SnapshotFiles(files.snapshot_id, out, segment_of)
    return moved if _consistent(moved, lst) else None


def _consistent(files: SnapshotFiles, lst: LineageList) -> bool:
    """Whether every segment and resolved-delete file ``files`` names is one of ``lst``'s."""
    segments = set(lst.segments)
    resolved = set(lst.resolved_deletes or ())
    return all(s in segments for s in files.segment_of.values()) and all(
        r in resolved for f in files.files.values() for r in f.resolved
    )


def main_branch_snapshots(table: IcebergTable) -> list[Snapshot]:
    """Snapshots of the main branch, oldest first."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    out = []
    snap = table.metadata.current_snapshot()
    while snap is not None:
        out.append(snap)
        snap = by_id.get(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return list(reversed(out))


_GENERATION = [0]


def forget_planned_files() -> None:
    """Make every table plan its live files afresh from the manifests and segments on disk.

    For tools and tests that change or remove metadata files behind the
    library's back (the long-lived :class:`lineage.Table` objects keep the
    live files of their current snapshot in memory).
    """
    _GENERATION[0] += 1


# The planned files of the last few snapshots this process knew, by (table uuid, snapshot id, generation):
# when another engine commits on top of a snapshot a long-lived Table had planned, reconciling the new
# snapshot starts from its parent's files instead of planning the parent again.
_RECENT: OrderedDict[tuple[str, int, int], SnapshotFiles] = OrderedDict()
_RECENT_SIZE = 4


def remember_files(table: IcebergTable, files: SnapshotFiles) -> None:
    """Keep ``files`` (of snapshot ``files.snapshot_id``) for :func:`recall_files`."""
    key = (table.metadata.table_uuid.hex, files.snapshot_id, _GENERATION[0])
    _RECENT[key] = files
    _RECENT.move_to_end(key)
    while len(_RECENT) > _RECENT_SIZE:
        _RECENT.popitem(last=False)


def recall_files(table: IcebergTable, snapshot_id: int) -> SnapshotFiles | None:
    """The files of ``snapshot_id`` if this process planned or derived them recently."""
    return _RECENT.get((table.metadata.table_uuid.hex, snapshot_id, _GENERATION[0]))


def carried_memo(snapshot_id: int, files: SnapshotFiles | None) -> dict:
    """A memo for :func:`state_at` holding the files a commit of this process derived for its snapshot."""
    return {"snapshot-id": snapshot_id, "generation": _GENERATION[0], **({"files": files} if files is not None else {})}


def state_at(table: IcebergTable, version: int | None = None, memo: dict | None = None, persist: bool = False) -> TableState:
    """The table's state at ``version`` (the current one if None).

    ``memo`` is a dict the caller keeps between calls: the state of the
    current snapshot shares it (its contents are dropped first when they
    belong to another snapshot), so files planned once, or derived by a
    commit of this process (key ``"files"``), are not planned again.
    ``persist`` (writers, current version only): the lineage of a foreign
    snapshot is derived under the table's location (:func:`writable_state`)
    instead of in memory.
    """
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise UnknownVersionError(f"as_of must be an integer version, got {version!r}")
    current = table.metadata.current_snapshot()
    if version is None or (current is not None and version == current.sequence_number):
        if memo is None:
            memo = {}
        current_id = current.snapshot_id if current is not None else None
        if memo.get("snapshot-id", -1) != current_id or memo.get("generation") != _GENERATION[0]:
            if memo.get("generation") == _GENERATION[0] and memo.get("files") is not None:
                remember_files(table, memo["files"])  # the parent of a foreign commit, most likely
            memo.clear()
            memo.update({"snapshot-id": current_id, "generation": _GENERATION[0]})
        state = TableState(table, current, lineage_list_of(table, current, persist), memo)
        return writable_state(state) if persist else state
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
