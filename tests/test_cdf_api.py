"""The change-feed API: views, timestamps, errors, retention, _changed_columns."""

from __future__ import annotations

import datetime as dt
import os

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cdf
import lineage
from conftest import SCHEMA, rows


@pytest.fixture
def history(table):
    """A table with six versions of mixed writes; returns (table, commit infos by version)."""
    infos = [
        table.append(pa.table({"id": [1, 2, 3, 4], "name": list("abcd"), "amount": [1.0, 2.0, 3.0, 4.0]})),  # v1
        table.update("id = 2", {"amount": "amount * 10"}),  # v2
        table.delete("id = 3"),  # v3
        table.upsert(pa.table({"id": [4, 5], "name": ["D", "e"], "amount": [4.0, 5.0]})),  # v4
        table.update("id = 2", {"name": "'bb'"}),  # v5
        table.delete("id = 5", mode="copy-on-write"),  # v6
    ]
    assert [i.version for i in infos] == [1, 2, 3, 4, 5, 6]
    return table, {i.version: i for i in infos}


def feed(t: pa.Table) -> list[tuple]:
    return rows(t, ["id", "name", "amount", "_change_type", "_commit_version", "_row_id", "_row_created_at_version",
                    "_row_last_updated_at_version", "_changed_columns"])


def test_per_version_feed_has_every_change_with_lineage(history):
    t, _ = history
    got = feed(cdf.changes(t, 1, 6))
    assert got == sorted([
        (2, "b", 2.0, "update_preimage", 2, 1, 1, 1, ["amount"]),
        (2, "b", 20.0, "update_postimage", 2, 1, 1, 2, ["amount"]),
        (3, "c", 3.0, "delete", 3, 2, 1, 1, None),
        (4, "d", 4.0, "update_preimage", 4, 3, 1, 1, ["name"]),
        (4, "D", 4.0, "update_postimage", 4, 3, 1, 4, ["name"]),
        (5, "e", 5.0, "insert", 4, 4, 4, 4, None),
        (2, "b", 20.0, "update_preimage", 5, 1, 1, 2, ["name"]),
        (2, "bb", 20.0, "update_postimage", 5, 1, 1, 5, ["name"]),
        (5, "e", 5.0, "delete", 6, 4, 4, 4, None),
    ], key=repr)


def test_output_columns_are_in_the_documented_order(history):
    t, _ = history
    out = cdf.changes(t, 0)
    assert out.column_names == SCHEMA.names + ["_change_type", "_commit_version", "_commit_timestamp", "_row_id",
                                               "_row_created_at_version", "_row_last_updated_at_version", "_changed_columns"]
    # the two string-valued change columns are dictionary-encoded; decode_change_columns() gives the Spark engine's types
    assert out.schema.field("_change_type").type == pa.dictionary(pa.int8(), pa.string())
    assert out.schema.field("_changed_columns").type == pa.list_(pa.dictionary(pa.int32(), pa.string()))
    decoded = cdf.decode_change_columns(out)
    assert decoded.schema.field("_change_type").type == pa.string()
    assert decoded.schema.field("_changed_columns").type == pa.list_(pa.string())
    assert decoded.to_pylist() == out.to_pylist()
    assert cdf.change_batches(t, 0).schema == out.schema


def test_net_feed_collapses_each_row(history):
    t, _ = history
    got = feed(cdf.changes(t, 1, 6, net=True))
    assert got == sorted([
        (3, "c", 3.0, "delete", 3, 2, 1, 1, None),
        (4, "d", 4.0, "update_preimage", 4, 3, 1, 1, ["name"]),
        (4, "D", 4.0, "update_postimage", 4, 3, 1, 4, ["name"]),
        (2, "b", 2.0, "update_preimage", 5, 1, 1, 1, ["name", "amount"]),
        (2, "bb", 20.0, "update_postimage", 5, 1, 1, 5, ["name", "amount"]),
    ], key=repr)


def test_update_that_changes_nothing_is_an_update_with_no_changed_columns(table):
    table.append(pa.table({"id": [1], "name": ["a"], "amount": [1.0]}))
    table.update("id = 1", {"amount": "amount"})
    per_version = cdf.changes(table, 1)
    assert per_version.column("_change_type").to_pylist() == ["update_preimage", "update_postimage"]
    assert per_version.column("_changed_columns").to_pylist() == [[], []]
    assert cdf.changes(table, 1, net=True).num_rows == 0  # equal images: the net pair is dropped


def test_a_table_written_with_lz4_feeds_and_reads_like_any_other(warehouse):
    import glob
    import os

    import pyarrow.parquet as pq

    from conftest import assert_interop

    t = lineage.create_table("shop.fast", SCHEMA, key=["id"], warehouse=warehouse, properties={"write.parquet.compression-codec": "lz4"})
    t.append(pa.table({"id": list(range(6)), "name": list("abcdef"), "amount": [float(i) for i in range(6)]}))
    t.upsert(pa.table({"id": [1, 9], "name": ["B", "z"], "amount": [10.0, 9.0]}))
    t.delete("id = 4")
    data = [f for f in glob.glob(os.path.join(warehouse, "**", "data", "*.parquet"), recursive=True) if "name" in pq.read_schema(f).names]
    codecs = {c for f in data for (c,) in duckdb.sql(f"SELECT DISTINCT compression FROM parquet_metadata('{f}')").fetchall()}
    assert data and codecs == {"LZ4_RAW"}  # Parquet's name (pyarrow's metadata calls it LZ4)
    feed = cdf.changes(t, 1)
    assert sorted(zip(feed.column("_change_type").to_pylist(), feed.column("id").to_pylist(), feed.column("name").to_pylist())) == [
        ("delete", 4, "e"), ("insert", 9, "z"), ("update_postimage", 1, "B"), ("update_preimage", 1, "b")]
    assert_interop(t)


def test_empty_range_and_columns_projection(history):
    t, _ = history
    assert cdf.changes(t, 4, 4).num_rows == 0
    out = cdf.changes(t, 1, 2, columns=["amount"])
    assert out.column_names[0] == "amount" and "name" not in out.column_names
    assert out.column("_changed_columns").to_pylist() == [["amount"], ["amount"]]


def test_commit_timestamps_and_timestamp_ranges(history):
    t, infos = history
    out = cdf.changes(t, 0)
    for version, ts in zip(out.column("_commit_version").to_pylist(), out.column("_commit_timestamp").to_pylist()):
        assert ts == infos[version].timestamp
    by_ts = cdf.changes(t, from_timestamp=infos[2].timestamp, to_timestamp=infos[5].timestamp)
    assert feed(by_ts) == feed(cdf.changes(t, 2, 5))
    before_everything = infos[1].timestamp - dt.timedelta(days=1)
    assert feed(cdf.changes(t, from_timestamp=before_everything)) == feed(cdf.changes(t, 0))
    iso = infos[3].timestamp.isoformat()
    assert feed(cdf.changes(t, from_timestamp=iso, to_version=6)) == feed(cdf.changes(t, 3, 6))


def test_deleted_rows_python_api(history):
    t, _ = history
    out = cdf.deleted_rows(t)
    assert rows(out, ["id", "name", "_row_deleted_at_version", "_row_id", "_row_created_at_version"]) == [
        (3, "c", 3, 2, 1), (5, "e", 6, 4, 4)]
    assert rows(cdf.deleted_rows(t, since=3), ["id"]) == [(5,)]
    assert rows(cdf.deleted_rows(t, until=5), ["id"]) == [(3,)]


def test_duckdb_views(history):
    t, _ = history
    con = duckdb.connect()
    assert cdf.register(con, t) == "orders"
    got = con.execute('SELECT * FROM "orders$changes"(1, 6)').to_arrow_table()
    assert feed(got) == feed(cdf.changes(t, 1, 6))
    net = con.execute('SELECT * FROM "orders$changes"(1, net := true)').to_arrow_table()
    assert feed(net) == feed(cdf.changes(t, 1, net=True))
    deleted = con.execute('SELECT id, _row_deleted_at_version FROM "orders$deleted_rows" ORDER BY id').fetchall()
    assert deleted == [(3, 3), (5, 6)]
    t.delete("id = 1")  # views are evaluated at query time
    assert con.execute('SELECT count(*) FROM "orders$deleted_rows"').fetchone()[0] == 3
    with pytest.raises(duckdb.Error, match="reversed"):
        con.execute('SELECT * FROM "orders$changes"(5, 2)').fetchall()


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((5, 2), lineage.VersionRangeError, "reversed"),
        ((0, 99), lineage.UnknownVersionError, "to_version=99"),
        ((42,), lineage.UnknownVersionError, "from_version=42"),
        (("1",), lineage.InvalidArgumentError, "integer"),
        ((), lineage.InvalidArgumentError, "from_version"),
    ],
)
def test_bad_ranges_are_refused(history, args, error, message):
    t, _ = history
    with pytest.raises(error, match=message):
        cdf.changes(t, *args)


def test_bad_arguments_are_refused(history):
    t, _ = history
    with pytest.raises(lineage.UnknownColumnError, match="nope"):
        cdf.changes(t, 0, columns=["nope"])
    with pytest.raises(lineage.InvalidArgumentError, match="engine"):
        cdf.changes(t, 0, engine="trino")
    with pytest.raises(lineage.InvalidArgumentError, match="lineage.Table"):
        cdf.changes("orders", 0)
    with pytest.raises(lineage.InvalidArgumentError, match="from_timestamp"):
        cdf.changes(t, from_timestamp="not a time")


@pytest.mark.parametrize("net", [False, True])
@pytest.mark.parametrize("batch_rows", [1, 2, 3, 100])
def test_change_batches_stream_the_rows_of_changes(history, net, batch_rows):
    t, _ = history
    want = cdf.changes(t, 0, 6, net=net, columns=["id", "amount"])
    reader = cdf.change_batches(t, 0, 6, net=net, columns=["id", "amount"], batch_rows=batch_rows)
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema == want.schema
    batches = list(reader)
    assert pa.Table.from_batches(batches, want.schema).equals(want)  # same rows, same order
    # an update pair is never split across batches: a part may hold one row more than asked for that
    assert all(b.num_rows <= batch_rows + 1 for b in batches)
    for b in batches:
        kinds = b.column("_change_type").to_pylist()
        assert kinds[0] != "update_postimage" and kinds[-1] != "update_preimage", kinds


def test_change_batches_refuse_bad_input_before_reading(history):
    t, _ = history
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(lineage.InvalidArgumentError, match="batch_rows"):
            cdf.change_batches(t, 0, batch_rows=bad)
        with pytest.raises(lineage.InvalidArgumentError, match="batch_bytes"):
            cdf.change_batches(t, 0, batch_bytes=bad)
    with pytest.raises(lineage.VersionRangeError, match="reversed"):
        cdf.change_batches(t, 5, 2)  # the range is checked by the call, not when the batches are read
    assert cdf.change_batches(t, 6, 6).read_all().num_rows == 0


def test_change_batches_name_a_file_removed_while_they_are_read(table):
    table.append(pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1.0, 2.0]}))  # v1
    first = table.state().all_data_file_paths()
    table.append(pa.table({"id": [3, 4], "name": ["c", "d"], "amount": [3.0, 4.0]}))  # v2, a file of its own
    (second,) = table.state().all_data_file_paths() - first
    reader = cdf.change_batches(table, 0, 2, batch_rows=1)
    assert reader.read_next_batch().column("id").to_pylist() == [1]
    os.remove(second.removeprefix("file://"))  # as a vacuum run by another process would, between two batches
    with pytest.raises(lineage.LostFileError, match="ask for the feed again"):
        reader.read_all()


def test_retention_by_versions(warehouse):
    t = lineage.create_table("r.t", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.retention.versions": "2"})
    for i in range(5):
        t.append(pa.table({"id": [i], "name": ["x"], "amount": [1.0]}))
    assert cdf.changes(t, 3).num_rows == 2
    with pytest.raises(lineage.RetentionError, match="oldest available version is 3"):
        cdf.changes(t, 2)
    with pytest.raises(lineage.RetentionError, match="oldest available version is 3"):
        cdf.deleted_rows(t, since=1)


def test_retention_by_days(warehouse):
    t = lineage.create_table("r.d", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.retention.days": "1"})
    for i in range(3):
        t.append(pa.table({"id": [i], "name": ["x"], "amount": [1.0]}))
    # every commit is younger than a day, so the whole history is available
    assert cdf.changes(t, 0).num_rows == 3
    from cdf.retention import window

    tomorrow = int(t.history()[-1].timestamp.timestamp() * 1000) + 2 * 86_400_000
    assert window(t.state(), now_ms=tomorrow).oldest == 3


def test_unreadable_retention_property(warehouse):
    t = lineage.create_table("r.bad", SCHEMA, warehouse=warehouse, properties={"lineage.cdf.retention.versions": "ten"})
    t.append(pa.table({"id": [1], "name": ["x"], "amount": [1.0]}))
    with pytest.raises(lineage.InvalidArgumentError, match="lineage.cdf.retention.versions"):
        cdf.changes(t, 0)


def test_feed_is_answered_from_the_index_after_copy_on_write(history):
    """The v6 delete rewrote a file; its old image is read from the pinned file via the index."""
    t, _ = history
    got = cdf.changes(t, 5, 6)
    assert rows(got, ["id", "_change_type"]) == [(5, "delete")]


@pytest.mark.parametrize("ncols", [1, 5, 130, 260])  # the column numbers are int8 under 128, the counts uint8 under 256
def test_changed_columns_lists_match_the_changed_matrix(ncols):
    from cdf.engine_duckdb import _changed_lists

    rng = np.random.default_rng(ncols)
    n = 41
    pre = np.sort(rng.choice(np.arange(0, n - 1, 2), 12, replace=False))
    changed = rng.random((len(pre), ncols)) < 0.3
    names = [f"c{j}" for j in range(ncols)]
    got = _changed_lists(n, pre, changed, names).to_pylist()
    want: list[list[str] | None] = [None] * n
    for k, p in enumerate(pre):
        want[p] = want[p + 1] = [names[j] for j in np.flatnonzero(changed[k])]
    assert got == want


def _same(u: object, v: object) -> bool:
    return u == v or (isinstance(u, float) and isinstance(v, float) and u != u and v != v)  # NaN equals NaN


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_changed_matrix_compares_like_the_rule_for_every_column_kind(data):
    """The numpy and dictionary-index comparisons agree with the rule: null-safe, NaN equal to NaN."""
    from cdf.engine_duckdb import changed_matrix

    n = 2 * data.draw(st.integers(1, 12), label="pairs")
    ints = data.draw(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=n, max_size=n), label="ints")
    floats = data.draw(st.lists(st.one_of(st.none(), st.sampled_from([0.0, 1.5, float("nan")])), min_size=n, max_size=n), label="floats")
    words = data.draw(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c"])), min_size=n, max_size=n), label="words")
    kind = data.draw(st.sampled_from(["distinct", "repeated", "null"]), label="dictionary values")
    dictionary = pa.array({"distinct": ["a", "b", "c"], "repeated": ["a", "b", "c", "a"], "null": ["a", "b", "c", None]}[kind])
    # on odd rows the extra entry (index 3) stands for "a" (repeated) or for a null (null): the same value under
    # different indices, or a null under an index where other rows are null by their validity
    codes = [3 if i % 2 and ((kind == "repeated" and w == "a") or (kind == "null" and w is None))
             else None if w is None else "abc".index(w) for i, w in enumerate(words)]
    encoded = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), dictionary)
    table = pa.table({
        "i": pa.array(ints, pa.int64()),
        "i_full": pa.array([0 if x is None else x for x in ints], pa.int64()),
        "f": pa.array(floats, pa.float64()),
        "f_full": pa.array([0.0 if x is None else x for x in floats], pa.float64()),
        "ts": pa.array([0 if x is None else x for x in ints], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "s": pa.array(words, pa.large_string()),
        "d": encoded,
    })
    pre = np.array(sorted(data.draw(st.sets(st.sampled_from(range(0, n, 2)), min_size=1), label="pre")), np.int64)
    got = changed_matrix(table, pre)
    for j, name in enumerate(table.column_names):
        col = table.column(name).to_pylist()
        want = [not _same(col[k], col[k + 1]) for k in pre]
        assert got[:, j].tolist() == want, name


def test_change_batches_cut_wide_rows_by_bytes(table):
    rng = np.random.default_rng(7)
    blob = lambda n: ["".join(map(chr, rng.integers(97, 123, 2000))) for _ in range(n)]  # noqa: E731  (2 kB, incompressible)
    table.append(pa.table({"id": np.arange(400), "name": blob(400), "amount": np.ones(400)}))
    table.update("id % 3 = 0", {"amount": "amount + 1"})  # pairs: a part may grow by one row to keep one whole
    table.delete("id % 5 = 1")
    budget = 64 << 10
    want = cdf.changes(table, 0)
    batches = list(cdf.change_batches(table, 0, batch_bytes=budget))
    assert pa.Table.from_batches(batches, want.schema).equals(want)
    widest = 2000 + 200  # the string, the other columns and the change columns of one row
    assert len(batches) > want.get_total_buffer_size() // budget
    sizes = [b.get_total_buffer_size() for b in batches]  # a batch is a part here (one chunk per column)
    assert all(size <= budget + 2 * widest for size in sizes), sizes
    assert max(b.num_rows for b in batches) < 40  # a row budget alone (1M rows) would hold the whole feed
    rows_only = list(cdf.change_batches(table, 0, batch_bytes=None))
    assert len(rows_only) == 1 and pa.Table.from_batches(rows_only, want.schema).equals(want)


def test_the_streamed_feeds_plan_holds_33_bytes_a_row(history):
    import cdf.stream as stream

    t, _ = history
    state = t.state()
    feed = stream.plan_feed(state, 0, state.version, t.arrow_schema, False)
    assert len(feed) == cdf.changes(t, 0).num_rows > 0
    assert stream.plan_bytes(feed) <= 33 * len(feed)  # versions, positions and row ids of this table fit in 32 bits
    parts = stream.plan_parts(state, 0, state.version, t.arrow_schema, False, 2)
    assert len(parts) > 1 and parts[0].change.base is not None
    assert all(p.change.base is parts[0].change.base for p in parts), "parts are views of one plan, not copies"
    assert sum(len(p) for p in parts) == len(feed)


def test_a_feed_streamed_in_several_parts_leaves_the_decoded_row_group_cache_alone(history, monkeypatch):
    from lineage import decoded_cache

    t, _ = history
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "64")
    decoded_cache.clear()
    for _ in range(3):  # kept from the second decoding on, were the parts using the cache
        assert cdf.change_batches(t, 0, batch_rows=2).read_all().equals(cdf.change_batches(t, 0, batch_rows=3).read_all())
    assert decoded_cache.CACHE.held == 0
    for _ in range(2):  # in one part: as changes(), the second read keeps what it decoded
        cdf.change_batches(t, 0).read_all()
    assert decoded_cache.CACHE.held > 0
    decoded_cache.clear()


def test_live_images_removed_since_are_found_by_mask_or_by_sort_alike(history, monkeypatch):
    """Live images of the range less those the index names as removed: a mask over the files' rows (small
    files) or a sorted membership test (few images of large files) give the same feeds."""
    import cdf.pointers as pointers

    t, _ = history
    feeds = {}
    for slack in (pointers.MASK_SLACK, -(1 << 62)):  # the default, then the sorted test forced
        monkeypatch.setattr(pointers, "MASK_SLACK", slack)
        feeds[slack] = [(feed(cdf.changes(t, a, b)), feed(cdf.changes(t, a, b, net=True)))
                        for a in range(t.version) for b in range(a + 1, t.version + 1)]
    first, second = feeds.values()
    assert first == second
