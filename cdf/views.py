"""``<table>$changes`` and ``<table>$deleted_rows`` inside a DuckDB connection.

DuckDB cannot call Python from a table function, so each view is a table
macro (or view) over a Python scalar UDF that returns the whole result as one
list of structs, which the macro unnests. The UDF computes the feed when the
query runs, so the views always reflect the table's current state, and our
errors (retention, reversed range...) surface as DuckDB errors with our
message.

    SELECT * FROM "orders$changes"(3, 7);              -- versions (3, 7]
    SELECT * FROM "orders$changes"(3, net := true);    -- (3, current], net
    SELECT * FROM "orders$deleted_rows";
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

import cdf.api as api
import lineage.duck as duck
from cdf.output import change_schema, decode_change_columns, deleted_schema
from lineage.errors import InvalidArgumentError
from lineage.table import Table

if TYPE_CHECKING:  # a view's connection loads DuckDB; importing cdf does not
    import duckdb


def _duckdb_type(con: duckdb.DuckDBPyConnection, schema: pa.Schema) -> duckdb.DuckDBPyType:
    """The DuckDB type ``STRUCT(<schema>)[]``."""
    import duckdb  # the caller's connection has loaded it

    fields = ", ".join('"' + name.replace('"', '""') + '" ' + dtype for name, dtype in duck.duckdb_types(schema))
    return con.sqltype(f"STRUCT({fields})[]") if hasattr(con, "sqltype") else duckdb.sqltype(f"STRUCT({fields})[]")


def _as_list_array(result: pa.Table, n: int) -> pa.Array:
    """Wrap a whole result table as ``n`` identical list<struct> values (DuckDB calls with n rows)."""
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in result.columns]
    structs = pa.StructArray.from_arrays(columns, fields=list(result.schema))
    one = pa.ListArray.from_arrays(pa.array([0, len(structs)], pa.int32()), structs)
    return pa.concat_arrays([one] * n) if n != 1 else one


def _arg(values: pa.ChunkedArray | pa.Array) -> object:
    first = values[0]
    return first.as_py() if hasattr(first, "as_py") else first


def register(con: duckdb.DuckDBPyConnection, table: Table, name: str | None = None) -> str:
    """Register ``"<name>$changes"(from, to := NULL, net := false)`` and ``"<name>$deleted_rows"``.

    ``name`` defaults to the table's name without its namespace. Returns it.
    """
    from duckdb.sqltypes import BIGINT, BOOLEAN  # ``con`` has loaded DuckDB

    if not isinstance(table, Table):
        raise InvalidArgumentError(f"table must be a lineage.Table, got {type(table).__name__}")
    name = name or table.name.split(".")[-1]
    if not name or '"' in name:
        raise InvalidArgumentError(f"view name {name!r} must be non-empty and contain no double quote")
    data = table.arrow_schema
    changes_fn = f"__lineage_changes_{abs(hash((name, id(con))))}"
    deleted_fn = f"__lineage_deleted_{abs(hash((name, id(con))))}"

    def changes_udf(a: pa.ChunkedArray, b: pa.ChunkedArray, net: pa.ChunkedArray) -> pa.Array:
        to_version = _arg(b)
        result = decode_change_columns(api.changes(table, _arg(a), to_version, net=bool(_arg(net))))  # the declared (plain) types
        return _as_list_array(result, len(a))

    def deleted_udf(since: pa.ChunkedArray, until: pa.ChunkedArray) -> pa.Array:
        result = api.deleted_rows(table, _arg(since), _arg(until))
        return _as_list_array(result, len(since))

    con.create_function(changes_fn, changes_udf, [BIGINT, BIGINT, BOOLEAN], _duckdb_type(con, change_schema(data)),
                        type="arrow", null_handling="special", side_effects=True)
    con.create_function(deleted_fn, deleted_udf, [BIGINT, BIGINT], _duckdb_type(con, deleted_schema(data)),
                        type="arrow", null_handling="special", side_effects=True)
    q = '"' + name
    con.execute(
        f'CREATE OR REPLACE TEMP MACRO {q}$changes"(from_version, to_version := NULL, net := false) AS TABLE '
        f"SELECT unnest({changes_fn}(from_version, to_version, net), recursive := true)"
    )
    con.execute(
        f'CREATE OR REPLACE TEMP MACRO {q}$deleted_rows_between"(since := NULL, until := NULL) AS TABLE '
        f"SELECT unnest({deleted_fn}(since, until), recursive := true)"
    )
    con.execute(f'CREATE OR REPLACE TEMP VIEW {q}$deleted_rows" AS SELECT * FROM {q}$deleted_rows_between"()')
    return name
