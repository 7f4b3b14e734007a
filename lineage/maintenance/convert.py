"""CONVERT: turn every live equality delete file into position delete files (v3: deletion vectors), changing no reader's answer.

Iceberg's rule for an equality delete file with data sequence number ``d``:
it removes the rows of data files with a data sequence number strictly below
``d`` (same partition, or every partition for an unpartitioned spec) that
equal one of its rows in its ``equality_ids`` columns, NULL matching NULL.
CONVERT resolves each one to the positions it removes, per data file, and
commits one ``replace`` snapshot that removes the equality delete files and
adds one position delete file per affected data file, **carrying the lowest
data sequence number ``d`` of the equality deletes it replaces**. A position
delete applies to the data file it names when the file's data sequence number
is ``<= d``, which holds since every one of those equality deletes applied to
it, so every reader sees the same rows before and after; afterwards the table
holds no equality delete files.

On a lineage table (:func:`convert_table`, ``Table.convert_equality_deletes``)
the snapshot is a commit of ours: it carries a lineage list with operation
``convert-deletes``, changes no row (no data file, no removed image, no change
event, the key index unchanged) and drops the list's resolved-delete files,
which only the converted equality deletes needed. On a plain Iceberg table
(:func:`convert_equality_deletes`: adoption converts first) it carries
``lineage.operation = convert-deletes`` and no lineage list; a reconciler sees
only position deletes of rows that were already deleted.

On an Iceberg v3 table no position delete file may be added: CONVERT writes
one deletion vector per affected data file instead, merged with the file's
current vector and position deletes, which it replaces in the same commit;
the vectors inherit the commit's sequence number
(:mod:`lineage.maintenance.convert_vectors` says why that is the spec's rule
and which row ids change: none).

Concurrency: the commit asserts the snapshot it was planned on; when another
writer commits first (new equality deletes included) the attempt's files are
removed and CONVERT plans again on the new head.

Resolution. On a lineage table every equality delete was already resolved when
its snapshot was reconciled, through the key index of the snapshot before it
(:mod:`lineage.reconcile`): the positions are in the lineage list's
resolved-delete files, which every reader of ours applies. CONVERT turns those
into Iceberg position delete files (:func:`plan_from_resolved`): it reads no
data file, so its cost is that of the positions it writes. A plain Iceberg
table has no such files: :func:`plan_conversion` resolves with
:func:`lineage.iceberg.equality.resolve_equality_deletes`, scanning the equality
columns of the data files each delete applies to.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation, Snapshot

from lineage.commits.commit import CommitRequest, commit_files
from lineage.context import HasContext, TableContext, context_of
from lineage.storage.deletes import positions_for
from lineage.iceberg.equality import Candidate, EqualityDelete, resolve_equality_deletes
import lineage.maintenance.convert_vectors as convert_vectors
from lineage.errors import CommitConflictError
from lineage.maintenance._common import MaintenanceResult, commit_with_retries
from lineage.storage.metadata import SUMMARY_OPERATION
from lineage.outcome import Attempt, CommitLoop
from lineage.iceberg.planning import live_entries, sequence_of
from lineage.properties import COMMIT_RETRIES
from lineage.properties import read as read_property
from lineage.state import TableState
from lineage.storage.writer import write_position_deletes

OPERATION = "convert-deletes"


@dataclass(frozen=True)
class ConvertResult(MaintenanceResult):
    """What CONVERT did: equality delete files (and their rows) replaced by position delete files (and positions)."""

    equality_files: int = 0
    equality_rows: int = 0
    position_files: int = 0
    positions: int = 0
    data_files: int = 0  # data files that got position deletes (v3: a deletion vector)
    deletion_vectors: int = 0  # v3: the deletion vectors written (position_files is 0 there)
    attempts: int = 0


@dataclass(frozen=True)
class Resolved:
    """Positions one equality delete file removes from one data file."""

    delete_file: DataFile
    sequence_number: int  # the equality delete's data sequence number
    data_file: DataFile
    positions: np.ndarray


def resolve_snapshot(iceberg: IcebergTable, snapshot: Snapshot) -> tuple[list[Resolved], list[DataFile]]:
    """The positions every live equality delete file of ``snapshot`` removes, per data file, and those delete files.

    Candidates are the snapshot's live data files with their data sequence
    numbers; :func:`lineage.iceberg.equality.resolve_equality_deletes` picks those each
    delete applies to and matches its rows against their equality columns.
    """
    unpartitioned = {spec.spec_id for spec in iceberg.metadata.partition_specs if spec.is_unpartitioned()}
    deletes: list[EqualityDelete] = []
    candidates: list[Candidate] = []
    for entry in live_entries(iceberg, snapshot.manifests(iceberg.io)):
        f = entry.data_file
        if f.content == DataFileContent.EQUALITY_DELETES:
            deletes.append(EqualityDelete(f, sequence_of(entry), (f.spec_id or 0) in unpartitioned))
        elif f.content == DataFileContent.DATA:
            candidates.append(Candidate(f, sequence_of(entry)))
    if not deletes:
        return [], []
    found = resolve_equality_deletes(iceberg.schema(), deletes, candidates)
    data_files = {c.data_file.file_path: c.data_file for c in candidates}
    out = [
        Resolved(d.delete_file, d.sequence_number, data_files[path], pos)
        for d in deletes
        for path, pos in found.get(d.delete_file.file_path, {}).items()
        if len(pos)
    ]
    return out, [d.delete_file for d in deletes]


@dataclass(frozen=True)
class Conversion:
    """The files one CONVERT attempt commits, planned against one snapshot."""

    added: list[DataFile]  # new position delete files (v3: deletion vectors)
    removed: list[DataFile]  # the equality delete files they replace
    sequence_numbers: dict[str, int]  # added file path -> data sequence number of the equality delete it replaces
    positions: int
    data_files: int
    replaced: list[DataFile] = dataclasses.field(default_factory=list)  # v3: current vectors/position deletes merged in
    vectors: bool = False  # v3: ``added`` are deletion vectors

    @property
    def leaving(self) -> list[DataFile]:
        """Every delete entry the commit removes: the equality delete files and (v3) the replaced deletes."""
        return self.removed + self.replaced

    def result(self, version: int | None, attempts: int) -> ConvertResult:
        """The report of this conversion, committed at ``version``."""
        removed_rows = sum(f.record_count for f in self.removed)
        leaving = self.leaving
        files = len({f.file_path for f in self.added})  # the vectors of one attempt share a Puffin file
        what = f"{len(self.added)} deletion vector(s)" if self.vectors else f"{len(self.added)} position delete file(s)"
        return ConvertResult(
            OPERATION, version, files_added=files, files_removed=len(leaving),
            bytes_added=sum({f.file_path: f.file_size_in_bytes for f in self.added}.values()),
            bytes_removed=sum(f.file_size_in_bytes for f in leaving),
            detail=f"{len(self.removed)} equality delete file(s) ({removed_rows} rows) -> "
            f"{what} ({self.positions} positions in {self.data_files} data file(s))",
            equality_files=len(self.removed), equality_rows=removed_rows, position_files=0 if self.vectors else len(self.added),
            positions=self.positions, data_files=self.data_files, attempts=attempts,
            deletion_vectors=len(self.added) if self.vectors else 0,
        )


def plan_conversion(ice: IcebergTable, snap: Snapshot, created: list[str]) -> Conversion | None:
    """Resolve ``snap``'s equality deletes by scanning and write the position delete files (paths appended to ``created``).

    None when the snapshot holds no equality delete file.
    """
    resolved, removed = resolve_snapshot(ice, snap)
    if not removed:
        return None
    # One position delete file per data file, with the lowest sequence number of the equality deletes that
    # remove rows of it: each of them is above the data file's own, and a position delete names its data file,
    # so that number makes it apply exactly where they did (one file per equality delete and data file would
    # multiply the delete files every reader opens).
    groups: dict[str, list[np.ndarray]] = defaultdict(list)
    lowest: dict[str, int] = {}
    targets: dict[str, DataFile] = {}
    for r in resolved:
        path = r.data_file.file_path
        groups[path].append(r.positions)
        lowest[path] = min(lowest.get(path, r.sequence_number), r.sequence_number)
        targets[path] = r.data_file
    current = convert_vectors.current_deletes(ice, snap) if ice.metadata.format_version >= 3 else {}
    return _write_conversion(ice, groups, lowest, targets, removed, created, current)


def plan_from_resolved(state: TableState, created: list[str]) -> Conversion | None:
    """CONVERT planned from the lineage list's resolved-delete files: the key-index resolution reconciliation made.

    Every live data file with resolved positions gets one position delete file
    with the positions no position delete file of it covers yet, carrying the
    lowest data sequence number of the equality deletes that apply to it (its
    own data sequence number when none applies any more: a position delete
    names its file, so any number not below the file's applies it). Reads the
    manifests and the resolved-delete files, no data file. None when the
    snapshot holds no equality delete file.
    """
    ice, snap = state.iceberg, state.snapshot
    if snap is None:
        return None
    seq: dict[str, int] = {}
    removed: list[DataFile] = []
    for entry in live_entries(ice, snap.manifests(ice.io)):
        f = entry.data_file
        seq[f.file_path] = sequence_of(entry)
        if f.content == DataFileContent.EQUALITY_DELETES:
            removed.append(f)
    if not removed:
        return None
    groups: dict[str, list[np.ndarray]] = {}
    lowest: dict[str, int] = {}
    targets: dict[str, DataFile] = {}
    current: dict[str, tuple[DataFile, ...]] = {}
    for f in state.files().files.values():
        if not f.resolved:
            continue
        pos = np.setdiff1d(positions_for(f.path, list(f.resolved)), positions_for(f.path, [d.file_path for d in f.deletes]))
        if not len(pos):
            continue
        groups[f.path] = [pos]
        lowest[f.path] = min((seq[d.file_path] for d in f.equality_deletes), default=seq[f.path])
        targets[f.path] = f.data_file
        current[f.path] = f.deletes
    return _write_conversion(ice, groups, lowest, targets, removed, created, current)


def _write_conversion(
    ice: IcebergTable,
    groups: dict[str, list[np.ndarray]],
    lowest: dict[str, int],
    targets: dict[str, DataFile],
    removed: list[DataFile],
    created: list[str],
    current: dict[str, tuple[DataFile, ...]],
) -> Conversion:
    """Write one position delete file per data file of ``groups`` (sequence number ``lowest``) replacing ``removed``.

    On a v3 table: one deletion vector per data file, merged with its
    ``current`` delete files, which it replaces; the vectors inherit the
    commit's sequence number (:mod:`lineage.maintenance.convert_vectors`).
    """
    if ice.metadata.format_version >= 3:
        v = convert_vectors.write_conversion_vectors(ice, groups, targets, current, created)
        return Conversion(v.vectors, removed, {}, v.positions, len(v.vectors), v.replaced, vectors=True)
    added: list[DataFile] = []
    sequence_numbers: dict[str, int] = {}
    positions = 0
    for path, parts in sorted(groups.items()):
        seq = lowest[path]
        pos = np.unique(np.concatenate(parts))
        positions += len(pos)
        (f,) = write_position_deletes(ice, [(targets[path], pos)])
        created.append(f.file_path)
        added.append(f)
        sequence_numbers[f.file_path] = seq
    return Conversion(added, removed, sequence_numbers, positions, len(targets))


def convert_equality_deletes(iceberg: IcebergTable, refresh: Callable[[], IcebergTable], name: str) -> ConvertResult:
    """CONVERT every live equality delete file of a plain Iceberg table's ``main`` (adoption; see the module docs).

    The snapshot carries no lineage list: use :func:`convert_table` on a
    lineage table. ``refresh`` reloads ``iceberg`` from the catalog (the
    commit loop calls it before every attempt); ``name`` names the table in
    messages.
    """
    retries = int(read_property(iceberg.metadata.properties, COMMIT_RETRIES))
    table = [iceberg]

    def attempt(a: Attempt) -> ConvertResult:
        ice = table[0]
        snap = ice.metadata.current_snapshot()
        if snap is None:
            return ConvertResult(OPERATION, None, attempts=a.number)
        plan = plan_conversion(ice, snap, a.files)
        if plan is None:
            return ConvertResult(OPERATION, None, detail="no equality delete files", attempts=a.number)
        snapshot_id = ice.metadata.new_snapshot_id()
        result = plan.result(ice.metadata.next_sequence_number(), a.number)
        a.result = result
        commit_files(
            ice, operation=Operation.REPLACE, added=plan.added, removed=plan.leaving, properties={SUMMARY_OPERATION: OPERATION},
            timestamp_ms=max(int(time.time() * 1000), snap.timestamp_ms + 1), snapshot_id=snapshot_id, attempt=a,
            delete_sequence_numbers=plan.sequence_numbers,
        )
        return result

    def reload() -> None:
        table[0] = refresh()

    loop: CommitLoop[ConvertResult] = CommitLoop(f"{name}: {OPERATION}", lambda: table[0], reload, retries)
    return loop.run(
        attempt,
        lambda n: CommitConflictError(
            f"gave up after {n} attempts: other writers kept committing to {name}; nothing was converted. "
            f"Retry later or raise the table property {COMMIT_RETRIES}"
        ),
    )


def convert_table(table: TableContext | HasContext) -> ConvertResult:
    """CONVERT a lineage table: one ``replace`` commit of ours that carries a lineage list.

    The commit changes no row's lineage and makes no change event (no data
    file, no removed image, no key-index change). It drops the lineage list's
    resolved-delete files: they resolve equality deletes, and after the
    commit the table holds none (every position they name is covered by the
    new position deletes, which resolve the same equality deletes against
    every older row). Each attempt plans on the current head (reconciled
    first if a foreign or equality commit made it), so a writer that commits
    first, new equality deletes included, makes CONVERT plan again.
    Positions come from the resolved-delete files (:func:`plan_from_resolved`).
    """
    table = context_of(table)
    plans: list[Conversion] = []
    attempts = [0]

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        attempts[0] += 1
        conversion = plan_from_resolved(state, created)
        if conversion is None:
            return None
        plans.append(conversion)
        return CommitRequest(
            OPERATION, Operation.REPLACE, delete_files=conversion.added, removed_files=conversion.leaving,
            delete_sequence_numbers=conversion.sequence_numbers,
            transform_list=lambda lst: dataclasses.replace(lst, resolved_deletes=None),
        )

    _, result = commit_with_retries(table, plan, OPERATION)
    if result is None:
        return ConvertResult(OPERATION, None, detail="no equality delete files", attempts=attempts[0])
    return plans[-1].result(result.version, attempts[0])
