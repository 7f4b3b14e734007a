"""Deletes and updates a group of data files at a time (lineage.writes.grouped), and the bounded key index delta.

A merge-on-read delete or update over more rows than ``LINEAGE_WRITE_GROUP_ROWS``
runs its predicate and writes its outputs one group of data files at a
time. These tests run the same writes on two identical tables, one in
groups of a few rows and one in one piece, and check that they agree on
everything a user sees: the rows with their lineage, the change feed, the
key index and the commit's counts, on Iceberg v2 and v3, with and without
pre-image capture. They also check that a failing group leaves the table
untouched and removes what earlier groups wrote, and that the delta segment
built in bounded memory (index.key_delta) is the in-memory one byte for byte.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cdf
import lineage
import lineage.writes.chunked_upsert as chunked_upsert
import lineage.writes.grouped as grouped
from conftest import SCHEMA
from index import key_delta
from index.key_entries import file_entries
from index.key_index import KeyIndex, delta_segment
from index.key_segment import CREATED, ROW_ID, UPDATED, drop_tombstones, write_key_segment
from lineage.columns import HIDDEN_ROW_ID
from lineage.errors import InvalidArgumentError
from lineage.maintenance import verify
from lineage.writes.rows import by_row_id

FILES, PER_FILE = 6, 40


def _table(warehouse: str, name: str, *, v3: bool, capture: bool) -> lineage.Table:
    props = {"lineage.cdf.capture-preimages": "true"} if capture else {}
    t = lineage.create_table(name, SCHEMA, key=["id"], warehouse=warehouse, properties=props, format_version=3 if v3 else None)
    for f in range(FILES):
        ids = np.arange(f * PER_FILE, (f + 1) * PER_FILE)
        t.append(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i % 7}" for i in ids], "amount": pa.array(ids * 0.5)}))
    return t


def _writes(t: lineage.Table) -> list[lineage.CommitInfo]:
    return [
        t.delete("id % 5 = 0"),
        t.update("name = 'n3'", {"amount": "amount + 1", "name": "'m'"}),
        t.delete("id > 200 AND id < 230"),
        t.update("id % 2 = 1", {"amount": "amount * 2"}),
        t.delete("name = 'nothing'"),
    ]


def _seen(t: lineage.Table, base: int) -> tuple:
    scan = t.scan().sort_by("_row_id").to_pylist()
    feed = cdf.changes(t, base).drop_columns(["_commit_timestamp"]).to_pylist()
    feed.sort(key=lambda r: (r["_commit_version"], r["_row_id"], r["_change_type"]))
    entries = KeyIndex.open(t.state()).live_entries().select(["id", ROW_ID, CREATED, UPDATED]).sort_by("id").to_pylist()
    return scan, feed, entries


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
@pytest.mark.parametrize("capture", [False, True], ids=["pointers", "captured"])
def test_grouped_writes_equal_one_piece_writes(warehouse: str, monkeypatch: pytest.MonkeyPatch, v3: bool, capture: bool) -> None:
    whole = _table(warehouse, "shop.whole", v3=v3, capture=capture)
    parts = _table(warehouse, "shop.parts", v3=v3, capture=capture)
    base = whole.version
    calls = []
    query = grouped._query
    monkeypatch.setattr(grouped, "_query", lambda *a: calls.append(len(a[0])) or query(*a))
    expected = _writes(whole)
    assert not calls  # 240 rows: one piece
    monkeypatch.setenv(grouped.ENV_GROUP_ROWS, str(2 * PER_FILE))
    monkeypatch.setattr(key_delta, "SPOOL_ROWS", 0)  # every delta the planner knows the tombstones of: bounded build
    got = _writes(parts)
    assert calls and max(calls) == 2  # two data files a group
    strip = ("snapshot_id", "timestamp", "bytes_written", "data_files_added", "delete_files_added", "data_files_removed")
    assert [{k: v for k, v in vars(c).items() if k not in strip} for c in got] == [
        {k: v for k, v in vars(c).items() if k not in strip} for c in expected
    ]
    assert not got[-1].committed
    assert _seen(parts, base) == _seen(whole, base)
    assert verify(parts).ok, verify(parts).problems


def _batch(ids: np.ndarray, tag: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"{tag}{i % 3}" for i in ids], "amount": pa.array(ids * 0.25)})


def _upserts(t: lineage.Table) -> list[lineage.CommitInfo]:
    return [
        t.upsert(_batch(np.concatenate([np.arange(0, 240, 7), np.arange(500, 530)]), "u")),  # updates and inserts, mixed in chunks
        t.merge(_batch(np.arange(600, 640), "i"), _batch(np.arange(1, 240, 11), "x").select(["id"])),  # inserts only, and deletes
        t.upsert(_batch(np.arange(3, 240, 5), "v"), mode="copy-on-write"),
    ]


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
def test_chunked_upserts_equal_one_piece_upserts(warehouse: str, monkeypatch: pytest.MonkeyPatch, v3: bool) -> None:
    whole = _table(warehouse, "shop.whole", v3=v3, capture=True)
    parts = _table(warehouse, "shop.parts", v3=v3, capture=True)
    base = whole.version
    expected = _upserts(whole)
    calls = []
    match = chunked_upsert.key_checks.match_upserts
    monkeypatch.setattr(chunked_upsert.key_checks, "match_upserts", lambda *a: calls.append(a[2].num_rows) or match(*a))
    monkeypatch.setattr(chunked_upsert, "CHUNK_ROWS", 16)
    monkeypatch.setattr(key_delta, "SPOOL_ROWS", 0)
    got = _upserts(parts)
    assert calls and max(calls) == 16
    strip = ("snapshot_id", "timestamp", "bytes_written", "data_files_added", "delete_files_added", "data_files_removed")
    assert [{k: v for k, v in vars(c).items() if k not in strip} for c in got] == [
        {k: v for k, v in vars(c).items() if k not in strip} for c in expected
    ]
    scan, feed, entries = _seen(parts, base)
    want_scan, want_feed, want_entries = _seen(whole, base)
    if v3:  # fresh row ids follow the files' first row ids on v3: the chunks' files number the inserts apart
        scan, want_scan, feed, want_feed = ([{k: v for k, v in r.items() if k != "_row_id"} for r in x] for x in (scan, want_scan, feed, want_feed))
        feed.sort(key=repr), want_feed.sort(key=repr)
        scan.sort(key=lambda r: r["id"]), want_scan.sort(key=lambda r: r["id"])
        entries = [{k: v for k, v in r.items() if k != ROW_ID} for r in entries]
        want_entries = [{k: v for k, v in r.items() if k != ROW_ID} for r in want_entries]
    assert (scan, feed, entries) == (want_scan, want_feed, want_entries)
    assert verify(parts).ok, verify(parts).problems


def test_a_failing_group_leaves_the_table_and_storage_as_they_were(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _table(warehouse, "shop.orders", v3=False, capture=False)
    before = (t.version, t.scan().sort_by("_row_id").to_pylist())
    files_before = {os.path.join(d, f) for d, _, fs in os.walk(warehouse) for f in fs}
    monkeypatch.setenv(grouped.ENV_GROUP_ROWS, str(PER_FILE))
    monkeypatch.setattr(grouped, "FLUSH_POSITIONS", 1)  # every group writes its delete files at once
    query, seen = grouped._query, []

    def failing(*a):  # noqa: ANN002, ANN202
        seen.append(1)
        if len(seen) == 4:
            raise OSError("disk gone")
        return query(*a)

    monkeypatch.setattr(grouped, "_query", failing)
    with pytest.raises(OSError, match="disk gone"):
        t.update("id % 3 = 0", {"amount": "0"})
    assert (t.version, t.scan().sort_by("_row_id").to_pylist()) == before
    assert {os.path.join(d, f) for d, _, fs in os.walk(warehouse) for f in fs} == files_before


def test_mode_and_key_updates_take_the_one_piece_plan(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _table(warehouse, "shop.orders", v3=False, capture=False)
    monkeypatch.setenv(grouped.ENV_GROUP_ROWS, str(PER_FILE))
    monkeypatch.setattr(grouped, "grouped_plan", lambda *a, **k: pytest.fail("grouped"))
    assert t.delete("id < 3", mode="copy-on-write").deleted == 3
    assert t.update("id = 5", {"id": "1000"}).updated == 1
    assert sorted(r["id"] for r in t.scan(columns=["id"]).to_pylist())[-1] == 1000


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_group_size_is_refused_before_anything_is_written(warehouse: str, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    t = _table(warehouse, "shop.orders", v3=False, capture=False)
    monkeypatch.setenv(grouped.ENV_GROUP_ROWS, value)
    with pytest.raises(InvalidArgumentError, match=grouped.ENV_GROUP_ROWS):
        t.delete("id < 10")
    assert t.scan().num_rows == FILES * PER_FILE


def test_file_groups_cut_consecutive_files_by_rows() -> None:
    class F:
        def __init__(self, n: int) -> None:
            self.data_file = type("D", (), {"record_count": n})()

    assert grouped.file_groups([F(n) for n in (3, 3, 5, 1, 1, 9)], 6) == [[0, 1], [2, 3], [4], [5]]


@pytest.mark.parametrize("chunk", [None, 1, 7, 40], ids=["chunk-default", "chunk-1", "chunk-7", "chunk-file"])
@pytest.mark.parametrize("budget", [1 << 10, 1 << 30], ids=["spilled", "in-memory"])
@pytest.mark.parametrize("with_base", [True, False], ids=["delta", "first-segment"])
def test_bounded_delta_is_the_in_memory_delta_byte_for_byte(warehouse: str, tmp_path, monkeypatch, budget: int, with_base: bool,  # noqa: ANN001
                                                            chunk: int | None) -> None:
    """``chunk``: entries and tombstones turned into records that many at a time (a file's rows cut at every boundary)."""
    if chunk is not None:
        monkeypatch.setattr(key_delta, "CHUNK_ROWS", chunk)
    t = _table(warehouse, "shop.orders", v3=False, capture=False)
    state = t.state()
    index = KeyIndex.open(state)
    files = list(state.live_files())
    written = [f.lineage for f in files[:2]]  # their rows as the commit's new entries
    tombstones = pa.table({"id": pa.array(np.arange(1000, 1300), pa.int64())})  # keys no entry has
    io = t.iceberg.io
    bounded = key_delta.spooled_delta(io, index, written, (), {}, tombstones, base=not with_base, budget=budget)
    in_memory = delta_segment(index, file_entries(io, index, written, (), {}), tombstones)
    if not with_base:  # the first segment of an index: a base, without tombstones (as next_key_index makes it)
        in_memory = dataclasses.replace(drop_tombstones(in_memory), base=True, level=0)
    a, b = str(tmp_path / "a.kix"), str(tmp_path / "b.kix")
    write_key_segment(io, a, bounded, 9)
    write_key_segment(io, b, in_memory, 9)
    assert open(a, "rb").read() == open(b, "rb").read()


def test_the_keys_a_grouped_write_keeps_hold_their_own_buffers_not_the_group_result() -> None:
    """A column of a DuckDB result shares the result's release: kept as is, it would keep every column alive."""
    import lineage.duck as duck

    con = duck.connect(isolated=True)
    result = duck.fetch_arrow(con, "SELECT range AS id, range * 2 AS a, range * 3 AS b FROM range(100000)")
    con.close()
    before = pa.total_allocated_bytes()
    kept = grouped.owned(result.select(["id"]))
    assert kept.equals(result.select(["id"]))
    assert pa.total_allocated_bytes() - before >= 8 * 100000  # copied into Arrow's pool
    theirs = {b.address for c in result.columns for chunk in c.chunks for b in chunk.buffers() if b is not None}
    assert not theirs & {b.address for c in kept.columns for chunk in c.chunks for b in chunk.buffers() if b is not None}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=8, unique=True), min_size=1, max_size=4), st.booleans())
def test_images_by_row_id_are_sort_by_order_and_not_copied_when_in_order(parts: list[list[int]], ordered: bool) -> None:
    """by_row_id orders the rows of its parts as sort_by does (ties included), empties the list, and copies nothing
    when they are in order already."""
    ids = [i for p in parts for i in p]
    if ordered:
        ids = sorted(set(ids))
        cut = [ids[:len(ids) // 2], ids[len(ids) // 2:]]
        parts = [p for p in cut if p] or [[]]
    tables = [pa.table({"v": pa.array([str(i) for i in p], pa.string()), HIDDEN_ROW_ID: pa.array(p, pa.int64()),
                        "n": pa.array(range(len(p)), pa.int64())}) for p in parts]
    want = pa.concat_tables(tables).sort_by(HIDDEN_ROW_ID)
    buffers = {b.address for t in tables for c in t.columns for ch in c.chunks for b in ch.buffers() if b is not None}
    held = list(tables)
    got = by_row_id(held)
    assert held == [] and got.schema == want.schema and got.combine_chunks().equals(want.combine_chunks())
    got_buffers = {b.address for c in got.columns for ch in c.chunks for b in ch.buffers() if b is not None}
    if ordered:
        assert got_buffers <= buffers
