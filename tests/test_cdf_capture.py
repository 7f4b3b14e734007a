"""Pre-image capture (table property ``lineage.cdf.capture-preimages``) and the deleted-rows index format.

The property tests (tests/test_cdf_property.py, tests/test_maintenance.py)
draw the mode and compare both with the model; here: what a captured segment
holds, that it pins no data file (the feed survives the pre-images' files
being vacuumed), that reads match columns by field id across schema changes,
that format-1 segments are still read, and that a bad property value is refused.
"""

from __future__ import annotations

import datetime as _dt
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap64

import cdf
import lineage
from conftest import SCHEMA, rename_and_add_a_column, rows
from index import deleted_rows
from index.deleted_rows import read_index, read_index_segment
from lineage.storage.fileio import local_path

CAPTURE = {"lineage.cdf.capture-preimages": "true"}
ZERO = _dt.timedelta(0)


def _history(t: lineage.Table) -> None:
    t.append(pa.table({"id": list(range(10)), "name": list("abcdeabcde"), "amount": [float(i) for i in range(10)]}, schema=SCHEMA))
    t.update("id % 3 = 0", {"amount": "amount + 100"})
    t.delete("id IN (1, 4)")
    t.update("id = 2", {"name": "'z'"}, mode="copy-on-write")
    t.merge(upserts=pa.table({"id": [3, 20], "name": ["u", "n"], "amount": [0.5, 2.0]}, schema=SCHEMA),
            deletes=pa.table({"id": [5]}))


def _feeds(t: lineage.Table) -> dict:
    """Every feed ending at the current version, without commit timestamps (they differ between tables)."""

    def strip(tbl: pa.Table) -> list[tuple]:
        return rows(tbl, [c for c in tbl.column_names if not c.endswith("_timestamp")])

    n = t.version
    out: dict = {}
    for a in range(n + 1):
        out[(a, False)] = strip(cdf.changes(t, a, n))
        out[(a, True)] = strip(cdf.changes(t, a, n, net=True))
    out["deleted"] = strip(cdf.deleted_rows(t))
    return out


def test_captured_feed_equals_pointer_feed_and_pins_nothing(warehouse):
    plain = lineage.create_table("s.plain", SCHEMA, key=["id"], warehouse=warehouse)
    cap = lineage.create_table("s.cap", SCHEMA, key=["id"], warehouse=warehouse, properties=CAPTURE)
    for t in (plain, cap):
        _history(t)

    assert _feeds(cap) == _feeds(plain)  # row ids are assigned alike: every column is compared
    _assert_captured(cap)
    for c in plain.state().lineage.commits:
        if c.index:
            assert not read_index(plain.iceberg.io, c.index).captured
    # nothing pins the pre-images' files: expire + vacuum deletes every file no snapshot needs, the feed is unchanged
    before = _feeds(cap)
    cap.expire_snapshots(retain_last=1)
    cap.vacuum(older_than=ZERO)
    segments = {c.index for c in cap.state().lineage.commits if c.index}
    pointed = {e.file_path for s in segments for e in read_index_segment(cap.iceberg.io, s)}
    live = cap.state().all_data_file_paths()
    assert any(not os.path.exists(local_path(p)) for p in pointed - live), "some pointed-to files were released"
    deleted_rows._CACHE.clear()
    deleted_rows._VALUE_CACHE.clear()
    assert _feeds(cap) == before
    assert not lineage_verify_problems(cap)


def _assert_captured(t: lineage.Table) -> int:
    """Every index segment of ``t`` holds its removed images' values (by field id), as their data files hold them.

    Returns the number of captured images checked against a data file.
    """
    field_ids = {f.name: f.field_id for f in t.iceberg.schema().fields}
    checked = 0
    for c in t.state().lineage.commits:
        if not c.index:
            continue
        seg = read_index(t.iceberg.io, c.index, with_values=True)
        assert seg.captured and seg.values.num_rows == len(seg), f"version {c.version} ({c.operation}) did not capture"
        assert sorted(seg.values.column_names) == sorted(str(i) for i in field_ids.values())
        raw = pq.read_table(local_path(c.index))
        assert {f"value.{i}" for i in field_ids.values()} <= set(raw.column_names)
        # the captured values are those of the pointed images, as the data file holds them
        for e in read_index_segment(t.iceberg.io, c.index, with_values=True):
            if os.path.exists(local_path(e.file_path)):
                data = pq.read_table(local_path(e.file_path)).take(pa.array(e.positions))
                for name in SCHEMA.names:
                    assert e.values.column(str(field_ids[name])).to_pylist() == data.column(name).to_pylist()
                checked += len(e.positions)
    return checked


def _changelog(*events: tuple) -> pa.Table:
    """``(op, id, name, amount)`` change events as an apply_changelog batch."""
    cols = list(zip(*events, strict=True))
    return pa.table({"_op": pa.array(cols[0]), "id": pa.array(cols[1], pa.int64()), "name": pa.array(cols[2]),
                     "amount": pa.array(cols[3], pa.float64())})


def test_changelog_and_key_index_writes_capture_their_removed_images(warehouse):
    """Writes that find removed images without reading table data (key-index upserts, merges, change streams) capture too."""
    plain = lineage.create_table("s.kplain", SCHEMA, key=["id"], warehouse=warehouse)
    cap = lineage.create_table("s.kcap", SCHEMA, key=["id"], warehouse=warehouse, properties=CAPTURE)
    ops: list[str] = []
    for t in (plain, cap):
        t.append(pa.table({"id": list(range(10)), "name": list("abcdeabcde"), "amount": [float(i) for i in range(10)]}, schema=SCHEMA))
        t.upsert(pa.table({"id": [1, 2, 30], "name": ["u", "v", "n"], "amount": [1.5, 2.5, 3.0]}, schema=SCHEMA))
        assert t.state().lineage.key_index is not None  # planned through the key index: no table data was read
        t.merge(upserts=pa.table({"id": [3], "name": ["w"], "amount": [0.0]}, schema=SCHEMA), deletes=pa.table({"id": [4, 30]}),
                mode="copy-on-write")
        t.apply_changelog(_changelog(("-U", 5, "a", 5.0), ("+U", 5, "x", 50.0), ("-D", 6, "b", 6.0), ("+I", 40, "n", 4.0)))
        t.apply_changelog(_changelog(("u", 7, "y", 70.0), ("d", 1, "u", 1.5)), upsert=True, mode="copy-on-write")
        t.upsert(pa.table({"id": [8, 9], "name": ["d", "z"], "amount": [8.0, 9.0]}, schema=SCHEMA), skip_unchanged=True)  # 8 unchanged
        ops = [c.operation for c in t.state().lineage.commits if c.index]
    assert ops == ["upsert", "merge", "changelog", "changelog", "upsert"]
    assert _feeds(cap) == _feeds(plain)
    assert _assert_captured(cap) == 2 + 3 + 2 + 2 + 1  # every removed image, checked against its file
    for c in plain.state().lineage.commits:
        if c.index:
            assert not read_index(plain.iceberg.io, c.index).captured
    # the captured values are what the feed shows: with the pre-images' files gone it is unchanged
    cap.compact()  # no live file holds a pre-image any more
    before = _feeds(cap)
    cap.expire_snapshots(retain_last=1)
    cap.vacuum(older_than=ZERO)
    pointed = {e.file_path for c in cap.state().lineage.commits if c.index for e in read_index_segment(cap.iceberg.io, c.index)}
    assert not any(os.path.exists(local_path(p)) for p in pointed), "vacuum released every pre-image's file"
    deleted_rows._CACHE.clear()
    deleted_rows._VALUE_CACHE.clear()
    assert _feeds(cap) == before
    assert not lineage_verify_problems(cap)


def lineage_verify_problems(t: lineage.Table) -> list[str]:
    from lineage.maintenance.verify import verify

    return verify(t).problems


def test_columns_are_matched_by_field_id_after_a_rename_and_an_added_column(warehouse):
    for props in ({}, CAPTURE):
        t = lineage.create_table(f"s.evo{len(props)}", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
        rename_and_add_a_column(t)
        got = [(r["id"], r["label"], r["note"], r["_change_type"], r["_changed_columns"]) for r in cdf.changes(t, 1).to_pylist()]
        assert got == [
            (1, "a", None, "update_preimage", ["amount"]),
            (1, "a", None, "update_postimage", ["amount"]),
            (2, "b", None, "update_preimage", ["note"]),
            (2, "b", "x", "update_postimage", ["note"]),
            (3, "c", None, "delete", None),
        ], props


def test_format_1_segments_are_still_read(warehouse, table):
    table.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.0, 2.0, 3.0]}, schema=SCHEMA))
    table.delete("id = 2")
    path = next(c.index for c in table.state().lineage.commits if c.index)
    (entry,) = read_index_segment(table.iceberg.io, path)
    feed = rows(cdf.changes(table, 0))
    v1 = pa.table(
        {"file_path": [entry.file_path], "positions": [BitMap64(entry.positions.tolist()).serialize()], "row_ids": [entry.row_ids.tolist()],
         "created_values": [[1]], "created_lengths": [[1]], "valid_from_values": [[1]], "valid_from_lengths": [[1]], "valid_to": [entry.valid_to]}
    ).replace_schema_metadata({"lineage.format": "deleted-rows-segment", "lineage.format-version": "1"})
    pq.write_table(v1, local_path(path))
    deleted_rows._CACHE.clear()
    (again,) = read_index_segment(table.iceberg.io, path)
    assert again.positions.tolist() == [1] and again.values is None and again.valid_to == entry.valid_to
    assert rows(cdf.changes(table, 0)) == feed
    newer = v1.replace_schema_metadata({"lineage.format": "deleted-rows-segment", "lineage.format-version": "3"})
    pq.write_table(newer, local_path(path))
    deleted_rows._CACHE.clear()
    with pytest.raises(lineage.UnsupportedFormatError, match="reads up to 2"):
        read_index_segment(table.iceberg.io, path)


def test_capture_values_round_trip_and_mixed_segments_are_refused(tmp_path):
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = PyArrowFileIO()
    values = pa.table({"1": pa.array([7, 5], pa.int64()), "2": pa.array(["x", None])})
    img = deleted_rows.RemovedImages("f.parquet", np.array([9, 2]), np.array([19, 12]), np.array([1, 1]), np.array([1, 2]), 3, values)
    path = str(tmp_path / "seg.parquet")
    deleted_rows.write_index_segment(io, path, [img])
    deleted_rows._CACHE.clear()
    deleted_rows._VALUE_CACHE.clear()
    (back,) = read_index_segment(io, path, with_values=True)
    assert back.positions.tolist() == [2, 9] and back.row_ids.tolist() == [12, 19]  # sorted by position, values with them
    assert back.values.column("1").to_pylist() == [5, 7] and back.values.column("2").to_pylist() == [None, "x"]
    assert read_index_segment(io, path)[0].values is None  # pointers only unless asked
    plain = deleted_rows.RemovedImages("g.parquet", np.array([1]), np.array([1]), np.array([1]), np.array([1]), 3)
    with pytest.raises(ValueError, match="all its entries or of none"):
        deleted_rows.write_index_segment(io, str(tmp_path / "mixed.parquet"), [img, plain])


def test_bad_capture_property_is_refused(warehouse):
    with pytest.raises(lineage.InvalidArgumentError, match="lineage.cdf.capture-preimages"):
        lineage.create_table("s.bad", SCHEMA, warehouse=warehouse, properties={"lineage.cdf.capture-preimages": "yes"})


def test_captured_strings_of_few_values_are_read_as_dictionaries_and_the_feed_is_unchanged(warehouse):
    """Captured string columns of few distinct values are dictionary-encoded once per parsed segment (as data
    files read them); many distinct values stay plain; the feeds equal those of a table without capture."""
    n = 400
    statuses = ["new", "paid", "shipped"]
    base = pa.table({"id": list(range(n)), "name": [statuses[i % 3] for i in range(n)], "amount": [float(i) for i in range(n)]},
                    schema=SCHEMA)
    plain = lineage.create_table("s.plain", SCHEMA, key=["id"], warehouse=warehouse)
    cap = lineage.create_table("s.cap", SCHEMA, key=["id"], warehouse=warehouse, properties=CAPTURE)
    for t in (plain, cap):
        t.append(base)
        t.merge(upserts=pa.table({"id": list(range(0, 200)), "name": [f"u{i}" for i in range(200)], "amount": [1.0] * 200},
                                 schema=SCHEMA), deletes=pa.table({"id": list(range(300, 340))}))
        t.merge(upserts=pa.table({"id": list(range(100, 300)), "name": ["paid"] * 200, "amount": [2.0] * 200}, schema=SCHEMA))
    assert _feeds(cap) == _feeds(plain)
    segments = [read_index(cap.iceberg.io, c.index, True) for c in cap.state().lineage.log.since(0) if c.index]
    name_id = str(next(f.field_id for f in cap.iceberg.schema().fields if f.name == "name"))
    encoded = [deleted_rows.dictionary_values(seg) for seg in segments]
    assert pa.types.is_dictionary(encoded[0].column(name_id).type)  # three statuses among 240 removed images
    assert not pa.types.is_dictionary(encoded[1].column(name_id).type)  # 100 distinct names among 200: kept plain
    assert encoded[0].column(name_id).cast(pa.string()).to_pylist() == segments[0].values.column(name_id).to_pylist()
    assert deleted_rows.dictionary_values(segments[0]) is encoded[0]  # encoded once, kept
    deleted_rows.forget_captured_values()
    assert deleted_rows.dictionary_values(segments[0]) is not encoded[0]
