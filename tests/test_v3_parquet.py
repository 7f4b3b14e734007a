"""Iceberg v3 data files whose rows keep their ids write ``_row_id`` delta-encoded (lineage.storage.v3_parquet).

The encoding changes bytes only: our scan, pyiceberg and DuckDB's ``iceberg_scan`` read the same rows and
``_row_id``s as before (Spark too: tests/test_v3_row_lineage.py and tests/test_v3_mixed_writers.py).
"""

from __future__ import annotations

import glob
import math
import os
import struct

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _reference_distinct(values: list) -> int:
    """Distinct values as Arrow's hash (and Parquet's dictionary) tells them apart: floats by their bits (0.0 and -0.0
    apart), NaN once."""
    return len({("nan" if math.isnan(v) else struct.pack("<d", v)) if isinstance(v, float) else v for v in values if v is not None})


@settings(max_examples=60, deadline=None)
@given(st.one_of(
    st.tuples(st.just(pa.int64()), st.lists(st.one_of(st.none(), st.integers(-5, 40)), max_size=60)),
    st.tuples(st.just(pa.float64()), st.lists(st.one_of(st.none(), st.floats(-3, 3, width=16)), max_size=60)),
    st.tuples(st.just(pa.string()), st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=60)),
), st.integers(1, 4))
def test_distinct_values_of_a_column_sampled_whole_are_counted_exactly(case, chunks):
    """estimated_distinct: a sample that is the whole column (nulls aside) gives its exact number of distinct values,
    whatever the chunks."""
    kind, values = case
    cut = [len(values) * i // chunks for i in range(chunks + 1)]
    column = pa.chunked_array([pa.array(values[a:b], kind) for a, b in zip(cut, cut[1:])], kind)
    sample = column.drop_null()
    assert v3_parquet.estimated_distinct(sample, len(sample)) == _reference_distinct(values)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200_000), st.integers(1, 10))
def test_sampled_distinct_estimate_is_within_a_third_of_the_truth(distinct, repeats):
    """A column of ``distinct`` values each repeated ``repeats`` times, shuffled: the estimate from a random sample is
    within a third of the truth (exact when the column is the sample) and never above the column's size."""
    import numpy as np

    n = distinct * repeats
    values = np.random.default_rng(distinct).permutation(np.repeat(np.arange(distinct, dtype=np.int64), repeats))
    column = pa.chunked_array([pa.array(values)])
    sample = column.take(v3_parquet._sample_positions(n))
    estimate = v3_parquet.estimated_distinct(sample, n)
    assert estimate <= n
    if n <= v3_parquet.SAMPLE_ROWS:
        assert estimate == distinct
    assert abs(estimate - distinct) <= distinct / 3, (estimate, distinct)


def test_columns_whose_dictionary_overflows_are_written_plain_and_read_back_the_same(tmp_path):
    """A column whose distinct values fill the dictionary page (here 4 KiB) is written without a dictionary from the
    start; the others keep theirs (as do all of them under a page limit they fit); every reader reads the same rows."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("w", pa.string()), ("f", pa.float64()), ("few", pa.int32()),
                        ("tens", pa.int64())])
    n = 20_000
    rows = pa.table({"id": pa.array(range(n), pa.int64()), "v": [f"name-{i}" for i in range(n)], "w": [str(i % 3) for i in range(n)],
                     "f": [i / 7 for i in range(n)], "few": pa.array([i % 4 for i in range(n)], pa.int32()),
                     "tens": pa.array([(i * 7919) % 300 for i in range(n)], pa.int64())}, schema=schema)
    assert v3_parquet.overflowing_dictionaries(rows, 4096) == {"id", "v", "f"}
    assert v3_parquet.overflowing_dictionaries(rows, 1 << 20) == set()
    assert v3_parquet.writer_options(rows.schema, rows, 4096) == {"use_dictionary": ["w", "few", "tens"]}
    t = lineage.create_table("db.t", schema, key=["id"], warehouse=str(tmp_path), properties={"write.parquet.dict-size-bytes": "4096"})
    t.append(rows)
    (path,) = glob.glob(str(tmp_path / "**" / "data" / "*.parquet"), recursive=True)
    enc = _encodings(path)
    assert all("RLE_DICTIONARY" not in enc[c] and "PLAIN_DICTIONARY" not in enc[c] for c in ("id", "v", "f"))
    assert all("RLE_DICTIONARY" in enc[c] for c in ("w", "few", "tens"))
    assert t.scan().select(schema.names).sort_by("id").cast(schema).equals(rows)
    con = duck.connect("iceberg")
    try:
        ddb = con.execute(f"SELECT * FROM iceberg_scan('{t.iceberg.metadata_location}') ORDER BY id").to_arrow_table()
    finally:
        con.close()
    assert ddb.select(schema.names).cast(schema).equals(rows)
