"""The build's warm-up workload (engine Python only): one pass over every operation the tests use.

``server.py --warmup DIR`` runs it once at the end of the build, in a JVM started with
``-XX:ArchiveClassesAtExit``, so that the classes Spark, Iceberg and the JDBC driver load for these operations
go into a class-data-sharing archive (``spark-cds.jsa``). Servers started later map that archive instead of
loading and verifying those classes again: start-up and the first statements cost about half the CPU time.
It doubles as the build's smoke test: a broken engine fails here, not in the first test that uses it.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from decimal import Decimal
from typing import Any

TABLE = "shop.warmup"
CATALOG_TABLES = """
CREATE TABLE iceberg_tables (
    catalog_name VARCHAR(255) NOT NULL, table_namespace VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL,
    metadata_location VARCHAR(1000), previous_metadata_location VARCHAR(1000), iceberg_type VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name));
CREATE TABLE iceberg_namespace_properties (
    catalog_name VARCHAR(255) NOT NULL, namespace VARCHAR(255) NOT NULL, property_key VARCHAR(255) NOT NULL,
    property_value VARCHAR(1000) NOT NULL, PRIMARY KEY (catalog_name, namespace, property_key));
"""
COLUMNS = (
    "id BIGINT NOT NULL, region STRING, qty INT, amount DOUBLE, price DECIMAL(10, 2), ok BOOLEAN, d DATE, "
    "ts TIMESTAMP, local_ts TIMESTAMP_NTZ"
)


def _rows(keys: range) -> Any:
    import pyarrow as pa

    t0 = dt.datetime(2024, 2, 28, 12, tzinfo=dt.timezone.utc)
    return pa.table(
        {
            "id": pa.array(list(keys), pa.int64()),
            "region": [["eu", "us", None][k % 3] for k in keys],
            "qty": pa.array([k % 7 for k in keys], pa.int32()),
            "amount": [k / 2 for k in keys],
            "price": pa.array([Decimal(k) / 100 for k in keys], pa.decimal128(10, 2)),
            "ok": [bool(k % 2) for k in keys],
            "d": [dt.date(1969, 12, 1) + dt.timedelta(days=k * 40) for k in keys],
            "ts": pa.array([t0 + dt.timedelta(hours=k * 7) for k in keys], pa.timestamp("us", tz="UTC")),
            "local_ts": pa.array([dt.datetime(2000, 1, 1) + dt.timedelta(minutes=k) for k in keys], pa.timestamp("us")),
        }
    )


def run(server: Any, folder: str) -> None:
    """Run the workload against a fresh warehouse in ``folder``; raise on the first failure."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    warehouse = os.path.join(folder, "warehouse")
    os.makedirs(warehouse)
    # The server's JdbcCatalog does not create its tables (see server.py); these are the ones pyiceberg's
    # SqlCatalog creates, which the tests' client makes with pyiceberg itself.
    con = sqlite3.connect(os.path.join(warehouse, "catalog.db"))
    con.executescript(CATALOG_TABLES)
    con.close()

    def parquet(name: str, table: Any) -> str:
        path = os.path.join(folder, f"{name}.parquet")
        pq.write_table(table, path)
        return path

    def call(op: str, **args: Any) -> Any:
        response = server.handle({"id": op, "op": op, "args": {"warehouse": warehouse, **args}})
        if not response.get("ok"):
            raise RuntimeError(f"warm-up {op} {args} failed: {response.get('error')}")
        result = response["result"]
        if isinstance(result, dict) and result.get("arrow"):
            os.remove(result["arrow"])
        return result

    def sql(statement: str, **views: str) -> Any:
        return call("sql", statement=statement, views=views or None)

    sql("CREATE NAMESPACE IF NOT EXISTS shop")
    sql(
        f"CREATE TABLE {TABLE} ({COLUMNS}) USING iceberg PARTITIONED BY (days(ts), bucket(2, id)) TBLPROPERTIES "
        "('format-version'='2', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
        "'write.merge.mode'='merge-on-read')"
    )
    sql(f"ALTER TABLE {TABLE} SET IDENTIFIER FIELDS id")
    sql(f"INSERT INTO {TABLE} SELECT * FROM src", src=parquet("rows1", _rows(range(1, 9))))
    call("append", table=TABLE, data=parquet("rows2", _rows(range(9, 12))))
    sql(f"DELETE FROM {TABLE} WHERE id = 2")
    sql(f"UPDATE {TABLE} SET qty = qty + 1 WHERE region = 'eu'")
    sql(
        f"MERGE INTO {TABLE} t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        src=parquet("rows3", _rows(range(7, 14))),
    )
    events = _rows(range(20, 23)).append_column("_op", pa.array(["+I", "+I", "-D"]))
    events = events.append_column("_seq", pa.array([0, 1, 2], pa.int64()))
    call("flink_commit", table=TABLE, events=parquet("events1", events), upsert=True)
    call("flink_commit", table=TABLE, events=parquet("events2", events), upsert=False)
    snapshot = call("metadata", table=TABLE)["metadata"]["snapshots"][0]["snapshot-id"]
    call("read", table=TABLE)
    call("read", table=TABLE, snapshot_id=snapshot, columns=["id", "ts"], where="id > 3")
    for meta in ("files", "snapshots", "manifests", "position_deletes"):
        sql(f"SELECT * FROM {TABLE}.{meta}")
    sql(f"CALL system.rewrite_position_delete_files(table => '{TABLE}', options => map('rewrite-all', 'true'))")
    sql(f"CALL system.rewrite_data_files(table => '{TABLE}', options => map('rewrite-all', 'true'))")
    sql(f"CALL system.expire_snapshots(table => '{TABLE}', retain_last => 1, older_than => TIMESTAMP '2999-01-01 00:00:00')")
    call("remove_orphan_files", table=TABLE, dry_run=True)
    call("forget")
