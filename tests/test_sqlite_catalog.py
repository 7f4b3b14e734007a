"""lineage.catalog.write_ahead_log: a SQLite catalog committing through its write-ahead log."""

from __future__ import annotations

import sqlite3

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

import lineage
import lineage.catalog
from lineage.errors import InvalidArgumentError


def _pragmas(catalog: SqlCatalog) -> tuple[str, int]:
    with catalog.engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        return raw.execute("PRAGMA journal_mode").fetchone()[0], raw.execute("PRAGMA synchronous").fetchone()[0]


@pytest.mark.parametrize("durable, synchronous", [(True, 2), (False, 1)])  # FULL: synced at every commit; NORMAL: at checkpoints
def test_a_sqlite_catalog_commits_through_its_write_ahead_log(tmp_path, durable: bool, synchronous: int) -> None:
    path = tmp_path / "catalog.db"
    catalog = SqlCatalog("lake", uri=f"sqlite:///{path}", warehouse=str(tmp_path / "wh"))
    lineage.catalog.write_ahead_log(catalog, durable=durable)
    assert _pragmas(catalog) == ("wal", synchronous)
    t = lineage.create_table("s.t", pa.schema([("id", pa.int64())]), key=["id"], catalog=catalog)
    t.upsert(pa.table({"id": [1, 2]}))
    t.upsert(pa.table({"id": [2, 3]}))
    # another process's view of the file: the commits are in the database (through its log)
    other = SqlCatalog("lake", uri=f"sqlite:///{path}", warehouse=str(tmp_path / "wh"))
    assert sorted(lineage.open_table("s.t", catalog=other).scan()["id"].to_pylist()) == [1, 2, 3]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # a property of the file


def test_write_ahead_log_refuses_another_catalog(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="SqlCatalog on SQLite"):
        lineage.catalog.write_ahead_log(object())  # type: ignore[arg-type]
