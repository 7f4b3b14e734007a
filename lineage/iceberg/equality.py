"""Resolving equality delete files to the positions they remove, and our resolved-delete files.

An equality delete file (what Flink's sink writes) names rows by the values of
its ``equality_ids`` columns. By the Iceberg spec ("Scan Planning") a delete
file with data sequence number ``d`` removes every row of a data file whose
data sequence number is **strictly** lower than ``d``, in the same partition
(same spec and partition tuple), or in every partition when the delete file's
spec is unpartitioned (a global delete), whose equality columns equal the
delete row's; NULL matches NULL.

:func:`resolve_equality_deletes` answers, for each equality delete file, the
positions per data file it removes. It is shared by the reconciliation of
foreign snapshots (:mod:`lineage.reconcile`), and is meant for CONVERT and
adoption too. Two ways to find the rows:

* ``lookup``: when the equality columns are the table key and the caller
  has the key index of the state the deletes apply to, the keys are looked up
  in it (O(deleted keys));
* otherwise every candidate data file's equality columns are read and
  joined with the delete rows (a scan of the candidates: the documented
  fallback for deletes on other columns and for keyless tables).

Resolved positions are kept as **resolved-delete files** (Parquet with the
columns ``file_path`` and ``pos`` like an Iceberg position delete file, tagged
``lineage-resolved-deletes`` format 1) under ``metadata/_lineage``. They are
not Iceberg files: the lineage list names them and
:meth:`lineage.state.TableState.files` attaches them to the live files, so
every reader of ours that applies position deletes applies them too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.schema import Schema

import lineage.duck as duck
from lineage.errors import LineageMetadataError
from lineage.storage.fileio import local_path
from lineage.storage.metadata import write_tagged_parquet
from lineage.sql.predicate import quote_ident
import lineage.storage.files as store
from lineage.read.values import file_columns, layout

RESOLVED_FORMAT = "lineage-resolved-deletes"
_RESOLVED_SCHEMA = pa.schema([pa.field("file_path", pa.string(), nullable=False), pa.field("pos", pa.int64(), nullable=False)])


@dataclass(frozen=True)
class Candidate:
    """A data file an equality delete may apply to: the file, its data sequence number, and its spec's partitioning."""

    data_file: DataFile
    sequence_number: int


@dataclass(frozen=True)
class EqualityDelete:
    """An equality delete file with its data sequence number and whether its spec is unpartitioned (global)."""

    delete_file: DataFile
    sequence_number: int
    is_global: bool


# A key-index lookup: key table (columns named as the key) -> (data file path, position) per live key found.
KeyLookup = Callable[[pa.Table], list[tuple[str, int]]]


def applies_to(delete: EqualityDelete, candidate: Candidate) -> bool:
    """Whether ``delete`` applies to ``candidate`` by sequence number and partition (the spec's rule)."""
    if candidate.sequence_number >= delete.sequence_number:
        return False
    if delete.is_global:
        return True
    d, f = delete.delete_file, candidate.data_file
    return (d.spec_id or 0) == (f.spec_id or 0) and d.partition == f.partition


def equality_columns(schema: Schema, delete_file: DataFile) -> list[str]:
    """Names of the equality columns of ``delete_file`` in ``schema`` (ordered by field id)."""
    if delete_file.content != DataFileContent.EQUALITY_DELETES or not delete_file.equality_ids:
        raise LineageMetadataError(f"{delete_file.file_path} is not an equality delete file with equality ids")
    try:
        names = [schema.find_column_name(fid) for fid in sorted(delete_file.equality_ids)]
    except ValueError as exc:
        raise LineageMetadataError(f"equality delete {delete_file.file_path} names a column the schema lacks: {exc}") from None
    missing = [fid for fid, name in zip(sorted(delete_file.equality_ids), names, strict=True) if name is None]
    if missing:  # pyiceberg answers None for an id no column has (a column dropped after the deletes were written)
        raise LineageMetadataError(f"equality delete {delete_file.file_path} names a column the schema lacks: field id(s) {missing}")
    return names  # type: ignore[return-value]


def _file_columns(path: str, file_schema: pa.Schema, names: Sequence[str], ids: Sequence[int]) -> list[str]:
    """The columns of the file at ``path`` holding the equality columns ``names`` (field ids ``ids``), matched by
    field id, so a delete or data file written before a column was renamed is read by what it holds."""
    found = file_columns(file_schema, pa.schema([pa.field(n, pa.null()) for n in names]), dict(zip(names, ids, strict=True)))
    missing = [n for n, c in zip(names, found, strict=True) if c is None]
    if missing:
        raise LineageMetadataError(f"{path} has no column for the equality column(s) {missing}")
    return [c for c in found if c is not None]


def read_delete_rows(delete_file: DataFile, names: Sequence[str]) -> pa.Table:
    """The equality columns of an equality delete file (distinct rows), named ``names`` (see :func:`equality_columns`)."""
    pf = pq.ParquetFile(store.source(delete_file.file_path))
    columns = _file_columns(delete_file.file_path, pf.schema_arrow, names, sorted(delete_file.equality_ids))
    table = pf.read(columns=columns, use_threads=False).rename_columns(list(names))
    return table.group_by(list(names)).aggregate([]) if table.num_rows else table


def match_positions(data_path: str, names: Sequence[str], keys: pa.Table, ids: Sequence[int]) -> np.ndarray:
    """Sorted positions of the rows of ``data_path`` whose ``names`` columns (field ids ``ids``) equal a row of
    ``keys`` (NULL = NULL)."""
    if not keys.num_rows:
        return np.zeros(0, np.int64)
    columns = _file_columns(data_path, layout(local_path(data_path)).arrow, names, ids)
    con = duck.connect()
    try:
        con.register("k", keys)
        on = " AND ".join(f"d.{quote_ident(n)} IS NOT DISTINCT FROM k.{quote_ident(n)}" for n in names)
        cols = ", ".join(f"{quote_ident(c)} AS {quote_ident(n)}" for c, n in zip(columns, names, strict=True))
        path = local_path(data_path).replace("'", "''")
        found = con.execute(
            f"SELECT d.file_row_number AS pos FROM (SELECT {cols}, file_row_number FROM "
            f"read_parquet('{path}', file_row_number = true, hive_partitioning = false)) d "
            f"SEMI JOIN k ON {on} ORDER BY 1"
        ).fetchnumpy()["pos"]
    finally:
        con.close()
    return np.asarray(found, np.int64)


def resolve_equality_deletes(
    schema: Schema,
    deletes: Sequence[EqualityDelete],
    candidates: Sequence[Candidate],
    *,
    key_names: Sequence[str] = (),
    lookup: KeyLookup | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """For each equality delete file (by path): data file path -> sorted positions it removes.

    ``candidates`` are the data files the deletes may apply to (each delete
    picks those its sequence number and partition allow). When a delete's
    equality columns are exactly ``key_names`` and ``lookup`` is given, its
    keys are looked up instead of scanning the candidates; a lookup sees only
    what it indexes (the live images of one state), which is what a caller
    reconciling a snapshot on top of that state needs. Positions already
    deleted by other delete files are included: callers subtract what they know.
    """
    out: dict[str, dict[str, np.ndarray]] = {}
    for delete in deletes:
        names = equality_columns(schema, delete.delete_file)
        keys = read_delete_rows(delete.delete_file, names)
        targets = {c.data_file.file_path: c for c in candidates if applies_to(delete, c)}
        hits: dict[str, np.ndarray] = {}
        if lookup is not None and sorted(names) == sorted(key_names) and keys.num_rows:
            found: dict[str, list[int]] = {}
            for path, pos in lookup(keys):
                if path in targets:
                    found.setdefault(path, []).append(pos)
            hits = {p: np.unique(np.array(v, np.int64)) for p, v in found.items()}
        else:
            for path in targets:
                pos = match_positions(path, names, keys, sorted(delete.delete_file.equality_ids))
                if len(pos):
                    hits[path] = pos
        out[delete.delete_file.file_path] = hits
    return out


def merge_positions(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Union of several ``data file -> positions`` maps."""
    out: dict[str, np.ndarray] = {}
    for part in parts:
        for path, pos in part.items():
            out[path] = np.union1d(out[path], pos) if path in out else np.asarray(pos, np.int64)
    return out


def write_resolved_deletes(fileio: FileIO, path: str, positions: Mapping[str, np.ndarray]) -> int:
    """Write a resolved-delete file (``file_path``, ``pos`` rows sorted by path and position); return its size."""
    paths = sorted(p for p, pos in positions.items() if len(pos))
    table = pa.table(
        {
            "file_path": pa.array([p for p in paths for _ in range(len(positions[p]))], pa.string()),
            "pos": pa.array(np.concatenate([np.sort(positions[p]) for p in paths]) if paths else np.zeros(0, np.int64), pa.int64()),
        },
        schema=_RESOLVED_SCHEMA,
    )
    return write_tagged_parquet(fileio, path, table, RESOLVED_FORMAT)
