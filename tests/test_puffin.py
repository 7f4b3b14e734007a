"""Iceberg v3 deletion vectors in Puffin files (lineage.storage.puffin): the format, bit for bit, and Spark's files."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

import lineage.storage.fileio as fileio
from lineage.errors import InvalidArgumentError, LineageError, PuffinFormatError
from lineage.storage.puffin import (
    DV_MAGIC, PUFFIN_MAGIC, DeletionVectorBlob, decode_deletion_vector, encode_deletion_vector, parse_footer,
    puffin_bytes, read_deletion_vector, read_puffin_deletion_vectors, write_deletion_vectors,
)

IO = PyArrowFileIO()


def _random_positions(rng: np.random.Generator, n: int) -> np.ndarray:
    """Positions in several 32-bit key ranges: dense runs, sparse ones, and values above 2^32."""
    parts = [
        rng.integers(0, 1 << 16, n),                      # array containers
        np.arange(70_000, 70_000 + rng.integers(0, 9_000)),  # a run
        rng.integers(1 << 20, (1 << 20) + 8_000, 5 * n),  # a dense (bitmap) container
        rng.integers(1 << 32, 1 << 40, max(1, n // 10)),  # keys above 0
        [(1 << 63) - 1, 1 << 32, (1 << 32) - 1],          # the largest position, the key boundaries
    ]
    return np.unique(np.concatenate([np.asarray(p, np.int64) for p in parts]))


@pytest.mark.parametrize("seed", range(8))
def test_round_trip_random_positions(seed):
    rng = np.random.default_rng(seed)
    positions = _random_positions(rng, int(rng.integers(0, 3_000)))
    assert positions.max() > 1 << 32
    shuffled = rng.permutation(np.concatenate([positions, positions[: len(positions) // 3]]))
    blob = encode_deletion_vector(shuffled)  # unsorted, with duplicates: the vector is the set
    assert blob == encode_deletion_vector(positions)
    out = decode_deletion_vector(blob)
    assert out.dtype == np.int64 and np.array_equal(out, positions)


def test_blob_layout_follows_the_spec():
    blob = encode_deletion_vector([0, 5, 1 << 33])
    (length,) = struct.unpack(">I", blob[:4])
    assert length == len(blob) - 8 and blob[4:8] == DV_MAGIC
    assert struct.unpack(">I", blob[-4:])[0] == zlib.crc32(blob[4:-4])
    assert struct.unpack("<Q", blob[8:16])[0] == 2  # two 32-bit bitmaps: keys 0 and 2
    assert struct.unpack("<I", blob[16:20])[0] == 0
    assert np.array_equal(decode_deletion_vector(encode_deletion_vector([])), [])


def test_negative_position_is_refused():
    with pytest.raises(InvalidArgumentError):
        encode_deletion_vector([3, -1])


def test_corrupt_blobs_raise_puffin_format_error():
    blob = bytearray(encode_deletion_vector(np.arange(0, 100_000, 3)))
    bad_crc = bytearray(blob)
    bad_crc[-1] ^= 0xFF
    bad_magic = bytearray(blob)
    bad_magic[4] = 0xD0
    bad_magic[-4:] = struct.pack(">I", zlib.crc32(bytes(bad_magic[4:-4])))  # a valid CRC over the wrong magic
    flipped_bit = bytearray(blob)
    flipped_bit[30] ^= 0x10
    for bad, words in [(bad_crc, "CRC-32"), (bad_magic, "magic"), (flipped_bit, "CRC-32"),
                       (blob[:-1], "length"), (blob[:8], "at least 12")]:
        with pytest.raises(PuffinFormatError, match=words) as caught:
            decode_deletion_vector(bytes(bad))
        assert isinstance(caught.value, LineageError)


def test_puffin_file_write_and_ranged_reads(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    vectors = [(f"s3://bucket/data/file-{i}.parquet", _random_positions(rng, 200 * i)) for i in range(4)]
    path = str(tmp_path / "dv.puffin")
    blobs = write_deletion_vectors(IO, path, vectors)
    size = os.path.getsize(path)
    assert [b.referenced_data_file for b in blobs] == [v[0] for v in vectors]
    assert all(isinstance(b, DeletionVectorBlob) and b.path == path and b.file_size_in_bytes == size for b in blobs)
    assert blobs[0].content_offset == 4
    data = open(path, "rb").read()
    assert data[:4] == PUFFIN_MAGIC and data[-4:] == PUFFIN_MAGIC
    meta, props = parse_footer(data)
    assert props["created-by"]
    for b, m, (_, positions) in zip(blobs, meta, vectors, strict=True):
        assert (m.type, m.snapshot_id, m.sequence_number, m.compression_codec) == ("deletion-vector-v1", -1, -1, None)
        assert (m.offset, m.length) == (b.content_offset, b.content_size_in_bytes)
        assert m.properties == {"referenced-data-file": b.referenced_data_file, "cardinality": str(len(positions))}
        assert b.record_count == len(positions)

    calls = []
    real = fileio.read_range
    monkeypatch.setattr(fileio, "read_range", lambda *a: calls.append(a[1:]) or real(*a))
    for b, (_, positions) in zip(blobs, vectors, strict=True):
        got = read_deletion_vector(IO, b.path, b.content_offset, b.content_size_in_bytes)
        assert np.array_equal(got, positions)
    assert calls == [(path, b.content_offset, b.content_size_in_bytes) for b in blobs]  # one ranged read per vector

    assert {k: v.tolist() for k, v in read_puffin_deletion_vectors(IO, path).items()} == \
        {k: v.tolist() for k, v in vectors}
    with pytest.raises(PuffinFormatError):  # a range that is not a blob
        read_deletion_vector(IO, path, blobs[1].content_offset + 1, blobs[1].content_size_in_bytes)
    with pytest.raises(PuffinFormatError, match="cut off"):
        read_deletion_vector(IO, path, size - 20, 100)


def test_one_vector_per_data_file():
    with pytest.raises(InvalidArgumentError, match="two deletion vectors"):
        puffin_bytes([("a.parquet", [1]), ("a.parquet", [2])])


def test_bad_footer_is_refused(tmp_path):
    data, _ = puffin_bytes([("a.parquet", [1, 2, 3])])
    for bad in [data[:-1], b"XXXX" + data[4:], data[:-12] + struct.pack("<i", 10_000) + data[-8:],
                data[:-8] + b"\x01\x00\x00\x00" + data[-4:]]:
        with pytest.raises(PuffinFormatError):
            parse_footer(bad)


@pytest.mark.reference
def test_spark_deletion_vectors_are_read_and_written_bit_for_bit(reference, tmp_path):
    warehouse = str(tmp_path / "wh")
    os.makedirs(warehouse)
    reference.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS db")
    reference.sql(warehouse, "CREATE TABLE db.t (id bigint, v string) USING iceberg TBLPROPERTIES "
                             "('format-version'='3', 'write.delete.mode'='merge-on-read')")
    reference.sql(warehouse, "INSERT INTO db.t SELECT id, cast(id AS string) FROM range(0, 20000)")
    reference.sql(warehouse, "DELETE FROM db.t WHERE id % 7 = 0 OR id BETWEEN 5000 AND 15000")
    reference.sql(warehouse, "DELETE FROM db.t WHERE id % 5 = 0")  # merged into the file's vector
    files = reference.sql(warehouse, "SELECT file_path, file_format, referenced_data_file, content_offset, "
                                     "content_size_in_bytes, record_count FROM db.t.delete_files").to_pylist()
    live_ids = set(reference.sql(warehouse, "SELECT id FROM db.t").column("id").to_pylist())
    assert files and all(f["file_format"] == "PUFFIN" for f in files)
    deleted = 0
    for f in files:
        positions = read_deletion_vector(IO, f["file_path"], f["content_offset"], f["content_size_in_bytes"])
        assert len(positions) == f["record_count"]
        deleted += len(positions)
        raw = fileio.read_range(IO, f["file_path"], f["content_offset"], f["content_size_in_bytes"])
        assert encode_deletion_vector(positions) == raw  # our bytes are Spark's
    assert deleted == 20000 - len(live_ids)
    for path in {f["file_path"] for f in files}:  # the whole file, footer included, but for the writer's name
        data = open(path, "rb").read()
        meta, props = parse_footer(data)
        vectors = [(m.properties["referenced-data-file"], decode_deletion_vector(data[m.offset:m.offset + m.length]))
                   for m in meta]
        assert puffin_bytes(vectors, created_by=props["created-by"])[0] == data


def test_duckdb_deletion_vectors_are_read_and_written_bit_for_bit(tmp_path):
    """DuckDB's deletion vectors (DuckLake writes Iceberg's ``deletion-vector-v1`` blobs, one per file, without the
    Puffin container: its catalog keeps the offsets): ours decode to the positions DuckDB deleted, and our encoding
    of them is DuckDB's, byte for byte. DuckDB's iceberg_scan reading our vectors is tested in test_iceberg_v3_write."""
    import pyarrow.parquet as pq

    from lineage import duck

    con = duck.connect("ducklake", isolated=True)
    try:
        con.execute(f"ATTACH 'ducklake:{tmp_path}/dl.ducklake' AS dl (DATA_PATH '{tmp_path}/data/', "
                    "WRITE_DELETION_VECTORS true, DATA_INLINING_ROW_LIMIT 0)")
        con.execute("CREATE TABLE dl.t AS SELECT i AS id FROM range(200000) t(i)")
        con.execute("DELETE FROM dl.t WHERE id % 7 = 0 OR id BETWEEN 100000 AND 150000")  # arrays, bitmaps and a run
        con.execute("DELETE FROM dl.t WHERE id % 5 = 0")  # merged into each file's vector
        live = con.execute("SELECT count(*) FROM dl.t").fetchone()[0]
        files = con.execute("SELECT data_file, delete_file FROM ducklake_list_files('dl', 't')").fetchall()
    finally:
        con.close()
    assert files and all(d is not None for _, d in files)
    deleted = 0
    for data_file, delete_file in files:
        raw = open(delete_file, "rb").read()
        positions = decode_deletion_vector(raw)
        ids = pq.read_table(data_file, columns=["id"]).column("id").to_numpy()
        gone = (ids % 7 == 0) | ((ids >= 100_000) & (ids <= 150_000)) | (ids % 5 == 0)
        assert np.array_equal(positions, np.flatnonzero(gone))
        assert encode_deletion_vector(positions) == raw  # our bytes are DuckDB's
        deleted += len(positions)
    assert deleted == 200_000 - live


def test_deletion_vectors_on_an_object_store(s3, monkeypatch):
    from lineage.storage import files
    from lineage.storage.store_fileio import StoreFileIO

    files.register(s3.warehouse, s3.properties)
    io = StoreFileIO(dict(s3.properties))
    path = f"{s3.warehouse.rstrip('/')}/data/dv-1.puffin"
    vectors = [("s3://b/a.parquet", np.arange(0, 5000, 2)), ("s3://b/b.parquet", np.array([1 << 35]))]
    blobs = write_deletion_vectors(io, path, vectors)
    # one signed ranged GET per vector: pyarrow's file system (a HEAD, then a GET) is not used
    monkeypatch.setattr(files, "filesystem", lambda *a: pytest.fail("pyarrow's file system was used"))
    for b, (_, positions) in zip(blobs, vectors, strict=True):
        assert np.array_equal(read_deletion_vector(io, path, b.content_offset, b.content_size_in_bytes), positions)
    assert fileio.read_range(io, path, 10**6, 10) == b""
    with pytest.raises(FileNotFoundError):
        fileio.read_range(io, path + ".missing", 0, 10)
    monkeypatch.undo()
    assert set(read_puffin_deletion_vectors(io, path)) == {"s3://b/a.parquet", "s3://b/b.parquet"}
