"""The packed key index segment format (format 3, index/key_packed.py) against a dict model, mixed with Arrow segments.

Hypothesis draws histories of deltas (inserts, updates, deletes, re-inserts)
over random keys of three shapes (a 64-bit integer the hash gives back, a
string, a composite key), sometimes under a hash narrowed to a few bits (so
most keys collide), writes each delta in format 3 or in format 2 (as earlier
releases did), merges them as the policy says, and checks every lookup and
the live entries against a dict. Table-level tests check that a table with
Arrow segments keeps working, that maintenance rewrites them, and that
vacuum removes the unreachable ones.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO

import lineage
from conftest import SCHEMA, key_hash_mask
from index import key_hash as kh
from index import key_index, key_segment
from index.key_index import KeyIndex
from index.key_merge_policy import MergePolicy, SegmentInfo, next_merge
from index.key_packed import prefix_bits
from index.key_segment import KeyField, make_segment, merge_segments, read_key_segment, write_key_segment
from lineage.errors import LineageMetadataError, UnsupportedFormatError
from lineage.storage.fileio import local_path
from lineage.maintenance import verify

IO = PyArrowFileIO()
SHAPES = {
    "int": (KeyField(1, "id", pa.int64()),),
    "string": (KeyField(1, "s", pa.large_string()),),
    "composite": (KeyField(1, "a", pa.int32()), KeyField(2, "b", pa.string())),
}


def _key_values(shape: str, k: int) -> dict[str, object]:
    if shape == "int":
        return {"id": k * 7_919 - 2**40 if k % 3 else k}  # negative, large and small values
    if shape == "string":
        return {"s": f"key-{k}" + "é" * (k % 4)}
    return {"a": k % 5, "b": f"b{k // 5}"}


def _entries(shape: str, live: dict[int, tuple[int, int, int]], version: int) -> pa.Table:
    """Entry rows of ``live`` (key -> (row id, file number, position))."""
    key = SHAPES[shape]
    rows = []
    for k, (row_id, file, pos) in live.items():
        rows.append({**_key_values(shape, k), "_row_id": row_id, "__file_path": f"s3://b/t/data/f{file}.parquet", "__pos": pos,
                     "_row_created_at_version": version - row_id % 3, "_row_last_updated_at_version": version})
    schema = key_segment.entry_schema(key)
    return pa.Table.from_pylist(rows, schema=schema)


def _keys(shape: str, ks: list[int]) -> pa.Table:
    key = SHAPES[shape]
    return pa.Table.from_pylist([_key_values(shape, k) for k in ks], schema=pa.schema([pa.field(f.name, f.type, nullable=False) for f in key]))


deltas = st.lists(
    st.dictionaries(st.integers(0, 40), st.one_of(st.none(), st.tuples(st.integers(0, 2**33), st.integers(0, 3), st.integers(0, 10**6))),
                    max_size=10),
    min_size=1, max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(SHAPES)), deltas, st.lists(st.sampled_from([0, 2, 3]), min_size=12, max_size=12), st.booleans(),
       st.integers(1, 3))
def test_packed_and_arrow_segments_match_a_dict(tmp_path_factory, shape, history, formats, tiny_hash, fanout):
    """Lookups and live entries over written, re-read and merged segments of both formats equal a dict model."""
    folder = tmp_path_factory.mktemp("seg")
    key = SHAPES[shape]
    policy = MergePolicy(fanout=fanout, base_fraction=0.5, writer_limit=30, max_segments=4)
    with key_hash_mask(np.uint64(3) if tiny_hash else kh._FULL):
        model: dict[int, tuple[int, int, int, int]] = {}
        segments: list[key_segment.Segment] = []
        for version, delta in enumerate(history, start=1):
            live = {k: v for k, v in delta.items() if v is not None}
            dead = [k for k, v in delta.items() if v is None]
            for k in dead:
                model.pop(k, None)
            model.update({k: (*v, version) for k, v in live.items()})
            if not delta:
                continue
            seg = make_segment(key, _entries(shape, live, version), _keys(shape, dead), level=0)
            fmt = formats[version - 1]
            if fmt:
                path = str(folder / f"{version}-{fmt}.seg")
                write_key_segment(IO, path, seg, version, format_version=fmt)
                seg = read_key_segment(IO, path)
                assert seg.format_version == fmt
            segments.append(seg)
            while (step := next_merge([SegmentInfo(s.level, s.base, s.entries) for s in segments], policy, "writer")) is not None:
                start, level = step
                segments[start:] = [merge_segments(segments[start:], base=start == 0, level=level)]
            _check(shape, segments, model)
        if not segments:
            return
        merged = merge_segments(segments, base=True, level=0)
        path = str(folder / "merged.seg")
        write_key_segment(IO, path, merged, 99)
        _check(shape, [read_key_segment(IO, path)], model)


def _check(shape: str, segments: list[key_segment.Segment], model: dict[int, tuple[int, int, int, int]]) -> None:
    key = SHAPES[shape]
    names = [k.name for k in key]
    probe_keys = list(range(-1, 42))
    found = KeyIndex(key, segments).lookup(_keys(shape, probe_keys))
    got = {probe_keys[r["__input"]]: (r["_row_id"], r["__file_path"], r["__pos"], r["_row_last_updated_at_version"]) for r in found.to_pylist()}
    want = {k: (rid, f"s3://b/t/data/f{f}.parquet", pos, v) for k, (rid, f, pos, v) in model.items()}
    assert got == want
    for r in found.to_pylist():  # the key columns of a hit are the key looked up
        assert {n: r[n] for n in names} == _key_values(shape, probe_keys[r["__input"]])
    live = KeyIndex(key, segments).live_entries()
    assert sorted(tuple(r[n] for n in names) for r in live.to_pylist()) == sorted(
        tuple(_key_values(shape, k)[n] for n in names) for k in model)


def test_a_64_bit_key_takes_under_16_bytes_and_is_not_stored(tmp_path):
    n = 200_000
    rng = np.random.default_rng(3)
    ids = rng.choice(2**62, n, replace=False).astype(np.int64)
    files = pa.DictionaryArray.from_arrays(pa.array(np.repeat(np.arange(20, dtype=np.int32), n // 20)),
                                           pa.array([f"s3://bucket/warehouse/db/t/data/{i:05d}.parquet" for i in range(20)]))
    entries = pa.table({"id": ids, "_row_id": np.arange(n, dtype=np.int64) + 5_000_000, "__file_path": files,
                        "__pos": np.tile(np.arange(n // 20, dtype=np.int64), 20), "_row_created_at_version": np.full(n, 3),
                        "_row_last_updated_at_version": rng.integers(3, 40, n)})
    seg = make_segment(SHAPES["int"], entries, level=0, base=True)
    assert seg.store.keys is None  # a 64-bit integer key is recovered from its hash
    path = str(tmp_path / "s.seg")
    size = write_key_segment(IO, path, seg, 1)
    assert size / n <= 13, size / n  # 64 - 12 hash bits, 20 files, 10,000 positions, 200,000 row ids, 37 versions
    back = read_key_segment(IO, path)
    assert prefix_bits(n) == 12 and back.store.layout.prefix_bits == 12
    probe = pa.table({"id": np.concatenate([ids[:500], rng.integers(2**62, 2**63, 10)])})
    hits = KeyIndex(SHAPES["int"], [back]).lookup(probe)
    assert hits.column("__input").to_pylist() == list(range(500))
    want = entries.take(pa.array(np.arange(500)))
    for c in ("id", "_row_id", "__pos", "_row_last_updated_at_version"):
        assert hits.column(c).to_pylist() == want.column(c).to_pylist()
    assert hits.column("__file_path").to_pylist() == want.column("__file_path").cast(pa.string()).to_pylist()
    assert back.live().sort_by("_row_id").column("id").to_pylist() == entries.sort_by("_row_id").column("id").to_pylist()


@pytest.mark.parametrize("typ,values", [
    (pa.int8(), [-128, 127, 0]), (pa.uint64(), [0, 2**64 - 1]), (pa.int32(), [-(2**31), 2**31 - 1]),
    (pa.date32(), [dt.date(1900, 1, 1), dt.date(2100, 12, 31)]), (pa.timestamp("ns", tz="UTC"), [dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)]),
    (pa.time64("us"), [dt.time(23, 59, 59)]),
])
def test_keys_are_recovered_from_their_hash(typ, values):
    arr = pa.array(values, typ)
    assert kh.hash_is_injective([typ])
    assert kh.unhash(kh.key_hash(pa.table({"k": arr})), typ).equals(arr)


def test_keys_the_hash_cannot_give_back_are_stored():
    assert not kh.hash_is_injective([pa.string()]) and not kh.hash_is_injective([pa.int64(), pa.int64()])
    assert not kh.hash_is_injective([pa.decimal128(10, 2)]) and not kh.hash_is_injective([pa.bool_()])
    with key_hash_mask(np.uint64(0xFF)):
        assert not kh.hash_is_injective([pa.int64()])
    seg = make_segment(SHAPES["string"], _entries("string", {1: (1, 0, 0), 2: (2, 0, 1)}, 1))
    assert seg.store.keys is not None and seg.store.keys.num_rows == 2


def _written(tmp_path, **header_changes: str) -> str:
    seg = make_segment(SHAPES["int"], _entries("int", {1: (1, 0, 0), 2: (2, 0, 1)}, 1), level=0, base=True)
    path = str(tmp_path / "s.seg")
    write_key_segment(IO, path, seg, 1)
    return path


def test_format_3_tag_version_and_damage_are_checked(tmp_path):
    path = _written(tmp_path)
    data = open(path, "rb").read()
    assert data.startswith(b"KEYINDEX") and b'"lineage.format-version": "3"' in data

    def variant(name: str, new: bytes) -> str:
        out = str(tmp_path / name)
        with open(out, "wb") as f:
            f.write(new)
        return out

    with pytest.raises(UnsupportedFormatError, match="upgrade"):
        read_key_segment(IO, variant("newer.seg", data.replace(b'"lineage.format-version": "3"', b'"lineage.format-version": "4"')))
    with pytest.raises(LineageMetadataError, match="not a key-index-segment"):
        read_key_segment(IO, variant("foreign.seg", data.replace(b'"key-index-segment"', b'"deleted-rows-segm"')))
    with pytest.raises(LineageMetadataError, match="damaged"):
        read_key_segment(IO, variant("short.seg", data[:-7]))
    with pytest.raises(LineageMetadataError, match="unreadable"):
        read_key_segment(IO, variant("header.seg", data[:20]))


def _batch(keys: list[int], tag: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(keys, pa.int64()), "name": [f"{tag}{k}" for k in keys], "amount": [float(k) for k in keys]}, schema=SCHEMA)


def test_a_table_with_arrow_segments_keeps_working_and_maintenance_rewrites_them(warehouse, monkeypatch):
    # Writers leave the deltas beside the base (the merge policy would fold them into a new base at once).
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.key-index.base-fraction": "100"})
    with monkeypatch.context() as m:  # as an earlier release wrote the index
        m.setattr(key_index, "write_key_segment", functools.partial(write_key_segment, format_version=2))
        m.setattr(key_index, "SEGMENT_SUFFIX", "-keys.arrow")
        t.append(_batch(list(range(10))))
        t.upsert(_batch([3, 4, 20], "u"))
        t.delete("id = 5")
    old = t.state().lineage.key_index
    assert old and all(p.endswith("-keys.arrow") for p in old)
    assert {read_key_segment(t.iceberg.io, p).format_version for p in old} == {2}
    t.upsert(_batch([6, 21], "v"))  # a writer adds a format 3 delta beside them
    mixed = [read_key_segment(t.iceberg.io, p) for p in t.state().lineage.key_index]
    assert {s.format_version for s in mixed} == {2, 3}
    assert KeyIndex.open(t.state()).outdated
    assert verify(t).ok
    result = t.merge_key_index()
    assert result.version is not None
    now = [read_key_segment(t.iceberg.io, p) for p in t.state().lineage.key_index]
    assert {s.format_version for s in now} == {3} and not KeyIndex.open(t.state()).outdated
    assert verify(t).ok
    found = KeyIndex.open(t.state()).lookup(pa.table({"id": pa.array([3, 5, 6, 20, 21, 99], pa.int64())}))
    assert found.column("id").to_pylist() == [3, 6, 20, 21]
    assert t.merge_key_index().version is None  # nothing left to rewrite
    # The Arrow segments are unreachable once the snapshots naming them expire; vacuum removes them.
    t.expire_snapshots(retain_last=1)
    t.vacuum(older_than=dt.timedelta(0))
    assert not any(os.path.exists(local_path(p)) for p in old)
    assert all(os.path.exists(local_path(p)) for p in t.state().lineage.key_index)
    assert verify(t).ok


def test_reindex_writes_the_current_format_and_info_shows_bytes_per_key(warehouse, capsys):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(list(range(1000))))
    t.reindex()
    (path,) = t.state().lineage.key_index
    assert path.endswith("-keys.kix") and read_key_segment(t.iceberg.io, path).format_version == 3
    from lineage.cli.app import main

    assert main(["--warehouse", warehouse, "--format", "json", "info", "s.t"]) == 0
    ki = json.loads(capsys.readouterr().out)["key_index"]
    assert ki["records"] == 1000 and 0 < ki["bytes_per_key"] == round(ki["segment_bytes"] / 1000, 1) < 16
    assert main(["--warehouse", warehouse, "info", "s.t"]) == 0
    assert f"({ki['bytes_per_key']} bytes per live key)" in capsys.readouterr().out
