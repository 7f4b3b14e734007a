"""Values at row positions of data files (lineage.read.values: values_at, the write path's reader, and read_at, the feed's) against a plain read of the whole files."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.types import StringType

import lineage
from conftest import SCHEMA
from lineage import decoded_cache
from lineage.read import values
from lineage.errors import KeyViolationError
from lineage.read.values import values_at

TARGET = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("note", pa.string())])
IDS = {"id": 1, "name": 2, "amount": 3, "note": 4}


def _with_ids(schema: pa.Schema, ids: dict[str, int]) -> pa.Schema:
    return pa.schema([f.with_metadata({b"PARQUET:field_id": str(ids[f.name]).encode()}) for f in schema])


def _write(path: str, rows: int, seed: int, row_group: int, old_layout: bool) -> pa.Table:
    """A data file of ``rows`` rows in row groups of ``row_group``; returns its rows as the table reads them.

    ``old_layout``: written under an older schema in which ``id`` was an int32,
    ``name`` was called ``label`` and ``note`` did not exist yet.
    """
    rng = np.random.default_rng(seed)
    ids = np.arange(rows) + 1000 * seed
    names = pa.array([None if i % 5 == 0 else f"n{i % 3}" for i in range(rows)], pa.string())  # dictionary-encoded
    amounts = rng.random(rows)
    if old_layout:
        data = pa.Table.from_arrays([pa.array(ids, pa.int32()), names, pa.array(amounts)], schema=_with_ids(
            pa.schema([("id", pa.int32()), ("label", pa.string()), ("amount", pa.float64())]), {"id": 1, "label": 2, "amount": 3}))
        want = pa.table([pa.array(ids, pa.int64()), names, pa.array(amounts), pa.nulls(rows, pa.string())], schema=TARGET)
    else:
        notes = pa.array([f"unique-{seed}-{i}" for i in range(rows)], pa.string())  # plain-encoded
        data = pa.Table.from_arrays([pa.array(ids, pa.int64()), names, pa.array(amounts), notes], schema=_with_ids(TARGET, IDS))
        want = pa.table([pa.array(ids, pa.int64()), names, pa.array(amounts), notes], schema=TARGET)
    pq.write_table(data, path, row_group_size=row_group, use_dictionary=["label", "name"])
    return want


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_values_at_positions_equal_a_full_read(tmp_path, data):
    files = data.draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 9), st.booleans()), min_size=1, max_size=4), label="files")
    by_id = data.draw(st.booleans(), label="by field id")
    cache = data.draw(st.sampled_from([0, 300, 1 << 20]), label="cache bytes")
    tag = len(os.listdir(tmp_path))
    paths, wants = [], []
    for i, (rows, group, old) in enumerate(files):
        path = str(tmp_path / f"f{tag}-{i}.parquet")
        wants.append(_write(path, rows, i, group, old and by_id))
        paths.append(path)
    picks = data.draw(st.lists(st.integers(0, 10**6), max_size=60), label="picks")
    file_ids = np.array([p % len(files) for p in picks], dtype=np.int32)
    pos = np.array([(p // len(files)) % files[f][0] for p, f in zip(picks, file_ids, strict=True)], dtype=np.int64)
    want = [wants[f].slice(int(p), 1).to_pylist()[0] for f, p in zip(file_ids, pos, strict=True)]
    old_budget = os.environ.get(decoded_cache.ENV_BUDGET)
    os.environ[decoded_cache.ENV_BUDGET] = str(cache / 2**20)
    decoded_cache.clear()
    try:
        for _ in range(2):  # cold, then from the cache
            got = values_at(paths, file_ids, pos, TARGET, IDS if by_id else None)
            assert got is not None and got.schema == TARGET
            assert got.to_pylist() == want
    finally:
        if old_budget is None:
            del os.environ[decoded_cache.ENV_BUDGET]
        else:
            os.environ[decoded_cache.ENV_BUDGET] = old_budget
        decoded_cache.clear()
    split = data.draw(st.sampled_from([0, values.SPLIT_BYTES]), label="split row groups over")
    old_split, values.SPLIT_BYTES = values.SPLIT_BYTES, split  # 0: every row group is decoded in column parts
    try:
        got = values.read_at(paths, file_ids, pos, TARGET, IDS if by_id else None)  # the feed's reader
    finally:
        values.SPLIT_BYTES = old_split
    assert got.schema == TARGET
    assert got.to_pylist() == want


def test_only_the_row_groups_that_hold_a_position_are_read(tmp_path, monkeypatch):
    path = str(tmp_path / "f.parquet")
    want = _write(path, 100, 1, 10, False)
    read: list[int] = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, i, **k: read.append(i) or real(self, i, **k))
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "1")
    decoded_cache.clear()
    got = values_at([path], np.zeros(3, np.int32), np.array([57, 3, 51]), TARGET, None)
    assert got.to_pylist() == [want.slice(p, 1).to_pylist()[0] for p in (57, 3, 51)]
    assert set(read) == {0, 5}  # (a column at a time: one call per column of each row group)
    n = len(read)
    values_at([path], np.zeros(1, np.int32), np.array([55]), TARGET, None)
    assert read[n:] and set(read[n:]) == {5}, "decoded by a second read: kept from now on"
    n = len(read)
    values_at([path], np.zeros(1, np.int32), np.array([55]), TARGET, None)
    assert read[n:] == [], "a kept row group was read again"
    with pytest.raises(IndexError, match="out of range"):
        values_at([path], np.zeros(1, np.int32), np.array([100]), TARGET, None)


def test_the_feed_reader_starts_the_largest_row_group_first(tmp_path, monkeypatch):
    small, large = str(tmp_path / "small.parquet"), str(tmp_path / "large.parquet")
    want_small, want_large = _write(small, 20, 1, 20, False), _write(large, 400, 2, 400, False)
    started: list[int] = []
    real = values._read_columns
    monkeypatch.setattr(values, "_read_columns", lambda f, pos, rg, cols, read: started.append(len(pos)) or real(f, pos, rg, cols, read))
    monkeypatch.setattr(values, "WORKERS", 1)  # one worker: tasks run in the order they were submitted
    file_ids = np.array([0, 0, 1, 1, 1], np.int32)  # the small file is numbered first
    pos = np.array([3, 7, 9, 399, 200])
    got = values.read_at([small, large], file_ids, pos, TARGET, IDS)
    want = [w.slice(p, 1).to_pylist()[0] for w, p in zip([want_small] * 2 + [want_large] * 3, pos, strict=True)]
    assert got.to_pylist() == want
    assert started == [3, 2], "the large file's row group should be decoded first"


def test_a_large_row_group_is_decoded_by_both_workers_in_column_parts(tmp_path, monkeypatch):
    path = str(tmp_path / "large.parquet")
    want = _write(path, 400, 3, 400, False)
    parts: list[tuple[str, ...]] = []
    real = values._read_columns
    monkeypatch.setattr(values, "_read_columns", lambda f, pos, rg, cols, read: parts.append(cols) or real(f, pos, rg, cols, read))
    monkeypatch.setattr(values, "SPLIT_BYTES", 1)
    pos = np.array([399, 5, 17, 5])
    got = values.read_at([path], np.zeros(len(pos), np.int32), pos, TARGET, IDS)
    assert got.to_pylist() == [want.slice(p, 1).to_pylist()[0] for p in pos]
    assert len(parts) == values.WORKERS and sorted(c for p in parts for c in p) == sorted(TARGET.names)
    parts.clear()
    monkeypatch.setattr(values, "SPLIT_BYTES", 1 << 30)  # under the threshold: one worker reads the row group whole
    assert values.read_at([path], np.zeros(len(pos), np.int32), pos, TARGET, IDS).equals(got)
    assert parts == [tuple(sorted(TARGET.names))]
    parts.clear()
    monkeypatch.setattr(values, "SPLIT_BYTES", 1)
    other = str(tmp_path / "other.parquet")
    _write(other, 400, 4, 400, False)
    values.read_at([path, other], np.array([0, 1], np.int32), np.array([3, 4]), TARGET, IDS)
    assert parts == [tuple(sorted(TARGET.names))] * 2, "two equal row groups: each worker has one, none is split"


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_take_rows_orders_dictionary_encoded_strings_like_plain_ones(data):
    """Pieces from Parquet keep string columns as dictionaries (each its own); captured pieces hold plain strings."""
    words = st.one_of(st.none(), st.sampled_from(["a", "bb", "", "ccc", "dd"]), st.text(max_size=3))
    pieces, plain = [], []
    for kind in data.draw(st.lists(st.sampled_from(["dict", "large dict", "plain"]), min_size=1, max_size=4), label="pieces"):
        got = data.draw(st.lists(words, max_size=12), label="values")
        plain.extend(got)
        arr = pa.array(got, pa.large_string() if kind == "large dict" else pa.string())
        pieces.append(pa.table({"s": arr if kind == "plain" else arr.dictionary_encode(), "n": pa.array(range(len(got)), pa.int64())}))
    # up to 200 rows: enough for the dictionaries to be small beside them (the path that reorders indices)
    rows = np.array(data.draw(st.lists(st.integers(0, max(len(plain) - 1, 0)), max_size=200) if plain else st.just([])), np.int64)
    schema = pa.schema([("s", pa.string()), ("n", pa.int64())])
    got = values.take_rows(pieces, rows, schema)
    assert got.schema == schema
    assert got.column("s").to_pylist() == [plain[i] for i in rows]
    assert pieces == [], "take_rows consumes its pieces"


@pytest.mark.parametrize("target", [pa.string(), pa.large_string()])  # pyiceberg's tables read strings as large_string
def test_take_rows_reorders_few_distinct_strings_as_dictionary_indices(monkeypatch, target):
    first, second = pa.array(["x", None, "y", "x"]).dictionary_encode(), pa.array(["z", "y", None]).dictionary_encode()
    plain = first.to_pylist() + second.to_pylist()
    rows = np.random.default_rng(5).integers(0, len(plain), 400)
    joined: list[pa.DataType] = []
    real = pa.concat_arrays
    monkeypatch.setattr(pa, "concat_arrays", lambda arrays, *a, **k: joined.extend(x.type for x in arrays) or real(arrays, *a, **k))
    got = values.take_rows([pa.table({"s": first}), pa.table({"s": second})], rows, pa.schema([("s", target)]))
    assert got.column("s").to_pylist() == [plain[i] for i in rows]
    assert got.schema.field("s").type == target
    assert joined and all(pa.types.is_dictionary(t) for t in joined), "the indices, not the strings, should be reordered"


def test_take_rows_decodes_dictionaries_of_different_string_widths():
    """A data file's dictionary of strings beside captured values encoded as large strings: decoded first, same rows."""
    first, second = pa.array(["x", "y", "x"]).dictionary_encode(), pa.array(["y", "z"], pa.large_string()).dictionary_encode()
    rows = np.array([0, 4, 1, 3] * 20)
    got = values.take_rows([pa.table({"s": first}), pa.table({"s": second})], rows, pa.schema([("s", pa.large_string())]))
    assert got.column("s").to_pylist() == [["x", "y", "x", "y", "z"][i] for i in rows]


def test_files_that_cannot_be_read_by_position_are_left_to_the_scan(tmp_path):
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": [1, 2]}), path)  # no field ids
    schema = pa.schema([("id", pa.int64())])
    assert values_at([path], np.zeros(1, np.int32), np.array([1]), schema, {"id": 1}) is None
    assert values_at(["s3://bucket/f.parquet"], np.zeros(1, np.int32), np.array([1]), schema, None) is None
    assert values_at([path], np.zeros(1, np.int32), np.array([1]), schema, None).to_pylist() == [{"id": 2}]


def test_strict_change_streams_check_images_across_row_groups_and_renamed_columns(warehouse, monkeypatch):
    from lineage.writes import live_images as keys

    groups: list[int] = []  # row groups of the files read by position; -1 when left to the scan
    real = keys.values_at

    def spy(paths, *a, **k):
        out = real(paths, *a, **k)
        groups.extend(pq.ParquetFile(lineage.storage.fileio.local_path(p)).num_row_groups if out is not None else -1 for p in paths)
        return out

    monkeypatch.setattr(keys, "values_at", spy)
    t = lineage.create_table("s.rg", SCHEMA, key=["id"], warehouse=warehouse, properties={"write.parquet.row-group-limit": "3"})
    t.append(pa.table({"id": pa.array(range(20), pa.int64()), "name": [f"n{i}" for i in range(20)], "amount": [float(i) for i in range(20)]}))

    def events(rows: list[tuple[str, int, str, float]]) -> pa.Table:
        return pa.table({"id": pa.array([r[1] for r in rows], pa.int64()), "name": [r[2] for r in rows],
                         "amount": [r[3] for r in rows], "_op": [r[0] for r in rows]})

    info = t.apply_changelog(events([("-U", 1, "n1", 1.0), ("+U", 1, "a", 1.5), ("-U", 17, "n17", 17.0), ("+U", 17, "b", 0.0)]))
    assert info.updated == 2 and groups == [7]
    with pytest.raises(KeyViolationError, match="1 image"):
        t.apply_changelog(events([("-U", 10, "n10", 10.0), ("+U", 10, "c", 0.0), ("-U", 13, "wrong", 13.0), ("+U", 13, "d", 0.0)]))
    with t.iceberg.update_schema() as upd:  # files are read by field id from now on
        upd.rename_column("name", "label")
        upd.add_column("note", StringType())
    t.refresh()
    info = t.apply_changelog(pa.table({
        "id": pa.array([1, 1, 14, 14], pa.int64()), "label": ["a", "e", "n14", "f"], "amount": [1.5, 2.0, 14.0, 1.0],
        "note": [None, "x", None, None], "_op": ["-U", "+U", "-U", "+U"],
    }))
    assert info.updated == 2 and -1 not in groups
    live = {r["id"]: (r["label"], r["amount"], r["note"]) for r in t.scan().to_pylist()}
    assert live[1] == ("e", 2.0, "x") and live[14] == ("f", 1.0, None) and live[17] == ("b", 0.0, None) and len(live) == 20



def test_a_file_replaced_at_its_path_is_not_served_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "1")
    decoded_cache.clear()
    path = str(tmp_path / "f.parquet")
    first = _write(path, 30, 1, 10, False)
    assert values_at([path], np.zeros(1, np.int32), np.array([25]), TARGET, None).to_pylist() == first.slice(25, 1).to_pylist()
    second = _write(path, 30, 2, 7, False)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a coarse clock must not hide the change
    assert values_at([path], np.zeros(1, np.int32), np.array([25]), TARGET, None).to_pylist() == second.slice(25, 1).to_pylist()


def test_a_string_chunk_whose_dictionary_overflowed_is_read_plain_and_taken_rows_keep_no_large_dictionary(tmp_path, monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "0")
    few, many = str(tmp_path / "few.parquet"), str(tmp_path / "many.parquet")
    n = 150_000
    pq.write_table(pa.table({"name": pa.array([f"v{i % 3}" for i in range(n)])}), few)
    # 150,000 distinct strings outgrow the writer's 1 MiB dictionary: the rest of the chunk is written plain
    pq.write_table(pa.table({"name": pa.array([f"distinct-{i}" for i in range(n)])}), many)
    assert values.layout(few).dictionary == ("name",)
    assert values.layout(many).dictionary == ()
    schema = pa.schema([("name", pa.string())])
    pos = np.array([7, 149_999, 3])
    for path, want in ((few, ["v1", "v2", "v0"]), (many, ["distinct-7", "distinct-149999", "distinct-3"])):
        got = values.gather([path], np.zeros(3, np.int32), pos, schema)
        assert values.take_rows(got.pieces, got.rows, schema).column("name").to_pylist() == want
    # taken rows of a chunk read as a dictionary keep it only while it is smaller than they are
    whole = pa.table({"name": pa.array([f"d{i}" for i in range(100)]).dictionary_encode()})
    assert values._without_large_dictionaries(whole.slice(0, 3)).column("name").type == pa.string()
    assert pa.types.is_dictionary(values._without_large_dictionaries(whole).column("name").type)
