"""The cost of a v3 commit: manifests written in one Avro block, remembered as read, never read back by the writer.

A merge-on-read commit on a v3 table replaces the deletion vectors of the
files it touches, so it rewrites the delete manifests holding them. These
tests prove the shortcuts that keep that cheap change no byte a reader sees:
the one-block writer's records equal pyiceberg's, the entries a commit
remembers equal what a reader decodes from the file, a commit removing only
vectors reads no data manifest, and a vector merges by insertion exactly as a
set union does.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import Record
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS, DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntry, ManifestEntryStatus,
)

import cdf
import lineage
import lineage.iceberg.planning as planning
from lineage.storage import manifests_v3
from lineage.storage.avro_out import BufferedAvroOutput, BufferEncoder
from lineage.storage.deletion_vectors import merge_positions

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("region", pa.string())])


def _batch(ids: list[int], tag: str = "a") -> pa.Table:
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids], "region": ["eu" if i % 2 else "us" for i in ids]}, schema=SCHEMA)


def _entry(i: int, status: ManifestEntryStatus) -> ManifestEntry:
    df = manifests_v3.as_v3(DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=f"file:/w/{i}-dv.puffin", file_format=FileFormat.PUFFIN,
        partition=Record(), record_count=i + 1, file_size_in_bytes=1000 + i,
        column_sizes=None, value_counts=None, null_value_counts=None, nan_value_counts=None,
        lower_bounds={2147483546: f"file:/w/{i}.parquet".encode()}, upper_bounds={2147483546: f"file:/w/{i}.parquet".encode()},
        split_offsets=None, equality_ids=None, sort_order_id=None, key_metadata=None,
    ), referenced_data_file=f"file:/w/{i}.parquet", content_offset=4 + 40 * i, content_size_in_bytes=40 + i, first_row_id=None)
    return ManifestEntry.from_args(status=status, snapshot_id=7 if status != ManifestEntryStatus.ADDED else None,
                                   sequence_number=3 if status != ManifestEntryStatus.ADDED else None,
                                   file_sequence_number=3 if status != ManifestEntryStatus.ADDED else None, data_file=df)


def _read(path: str) -> list[ManifestEntry]:
    with AvroFile[ManifestEntry](PyArrowFileIO().new_input(path), MANIFEST_ENTRY_SCHEMAS[3],
                                 read_types={-1: ManifestEntry, 2: DataFile},
                                 read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}) as reader:
        return list(reader)


@pytest.mark.parametrize("codec", ["gzip", "zstd", "null"])
def test_one_block_writer_writes_what_pyiceberg_writes(tmp_path, codec):
    """The same records as pyiceberg's block-per-record writer, read back by pyiceberg's reader; one block in all."""
    schema = MANIFEST_ENTRY_SCHEMAS[3]
    entries = [_entry(i, ManifestEntryStatus(i % 3)) for i in range(50)]
    io = PyArrowFileIO()
    paths = {}
    for name, cls in (("ours", BufferedAvroOutput), ("pyiceberg", AvroOutputFile)):
        paths[name] = str(tmp_path / f"{name}.avro")
        with cls(output_file=io.new_output(paths[name]), file_schema=schema, record_schema=schema, schema_name="manifest_entry",
                 metadata={"avro.codec": codec, "format-version": "3"}) as out:
            for e in entries:
                out.write_block([e])
    ours, theirs = _read(paths["ours"]), _read(paths["pyiceberg"])
    assert ours == theirs == entries
    headers = {}
    for name, path in paths.items():
        with AvroFile[ManifestEntry](io.new_input(path), schema, read_types={-1: ManifestEntry, 2: DataFile}) as reader:
            headers[name] = reader.header.meta
            next(reader)
            blocks = reader.block.block_records  # type: ignore[union-attr]
        assert blocks == (50 if name == "ours" else 1)
    assert headers["ours"] == headers["pyiceberg"]


def test_buffer_encoder_is_pyiceberg_encoding():
    import io as stdio

    from pyiceberg.avro.encoder import BinaryEncoder

    values = [0, 1, -1, 63, 64, -64, -65, 127, 128, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]
    mine, buf = BufferEncoder(), stdio.BytesIO()
    theirs = BinaryEncoder(buf)
    for v in values:
        mine.write_int(v)
        theirs.write_int(v)
    for enc in (mine, theirs):
        enc.write_utf8("ünïcode")
        enc.write_bytes(b"\x00\x01")
        enc.write_boolean(True)
        enc.write_boolean(False)
    assert bytes(mine.buffer) == buf.getvalue()


def _table(warehouse: str, partitioned: bool) -> lineage.Table:
    return lineage.create_table("shop.dv", SCHEMA, key=["id"], partition_by=["region"] if partitioned else None,
                                warehouse=warehouse, format_version=3)


@pytest.mark.parametrize("partitioned", [False, True])
def test_remembered_entries_equal_what_a_reader_decodes(warehouse, partitioned):
    """Every manifest of every snapshot: the entries a commit kept equal a fresh decode of the file (values, spec id, row ids)."""
    t = _table(warehouse, partitioned)
    t.append(_batch(list(range(40))))
    t.append(_batch(list(range(40, 60))))
    t.delete("id IN (1, 2, 41)")
    t.update("id IN (3, 42)", {"name": "'u'"})
    t.apply_changelog(pa.table({"_op": ["-D", "+I", "-U", "+U"], "id": [5, 100, 6, 6], "name": ["a5", "x", "a6", "y"],
                                "region": ["eu", "us", "us", "us"]}))
    t.delete("id IN (7, 43)")
    io = t.iceberg.io
    compared = {ManifestContent.DATA: 0, ManifestContent.DELETES: 0}
    for snap in t.iceberg.metadata.snapshots:
        for m in manifests_v3.read_manifest_list(io, snap.manifest_list):
            kept = manifests_v3._ENTRIES.peek((m.manifest_path, manifests_v3.manifest_first_row_id(m), m.sequence_number))
            assert kept is not None, m.manifest_path  # written by this process: never read back
            fresh = manifests_v3._read_entries(m, io)
            assert list(kept) == list(fresh)
            assert [e.data_file.spec_id for e in kept] == [e.data_file.spec_id for e in fresh]
            compared[m.content] += 1
    assert compared[ManifestContent.DATA] and compared[ManifestContent.DELETES]
    assert sorted(t.scan(columns=["id"]).column("id").to_pylist()) == sorted(set(range(60)) - {1, 2, 41, 5, 7, 43} | {100})


def test_a_commit_replacing_vectors_reads_no_data_manifest(warehouse, monkeypatch):
    t = _table(warehouse, False)
    for i in range(4):
        t.append(_batch(list(range(10 * i, 10 * i + 10))))
    t.delete("id IN (1, 11, 21)")
    manifests_v3._ENTRIES.clear()
    planning._ENTRIES.clear()
    t.refresh()
    t.state()  # plans the table (reads every manifest) before the commit is timed
    read: list[ManifestContent] = []
    real = manifests_v3._read_entries
    monkeypatch.setattr(manifests_v3, "_read_entries", lambda m, io: read.append(m.content) or real(m, io))
    manifests_v3._ENTRIES.clear()
    v = t.version
    t.delete("id IN (2, 12, 22, 31)")  # replaces three vectors, adds one
    assert ManifestContent.DATA not in read
    changes = cdf.changes(t, v, t.version)
    assert sorted(changes.column("id").to_pylist()) == [2, 12, 22, 31]


def test_merge_positions_is_a_set_union():
    rng = np.random.default_rng(5)
    for _ in range(500):
        old = np.unique(rng.integers(0, 1 << 34, int(rng.integers(0, 60))))
        new = rng.integers(0, 1 << 34, int(rng.integers(0, 40)))
        new = np.concatenate([new, rng.choice(old, min(len(old), 5))]) if len(old) else new
        got = merge_positions(old, new)
        assert got.dtype == np.int64 and np.array_equal(got, np.union1d(old, new))


def test_rewritten_delete_manifests_become_one_and_every_reader_agrees(warehouse):
    """Vectors replaced in four delete manifests: the commit writes one delete manifest (the new vectors added, the
    replaced ones deleted)."""
    import lineage.duck as duck

    t = _table(warehouse, False)
    for i in range(4):
        t.append(_batch(list(range(10 * i, 10 * i + 10))))
    for i in range(4):
        t.delete(f"id = {10 * i}")  # one vector per commit, each in a delete manifest of its own
    t.delete("id IN (1, 11, 21, 31)")  # replaces the four vectors
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    deletes = [m for m in manifests_v3.read_manifest_list(t.iceberg.io, snap.manifest_list) if m.content == ManifestContent.DELETES]
    live = [m for m in deletes if (m.added_files_count or 0) + (m.existing_files_count or 0)]
    assert [(m.added_files_count, m.existing_files_count, m.deleted_files_count) for m in deletes] == [(4, 0, 4)]
    assert len(live) == 1
    want = sorted(set(range(40)) - {0, 10, 20, 30, 1, 11, 21, 31})
    assert sorted(t.scan(columns=["id"]).column("id").to_pylist()) == want
    assert sorted(t.iceberg.scan().to_arrow().column("id").to_pylist()) == want
    con = duck.connect("iceberg")
    try:
        got = con.execute(f"SELECT id FROM iceberg_scan('{t.iceberg.metadata_location}') ORDER BY id").fetchall()
    finally:
        con.close()
    assert [r[0] for r in got] == want


def test_a_vector_entry_is_the_v3_data_file_struct():
    """The positional build of a vector's entry equals pyiceberg's by-name build in the v3 struct."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.types import StringType

    from lineage.storage.deletes import PATH_FIELD_ID
    from lineage.storage.deletion_vectors import vector_entry
    from lineage.storage.puffin import DeletionVectorBlob

    data = DataFile.from_args(content=DataFileContent.DATA, file_path="file:/w/d.parquet", file_format=FileFormat.PARQUET,
                              partition=Record("eu"), record_count=10, file_size_in_bytes=100)
    data.spec_id = 3
    blob = DeletionVectorBlob("file:/w/v.puffin", 500, "file:/w/d.parquet", 4, 60, 7)
    bound = to_bytes(StringType(), "file:/w/d.parquet")
    by_name = manifests_v3.as_v3(DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path="file:/w/v.puffin", file_format=FileFormat.PUFFIN, partition=Record("eu"),
        record_count=7, file_size_in_bytes=500, lower_bounds={PATH_FIELD_ID: bound}, upper_bounds={PATH_FIELD_ID: bound},
    ), referenced_data_file="file:/w/d.parquet", content_offset=4, content_size_in_bytes=60)
    got = vector_entry(blob, data, 0)
    assert got == by_name and got.spec_id == 3 and manifests_v3.is_deletion_vector(got)


def test_a_vector_grows_from_the_kept_bitmap_and_equals_the_union(warehouse, monkeypatch):
    """A commit deleting from a file whose vector this process wrote adds the new positions to the kept bitmap (no
    read, merge or encode of the old positions); the vector written is the union all the same, and a process that did
    not write it (the cache emptied) reads and merges it as before."""
    import lineage.storage.deletion_vectors as dv
    from lineage.storage.puffin import read_puffin_deletion_vectors

    t = _table(warehouse, False)
    t.append(_batch(list(range(200))))
    t.delete("id % 10 = 0")
    real = dv.positions_for
    calls: list[str] = []
    monkeypatch.setattr(dv, "positions_for", lambda path, deletes, *a: calls.append(path) or real(path, deletes, *a))
    t.delete("id % 10 = 1")  # the kept bitmap
    assert calls == []
    dv._BITMAPS._entries.clear()  # as in a new process
    t.delete("id % 10 = 2")  # reads the current vector
    assert len(calls) == 1
    t.delete("id % 10 = 3")  # kept again
    assert len(calls) == 1
    t.refresh()
    (vector,) = [d for f in t.iceberg.scan().plan_files() for d in f.delete_files]
    (positions,) = read_puffin_deletion_vectors(t.iceberg.io, vector.file_path).values()
    assert positions.tolist() == [i for i in range(200) if i % 10 < 4]
    assert sorted(t.iceberg.scan().to_arrow().column("id").to_pylist()) == [i for i in range(200) if i % 10 >= 4]


def test_vectors_across_roaring_containers_kept_and_read_back_until_every_row_is_deleted(warehouse):
    """A 65,600-row file (positions past 65,535: a second Roaring container) deleted from commit after commit, the
    vector grown from the kept bitmap or read back (as a new process would), a run of 30,000 positions, then every
    row: after each commit the vector holds exactly the positions deleted, and pyiceberg, DuckDB's iceberg_scan and
    our scan read the same rows (the row ids and versions natively too)."""
    import lineage.storage.deletion_vectors as dv
    from conftest import assert_interop
    from lineage.storage.puffin import read_puffin_deletion_vectors

    t = _table(warehouse, False)
    n = 65_600
    t.append(pa.table({"id": np.arange(n), "name": pa.nulls(n, pa.string()), "region": pa.nulls(n, pa.string())}, schema=SCHEMA))
    deleted = np.zeros(n, bool)
    ids = np.arange(n)
    steps = [("id BETWEEN 65530 AND 65540", (ids >= 65530) & (ids <= 65540), True),
             ("id % 997 = 7", ids % 997 == 7, False),
             ("id < 30000", ids < 30000, True),
             ("id IN (65535, 65536, 65599)", np.isin(ids, [65535, 65536, 65599]), False),
             ("id >= 0", ids >= 0, True)]
    for step, (where, mask, kept) in enumerate(steps):
        if not kept:
            dv._BITMAPS._entries.clear()  # as in a process that did not write the current vector
        deleted |= mask
        t.delete(where)
        t.refresh()
        tasks = list(t.iceberg.scan().plan_files())
        if tasks or not deleted.all():  # (a file left with no row may also leave the table)
            (vector,) = tasks[0].delete_files
            (positions,) = read_puffin_deletion_vectors(t.iceberg.io, vector.file_path).values()
            assert positions.tolist() == np.flatnonzero(deleted).tolist() and vector.record_count == deleted.sum()
        if step >= 2:  # every container of each kind by then (array, run, both keys)
            assert_interop(t)
    assert t.scan().num_rows == 0
    feed = cdf.changes(t, 1)
    assert feed.num_rows == n and sorted(feed.column("id").to_pylist()) == list(range(n))
