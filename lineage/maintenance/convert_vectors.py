"""CONVERT on Iceberg v3 tables: equality deletes become deletion vectors, never position delete files.

Format version 3 keeps equality delete files (Flink's sink writes them) but
forbids adding position delete files: every position delete is a deletion
vector, at most one per data file in a snapshot, and a new vector must hold
every position the file's current vector and position delete files remove,
which leave the snapshot in the same commit (spec, "Deletion Vectors" and
"Scan Planning"). So CONVERT resolves the equality deletes to positions
exactly as on v2 (:mod:`lineage.maintenance.convert`), and then, per affected
data file, writes one vector: those positions plus the file's current ones
(:func:`lineage.storage.deletion_vectors.write_vectors`, which also names the
vector and the file-scoped position delete files it replaces).

**Sequence number.** A deletion vector applies to the data file whose path it
names when that file's data sequence number is *at most* the vector's (and
the partition is the same). Every data file CONVERT writes a vector for is
live in the snapshot it plans on, so its data sequence number is below the
CONVERT snapshot's: the vector simply inherits the commit's sequence number,
as every vector of an ordinary delete does. Carrying the lowest sequence
number of the equality deletes replaced (what CONVERT does on v2, for
position delete files) would also be allowed, since each of them is above the
data file's, but it is not needed, and a merged vector has no single such
number: it also holds the positions of the file's current vector, written at
another sequence number. The spec's rule is by path, so no other data file is
affected either way.

**Row ids.** CONVERT adds deletion vectors and removes delete files; it
writes no data file, so no row's ``_row_id`` or
``_last_updated_sequence_number`` changes for any reader. (An equality
writer's update is a delete by key plus an insert: the new image got a fresh
``_row_id`` when that writer committed; rewriting it now with the old id
would change an id readers already returned at that snapshot.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from lineage.iceberg.planning import plan_snapshot
from lineage.storage.deletes import positions_for
from lineage.storage.deletion_vectors import VectorTarget, write_vectors


@dataclass(frozen=True)
class VectorConversion:
    """The deletion vectors one CONVERT attempt writes on a v3 table, and the delete entries they replace."""

    vectors: list[DataFile]  # one new deletion vector per affected data file (one Puffin file)
    replaced: list[DataFile]  # the files' current vectors and file-scoped position delete files
    positions: int  # positions the equality deletes remove that no current delete removed yet


def current_deletes(iceberg: IcebergTable, snapshot: Snapshot) -> dict[str, tuple[DataFile, ...]]:
    """The position delete files and deletion vectors that apply to each live data file of ``snapshot``, by path."""
    return {p.data_file.file_path: p.position_deletes for p in plan_snapshot(iceberg, snapshot)}


def write_conversion_vectors(
    iceberg: IcebergTable,
    groups: Mapping[str, Sequence[np.ndarray]],
    targets: Mapping[str, DataFile],
    current: Mapping[str, Sequence[DataFile]],
    created: list[str],
) -> VectorConversion:
    """One deletion vector per data file of ``groups`` (resolved positions), merged with its ``current`` deletes.

    Paths of the files written are appended to ``created``. A data file whose
    resolved positions are all deleted already gets no vector: its current
    deletes stay as they are.
    """
    wanted: list[VectorTarget] = []
    positions = 0
    for path, parts in sorted(groups.items()):
        now = tuple(d for d in current.get(path, ()) if d.content == DataFileContent.POSITION_DELETES)
        new = np.setdiff1d(np.unique(np.concatenate(parts)), positions_for(path, [d.file_path for d in now]))
        if len(new):
            positions += len(new)
            wanted.append(VectorTarget(targets[path], new.astype(np.int64), now))
    vectors, replaced = write_vectors(iceberg, wanted)
    created.extend(sorted({f.file_path for f in vectors}))
    return VectorConversion(vectors, replaced, positions)
