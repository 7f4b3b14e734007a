"""The public entry points of materialized views: ``create``, ``open_view``, ``refresh``, ``spark_refresh_job``."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog

from cdf.mv.engines import duckdb_connection
from cdf.mv.query import GROUP_KEY, GROUP_ROWS, SRC_ROW_ID, ViewQuery, ViewQueryError, parse
from cdf.mv.stored import load, storage_schema
from cdf.mv.view import (
    PROP_DEFINITION,
    PROP_QUERY,
    PROP_SHAPE,
    PROP_SOURCE,
    PROP_SOURCE_UUID,
    MaterializedView,
    RefreshResult,
)
import lineage.duck as duck
from lineage.properties import METADATA_DELETE_AFTER_COMMIT, METADATA_PREVIOUS_VERSIONS_MAX
from lineage.catalog import identifier, resolve_catalog
from lineage.errors import InvalidArgumentError, LineageError, TableNotFoundError
from lineage.table import Table, create_table, open_table

log = logging.getLogger("cdf.mv")


class ViewNotFoundError(TableNotFoundError):
    """The named table does not exist or is not a materialized view."""


def _view_schema(query: ViewQuery, source: Table) -> tuple[pa.Schema, dict[str, str]]:
    """The view table's Arrow schema and DuckDB types, from DuckDB's binding of the query over the source schema."""
    probe = pa.schema(list(source.arrow_schema) + [pa.field("_row_id", pa.int64())])
    con = duckdb_connection()
    try:
        duck.seal(con)  # typing binds the query's fragments; no file is needed
        con.register("src", pa.Table.from_batches([], schema=probe))

        def typeof(sql: str, what: str) -> str:
            try:
                return con.execute(f"DESCRIBE SELECT {sql} AS x FROM src").fetchall()[0][1]
            except duckdb.Error as exc:
                raise ViewQueryError(f"{what} does not work on the source's columns: {exc}") from None

        if query.where_duck:
            t = typeof(query.where_duck, f"WHERE {query.where_duck}")
            if t not in ("BOOLEAN", '"NULL"', "NULL"):
                raise ViewQueryError(f"WHERE {query.where_duck} is of type {t}, not a boolean condition")
        types: dict[str, str] = {}
        for c in query.columns:
            if c.kind == "expr":
                t = typeof(c.duck, f"the select item {c.name!r}")  # type: ignore[arg-type]
            elif c.kind in ("count", "count_star"):
                if c.duck:
                    typeof(f"COUNT({c.duck})", f"the select item {c.name!r}")
                t = "BIGINT"
            else:
                t = typeof(f"{c.function}({c.duck})", f"the select item {c.name!r}")
                if c.kind == "sum" and t in ("HUGEINT", "UHUGEINT"):
                    t = "BIGINT"  # sums of integer columns are stored as 64-bit integers
                if c.kind == "avg":
                    st = typeof(f"SUM({c.duck})", f"the select item {c.name!r}")
                    types[c.hidden()[0]] = "BIGINT" if st in ("HUGEINT", "UHUGEINT") else st
            if t in ('"NULL"', "NULL"):
                raise ViewQueryError(f"the select item {c.name!r} is always NULL; give it a type with CAST(... AS <type>)")
            types[c.name] = t
            if c.kind == "sum":
                types[c.hidden()[0]] = "BIGINT"
            if c.kind == "avg":
                types[c.hidden()[1]] = "BIGINT"
        if query.shape == "projection":
            types[SRC_ROW_ID] = "BIGINT"
        else:
            types[GROUP_KEY] = "VARCHAR"
            types[GROUP_ROWS] = "BIGINT"
        order = query.storage_columns()
        return storage_schema(con, types, order), {n: types[n] for n in order}
    finally:
        con.close()


def create(
    name: str,
    source: Table,
    query: str,
    *,
    warehouse: str | os.PathLike[str] | None = None,
    catalog: Catalog | None = None,
) -> MaterializedView:
    """Define a materialized view ``name`` over ``source`` (a :class:`lineage.Table`).

    The query is validated now (unsupported shapes raise
    :class:`~cdf.mv.query.ViewQueryError`, an ``InvalidArgumentError``); the
    view's table is created empty, and the first :meth:`MaterializedView.refresh`
    fills it. The view lives in the source's catalog unless ``warehouse`` or
    ``catalog`` names another view of the same catalog.
    """
    if not isinstance(source, Table):
        raise InvalidArgumentError(f"source must be a lineage.Table (from lineage.open_table), got {type(source).__name__}")
    cat = resolve_catalog(warehouse, catalog) if (warehouse is not None or catalog is not None) else source.catalog
    try:
        same = open_table(source.name, catalog=cat)
    except TableNotFoundError:
        raise InvalidArgumentError(
            f"the source table {source.name} is not in the view's catalog; create the view in the source's catalog"
        ) from None
    if str(same.iceberg.metadata.table_uuid) != str(source.iceberg.metadata.table_uuid):
        raise InvalidArgumentError(f"the view's catalog has another table named {source.name}; create the view in the source's catalog")
    ns, tbl = identifier(name)
    if f"{ns}.{tbl}" == source.name:
        raise InvalidArgumentError("a view cannot have the same name as its source table")
    parsed = parse(query, source.name, source.arrow_schema.names)
    schema, types = _view_schema(parsed, source)
    parsed = dataclasses.replace(parsed, types=types)
    key = [SRC_ROW_ID] if parsed.shape == "projection" else [GROUP_KEY]
    props = {
        PROP_DEFINITION: parsed.to_json(),
        PROP_QUERY: parsed.text,
        PROP_SOURCE: source.name,
        PROP_SOURCE_UUID: str(source.iceberg.metadata.table_uuid),
        PROP_SHAPE: parsed.shape,
        # Idle checkpoints are property updates: keep the metadata log short.
        METADATA_DELETE_AFTER_COMMIT: "true",
        METADATA_PREVIOUS_VERSIONS_MAX: "20",
    }
    try:
        table = create_table(f"{ns}.{tbl}", schema, key=key, catalog=cat, properties=props)
    except LineageError:
        raise
    except Exception as exc:  # a column type Iceberg cannot store
        raise ViewQueryError(f"the view's columns {schema} cannot be stored in an Iceberg table: {exc}") from None
    log.info("created view %s (%s) over %s", table.name, parsed.shape, source.name)
    return MaterializedView(table, parsed)


def open_view(name: str, *, warehouse: str | os.PathLike[str] | None = None, catalog: Catalog | None = None) -> MaterializedView:
    """Open a view created by :func:`create`."""
    try:
        table = open_table(name, warehouse=warehouse, catalog=catalog)
    except TableNotFoundError:
        raise ViewNotFoundError(f"materialized view {name} does not exist in this catalog") from None
    if PROP_DEFINITION not in table.properties:
        raise ViewNotFoundError(f"table {table.name} is not a materialized view (it has no {PROP_DEFINITION} property)")
    return MaterializedView(table, load(table.name, table.properties, table.arrow_schema))


def refresh(
    name: str,
    *,
    warehouse: str | os.PathLike[str] | None = None,
    catalog: Catalog | None = None,
    engine: str = "duckdb",
    full: bool = False,
    spark: Any = None,
) -> RefreshResult:
    """Open the view ``name`` and refresh it (see :meth:`MaterializedView.refresh`)."""
    return open_view(name, warehouse=warehouse, catalog=catalog).refresh(engine=engine, full=full, spark=spark)


def spark_refresh_job(spark: Any, name: str, warehouse: str | os.PathLike[str], *, full: bool = False) -> RefreshResult:
    """Spark job entry point: refresh view ``name`` of ``warehouse`` with the Spark engine.

    Run it from a driver script under ``spark-submit``::

        from pyspark.sql import SparkSession
        import cdf.mv
        spark = SparkSession.builder.appName("refresh shop.totals").getOrCreate()
        print(cdf.mv.spark_refresh_job(spark, "shop.totals", "/data/warehouse"))

    Executors read the source's files for the change feed (and for any
    recomputation); the driver collects only the view's delta and commits it
    with the checkpoint. Returns the :class:`RefreshResult` (its ``str`` is a
    one-line log summary).
    """
    result = refresh(name, warehouse=warehouse, engine="spark", full=full, spark=spark)
    log.info("%s", result)
    return result
