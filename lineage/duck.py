"""DuckDB connections with the extensions this project uses, loaded from wheels.

Extensions come from the ``duckdb-extension-*`` PyPI wheels installed next to
duckdb and are loaded by file path; DuckDB never downloads anything.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import threading

import duckdb

from lineage.errors import LineageError


def extension_path(name: str) -> str:
    """Path of the ``name`` extension binary shipped by its PyPI wheel."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        raise LineageError(f"the DuckDB extension {name!r} is not installed; pip install duckdb-extension-{name}")
    root = list(spec.submodule_search_locations)[0]
    hits = sorted(glob.glob(os.path.join(root, "extensions", "*", f"{name}.duckdb_extension")))
    if not hits:
        raise LineageError(f"the duckdb-extension-{name} wheel has no extension binary under {root}")
    return hits[-1]


def connect(*extensions: str) -> duckdb.DuckDBPyConnection:
    """A new connection to an in-memory DuckDB database with ``extensions`` loaded from their wheels.

    Connections are cursors of one database per process and set of
    extensions: opening a database costs tens of milliseconds (a large share
    of a small commit), a cursor much less. Everything this project creates
    in DuckDB is TEMP or registered, hence private to its connection, and
    closing the connection drops it.
    """
    needed = list(extensions)
    if "iceberg" in needed and "avro" not in needed:
        needed.insert(0, "avro")  # the iceberg extension reads manifests through avro
    con = _database(tuple(needed)).cursor()
    # DuckDB 1.5 runs small-looking ASOF joins as nested loops (rows x runs); lineage runs need the sort-merge plan.
    con.execute("SET asof_loop_join_threshold = 0")
    return con


_DATABASES: dict[tuple[int, tuple[str, ...]], duckdb.DuckDBPyConnection] = {}
_DATABASES_LOCK = threading.Lock()


def _database(extensions: tuple[str, ...]) -> duckdb.DuckDBPyConnection:
    """The process's database with ``extensions`` loaded (a forked child opens its own)."""
    key = (os.getpid(), extensions)
    with _DATABASES_LOCK:
        db = _DATABASES.get(key)
        if db is None:
            db = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
            for name in extensions:
                db.execute(f"LOAD '{extension_path(name)}'")
            _DATABASES[key] = db
        return db


def fetch_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> "pa.Table":
    """The result of ``sql`` as an Arrow table, materialised in DuckDB first.

    Exporting a query over the ``live`` view straight to Arrow
    (``to_arrow_table`` or a record-batch reader) hung forever, with no CPU
    used, in DuckDB 1.5.5 on a 10M-row table whose view had both branches
    (single-run files and ASOF-joined multi-run files); ``CREATE TABLE AS``
    of the same query, then exporting that table, takes 1.5 s. Row order is
    kept (DuckDB preserves insertion order).
    """
    name = f"__result_{next(_RESULTS)}"
    con.execute(f"CREATE TEMP TABLE {name} AS {sql}")
    try:
        return con.execute(f"SELECT * FROM {name}").to_arrow_table()
    finally:
        con.execute(f"DROP TABLE IF EXISTS {name}")


_RESULTS = itertools.count()


def duckdb_types(schema: "pa.Schema") -> list[tuple[str, str]]:
    """``(column, DuckDB type)`` for each field of an Arrow schema."""
    import pyarrow as pa

    scratch = connect()
    try:
        scratch.register("probe", pa.Table.from_batches([], schema=schema))
        return [(row[0], row[1]) for row in scratch.execute("DESCRIBE probe").fetchall()]
    finally:
        scratch.close()
