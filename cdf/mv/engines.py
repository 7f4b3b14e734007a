"""Where a refresh evaluates the feed, the delta and source recomputations: DuckDB in process, or Spark.

The DuckDB engine keeps everything in one connection; the Spark engine
registers temp views and collects only the (small) results to the driver.
"""

from __future__ import annotations

import uuid
from typing import Any

import duckdb
import pyarrow as pa

import cdf
import lineage.duck as duck
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import projection_field_ids
from lineage.table import Table


class Engine:
    """Where the feed, the delta and source recomputations are evaluated."""

    dialect = "duckdb"
    purged = False  # whether the feed has a _purged column (the source was ever purged)

    def __init__(self) -> None:
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The engine's DuckDB connection, opened on first use (a refresh with nothing to do opens none)."""
        if self._con is None:
            self._con = duckdb_connection()
        return self._con

    def name(self, logical: str) -> str:
        return logical

    def feed(self, source: Table, a: int, b: int, columns: list[str]) -> int:
        tbl = cdf.changes(source, a, b, net=True, columns=columns)
        self.con.register("feed", tbl)
        self.purged = "_purged" in tbl.column_names
        return tbl.num_rows

    def source(self, source: Table, b: int) -> None:
        state = source.state(b)
        field_ids = projection_field_ids(source.iceberg.metadata)
        register_live_view(self.con, "src", state.live_files(), source.arrow_schema, field_ids)

    def register(self, name: str, data: pa.Table) -> None:
        self.con.register(name, data)

    def query(self, sql: str) -> pa.Table:
        return duck.fetch_arrow(self.con, sql)  # queries may read the `src` live view

    def close(self) -> None:
        if self._con is not None:
            self._con.close()


class SparkEngine(Engine):
    """Spark computes the feed, the delta and recomputations; the (small) results are collected."""

    dialect = "spark"
    con = None  # type: ignore[assignment]  # the refresh applies the collected delta on a DuckDB connection of its own

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.tag = uuid.uuid4().hex[:10]
        self.views: list[str] = []

    def name(self, logical: str) -> str:
        return f"__mv_{logical}_{self.tag}"

    def _view(self, logical: str, df: Any) -> None:
        df.createOrReplaceTempView(self.name(logical))
        self.views.append(self.name(logical))

    def feed(self, source: Table, a: int, b: int, columns: list[str]) -> int:
        df = cdf.changes(source, a, b, net=True, columns=columns, engine="spark", spark=self.spark)
        self._view("feed", df)
        self.purged = "_purged" in df.columns
        return -1  # not counted: counting would run the feed twice

    def source(self, source: Table, b: int) -> None:
        self._view("src", source.to_spark(self.spark, as_of=b))

    def register(self, name: str, data: pa.Table) -> None:
        self._view(name, self.spark.createDataFrame(data))

    def query(self, sql: str) -> pa.Table:
        return self.spark.sql(sql).toArrow()

    def close(self) -> None:
        for v in self.views:
            try:
                self.spark.catalog.dropTempView(v)
            except Exception:  # pragma: no cover - best effort
                pass


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the settings every refresh uses (duck.connect, UTC)."""
    con = duck.connect(isolated=True)
    con.execute("SET TimeZone = 'UTC'")  # group keys of timestamptz columns render the same everywhere
    return con


