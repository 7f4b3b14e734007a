"""Table.scan_batches: the rows of scan(), streamed a group of files at a time in bounded memory."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import lineage
from lineage.errors import BadPredicateError, InvalidArgumentError, UnknownColumnError

from conftest import SCHEMA, rows


def _orders(n: int, start: int = 0) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.table({"id": ids, "name": pa.array([f"n{i % 97}" for i in range(start, start + n)]), "amount": pa.array([i * 0.5 for i in range(start, start + n)])})


@pytest.fixture
def history(table: lineage.Table) -> lineage.Table:
    """Five appends, an update, a delete and an upsert: files with several lineage runs and delete files."""
    for i in range(5):
        table.append(_orders(40, start=i * 40))
    table.update("id % 7 = 0", {"amount": "amount + 1"})
    table.delete("id BETWEEN 30 AND 60")
    table.upsert(_orders(10, start=195))
    return table


@pytest.mark.parametrize("group_bytes", [1, 3000, 1 << 30])
@pytest.mark.parametrize("batch_rows", [1, 7, 65_536])
def test_streamed_rows_are_the_scan_rows(history: lineage.Table, group_bytes: int, batch_rows: int) -> None:
    reader = history.scan_batches(batch_rows=batch_rows, group_bytes=group_bytes)
    assert isinstance(reader, pa.RecordBatchReader)
    batches = list(reader)
    assert all(0 < b.num_rows <= batch_rows for b in batches)
    streamed = pa.Table.from_batches(batches, schema=reader.schema)
    assert streamed.schema == history.scan().schema
    assert rows(streamed) == rows(history.scan())


@pytest.mark.parametrize(
    "where, columns, as_of",
    [
        ("amount > 50 AND name LIKE 'n1%'", None, None),
        ("_row_last_updated_at_version = 6", ["id", "_row_id"], None),
        (None, ["name"], 3),
        ("id IN (1, 2, 3, 500)", None, 5),
    ],
)
def test_where_columns_and_as_of_match_scan(history: lineage.Table, where, columns, as_of) -> None:
    want = history.scan(where, columns=columns, as_of=as_of)
    reader = history.scan_batches(where, columns=columns, as_of=as_of, batch_rows=5, group_bytes=1)
    got = reader.read_all()
    assert got.schema == want.schema
    assert rows(got) == rows(want)


def test_a_consumer_streams_the_reader_into_duckdb(history: lineage.Table) -> None:
    con = duckdb.connect()
    con.register("scanned", history.scan())
    con.register("streamed", history.scan_batches(batch_rows=16, group_bytes=1))
    query = "SELECT count(*), sum(amount), max(_row_id) FROM {}"
    assert con.execute(query.format("streamed")).fetchone() == con.execute(query.format("scanned")).fetchone()


def test_bad_arguments_fail_before_any_file_is_read(history: lineage.Table) -> None:
    with pytest.raises(InvalidArgumentError, match="batch_rows"):
        history.scan_batches(batch_rows=0)
    with pytest.raises(InvalidArgumentError, match="group_bytes"):
        history.scan_batches(group_bytes=0)
    with pytest.raises(UnknownColumnError):
        history.scan_batches(columns=["nope"])
    with pytest.raises(UnknownColumnError, match="nope"):
        history.scan_batches("nope > 1")
    with pytest.raises(BadPredicateError):
        history.scan_batches("id >")


def test_an_empty_table_streams_no_batch(table: lineage.Table) -> None:
    reader = table.scan_batches()
    assert list(reader) == []
    assert reader.schema == table.scan().schema


def test_memory_is_bounded_by_a_group_not_by_the_table(warehouse: str) -> None:
    """Twelve files of 40,000 rows: streamed one file at a time, Arrow holds about one file's rows at once."""
    t = lineage.create_table("shop.big", SCHEMA, key=["id"], warehouse=warehouse)
    for i in range(12):
        t.append(_orders(40_000, start=i * 40_000))
    pool = pa.default_memory_pool()
    base = pool.bytes_allocated()
    whole = t.scan()
    whole_bytes = pool.bytes_allocated() - base
    del whole
    base = pool.bytes_allocated()
    peak = 0
    seen = 0
    for batch in t.scan_batches(group_bytes=1):  # one file per group
        seen += batch.num_rows
        peak = max(peak, pool.bytes_allocated() - base)
    assert seen == 480_000
    assert peak < whole_bytes / 4, f"streaming held {peak} bytes of Arrow memory, a full scan {whole_bytes}"


def test_groups_are_sized_by_decoded_rows_not_by_parquet(warehouse: str) -> None:
    """Repetitive data compresses ten times or more: a group is cut by the rows' size in memory, estimated from
    the files' metadata (within a factor of 1.5 of the Arrow bytes), not by their Parquet size."""
    from lineage.read.batched_scan import decoded_bytes, file_groups

    t = lineage.create_table("shop.dense", SCHEMA, key=["id"], warehouse=warehouse)
    for i in range(4):
        t.append(pa.table({"id": pa.array(range(i * 50_000, (i + 1) * 50_000), pa.int64()),
                           "name": pa.array(["paid"] * 50_000), "amount": pa.array([1.0] * 50_000)}))
    files = t.state().live_files()
    ids = {f.name: f.field_id for f in t.iceberg.schema().fields}
    estimates = [decoded_bytes(f, t.arrow_schema, ids) for f in files]
    arrow = t.scan().nbytes / len(files)
    assert all(arrow / 1.5 <= e <= arrow * 1.5 for e in estimates), (estimates, arrow)
    parquet = sum(int(f.data_file.file_size_in_bytes) for f in files)
    assert parquet * 5 < sum(estimates)  # the data compresses: Parquet size would put all four files in one group
    assert len(file_groups(files, parquet)) == 1
    assert len(t.state().live_files()) == 4
    groups = [g.num_rows for g in t.scan_batches(group_bytes=max(estimates), batch_rows=1 << 20)]
    assert groups == [50_000] * 4  # one file per group, one batch per group


def test_files_with_many_lineage_runs_weigh_their_join_too(warehouse: str) -> None:
    """A file an update wrote (a lineage run per row) is weighed for the ASOF join of its rows with its runs, so its
    group holds fewer rows than one of files appended whole; the rows streamed are the same."""
    from lineage.read.batched_scan import decoded_bytes, scan_weight

    t = lineage.create_table("shop.runs", SCHEMA, key=["id"], warehouse=warehouse)
    n = 20_000
    t.append(pa.table({"id": pa.array(range(n), pa.int64()), "name": pa.array([f"n{i}" for i in range(n)]),
                       "amount": pa.array([1.0] * n)}))
    t.update("id % 2 = 0", {"amount": "amount + 1"})  # a new file of every second row id: one run per row
    ids = {f.name: f.field_id for f in t.iceberg.schema().fields}
    files = t.state().live_files()
    appended = next(f for f in files if len(f.lineage.row_ids.lengths) == 1)
    updated = next(f for f in files if len(f.lineage.row_ids.lengths) > 1)
    assert scan_weight(appended, t.arrow_schema, ids) == decoded_bytes(appended, t.arrow_schema, ids)
    assert len(updated.lineage.row_ids.lengths) == n // 2
    assert scan_weight(updated, t.arrow_schema, ids) >= 2 * decoded_bytes(updated, t.arrow_schema, ids) + n // 2 * 80
    rows = sorted(r["_row_id"] for b in t.scan_batches(group_bytes=1) for r in b.to_pylist())
    assert rows == sorted(t.scan().column("_row_id").to_pylist()) and len(rows) == n


def test_groups_are_estimated_for_every_column_type(warehouse: str) -> None:
    """Booleans (bit-packed), decimals, dates and timestamps are estimated without error, and streamed."""
    import datetime as dt
    import decimal

    from lineage.read.batched_scan import decoded_bytes

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("flag", pa.bool_()), ("dec", pa.decimal128(10, 2)),
                        ("d", pa.date32()), ("ts", pa.timestamp("us"))])
    t = lineage.create_table("shop.typed", schema, key=["id"], warehouse=warehouse)
    n = 1000
    t.append(pa.table({"id": list(range(n)), "flag": [i % 2 == 0 for i in range(n)],
                       "dec": [decimal.Decimal("1.25")] * n, "d": [dt.date(2024, 1, 1)] * n,
                       "ts": [dt.datetime(2024, 1, 2)] * n}, schema=schema))
    ids = {f.name: f.field_id for f in t.iceberg.schema().fields}
    f = t.state().live_files()[0]
    assert decoded_bytes(f, t.arrow_schema, ids) >= n * (8 + 16 + 4 + 8)  # id, dec, d, ts at least
    assert sum(b.num_rows for b in t.scan_batches(group_bytes=1)) == n
