"""What the lineage sidecar keeps on an Iceberg v3 table.

A data file whose rows keep their ids (the new images of an update or
upsert, a fold or compaction) holds them in its ``_row_id`` column on v3, so
its lineage segment (format 2) stores no row ids for it: only the file's
``first_row_id`` and a checksum; a reader takes the ids from the data file,
as every v3 reader does. v2 tables and files of new rows (one run of ids)
are written as before (format 1).
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO

import lineage
import lineage.duck as duck
from index import deleted_rows
from lineage.storage import commit_log, metadata
from lineage.storage.fileio import local_path
from lineage.storage.lineage_columns import ROW_ID_FIELD_ID, native_row_ids
from lineage.storage.metadata import SUMMARY_LIST, FileLineage, read_list, read_segment, write_segment
from lineage.storage.rle import encode_sequence, encode_values, sequence_run, value_run

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
FILEIO = PyArrowFileIO()


def _clear_caches() -> None:
    metadata._SEGMENT_CACHE.clear()
    metadata._LIST_CACHE.clear()
    commit_log._CHUNK_CACHE.clear()
    deleted_rows._CACHE.clear()


@pytest.fixture(autouse=True)
def _fresh_caches():
    _clear_caches()
    yield
    _clear_caches()


def _rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def _current_list(t: lineage.Table) -> tuple[str, metadata.LineageList]:
    t.refresh()
    path = t.iceberg.metadata.current_snapshot().summary.additional_properties[SUMMARY_LIST]
    return path, read_list(t.iceberg.io, path)


def _live_lineage(t: lineage.Table) -> dict[str, FileLineage]:
    return {fl.file_path: fl for s in _current_list(t)[1].segments for fl in read_segment(t.iceberg.io, s)}


def _runs(fl: FileLineage) -> tuple:
    return tuple(tuple(getattr(fl, n).values.tolist()) + tuple(getattr(fl, n).lengths.tolist()) for n in ("row_ids", "created", "updated"))


def _scan(t: lineage.Table) -> list[tuple]:
    cols = ["id", "name", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
    return sorted(tuple(r.values()) for r in t.scan(columns=cols).to_pylist())


def _stream(warehouse: str, format_version: int) -> lineage.Table:
    t = lineage.create_table("shop.items", SCHEMA, key=["id"], warehouse=warehouse, format_version=format_version)
    t.append(_rows(range(300)))
    t.update("id % 7 = 0", {"name": "'u'"})  # scattered rows keep their ids in a new file
    t.upsert(_rows([3, 10, 11, 500, 501]))  # updated rows and fresh inserts in one file
    t.delete("id % 11 = 1")
    return t


@pytest.mark.parametrize("inline", [True, False])
def test_files_whose_rows_keep_their_ids_store_none_in_the_sidecar_and_a_new_process_reads_the_same(warehouse, inline, monkeypatch):
    if not inline:
        monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", -1)
    t = _stream(warehouse, 3)
    written = _live_lineage(t)
    native = {p: fl for p, fl in written.items() if fl.native_first_row_id is not None}
    assert len(native) == 2  # the update's file and the upsert's file; the append's file is one run of ids
    assert all(len(fl.row_ids) == 1 for p, fl in written.items() if p not in native)
    scanned = _scan(t)
    list_path, lst = _current_list(t)
    for s in lst.segments:
        if metadata.is_inline_segment(s):
            with open(local_path(metadata.segment_object(s))) as f:
                obj = json.load(f)
            rows = obj["segment"]
            assert obj["format-version"] == (metadata.LIST_FORMAT_VERSION_NATIVE if any(r.get("row_ids_native") is not None for r in rows) else 4)
        else:
            pf = pq.ParquetFile(local_path(s))
            rows = pf.read().to_pylist()
            version = pf.schema_arrow.metadata[b"lineage.format-version"].decode()
            assert version == ("2" if any(r.get("row_ids_native") is not None for r in rows) else "1")
        for row in rows:
            if row["file_path"] in native:
                assert row["row_id_starts"] == row["row_id_lengths"] == []
                assert row["row_ids_native"] == native[row["file_path"]].native_first_row_id
    _clear_caches()  # as a new process: the row ids of those files come from the data files
    again = _live_lineage(t)
    assert {p: _runs(fl) for p, fl in again.items()} == {p: _runs(fl) for p, fl in written.items()}
    assert {p for p, fl in again.items() if fl.native_first_row_id is not None} == set(native)
    assert _scan(t) == scanned
    con = duck.connect("iceberg")
    got = con.execute(f"SELECT id, _row_id FROM iceberg_scan('{t.iceberg.metadata_location}') ORDER BY id").fetchall()
    assert got == sorted((r[0], r[2]) for r in scanned)
    t.update("id % 5 = 0", {"name": "'v'"})  # a later commit on the re-read lineage
    _clear_caches()
    got = con.execute(f"SELECT id, _row_id FROM iceberg_scan('{t.iceberg.metadata_location}') ORDER BY id").fetchall()
    assert got == sorted((r[0], r[2]) for r in _scan(t))


def test_v2_tables_keep_writing_format_1(warehouse):
    t = _stream(warehouse, 2)
    assert all(fl.native_first_row_id is None for fl in _live_lineage(t).values())
    for s in _current_list(t)[1].segments:
        obj_path = local_path(metadata.segment_object(s))
        if metadata.is_inline_segment(s):
            with open(obj_path) as f:
                assert json.load(f)["format-version"] == 4
        else:
            assert pq.ParquetFile(obj_path).schema_arrow.metadata[b"lineage.format-version"] == b"1"


def _data_file(path: str, row_ids: list[int | None]) -> None:
    field = pa.field("_row_id", pa.int64(), metadata={b"PARQUET:field_id": str(ROW_ID_FIELD_ID).encode()})
    pq.write_table(pa.table({"x": pa.array(range(len(row_ids)), pa.int64()), "_row_id": pa.array(row_ids, pa.int64())},
                            schema=pa.schema([pa.field("x", pa.int64()), field])), path)


def test_native_row_ids_are_the_written_values_else_first_row_id_plus_position(tmp_path):
    path = str(tmp_path / "d.parquet")
    _data_file(path, [40, None, 7, None])
    assert native_row_ids(path, 100, 4).tolist() == [40, 101, 7, 103]
    pq.write_table(pa.table({"x": [1, 2]}), str(tmp_path / "plain.parquet"))  # no _row_id column: all inherited
    assert native_row_ids(str(tmp_path / "plain.parquet"), 9, 2).tolist() == [9, 10]
    with pytest.raises(lineage.LineageMetadataError):
        native_row_ids(path, 100, 5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.lists(st.one_of(st.none(), st.integers(0, 2**40)), min_size=1, max_size=50)),
                min_size=1, max_size=6), st.sampled_from([1, 20, 1 << 18]))
def test_segments_mixing_both_kinds_of_files_read_back_the_same(tmp_path, files, part_runs):
    """A segment of files of either kind (in one or several row groups) reads back the same lineage."""
    folder = tempfile.mkdtemp(dir=tmp_path)  # one per example
    lineages = []
    for i, (native, ids) in enumerate(files):
        path = os.path.join(folder, f"{i}.parquet")
        first = 1000 * (i + 1)
        _data_file(path, ids)
        full = [v if v is not None else first + p for p, v in enumerate(ids)]
        created = encode_values(np.arange(len(ids)) % 3)
        lineages.append(FileLineage(path, len(ids), encode_sequence(np.array(full, np.int64)), created,
                                    value_run(5, len(ids)), first if native else None))
    seg = os.path.join(folder, "seg.parquet")
    metadata.SEGMENT_PART_RUNS, saved = part_runs, metadata.SEGMENT_PART_RUNS
    try:
        write_segment(FILEIO, seg, lineages)
    finally:
        metadata.SEGMENT_PART_RUNS = saved
    tag = pq.ParquetFile(seg).schema_arrow.metadata[b"lineage.format-version"]
    assert tag == (b"2" if any(n for n, _ in files) else b"1")
    got = metadata._read_segment_uncached(FILEIO, seg)
    assert [_runs(g) for g in got] == [_runs(w) for w in lineages]
    assert [g.native_first_row_id for g in got] == [w.native_first_row_id for w in lineages]


def test_a_data_file_disagreeing_with_its_segment_or_missing_is_a_metadata_error(tmp_path):
    path = str(tmp_path / "d.parquet")
    _data_file(path, [1, 2, 3])
    fl = FileLineage(path, 3, encode_sequence(np.array([1, 2, 4])), value_run(1, 3), value_run(1, 3), 0)
    seg = str(tmp_path / "seg.parquet")
    write_segment(FILEIO, seg, [fl])
    with pytest.raises(lineage.LineageMetadataError, match="not the ones its lineage segment recorded"):
        metadata._read_segment_uncached(FILEIO, seg)
    ok = str(tmp_path / "ok.parquet")
    write_segment(FILEIO, ok, [FileLineage(path, 3, sequence_run(1, 3), value_run(1, 3), value_run(1, 3), 0)])
    assert metadata._read_segment_uncached(FILEIO, ok)[0].row_ids.values.tolist() == [1]
    os.remove(path)
    with pytest.raises(lineage.LineageMetadataError, match="is missing"):
        metadata._read_segment_uncached(FILEIO, ok)


def test_a_release_that_reads_segment_format_1_and_list_format_4_refuses_the_new_ones(warehouse, monkeypatch):
    monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", -1)
    t = _stream(warehouse, 3)
    seg = next(s for s in _current_list(t)[1].segments if any(fl.native_first_row_id is not None for fl in read_segment(t.iceberg.io, s)))
    with pytest.raises(lineage.UnsupportedFormatError, match="format version 2"):
        metadata.open_tagged_parquet(t.iceberg.io, seg, metadata.SEGMENT_FORMAT, "lineage segment", metadata.FORMAT_VERSION)
    monkeypatch.undo()
    t2 = _stream(warehouse + "2", 3)
    folder = os.path.dirname(local_path(_current_list(t2)[0]))
    versions = {}
    for name in os.listdir(folder):
        if name.endswith("-list.json"):
            with open(os.path.join(folder, name)) as f:
                versions[os.path.join(folder, name)] = json.load(f)["format-version"]
    newer = [p for p, v in versions.items() if v == 5]
    assert len(newer) == 2  # the lists of the update and of the upsert hold their segments
    monkeypatch.setattr(metadata, "LIST_FORMAT_VERSION_NATIVE", 4)
    _clear_caches()
    for path in newer:
        with pytest.raises(lineage.UnsupportedFormatError, match="format version 5"):
            read_list(t2.iceberg.io, path)
