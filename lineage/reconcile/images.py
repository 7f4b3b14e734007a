"""The row images one foreign snapshot removed and added (docs/design.md, "Foreign commits": the Iceberg v2 rules).

Removed images, each live at the parent P:
(a) every live row of a data file the snapshot removed;
(b) rows newly covered by its position delete files;
(c) rows its equality delete files match (data files of a strictly lower
    data sequence number, same partition or global; :mod:`lineage.iceberg.equality`).
Added images: the rows of the data files it added, less the positions its own
position deletes (and any equality delete that applies to them) remove.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile

from index.key_index import KeyIndex
import lineage.read.values as values
from lineage.storage.deletes import live_positions, positions_for, read_position_deletes
from lineage.iceberg.equality import Candidate, EqualityDelete, applies_to, resolve_equality_deletes
from lineage.iceberg.planning import sequence_of
from lineage.reconcile.changes import SnapshotChanges
from lineage.state import LiveFile, TableState

log = logging.getLogger(__name__)

_EMPTY = np.zeros(0, np.int64)


@dataclass
class Images:
    """Removed images by data file (positions live at P) and added files with their live positions."""

    removed: dict[str, np.ndarray] = field(default_factory=dict)  # P's data file -> removed positions
    added: list[tuple[DataFile, np.ndarray, np.ndarray]] = field(default_factory=list)  # file, live positions, dead positions
    resolved: dict[str, np.ndarray] = field(default_factory=dict)  # positions the snapshot's equality deletes remove
    # The parent's key index when equality deletes were looked up in it; built here when the parent had none
    # (a deferred bulk append, an equality-strategy stream), so the commit carries it forward.
    index: KeyIndex | None = None


def _union(target: dict[str, np.ndarray], path: str, pos: np.ndarray, *, sorted_unique: bool = False) -> None:
    if len(pos):
        if path in target:
            target[path] = np.union1d(target[path], pos)
        else:
            target[path] = np.asarray(pos, np.int64) if sorted_unique else np.unique(np.asarray(pos, np.int64))


def derive_images(parent: TableState, changes: SnapshotChanges) -> Images:
    """The removed and added images of the snapshot ``changes`` describes, on top of ``parent``."""
    live: dict[str, LiveFile] = parent.files().files if parent.snapshot is not None else {}
    dead_cache: dict[str, np.ndarray] = {}

    def dead_at_parent(path: str) -> np.ndarray:
        if path not in dead_cache:
            dead_cache[path] = positions_for(path, live[path].delete_paths)
        return dead_cache[path]

    out = Images()
    removed_paths = {f.file_path for f in changes.removed}
    for f in changes.removed:
        if f.file_path not in live:
            log.warning("snapshot %s removes %s, which was not live before it", changes.snapshot.snapshot_id, f.file_path)
            continue
        _union(out.removed, f.file_path, live_positions(f.record_count, dead_at_parent(f.file_path)), sorted_unique=True)

    added_paths = {e.data_file.file_path: e for e in changes.added}
    own_dead: dict[str, np.ndarray] = {}
    for entry in changes.position_deletes:
        for path, pos in read_position_deletes(entry.data_file.file_path).items():
            if path in added_paths:
                if sequence_of(added_paths[path]) <= sequence_of(entry):
                    _union(own_dead, path, pos)
            elif path in live and path not in removed_paths:
                _union(out.removed, path, np.setdiff1d(pos, dead_at_parent(path)))

    if changes.equality_deletes:
        _equality(parent, changes, live, removed_paths, dead_at_parent, out, own_dead)

    for entry in changes.added:
        f = entry.data_file
        dead = own_dead.get(f.file_path, _EMPTY)
        dead = dead[dead < f.record_count]
        out.added.append((f, live_positions(f.record_count, dead), dead))
    return out


def _equality(parent, changes, live, removed_paths, dead_at_parent, out: Images, own_dead) -> None:  # type: ignore[no-untyped-def]
    """Removed images of the snapshot's equality deletes (and positions of its own files they remove)."""
    candidates = [Candidate(f.data_file, f.sequence_number or 0) for p, f in live.items() if p not in removed_paths]
    candidates += [Candidate(e.data_file, sequence_of(e)) for e in changes.added]
    # Built when missing: one scan of the key columns, carried forward by the reconciled list, instead of a
    # scan of every candidate file for every equality commit.
    index = KeyIndex.open(parent) if parent.snapshot is not None else None
    out.index = index
    lookup = None
    if index is not None and not any(c.data_file.file_path not in live for c in candidates if _may_apply(changes.equality_deletes, c)):

        def lookup(keys: pa.Table) -> list[tuple[str, int]]:
            hits = index.lookup(keys)
            return list(zip(hits.column("__file_path").to_pylist(), hits.column("__pos").to_pylist(), strict=True))

    resolved = resolve_equality_deletes(
        parent.iceberg.schema(),
        changes.equality_deletes,
        candidates,
        key_names=index.names if index is not None else (),
        lookup=lookup,
    )
    for hits in resolved.values():
        for path, pos in hits.items():
            _union(out.resolved, path, pos)
            if path in live:
                _union(out.removed, path, np.setdiff1d(pos, dead_at_parent(path)))
            else:
                _union(own_dead, path, pos)


def _may_apply(deletes: list[EqualityDelete], candidate: Candidate) -> bool:
    return any(applies_to(d, candidate) for d in deletes)


def read_positions(path: str, positions: np.ndarray, names: list[str], arrow_schema: pa.Schema,
                   field_ids: dict[str, int] | None) -> pa.Table:
    """The ``names`` columns of the rows at ``positions`` of the data file at ``path`` (columns it lacks read as null).

    Reads only the row groups holding ``positions`` (:func:`lineage.read.values.read_positions`), by Iceberg
    field id when ``field_ids`` is given (:func:`lineage.iceberg.schema.projection_field_ids`): a file written
    before a column was renamed must pair with its rewritten copy, not read that column as null.
    """
    wanted = pa.schema([arrow_schema.field(n) for n in names])
    return values.read_positions(path, np.asarray(positions, np.int64), wanted, field_ids)
