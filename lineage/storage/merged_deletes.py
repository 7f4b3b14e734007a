"""Position deletes on Iceberg v2 that replace the data file's earlier delete file instead of adding one more.

A merge-on-read write on v2 gives each data file it deletes from a position
delete file. In a stream of small commits on a large table every commit
deletes a few rows of the same large files, so each of them gathers one
delete file per commit, and every reader opens them all (on an object store a
request each). On v3 the same stream keeps one deletion vector per data file:
a commit writes the union of the file's current vector and its new positions
and removes the old vector (:mod:`lineage.storage.deletion_vectors`).

:func:`write_merged_deletes` does the same on v2: a data file that already has
a file-scoped position delete file written by this library gets one new file
holding those positions and the new ones, and the commit removes the old file
in the same snapshot (Iceberg allows a row-delta or overwrite snapshot to
remove delete files; every reader applies the snapshot's live delete files,
and the union removes exactly the rows the two did). Delete files of other
writers, and partition-scoped ones, are left as they are (their positions are
not copied either: they stay live and keep applying). A commit's own deletes
are then the new file's positions minus those already deleted at its parent,
which is how reconciliation reads any snapshot's position deletes
(:func:`lineage.reconcile.images.derive_images`), and this library's own
commits record their removed images in the deleted-rows index, not by reading
delete files. The table property ``lineage.write.delete.merge`` turns it off.

A commit that deletes from several data files of a partition (an upsert whose
keys live in the large file and in a small one) writes them one delete file
when the table leaves ``write.delete.granularity`` unset
(:func:`write_merged_deletes` with ``per_partition``): Iceberg v2 lets a
position delete file cover any data files of its partition, so a commit
writes one delete file per partition it deletes from, as it writes one Puffin
file of deletion vectors on v3. That file also takes in the positions of our
delete files that apply to those data files (any of ours, whatever files they
cover, up to ``lineage.write.delete.merge.max-rows`` positions in all), which
leave the snapshot with it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

import numpy as np
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table as IcebergTable

import lineage.properties as props
from lineage.storage.deletes import is_puffin, positions_for, read_position_deletes, referenced_data_path
from lineage.storage.deletion_vectors import VectorTarget, merge_positions, write_vectors
from lineage.storage.writer import spec_id_of, write_position_deletes

# The name :func:`lineage.storage.writer.write_position_deletes` gives a delete file: a random UUID and "-deletes".
# Spark names its delete files "<partition>-<task>-<uuid>-<n>-deletes.parquet", which this does not match.
_OWN_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-deletes\.parquet")


def is_own(delete_file: DataFile) -> bool:
    """Whether ``delete_file`` is a Parquet position delete file this library wrote (for one data file or several)."""
    return (
        delete_file.content == DataFileContent.POSITION_DELETES
        and not is_puffin(delete_file.file_path)
        and _OWN_NAME.fullmatch(posixpath.basename(delete_file.file_path)) is not None
    )


def is_own_file_scoped(delete_file: DataFile, data_path: str) -> bool:
    """Whether ``delete_file`` is a Parquet position delete file this library wrote for ``data_path`` alone."""
    return is_own(delete_file) and referenced_data_path(delete_file) == data_path


def replaceable(data_path: str, current: Sequence[DataFile]) -> list[DataFile]:
    """The delete files of ``current`` that a merged delete file of ``data_path`` replaces (see :func:`is_own_file_scoped`)."""
    return [d for d in current if is_own_file_scoped(d, data_path)]


def write_merged_deletes(
    iceberg: IcebergTable, targets: Sequence[VectorTarget], granularity: str | None = None, per_partition: bool = False
) -> tuple[list[DataFile], list[DataFile]]:
    """Write the position deletes of ``targets`` on a v2 table; return the new delete files and the ones they replace.

    Each target's ``current`` are the delete files that apply to its data file
    now. With ``lineage.write.delete.merge`` on (the default), the positions of
    the file-scoped delete files of ours among them join the new positions and
    those files are returned for the commit to remove, except files holding more
    than ``lineage.write.delete.merge.max-rows`` positions (kept: a file that keeps
    losing rows is not rewritten whole by every commit). The files are grouped
    by ``write.delete.granularity`` as before (a partition-scoped file may then
    hold a replaced file's positions: still the same rows deleted), or by
    ``granularity`` when given (Spark tasks write the file-scoped ones of a
    partition-scoped table themselves). With ``per_partition`` (a commit's
    deletes written at once) and the granularity unset, one file per
    partition (see the module docstring).
    """
    properties = iceberg.metadata.properties
    configured, limit = props.delete_granularity(properties)
    granularity = granularity or configured
    merge = bool(props.read(properties, props.DELETE_MERGE))
    most = int(props.read(properties, props.DELETE_MERGE_MAX_ROWS))
    if per_partition and merge and granularity == "auto":
        return _one_per_partition(iceberg, targets, most)
    pairs: list[tuple[DataFile, np.ndarray]] = []
    replaced: list[DataFile] = []
    for t in targets:
        path = t.data_file.file_path
        new = np.asarray(t.positions, np.int64)
        old = [d for d in replaceable(path, t.current) if d.record_count <= most] if merge and len(new) else []
        if old:
            new = merge_positions(positions_for(path, [d.file_path for d in old]), new)
            replaced.extend(old)
        pairs.append((t.data_file, new))
    return write_position_deletes(iceberg, pairs, granularity, file_scoped_limit=limit), replaced


def _one_per_partition(iceberg: IcebergTable, targets: Sequence[VectorTarget], most: int) -> tuple[list[DataFile], list[DataFile]]:
    """One position delete file per partition of ``targets``, holding their new positions and those of the delete
    files of ours that apply to them (smallest first, at most ``most`` positions in all); and those files."""
    positions: dict[str, np.ndarray] = {}
    data_files: dict[str, DataFile] = {}
    for t in targets:
        if len(t.positions):
            positions[t.data_file.file_path] = np.unique(np.asarray(t.positions, np.int64))
            data_files[t.data_file.file_path] = t.data_file
    if not positions:
        return [], []
    candidates = {d.file_path: d for t in targets if len(t.positions) for d in t.current if is_own(d) and d.record_count <= most}
    replaced: list[DataFile] = []
    total = 0
    for d in sorted(candidates.values(), key=lambda d: (d.record_count, d.file_path)):
        if total + d.record_count > most:
            break
        total += d.record_count
        replaced.append(d)
        for path, old in read_position_deletes(d.file_path).items():
            positions[path] = merge_positions(old, positions[path]) if path in positions else old
            # a data file only the replaced file names (the commit does not delete from it): in that file's partition
            data_files.setdefault(path, _stand_in(path, d, spec_id_of(d, iceberg.metadata.default_spec_id)))
    pairs = [(data_files[p], positions[p]) for p in sorted(positions)]
    return write_position_deletes(iceberg, pairs, "partition"), replaced


def _stand_in(path: str, delete_file: DataFile, spec_id: int) -> DataFile:
    """A data-file entry for ``path`` in ``delete_file``'s partition and spec (what a delete file's writer reads of it)."""
    out = DataFile.from_args(content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
                             partition=delete_file.partition, record_count=0, file_size_in_bytes=0)
    out.spec_id = spec_id
    return out


def write_file_deletes(
    iceberg: IcebergTable, targets: Sequence[VectorTarget], granularity: str | None = None, per_partition: bool = False
) -> tuple[list[DataFile], list[DataFile]]:
    """A merge-on-read write's deletes of ``targets``: deletion vectors on Iceberg v3 (:func:`write_vectors`, one
    Puffin file), merged position delete files on v2 (:func:`write_merged_deletes`, one per partition with
    ``per_partition``); the new delete files and the ones they replace."""
    if iceberg.metadata.format_version >= 3:
        return write_vectors(iceberg, targets)
    return write_merged_deletes(iceberg, targets, granularity, per_partition)
