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
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

import numpy as np
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table as IcebergTable

import lineage.properties as props
from lineage.storage.deletes import is_puffin, positions_for, referenced_data_path
from lineage.storage.deletion_vectors import VectorTarget, merge_positions, write_vectors
from lineage.storage.writer import write_position_deletes

# The name :func:`lineage.storage.writer.write_position_deletes` gives a delete file: a random UUID and "-deletes".
# Spark names its delete files "<partition>-<task>-<uuid>-<n>-deletes.parquet", which this does not match.
_OWN_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-deletes\.parquet")


def is_own_file_scoped(delete_file: DataFile, data_path: str) -> bool:
    """Whether ``delete_file`` is a Parquet position delete file this library wrote for ``data_path`` alone."""
    return (
        delete_file.content == DataFileContent.POSITION_DELETES
        and not is_puffin(delete_file.file_path)
        and referenced_data_path(delete_file) == data_path
        and _OWN_NAME.fullmatch(posixpath.basename(delete_file.file_path)) is not None
    )


def replaceable(data_path: str, current: Sequence[DataFile]) -> list[DataFile]:
    """The delete files of ``current`` that a merged delete file of ``data_path`` replaces (see :func:`is_own_file_scoped`)."""
    return [d for d in current if is_own_file_scoped(d, data_path)]


def write_merged_deletes(
    iceberg: IcebergTable, targets: Sequence[VectorTarget], granularity: str | None = None
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
    partition-scoped table themselves).
    """
    properties = iceberg.metadata.properties
    configured, limit = props.delete_granularity(properties)
    granularity = granularity or configured
    merge = bool(props.read(properties, props.DELETE_MERGE))
    most = int(props.read(properties, props.DELETE_MERGE_MAX_ROWS))
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


def write_file_deletes(
    iceberg: IcebergTable, targets: Sequence[VectorTarget], granularity: str | None = None
) -> tuple[list[DataFile], list[DataFile]]:
    """A merge-on-read write's deletes of ``targets``: deletion vectors on Iceberg v3 (:func:`write_vectors`), merged
    position delete files on v2 (:func:`write_merged_deletes`); the new delete files and the ones they replace."""
    if iceberg.metadata.format_version >= 3:
        return write_vectors(iceberg, targets)
    return write_merged_deletes(iceberg, targets, granularity)
