"""Live row images with lineage, as a DuckDB view over the table's Parquet files.

The view ``name`` has the data columns, the three lineage columns, and two
hidden columns ``__file_id`` and ``__pos`` (index into the file list and row
position inside the file) that writers use to address images. Lineage is
attached by an ASOF join of each row's position with its file's runs, and
position deletes are applied with an anti join, so no per-row lineage is
ever materialised in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from lineage.duck import duckdb_types
import lineage.columns as columns
from lineage.storage.deletes import is_puffin, vector_table
from lineage.storage.fileio import local_path
from lineage.sql.predicate import quote_ident
from lineage.storage.rle import combined_breakpoints
from lineage.state import LiveFile

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

LINEAGE_SCHEMA = columns.LINEAGE_SCHEMA  # the lineage columns a scan adds (lineage.columns)


def file_paths(files: Sequence[LiveFile], copies: Mapping[str, str] | None = None) -> list[str]:
    """The local paths :func:`register_live_view` reads for ``files``: data files, then their delete files."""
    local = _localizer(copies)
    data = [local(f.path) for f in files]
    return data + sorted({local(d) for f in files for d in f.delete_paths} - set(data))


def _localizer(copies: Mapping[str, str] | None) -> Callable[[str], str]:
    """How a file's location is read: its local copy (see :func:`lineage.storage.prefetch.local_copies`) or itself."""
    if not copies:
        return local_path
    return lambda p: copies.get(p) or local_path(p)


def register_live_view(
    con: duckdb.DuckDBPyConnection,
    name: str,
    files: Sequence[LiveFile],
    schema: pa.Schema,
    field_ids: dict[str, int] | None = None,
    *,
    keys: tuple[str, Sequence[str]] | None = None,
    copies: Mapping[str, str] | None = None,
) -> list[str]:
    """Create the temp view ``name`` of the live images of ``files``; return the local paths it reads.

    ``copies`` maps locations to local copies read instead (files fetched from an object store beforehand).

    With ``field_ids`` (column name → Iceberg field id) Parquet columns are
    matched by field id, as Iceberg requires: columns added after a file was
    written read as null, and renamed columns keep their values. The paths
    (data and delete files) are what :func:`lineage.duck.seal` should allow.
    """
    cols = ", ".join(f"d.{quote_ident(c)}" for c in schema.names)
    if not files:
        empty = pa.schema(list(schema) + LINEAGE_SCHEMA + [pa.field("__file_id", pa.int32()), pa.field("__pos", pa.int64())])
        con.register(f"{name}__empty", pa.Table.from_batches([], schema=empty))
        con.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS SELECT * FROM {quote_ident(name + '__empty')}")
        return []

    paths = [f.path for f in files]
    local = _localizer(copies)
    locals_ = [local(p) for p in paths]
    con.register(f"{name}__files", pa.table({"file_id": pa.array(range(len(files)), pa.int32()), "path": paths, "local": locals_}))

    # Files written by one append have a single run: lineage is arithmetic on the
    # position (hash join on a tiny table). Only files with several runs (updates,
    # rewrites) need the ASOF join of positions with run starts.
    single, multi = [], []
    for i, f in enumerate(files):
        pos, rid, created, updated = combined_breakpoints(f.lineage.row_ids, f.lineage.created, f.lineage.updated)
        target = single if len(pos) == 1 else multi
        target.append((np.full(len(pos), i, np.int32), pos, rid, created, updated))
    for label, parts in (("single", single), ("runs", multi)):
        if parts:
            con.register(
                f"{name}__{label}",
                pa.table(
                    {
                        "file_id": np.concatenate([p[0] for p in parts]),
                        "pos_start": np.concatenate([p[1] for p in parts]),
                        "row_id_start": np.concatenate([p[2] for p in parts]),
                        "created": np.concatenate([p[3] for p in parts]),
                        "updated": np.concatenate([p[4] for p in parts]),
                    }
                ),
            )

    delete_paths = sorted({local(d) for f in files for d in f.delete_paths if not is_puffin(d)})
    vectors = sorted({d for f in files for d in f.delete_paths if is_puffin(d)})  # Iceberg v3 deletion vectors
    if vectors:
        con.register(f"{name}__dvs", vector_table(vectors, set(paths)))
    if delete_paths or vectors:
        sources = [f"SELECT file_path, pos FROM read_parquet({_list(delete_paths)}, hive_partitioning = false)"] if delete_paths else []
        sources += [f"SELECT file_path, pos FROM {quote_ident(name + '__dvs')}"] if vectors else []
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {quote_ident(name + '__dels')} AS "
            f"SELECT f.file_id, x.pos FROM ({' UNION ALL '.join(sources)}) x "
            f"JOIN {quote_ident(name + '__files')} f ON f.path = x.file_path"
        )
        delete_paths += vectors

    by_id = ""
    if field_ids:
        entries = ", ".join(
            f"{field_ids[col]}: {{name: {_string(col)}, type: {_string(dtype)}, default_value: NULL}}" for col, dtype in duckdb_types(schema)
        )
        by_id = f", schema = MAP {{{entries}}}"

    def source(group: list[tuple[np.ndarray, ...]]) -> str:
        # file_index (position in the list read) maps to our file id by a constant
        # lookup: no join, so filters and semi joins reach the Parquet scan.
        # Iceberg partition folders look like Hive's (name=x/): never read values from paths.
        ids = sorted({int(p[0][0]) for p in group})
        lookup = f"CAST(([{', '.join(map(str, ids))}])[CAST(r.file_index AS BIGINT) + 1] AS INTEGER)"
        semi = ""
        if keys is not None:
            on = " AND ".join(f"k.{quote_ident(c)} = r.{quote_ident(c)}" for c in keys[1])
            semi = f" SEMI JOIN {quote_ident(keys[0])} k ON {on}"
        rows = (
            f"(SELECT r.*, {lookup} AS file_id "
            f"FROM read_parquet({_list([locals_[i] for i in ids])}, file_row_number = true, hive_partitioning = false{by_id}) r{semi})"
        )
        if not delete_paths:
            return rows
        return (
            f"(SELECT d.* FROM {rows} d "
            f"ANTI JOIN {quote_ident(name + '__dels')} x ON x.file_id = d.file_id AND x.pos = d.file_row_number)"
        )

    branches = []
    if single:
        branches.append(
            f"SELECT {cols}, r.row_id_start + (d.file_row_number - r.pos_start) AS _row_id, r.created AS _row_created_at_version, "
            f"r.updated AS _row_last_updated_at_version, d.file_id AS __file_id, d.file_row_number AS __pos "
            f"FROM {source(single)} d JOIN {quote_ident(name + '__single')} r ON r.file_id = d.file_id"
        )
    if multi:
        branches.append(
            f"SELECT {cols}, r.row_id_start + (d.file_row_number - r.pos_start) AS _row_id, r.created AS _row_created_at_version, "
            f"r.updated AS _row_last_updated_at_version, d.file_id AS __file_id, d.file_row_number AS __pos "
            f"FROM {source(multi)} d ASOF JOIN {quote_ident(name + '__runs')} r "
            f"ON r.file_id = d.file_id AND d.file_row_number >= r.pos_start"
        )
    con.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS " + " UNION ALL ".join(branches))
    return file_paths(files, copies)


def _string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _list(paths: Sequence[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
