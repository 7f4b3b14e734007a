"""Foreign commits: deriving the lineage of snapshots other engines committed (docs/design.md, "Foreign commits").

A snapshot on ``main`` whose summary has no ``lineage.list`` was committed by
another engine (Spark, Flink, pyiceberg, Trino). Its lineage list follows from
its parent's list and its own manifests (:mod:`lineage.reconcile.snapshot`).
:func:`foreign_list` walks back from a snapshot to the nearest ancestor whose
list is known (our own commit, or a snapshot reconciled before) and
reconciles forward, one snapshot at a time.

**Reads reconcile in memory; writes persist.** A reader derives the lineage
of a foreign snapshot into a process-private scratch directory
(:mod:`lineage.reconcile.scratch`) and keeps the list in this process's
cache: it writes nothing under the table's location, so a reader without
write permission there reads foreign versions like any other. Every writer
of ours (:func:`lineage.state.writable_state`, called before planning and by
:func:`lineage.commits.commit.commit_change`), ``Table.reconcile()`` and
``lineage reconcile`` persist it: the same files, derived again under the
table's location at paths named from the snapshot id
(``metadata/_lineage/reconciled-<id>-list.json``, with its segment, index
and key-index files named alike). Persisting is idempotent: every process
derives the same files. A missing, truncated or unreadable persisted list is
treated as absent and derived again. After that a foreign version costs what
our own does, for every process; a writer of ours whose base is a reconciled
snapshot carries its list forward, so the foreign commits stay in the commit
log (``history()``, marked ``foreign``) after the snapshots expire.
"""

from __future__ import annotations

from collections import OrderedDict

from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from lineage.errors import LineageMetadataError
from lineage.storage.metadata import LineageList, read_list
from lineage.reconcile.gap import last_known, reconcile_gap
from lineage.reconcile.scratch import persisted_path, scratch_view
from lineage.reconcile.snapshot import engine_of, reconcile_snapshot, reconciled_list_path
from lineage.state import Reconciler, TableState, main_branch_snapshots, own_list_path, register_reconciler

__all__ = ["engine_of", "foreign_list", "foreign_snapshots", "reconcile_table", "reconciled_list_path"]

# (table uuid, snapshot id) -> (list, persisted): lists a reader derived into scratch are not persisted.
_CACHE: OrderedDict[tuple[str, int], tuple[LineageList, bool]] = OrderedDict()
_CACHE_SIZE = 256


def _known(iceberg: IcebergTable, snapshot: Snapshot, persist: bool) -> LineageList | None:
    """The list of ``snapshot`` if it is ours or was reconciled before (else None).

    With ``persist`` only a list persisted under the table's location counts.
    """
    path = own_list_path(snapshot)
    if path is not None:
        return read_list(iceberg.io, path)
    key = (iceberg.metadata.table_uuid.hex, snapshot.snapshot_id)
    hit = _CACHE.get(key)
    if hit is not None and (hit[1] or not persist):
        _CACHE.move_to_end(key)
        return hit[0]
    try:
        lst = read_list(iceberg.io, reconciled_list_path(iceberg, snapshot.snapshot_id))
    except LineageMetadataError:
        return None  # absent, truncated or unreadable: reconcile (again)
    if lst.version != snapshot.sequence_number:
        return None
    _remember(key, lst, True)
    return lst


def _remember(key: tuple[str, int], lst: LineageList, persisted: bool) -> None:
    _CACHE[key] = (lst, persisted)
    _CACHE.move_to_end(key)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)


def foreign_list(iceberg: IcebergTable, snapshot: Snapshot, persist: bool = False) -> LineageList:
    """The lineage list of ``snapshot``, reconciling it and its foreign ancestors as needed.

    Without ``persist`` (readers) what is derived goes to this process's
    scratch directory; with it (writers, ``reconcile()``) under the table's
    location, where every process finds it.
    """
    uuid = iceberg.metadata.table_uuid.hex
    chain: list[Snapshot] = []
    snap: Snapshot | None = snapshot
    base: LineageList | None = None
    while snap is not None:
        base = _known(iceberg, snap, persist)
        if base is not None:
            break
        chain.append(snap)
        parent_id = snap.parent_snapshot_id
        if parent_id is None and snap.sequence_number <= 1:
            snap = None  # the table's first snapshot: reconciled on top of the empty table
            break
        # pyiceberg's expiry clears the parent id of the oldest survivor; Iceberg Java keeps it
        snap = iceberg.metadata.snapshot_by_id(parent_id) if parent_id is not None else None
        if snap is None:
            gap_at = chain.pop()  # the oldest survivor: everything since the last known list folds into it
            found = last_known(iceberg, gap_at, lambda s: _known(iceberg, s, persist))
            if found is None:
                raise LineageMetadataError(
                    f"cannot derive the lineage of snapshot {snapshot.snapshot_id} (version {snapshot.sequence_number}): it was "
                    f"committed by another engine, its ancestor {parent_id or '(unknown)'} expired before this library reconciled "
                    "it, and the table's older metadata files no longer name an ancestor whose lineage is known; "
                    "run `lineage reconcile` (Table.reconcile()) before another engine expires snapshots"
                )
            base = reconcile_gap(_target(iceberg, persist), found, gap_at)
            _remember((uuid, gap_at.snapshot_id), base, persist)
            snap = gap_at
            break
    parent_snapshot = snap
    lst = base if base is not None else LineageList.empty()
    target = _target(iceberg, persist) if chain else iceberg
    for s in reversed(chain):
        lst = reconcile_snapshot(target, TableState(target, parent_snapshot, lst), s)
        _remember((uuid, s.snapshot_id), lst, persist)
        parent_snapshot = s
    return lst


def _target(iceberg: IcebergTable, persist: bool) -> IcebergTable:
    """The table whose location derived lineage files go under: the table's own, or this process's scratch."""
    return iceberg if persist else scratch_view(iceberg)


def foreign_snapshots(iceberg: IcebergTable) -> list[Snapshot]:
    """Snapshots of the main branch committed by another engine, oldest first."""
    return [s for s in main_branch_snapshots(iceberg) if own_list_path(s) is None]


def reconcile_table(iceberg: IcebergTable) -> list[int]:
    """Derive and persist (under the table's location) the lineage of every foreign snapshot up to the current one; their versions, oldest first."""
    current = iceberg.metadata.current_snapshot()
    if current is None:
        return []
    if own_list_path(current) is None:
        foreign_list(iceberg, current, persist=True)
    return [s.sequence_number for s in foreign_snapshots(iceberg) if _known(iceberg, s, True) is not None]


register_reconciler(Reconciler(foreign_list, persisted_path))
