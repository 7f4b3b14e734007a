"""Iceberg v3 data files whose rows keep their ids write ``_row_id`` delta-encoded (lineage.storage.v3_parquet).

The encoding changes bytes only: our scan, pyiceberg and DuckDB's ``iceberg_scan`` read the same rows and
``_row_id``s as before (Spark too: tests/test_v3_row_lineage.py and tests/test_v3_mixed_writers.py).
"""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq

import lineage
import lineage.duck as duck
from lineage.storage import v3_parquet

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("s", pa.struct([("a", pa.int32()), ("b", pa.int64())]))])


def _rows(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64()), "v": [str(i % 7) for i in range(n)],
                     "s": [{"a": i % 5, "b": i} for i in range(n)]}, schema=SCHEMA)


def _encodings(path: str) -> dict[str, tuple[str, ...]]:
    md = pq.ParquetFile(path).metadata
    return {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i).encodings for i in range(md.num_columns)}


def test_leaf_paths_name_nested_columns_as_the_writer_does():
    paths = v3_parquet.leaf_paths(SCHEMA.append(pa.field("l", pa.list_(pa.int64()))).append(pa.field("_row_id", pa.int64())))
    assert paths == ("id", "v", "s.a", "s.b", "l.list.element", "_row_id")
    assert v3_parquet.writer_options(SCHEMA) == {}  # no _row_id: pyiceberg's options as they are


def test_rewritten_rows_carry_delta_encoded_row_ids_that_every_reader_reads(tmp_path):
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=str(tmp_path), properties={"format-version": "3"})
    t.append(_rows(20_000))
    before = set(glob.glob(str(tmp_path / "**" / "data" / "*.parquet"), recursive=True))
    t.update("id % 10 = 3", {"v": "'x'"})
    (new,) = set(glob.glob(str(tmp_path / "**" / "data" / "*.parquet"), recursive=True)) - before
    enc = _encodings(new)
    assert "DELTA_BINARY_PACKED" in enc["_row_id"]
    assert all("RLE_DICTIONARY" in enc[c] for c in ("id", "v", "s.a", "s.b"))
    assert pq.read_table(new, columns=["_row_id"]).column(0).to_pylist() == list(range(3, 20_000, 10))

    ice = t.iceberg
    expected = sorted((i, "x" if i % 10 == 3 else str(i % 7), i) for i in range(20_000))  # appended rows: id = row id
    ours = t.scan(columns=["id", "v", "_row_id"])
    assert sorted(zip(*(ours.column(c).to_pylist() for c in ("id", "v", "_row_id")), strict=True)) == expected
    con = duck.connect("iceberg")
    try:
        ddb = con.execute(f"SELECT id, v, _row_id FROM iceberg_scan('{ice.metadata_location}')").to_arrow_table()
    finally:
        con.close()
    assert sorted(zip(*(ddb.column(c).to_pylist() for c in ("id", "v", "_row_id")), strict=True)) == expected
    assert ice.scan().to_arrow().num_rows == 20_000  # pyiceberg
    assert os.path.getsize(new) < 60_000
