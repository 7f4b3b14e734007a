"""Live row images with lineage, as a DuckDB view over the table's Parquet files.

The view ``name`` has the data columns, the three lineage columns, and two
hidden columns ``__file_id`` and ``__pos`` (index into the file list and row
position inside the file) that writers use to address images. Lineage is
attached by an ASOF join of each row's position with its file's runs, and
position deletes are applied with an anti join, so no per-row lineage is
ever materialised in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa

from lineage.fileio import local_path
from lineage.predicate import quote_ident
from lineage.rle import combined_breakpoints
from lineage.state import LiveFile

LINEAGE_SCHEMA = [
    pa.field("_row_id", pa.int64(), nullable=False),
    pa.field("_row_created_at_version", pa.int64(), nullable=False),
    pa.field("_row_last_updated_at_version", pa.int64(), nullable=False),
]


def register_live_view(con: duckdb.DuckDBPyConnection, name: str, files: Sequence[LiveFile], schema: pa.Schema) -> None:
    """Create the temp view ``name`` of the live images of ``files``."""
    cols = ", ".join(f"d.{quote_ident(c)}" for c in schema.names)
    if not files:
        empty = pa.schema(list(schema) + LINEAGE_SCHEMA + [pa.field("__file_id", pa.int32()), pa.field("__pos", pa.int64())])
        con.register(f"{name}__empty", pa.Table.from_batches([], schema=empty))
        con.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS SELECT * FROM {quote_ident(name + '__empty')}")
        return

    paths = [f.path for f in files]
    locals_ = [local_path(p) for p in paths]
    con.register(f"{name}__files", pa.table({"file_id": pa.array(range(len(files)), pa.int32()), "path": paths, "local": locals_}))

    run_parts = []
    for i, f in enumerate(files):
        pos, rid, created, updated = combined_breakpoints(f.lineage.row_ids, f.lineage.created, f.lineage.updated)
        run_parts.append((np.full(len(pos), i, np.int32), pos, rid, created, updated))
    runs = pa.table(
        {
            "file_id": np.concatenate([p[0] for p in run_parts]),
            "pos_start": np.concatenate([p[1] for p in run_parts]),
            "row_id_start": np.concatenate([p[2] for p in run_parts]),
            "created": np.concatenate([p[3] for p in run_parts]),
            "updated": np.concatenate([p[4] for p in run_parts]),
        }
    )
    con.register(f"{name}__runs", runs)

    delete_paths = sorted({local_path(d.file_path) for f in files for d in f.deletes})
    if delete_paths:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {quote_ident(name + '__dels')} AS "
            f"SELECT f.file_id, x.pos FROM read_parquet({_list(delete_paths)}) x "
            f"JOIN {quote_ident(name + '__files')} f ON f.path = x.file_path"
        )
        anti = (
            f"ANTI JOIN {quote_ident(name + '__dels')} x ON x.file_id = f.file_id AND x.pos = d.file_row_number"
        )
    else:
        anti = ""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS
        SELECT {cols},
               r.row_id_start + (d.file_row_number - r.pos_start) AS _row_id,
               r.created AS _row_created_at_version,
               r.updated AS _row_last_updated_at_version,
               f.file_id AS __file_id,
               d.file_row_number AS __pos
        FROM read_parquet({_list(locals_)}, filename = true, file_row_number = true) d
        JOIN {quote_ident(name + '__files')} f ON f.local = d.filename
        {anti}
        ASOF JOIN {quote_ident(name + '__runs')} r ON r.file_id = f.file_id AND d.file_row_number >= r.pos_start
        """
    )


def _list(paths: Sequence[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
