"""Reconciling across a gap: foreign snapshots that were expired before this library reconciled them.

Another engine's ``expire_snapshots`` may remove snapshots (and, Iceberg
Java's default, their manifests and the data files only they referenced)
before any reader of ours derived their lineage. Their changes can then no
longer be told apart. docs/design.md, "Foreign commits": the chain
from the newest snapshot whose lineage is known (A) to the oldest surviving
snapshot G is reconciled as *one* step, attributed to G and marked ``gap`` in
its commit log entry; the change feed refuses ranges that cross it
(:class:`lineage.errors.HistoryGapError`).

A is found through the table's previous metadata files (``metadata-log``),
which still list the expired snapshots with their summaries and parents
(pyiceberg's expiry also clears G's parent id; the older metadata keeps it).
A's manifests may be gone, so its live images come from its lineage alone:
every position its lineage segments describe, less positions and images its
deleted-rows index removed and positions never visible (created version 0),
one image per row id. The step's changes are the difference to G's live
images (planned from G's manifests):

* a data file live at both keeps its lineage; its positions deleted since A
  are removed images;
* the live images of A's other files are removed images, unless their row
  id is still live at G (an older copy a move left behind);
* the live rows of G's other files are added images, paired with the removed
  ones by key (keyless: by value) as usual: updates keep row id and created
  version, identical rows are moves, the rest are inserts with fresh row ids.

Equality deletes committed inside the gap (data sequence number above A's
version; older ones A's resolved-delete files apply already) are resolved
against every data file live at G by the sequence-number rule, scanning the
files' equality columns (A's key index does not know rows added in the gap):
the positions they remove are dead at G, recorded in a resolved-delete file
the new list names, so rows they removed from A's files are removed images
and rows they removed from files added in the gap were never visible.

Removed images whose data file was deleted cannot be read, so they pair with
nothing (their key reappearing at G gets a new row id) and the index entry
recorded for them points at a lost file (``verify`` reports it). The key
index is rebuilt by the next keyed write.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation, Snapshot

from index.deleted_rows import RemovedImages, read_index
from lineage.commits.commit import build_lineage
from lineage.storage.deletes import live_positions, positions_for, read_position_deletes
from lineage.iceberg.equality import Candidate, EqualityDelete, merge_positions, resolve_equality_deletes, write_resolved_deletes
from lineage.storage.fileio import overwriting
from lineage.storage.metadata import FileLineage, LineageList, lineage_dir, read_segment
from lineage.iceberg.planning import PlannedFile, live_entries, plan_snapshot, sequence_of
from lineage.reconcile.images import read_positions
from lineage.reconcile.native import added_lineage, pair_by_row_id, with_native_ids
from lineage.reconcile.pairing import Pairs, pair_images
from lineage.reconcile.snapshot import assign_lineage, foreign_request, reconciled_tag
from lineage.storage.rle import decode_sequence, decode_values
from lineage.iceberg.schema import arrow_schema, projection_field_ids
from lineage.state import LiveFile, SnapshotFiles, TableState

log = logging.getLogger(__name__)

_EMPTY = np.zeros(0, np.int64)


@dataclass(frozen=True)
class KnownAncestor:
    """The newest ancestor of a surviving snapshot whose lineage is known (:func:`last_known`)."""

    snapshot: Snapshot | None  # None: the whole chain back to the table's first snapshot is foreign
    lineage: LineageList
    direct: bool  # the survivor's own parent: nothing between them was expired, so the step is one commit, not a gap


def last_known(
    iceberg: IcebergTable, survivor: Snapshot, lookup: Callable[[Snapshot], LineageList | None]
) -> KnownAncestor | None:
    """The newest ancestor of ``survivor`` whose lineage ``lookup`` knows, found in older metadata files.

    None when the metadata files no longer tell.
    """
    by_id: dict[int, Snapshot] = {}
    for entry in reversed(iceberg.metadata.metadata_log):
        try:
            older = FromInputFile.table_metadata(iceberg.io.new_input(entry.metadata_file))
        except Exception:  # deleted or unreadable metadata file: look further back
            continue
        for s in older.snapshots:
            # Newest file first, but pyiceberg's expiry clears the parent id of the oldest survivor: an older file's
            # copy of a snapshot that still names its parent wins.
            if s.snapshot_id not in by_id or (by_id[s.snapshot_id].parent_snapshot_id is None and s.parent_snapshot_id is not None):
                by_id[s.snapshot_id] = s
        parent = survivor.parent_snapshot_id
        if parent is None and survivor.snapshot_id in by_id:
            parent = by_id[survivor.snapshot_id].parent_snapshot_id
        direct = True
        while parent is not None and parent in by_id:
            snap = by_id[parent]
            lst = lookup(snap)
            if lst is not None:
                return KnownAncestor(snap, lst, direct)
            if snap.parent_snapshot_id is None and snap.sequence_number <= 1:
                return KnownAncestor(None, LineageList.empty(), False)
            parent = snap.parent_snapshot_id
            direct = False
    return None


def _images_at(iceberg: IcebergTable, base: LineageList) -> tuple[dict[str, FileLineage], dict[str, str], dict[str, np.ndarray]]:
    """Lineage of every file the list describes, its segment, and the positions of each that are live images."""
    files: dict[str, FileLineage] = {}
    segment_of: dict[str, str] = {}
    for seg in base.segments:
        for fl in read_segment(iceberg.io, seg):
            files[fl.file_path] = fl
            segment_of[fl.file_path] = seg
    dead_pos: dict[str, list[np.ndarray]] = {}
    dead_rid, dead_from = [], []
    for c in base.log.entries():
        if not c.index:
            continue
        seg = read_index(iceberg.io, c.index)
        dead_rid.append(seg.row_ids)
        dead_from.append(seg.valid_from)
        for i, path in enumerate(seg.files):
            dead_pos.setdefault(path, []).append(seg.positions[seg.file_index == i])
    # An image is (row id, valid-from); both fit a float64 exactly, so a complex number names it.
    dead = np.concatenate(dead_rid) + 1j * np.concatenate(dead_from) if dead_rid else np.zeros(0, complex)
    live: dict[str, np.ndarray] = {}
    seen = np.zeros(0, complex)
    for path, fl in reversed(files.items()):  # newest segments first: the copy a move made wins over the one it left
        rid, created, updated = decode_sequence(fl.row_ids), decode_values(fl.created), decode_values(fl.updated)
        ok = created != 0
        gone = np.concatenate(dead_pos[path]) if path in dead_pos else _EMPTY
        ok[gone[gone < fl.record_count]] = False
        ident = rid + 1j * updated
        ok &= ~np.isin(ident, dead) & ~np.isin(ident, seen)  # one image per identity: older copies left by moves
        pos = np.flatnonzero(ok)
        live[path] = pos
        seen = np.union1d(seen, ident[pos])
    return files, segment_of, live


def _gap_equality_deletes(iceberg: IcebergTable, survivor: Snapshot, planned: list[PlannedFile], base_version: int) -> dict[str, np.ndarray]:
    """Positions of ``survivor``'s data files that equality deletes committed inside the gap remove.

    Equality deletes of data sequence number up to the base's version were
    resolved by then (the base list's resolved-delete files apply them). The
    newer ones are resolved here with the sequence-number rule against every
    data file live at the survivor, by scanning their equality columns: the
    base's key index does not know the rows added inside the gap.
    """
    wanted = {d.file_path for p in planned for d in p.equality_deletes}
    if not wanted:
        return {}
    unpartitioned = {spec.spec_id for spec in iceberg.metadata.partition_specs if spec.is_unpartitioned()}
    deletes = []
    delete_manifests = [m for m in survivor.manifests(iceberg.io) if m.content == ManifestContent.DELETES]
    for entry in live_entries(iceberg, delete_manifests):
        f = entry.data_file
        if f.file_path in wanted and sequence_of(entry) > base_version:
            deletes.append(EqualityDelete(f, sequence_of(entry), (f.spec_id or 0) in unpartitioned))
    if not deletes:
        return {}
    candidates = [Candidate(p.data_file, p.sequence_number) for p in planned]
    resolved = resolve_equality_deletes(iceberg.schema(), deletes, candidates)
    return merge_positions(list(resolved.values()))


def reconcile_gap(iceberg: IcebergTable, known: KnownAncestor, survivor: Snapshot) -> LineageList:
    """The lineage list of ``survivor``, derived in one step from the list of its newest known ancestor.

    When that ancestor is the survivor's own parent (``known.direct``: the
    parent's snapshot expired after this library had read it, nothing
    unread was lost) the step is exactly the survivor's commit: it is
    recorded as an ordinary reconciled commit, not a gap, and the change
    feed reads it.
    """
    base_snapshot, base = known.snapshot, known.lineage
    version = survivor.sequence_number
    a_files, a_segment, a_live = _images_at(iceberg, base)
    resolved = list(base.resolved_deletes or ())
    resolved_of: dict[str, list[str]] = {}
    for path in resolved:
        for data_path in read_position_deletes(path):
            resolved_of.setdefault(data_path, []).append(path)
    planned = plan_snapshot(iceberg, survivor)
    eq_dead = _gap_equality_deletes(iceberg, survivor, planned, base.version)
    tag = reconciled_tag(survivor.snapshot_id)
    resolved_path = None
    if eq_dead:
        resolved_path = f"{lineage_dir(iceberg.metadata.location)}/{tag}-resolved-deletes.parquet"
        with overwriting():
            write_resolved_deletes(iceberg.io, resolved_path, eq_dead)

    schema = arrow_schema(iceberg.schema())

    field_ids = projection_field_ids(iceberg.metadata)  # older files are read by field id
    columns = schema.names
    keyed = bool(iceberg.schema().identifier_field_ids)
    key = [iceberg.schema().find_field(i).name for i in sorted(iceberg.schema().identifier_field_ids)] if keyed else []

    carried: list[LiveFile] = []
    added: list[tuple[DataFile, np.ndarray, np.ndarray]] = []  # data file, live positions, dead positions
    removed: dict[str, np.ndarray] = {}
    live_rids: list[np.ndarray] = []
    g_paths = set()
    for p in planned:
        f = p.data_file
        g_paths.add(f.file_path)
        dead = positions_for(f.file_path, [d.file_path for d in p.position_deletes] + resolved_of.get(f.file_path, []))
        if f.file_path in eq_dead:
            dead = np.union1d(dead, eq_dead[f.file_path])
        dead = dead[dead < f.record_count]
        live_pos = live_positions(f.record_count, dead)
        if f.file_path in a_files:
            fl = a_files[f.file_path]
            carried.append(LiveFile(f, p.position_deletes, fl, p.sequence_number, p.equality_deletes, tuple(resolved_of.get(f.file_path, ()))))
            live_rids.append(decode_sequence(fl.row_ids)[live_pos])
            gone = np.intersect1d(a_live[f.file_path], dead)
            if len(gone):
                removed[f.file_path] = gone
        else:
            added.append((f, live_pos, dead))
    for path, pos in a_live.items():
        if path not in g_paths and len(pos):
            removed[path] = pos
    still = np.concatenate(live_rids) if live_rids else _EMPTY

    # Removed images, flat, one per row id, without rows still live at G.
    r_paths, r_pos, r_rid, r_created, r_from = [], [], [], [], []
    for path in sorted(removed):
        fl, pos = a_files[path], removed[path]
        rid = decode_sequence(fl.row_ids)[pos]
        keep = ~np.isin(rid, still)
        r_paths += [path] * int(keep.sum())
        r_pos.append(pos[keep])
        r_rid.append(rid[keep])
        r_created.append(decode_values(fl.created)[pos][keep])
        r_from.append(decode_values(fl.updated)[pos][keep])
    cat = lambda xs: np.concatenate(xs) if xs else _EMPTY  # noqa: E731
    r_pos_a, r_rid_a, r_created_a, r_from_a = cat(r_pos), cat(r_rid), cat(r_created), cat(r_from)
    _, first = np.unique(r_rid_a, return_index=True)
    first = np.sort(first)
    r_paths_a = np.array(r_paths, dtype=object)[first] if len(first) else np.zeros(0, object)
    r_pos_a, r_rid_a, r_created_a, r_from_a = r_pos_a[first], r_rid_a[first], r_created_a[first], r_from_a[first]

    # Pair the readable removed images with the added ones.
    readable = np.array([iceberg.io.new_input(str(p)).exists() for p in r_paths_a], bool) if len(r_paths_a) else np.zeros(0, bool)
    lost = sorted(set(r_paths_a[~readable].tolist())) if len(r_paths_a) else []
    if lost:
        log.warning(
            "gap at version %d: %d data file(s) holding removed images are gone (e.g. %s); their rows cannot be paired",
            version, len(lost), lost[0],
        )
    n_added = int(sum(len(pos) for _, pos, _ in added))
    pairs = None
    ridx = np.flatnonzero(readable)
    native = added_lineage(iceberg, survivor, added, {p.data_file.file_path: p.sequence_number for p in planned})
    if native is not None:  # v3: the writers kept lineage; lost files need not be read
        pairs = pair_by_row_id(r_rid_a, r_from_a, native, added)
    elif len(ridx) and n_added:
        removed_rows = pa.concat_tables(
            [read_positions(str(path), r_pos_a[ridx][r_paths_a[ridx] == path], columns, schema, field_ids) for path in dict.fromkeys(r_paths_a[ridx].tolist())]
        )
        order = np.concatenate([ridx[r_paths_a[ridx] == path] for path in dict.fromkeys(r_paths_a[ridx].tolist())])
        added_rows = pa.concat_tables([read_positions(f.file_path, pos, columns, schema, field_ids) for f, pos, _ in added])
        replace_op = survivor.summary is not None and survivor.summary.operation == Operation.REPLACE
        pairs = pair_images(removed_rows, added_rows, [] if replace_op else key, columns)
        pairs = Pairs(order[pairs.removed], pairs.added, pairs.move)  # indexes into the removed images, not the rows read
    written, next_row_id, paired, moved, updates = assign_lineage(added, pairs, r_rid_a, r_created_a, r_from_a, version, base.next_row_id)
    if native is not None:
        written, next_row_id = with_native_ids(written, native, added), max(native.next_row_id, base.next_row_id)

    removed_images = []
    keep = ~moved
    for path in dict.fromkeys(r_paths_a.tolist()):
        sel = np.flatnonzero((r_paths_a == path) & keep)
        if len(sel):
            o = np.argsort(r_pos_a[sel], kind="stable")
            sel = sel[o]
            removed_images.append(RemovedImages(str(path), r_pos_a[sel], r_rid_a[sel], r_created_a[sel], r_from_a[sel], version))

    # The state at A as far as the commit needs it: A's files still live at G (the rest left in the gap).
    base_files = SnapshotFiles(
        base_snapshot.snapshot_id if base_snapshot is not None else 0,
        {f.path: f for f in carried},
        {f.path: a_segment[f.path] for f in carried},
    )
    parent = TableState(iceberg, base_snapshot, base, {"files": base_files})
    req = foreign_request(
        survivor,
        written=written,
        removed_images=removed_images,
        inserted=n_added - int(paired.sum()),
        updated=updates,
        deleted=int((~paired).sum()),
        next_row_id=next_row_id,
        gap=not known.direct,
        transform_list=None if resolved_path is None else lambda lst: replace(lst, resolved_deletes=(*(lst.resolved_deletes or ()), resolved_path)),
    )
    with overwriting():
        built = build_lineage(
            iceberg, parent, req, version=version, snapshot_id=survivor.snapshot_id, timestamp_ms=survivor.timestamp_ms, tag=tag, created=[]
        )
    if not known.direct:
        log.warning(
            "snapshots between version %d and %d were expired before they were reconciled; their net change is recorded "
            "at version %d (a gap: no change feed across it)", base.version, version, version,
        )
    return built.lineage_list

