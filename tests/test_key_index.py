"""The key index's format, lookups and merge policy (index/key_hash.py, key_segment.py, key_index.py).

Table-level behaviour (every write and maintenance path keeps the index equal
to a key scan) is in tests/test_key_index_property.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io as _io
import os
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lineage  # noqa: F401  (imports the package in dependency order)
from conftest import key_hash_mask
from index import key_hash as kh
from index import key_segment
from index.key_index import KeyIndex, segment_info
from index.key_merge import sliced
from index.key_merge_policy import FULL, HASHES, MAINTENANCE, WRITER, MergePolicy, SegmentInfo, Slice, base_end, next_merge, writer_slice
from index.key_segment import (
    SEGMENT_FORMAT_VERSION,
    KeyField,
    Segment,
    make_segment,
    merge_segments,
    read_key_segment,
    write_key_segment,
)
from lineage.errors import InvalidArgumentError, LineageMetadataError, UnsupportedFormatError
from pyiceberg.io.pyarrow import PyArrowFileIO

IO = PyArrowFileIO()
ID = (KeyField(1, "id", pa.int64()),)


def entries(keys: dict[str, list], row_ids: list[int], key: tuple[KeyField, ...] = ID, file: str = "f.parquet") -> pa.Table:
    n = len(row_ids)
    cols = {k.name: pa.array(keys[k.name], k.type) for k in key}
    cols.update(
        _row_id=pa.array(row_ids, pa.int64()),
        __file_path=pa.array([file] * n, pa.string()),
        __pos=pa.array(range(n), pa.int64()),
        _row_created_at_version=pa.array([1] * n, pa.int64()),
        _row_last_updated_at_version=pa.array([2] * n, pa.int64()),
    )
    return pa.table(cols)


def lookup_segments(segments: list[Segment], probe: pa.Table) -> dict:
    """Newest-first resolution through a throwaway KeyIndex."""
    idx = KeyIndex(segments[0].key, segments)
    found = idx.lookup(probe)
    names = [k.name for k in idx.key]
    return {tuple(r[n] for n in names): r["_row_id"] for r in found.to_pylist()}


# ---------------------------------------------------------------- the hash


def test_hash_is_stable_across_runs():
    """Golden values: changing the hash function must change HASH_NAME (old segments are then rebuilt)."""
    assert kh.hash_name() == "lineage-key-hash-1"
    assert kh.column_hash(pa.array([1, 2, 3, -1], pa.int64())).tolist() == [
        10451216379200822465, 10905525725756348110, 2092789425003139053, 16490336266968443936,
    ]
    assert kh.column_hash(pa.array(["", "a", "hello world"], pa.large_string())).tolist() == [
        12035550249420947055, 6774081908283191102, 12413018814670657295,
    ]


def test_hash_ignores_representation_but_not_value():
    ints = [1, 2, 3, -1, 0]
    assert kh.column_hash(pa.array(ints, pa.int32())).tolist() == kh.column_hash(pa.array(ints, pa.int64())).tolist()
    s = pa.array(["", "a", "a\x00", "b" * 300, "é"], pa.large_string())
    assert kh.column_hash(s).tolist() == kh.column_hash(s.cast(pa.string())).tolist()
    assert kh.column_hash(s.slice(2)).tolist() == kh.column_hash(s).tolist()[2:]
    chunked = pa.chunked_array([s.slice(0, 2), s.slice(2)])
    assert kh.column_hash(chunked).tolist() == kh.column_hash(s).tolist()
    assert len(set(kh.column_hash(s).tolist())) == 5
    words = pa.array([f"value-{i}" * (i % 7) for i in range(500)], pa.large_string())
    whole = kh.column_hash(words).tolist()
    old_chunk = kh._CHUNK_BYTES
    try:
        kh._CHUNK_BYTES = 5  # hashed a few values at a time (and long values alone)
        assert kh.column_hash(words).tolist() == whole
    finally:
        kh._CHUNK_BYTES = old_chunk
    two = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"]})
    assert len(set(kh.key_hash(two).tolist())) == 3
    swapped = pa.table({"a": ["x"], "b": ["y"]})
    assert kh.key_hash(swapped).tolist() != kh.key_hash(pa.table({"a": ["y"], "b": ["x"]})).tolist()


ALL_TYPES = [
    (pa.int8(), [1, -2, 3]),
    (pa.int16(), [1, -2, 300]),
    (pa.int32(), [1, -2, 3]),
    (pa.int64(), [1, -2, 2**40]),
    (pa.bool_(), [True, False]),
    (pa.large_string(), ["x", "", "long" * 50]),
    (pa.large_binary(), [b"\x00", b"", b"ab"]),
    (pa.binary(3), [b"abc", b"abd", b"\x00\x00\x00"]),
    (pa.date32(), [dt.date(2020, 1, 1), dt.date(1960, 5, 6)]),
    (pa.time64("us"), [dt.time(1, 2, 3), dt.time(0, 0)]),
    (pa.timestamp("us"), [dt.datetime(2020, 1, 1), dt.datetime(1969, 12, 31, 23, 59)]),
    (pa.timestamp("us", tz="UTC"), [dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)]),
    (pa.timestamp("ns"), [dt.datetime(2020, 1, 1)]),
    (pa.decimal128(10, 2), [decimal.Decimal("1.50"), decimal.Decimal("-2.00"), decimal.Decimal("0")]),
    (pa.decimal128(38, 0), [decimal.Decimal(10**37), decimal.Decimal(-(10**30))]),
]


@pytest.mark.parametrize("typ,values", ALL_TYPES, ids=[str(t) for t, _ in ALL_TYPES])
def test_every_key_type_round_trips(tmp_path, typ, values):
    key = (KeyField(1, "k", typ),)
    seg = make_segment(key, entries({"k": values}, list(range(len(values))), key), level=0, base=True)
    path = str(tmp_path / "s.arrow")
    write_key_segment(IO, path, seg, 1)
    back = read_key_segment(IO, path)
    probe = pa.table({"k": pa.array(list(reversed(values)), typ)})
    assert lookup_segments([back], probe) == {(v,): i for i, v in enumerate(values)}


def test_uuid_and_multi_column_keys(tmp_path):
    ids = [uuid.uuid4().bytes for _ in range(3)]
    key = (KeyField(1, "u", pa.uuid()), KeyField(2, "region", pa.large_string()))
    rows = {"u": [ids[0], ids[0], ids[1]], "region": ["eu", "us", "eu"]}
    data = entries({"u": pa.array(rows["u"], pa.binary(16)).cast(pa.uuid()).to_pylist(), "region": rows["region"]}, [5, 6, 7], key)
    seg = make_segment(key, data, level=0, base=True)
    path = str(tmp_path / "s.arrow")
    write_key_segment(IO, path, seg, 1)
    probe = pa.table({"u": pa.array([ids[0], ids[1], ids[2]], pa.binary(16)).cast(pa.uuid()), "region": ["us", "eu", "eu"]})
    found = lookup_segments([read_key_segment(IO, path)], probe)
    assert sorted(found.values()) == [6, 7]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.sampled_from([0, 0xFF, 0xFFFF, 2**64 - 1]), st.integers(0, 3))
def test_hash_order_is_a_stable_argsort(values, mask, repeat):
    """hash_order packs row numbers into the low bits for speed; ties and low-bit-only differences stay exact."""
    hashes = np.array(values * (repeat + 1), np.uint64) & np.uint64(mask)  # repeats: equal hashes; masks: low bits only
    order, ordered = key_segment.hash_order(hashes)
    expected = np.argsort(hashes, kind="stable")
    assert order.tolist() == expected.tolist() and ordered.tolist() == hashes[expected].tolist()


def test_hash_order_sorts_large_arrays_in_two_halves_the_same(monkeypatch):
    """From PARALLEL_SORT values on, the packed hashes are sorted as two halves (by their top bit) in two threads."""
    rng = np.random.default_rng(5)
    hashes = rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64)
    hashes[100:300] = hashes[7]  # ties keep their input order
    hashes[300:400] = np.uint64(2**63)  # the boundary between the halves
    expected = np.argsort(hashes, kind="stable")
    monkeypatch.setattr(key_segment, "PARALLEL_SORT", 1000)
    monkeypatch.setattr(key_segment.os, "cpu_count", lambda: 2)
    order, ordered = key_segment.hash_order(hashes)
    assert order.tolist() == expected.tolist() and ordered.tolist() == hashes[expected].tolist()


# ---------------------------------------------------------------- the file format


def _rewrite_metadata(path: str, out: str, **changes: str) -> None:
    reader = pa.ipc.open_file(pa.memory_map(path))
    meta = {k.decode(): v.decode() for k, v in reader.schema.metadata.items()}
    meta.update(changes)
    batch = reader.get_batch(0).replace_schema_metadata(meta)
    with pa.OSFile(out, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


def test_format_tag_and_version_are_checked(tmp_path):
    """Arrow segments (format 2, as earlier releases wrote them); tests/test_key_index_format.py checks format 3's."""
    seg = make_segment(ID, entries({"id": [1, 2]}, [0, 1]), level=0, base=True)
    path = str(tmp_path / "s.arrow")
    write_key_segment(IO, path, seg, 1, format_version=2)
    meta = pa.ipc.open_file(pa.memory_map(path)).schema.metadata
    assert meta[b"lineage.format"] == b"key-index-segment" and meta[b"lineage.format-version"] == b"2"
    newer = str(tmp_path / "newer.arrow")
    _rewrite_metadata(path, newer, **{"lineage.format-version": str(SEGMENT_FORMAT_VERSION + 1)})
    with pytest.raises(UnsupportedFormatError, match="upgrade"):
        read_key_segment(IO, newer)
    foreign = str(tmp_path / "foreign.arrow")
    _rewrite_metadata(path, foreign, **{"lineage.format": "deleted-rows-segment"})
    with pytest.raises(LineageMetadataError, match="not a key-index-segment"):
        read_key_segment(IO, foreign)
    with pytest.raises(LineageMetadataError, match="missing"):
        read_key_segment(IO, str(tmp_path / "gone.arrow"))
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(b"not arrow at all")
    with pytest.raises(LineageMetadataError, match="unreadable"):
        read_key_segment(IO, str(garbage))


V1_SEGMENT = os.path.join(os.path.dirname(__file__), "data", "key-index-segment-v1.arrow")  # written by format 1's writer


def test_format_1_segments_are_still_read_and_merge_into_the_current_format(tmp_path):
    old = read_key_segment(IO, V1_SEGMENT)
    assert old.batch.schema.field("__pos").type == pa.int64()  # format 1 as its writer left it
    probe = pa.table({"id": pa.array([1, 2, 4, 6, 8, 2**40], pa.int64())})
    found = KeyIndex(ID, [old]).lookup(probe)
    assert found.schema.field("__pos").type == pa.int64() and found.schema.field("_row_id").type == pa.int64()
    assert found.select(["id", "_row_id", "__file_path", "__pos", "_row_created_at_version", "_row_last_updated_at_version"]).to_pylist() == [
        {"id": 1, "_row_id": 10, "__file_path": "s3://b/t/data/a.parquet", "__pos": 0, "_row_created_at_version": 1, "_row_last_updated_at_version": 1},
        {"id": 2, "_row_id": 11, "__file_path": "s3://b/t/data/a.parquet", "__pos": 1, "_row_created_at_version": 1, "_row_last_updated_at_version": 3},
        {"id": 8, "_row_id": 14, "__file_path": "s3://b/t/data/b.parquet", "__pos": 1, "_row_created_at_version": 2, "_row_last_updated_at_version": 4},
        {"id": 2**40, "_row_id": 3_000_000_000, "__file_path": "s3://b/t/data/b.parquet", "__pos": 2, "_row_created_at_version": 2,
         "_row_last_updated_at_version": 2},
    ]
    # A newer delta over it: merged, the newest record wins and the result is written in the current format.
    new = make_segment(ID, entries({"id": [2, 4]}, [20, 21], file="c.parquet"), pa.table({"id": pa.array([3], pa.int64())}), level=0)
    merged = merge_segments([old, new], base=True, level=0)
    path = str(tmp_path / "merged.arrow")
    write_key_segment(IO, path, merged, 6)
    back = read_key_segment(IO, path)
    assert back.format_version == SEGMENT_FORMAT_VERSION == 3 and old.format_version == 1
    assert lookup_segments([back], pa.table({"id": pa.array([1, 2, 3, 4, 5, 7, 8, 2**40], pa.int64())})) == {
        (1,): 10, (2,): 20, (4,): 21, (5,): 13, (8,): 14, (2**40,): 3_000_000_000}
    legacy = str(tmp_path / "merged-v2.arrow")
    write_key_segment(IO, legacy, merged, 6, format_version=2)
    back = read_key_segment(IO, legacy)
    assert back.batch.schema.field("_row_id").type == pa.int64()  # a row id above 2**31 keeps the column wide
    assert back.batch.schema.field("__pos").type == pa.int32() and back.batch.schema.field("__file_path").type.index_type == pa.int16()


def test_format_2_narrows_only_what_fits(tmp_path):
    small = make_segment(ID, entries({"id": [1, 2, 3]}, [0, 1, 2]), level=0, base=True)
    write_key_segment(IO, str(tmp_path / "small.arrow"), small, 1, format_version=2)
    types = {f.name: f.type for f in read_key_segment(IO, str(tmp_path / "small.arrow")).batch.schema}
    assert [types[c] for c in ("_row_id", "__pos", "_row_created_at_version", "_row_last_updated_at_version")] == [pa.int32()] * 4
    wide = entries({"id": [1, 2]}, [2**31, -(2**31) - 1])
    seg = make_segment(ID, wide, level=0, base=True)
    path = str(tmp_path / "wide.arrow")
    write_key_segment(IO, path, seg, 1, format_version=2)
    back = read_key_segment(IO, path)
    assert back.batch.schema.field("_row_id").type == pa.int64() and back.batch.schema.field("__pos").type == pa.int32()
    assert sorted(back.live().column("_row_id").to_pylist()) == [-(2**31) - 1, 2**31]
    assert back.live().schema.field("_row_id").type == pa.int64()
    bad = str(tmp_path / "bad.arrow")
    batch = back.batch.set_column(back.batch.schema.get_field_index("__pos"), "__pos", pa.array(["x", "y"]))
    meta = pa.ipc.open_file(pa.memory_map(path)).schema.metadata
    with pa.OSFile(bad, "wb") as sink, pa.ipc.new_file(sink, batch.schema.with_metadata(meta)) as writer:
        writer.write_batch(batch.replace_schema_metadata(meta))
    with pytest.raises(LineageMetadataError, match="damaged"):
        read_key_segment(IO, bad)


class _MemoryIO:
    """A FileIO over a dict (stands in for object storage: paths with a scheme are not memory-mapped)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def new_input(self, path: str):  # noqa: ANN201
        io = self

        class _In:
            def open(self):  # noqa: ANN202
                if path not in io.files:
                    raise FileNotFoundError(path)
                return _io.BytesIO(io.files[path])

        return _In()

    def new_output(self, path: str):  # noqa: ANN201
        io = self

        class _Out:
            def create(self, overwrite: bool = False):  # noqa: ANN202
                class _Sink(_io.BytesIO):
                    def __exit__(self, *exc):  # noqa: ANN002, ANN204
                        io.files[path] = self.getvalue()
                        return super().__exit__(*exc)

                return _Sink()

        return _Out()


def test_segments_on_object_storage_are_read_through_fileio():
    mem = _MemoryIO()
    seg = make_segment(ID, entries({"id": [4, 5]}, [0, 1]), level=0, base=True)
    write_key_segment(mem, "mem://bucket/s.arrow", seg, 1)
    back = read_key_segment(mem, "mem://bucket/s.arrow")
    assert lookup_segments([back], pa.table({"id": [5, 6]})) == {(5,): 1}


# ---------------------------------------------------------------- lookups and merges against a model


def _apply(model: dict, delta: dict) -> None:
    for k, v in delta.items():
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v


def _delta_segment(delta: dict, level: int = 0) -> Segment:
    live = {k: v for k, v in delta.items() if v is not None}
    dead = [k for k, v in delta.items() if v is None]
    return make_segment(ID, entries({"id": list(live)}, list(live.values())), pa.table({"id": pa.array(dead, pa.int64())}), level=level)


deltas = st.lists(st.dictionaries(st.integers(0, 60), st.one_of(st.none(), st.integers(0, 10**6)), max_size=12), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(deltas, st.integers(1, 4), st.sampled_from([WRITER, MAINTENANCE, FULL]), st.booleans(), st.sampled_from([40, 8, 3]),
       st.sampled_from([WRITER, MAINTENANCE, FULL]))
def test_lookups_after_merges_match_a_dict(history, fanout, mode, tiny_hash, writer_limit, finish):
    """Random deltas merged by the policy (writers slicing merges past their limit into base pieces): lookups equal a
    dict model (with a 2-bit hash: every key collides); a merge in another mode at the end keeps them equal."""
    with key_hash_mask(np.uint64(3) if tiny_hash else kh._FULL):
        _check_history(history, fanout, mode, writer_limit, finish)


def _check_history(history: list[dict], fanout: int, mode: str, writer_limit: int = 40, finish: str | None = None) -> None:
    policy = MergePolicy(fanout=fanout, base_fraction=0.5, writer_limit=writer_limit, max_segments=6)
    model: dict[int, int] = {}
    segments: list[Segment] = []
    probe = pa.table({"id": pa.array(range(-1, 62), pa.int64())})

    def merge(mode: str) -> None:
        while (step := next_merge([segment_info(s) for s in segments], policy, mode)) is not None:
            start, level = step
            segments[start:] = [merge_segments(segments[start:], base=start == 0, level=level)]
            if start == 0:
                assert not segments[0].tombstones.any()
        if mode == WRITER and (piece := writer_slice([segment_info(s) for s in segments], policy)) is not None:
            before = sum(s.entries for s in segments[: piece.inputs])
            assert before <= policy.writer_limit or piece.hi - piece.lo < HASHES  # a piece, not the whole merge
            segments[:] = sliced(segments, piece)

    for delta in history:
        _apply(model, delta)
        if delta:
            segments.append(_delta_segment(delta))
        merge(mode)
        infos = [segment_info(s) for s in segments]
        tail = len(segments) - base_end(infos)
        assert tail <= max(policy.max_segments, 1) + len(history) if mode == WRITER else tail < policy.max_segments + 1
        if segments:
            assert lookup_segments(segments, probe) == {(k,): v for k, v in model.items()}
    if finish is not None and segments:
        merge(finish)
        assert lookup_segments(segments, probe) == {(k,): v for k, v in model.items()}


def test_sliced_merge_makes_a_base_of_pieces(tmp_path):
    """A writer over its merge limit slices the merge into a new base: one piece per commit, each holding the live keys
    of its hash range; the last piece retires the inputs; pieces keep their range through a file; lookups stay right."""
    policy = MergePolicy(fanout=8, base_fraction=0.25, writer_limit=50, max_segments=4)
    model = {k: k for k in range(200)}
    segments = [make_segment(ID, entries({"id": list(model)}, list(model.values())), level=0, base=True)]
    probe = pa.table({"id": pa.array(range(-1, 260), pa.int64())})
    commits = 0
    while commits < 40:
        delta = {200 + commits: 1000 + commits, commits: None, commits + 50: 2000 + commits}
        _apply(model, delta)
        segments.append(_delta_segment(delta))
        piece = writer_slice([segment_info(s) for s in segments], policy)
        if piece is not None:
            assert piece.hi - piece.lo == HASHES // 8  # 200-odd records in slices of at most 50: 8 pieces
            segments = sliced(segments, piece)
        commits += 1
        assert lookup_segments(segments, probe) == {(k,): v for k, v in model.items()}
    ranged = [s for s in segments if s.hash_range is not None]
    assert ranged and ranged[0].hash_range[0] == 0
    assert base_end([segment_info(s) for s in segments]) >= 8  # a finished slicing: the pieces are the base
    assert not any(s.tombstones.any() for s in ranged)
    io = PyArrowFileIO()
    back = []
    for i, s in enumerate(segments):
        path = str(tmp_path / f"{i}-keys.kix")
        write_key_segment(io, path, s, 1)
        back.append(read_key_segment(io, path))
    assert [s.hash_range for s in back] == [s.hash_range for s in segments]
    assert lookup_segments(back, probe) == {(k,): v for k, v in model.items()}
    empty = sliced([make_segment(ID, entries({"id": []}, []), level=0, base=True)], Slice(1, 1, 0, HASHES // 2))[-1]
    path = str(tmp_path / "empty-keys.kix")
    write_key_segment(io, path, empty, 1)
    assert read_key_segment(io, path).hash_range == (0, HASHES // 2) and read_key_segment(io, path).entries == 0


def test_collisions_never_mix_keys(monkeypatch):
    """With a 1-bit hash half the keys share each hash value; every lookup still finds exactly its own key."""
    monkeypatch.setattr(kh, "_MASK", np.uint64(1))
    assert kh.hash_name().endswith("/mask=1")
    names = [f"k{i}" for i in range(50)]
    key = (KeyField(1, "s", pa.large_string()),)
    base = make_segment(key, entries({"s": names}, list(range(50)), key), level=0, base=True)
    delta = make_segment(key, entries({"s": names[:5]}, [100 + i for i in range(5)], key), pa.table({"s": pa.array(names[5:10], pa.large_string())}))
    merged = merge_segments([base, delta], base=True, level=0)
    probe = pa.table({"s": names + ["absent", "k50"]})
    expect = {(n,): (100 + i if i < 5 else i) for i, n in enumerate(names) if not 5 <= i < 10}
    assert lookup_segments([base, delta], probe) == expect
    assert lookup_segments([merged], probe) == expect
    assert merged.entries == 45


# ---------------------------------------------------------------- the merge policy


def infos(*spec: str) -> list[SegmentInfo]:
    """'B100' is a base of 100 entries, '0:10' a level-0 segment of 10."""
    out = []
    for s in spec:
        if s.startswith("B"):
            out.append(SegmentInfo(0, True, int(s[1:])))
        else:
            level, n = s.split(":")
            out.append(SegmentInfo(int(level), False, int(n)))
    return out


def test_merge_policy():
    p = MergePolicy(fanout=2, base_fraction=0.5, writer_limit=100, max_segments=5)
    assert next_merge(infos("B1000", "0:10", "0:10"), p, WRITER) is None
    assert next_merge(infos("B1000", "0:10", "0:10", "0:10"), p, WRITER) == (1, 1)  # tail run of 3 > fanout 2
    assert next_merge(infos("B1000", "1:30", "1:30", "1:30"), p, WRITER) == (1, 2)
    assert next_merge(infos("B1000", "2:90", "2:90", "2:90"), p, WRITER) is None  # 270 > writer limit 100
    assert next_merge(infos("B1000", "2:90", "2:90", "2:90"), p, MAINTENANCE) == (1, 3)
    assert next_merge(infos("B60", "1:20", "0:20"), p, WRITER) == (0, 0)  # 40 > half the base, 100 within the limit
    assert next_merge(infos("B100", "1:30", "0:30"), p, WRITER) is None  # 160 over the writer limit
    assert next_merge(infos("B1000", "3:300", "2:90"), p, WRITER) is None
    assert next_merge(infos("B1000", "3:300", "2:90"), p, MAINTENANCE) is None  # 390 < 500
    assert next_merge(infos("B1000", "4:1", "3:1", "2:1", "1:1", "0:1"), p, WRITER) is None  # over max-segments: sliced
    assert writer_slice(infos("B1000", "4:1", "3:1", "2:1", "1:1", "0:1"), p) == Slice(6, 6, 0, HASHES // 16)  # 1005 / 100
    assert writer_slice(infos("B1000", "3:1", "2:1", "1:1", "0:1"), p) is None  # within max-segments
    assert next_merge(infos("B1000", "4:1", "3:1", "2:1", "1:1", "0:1"), p, MAINTENANCE) == (0, 0)  # over max-segments: forced
    assert writer_slice(infos("B1000", "2:90", "2:90", "2:90"), p) is None  # a base not due for a merge
    assert writer_slice(infos("B100", "1:30", "0:30"), p) is None  # due by base-fraction only: left to maintenance
    assert writer_slice(infos("B100", "3:30", "2:30", "2:1", "1:1", "0:1"), p) == Slice(6, 6, 0, HASHES // 2)  # 164: two pieces
    half = [SegmentInfo(0, True, 80, (0, HASHES // 2))]
    assert writer_slice(infos("B100", "1:30", "0:30") + half + infos("0:5"), p) == Slice(3, 4, HASHES // 2, HASHES)
    assert next_merge(infos("B100", "1:30", "0:30") + half + infos("0:5", "0:5", "0:5"), p, WRITER) == (4, 1)  # tail only
    assert next_merge(infos("B100", "1:30", "0:30") + half + infos("0:5"), p, MAINTENANCE) == (0, 0)
    pieces = [SegmentInfo(0, True, 50, (0, HASHES // 2)), SegmentInfo(0, True, 50, (HASHES // 2, HASHES))]
    assert base_end(pieces + infos("0:5")) == 2
    assert next_merge(pieces + infos("0:5"), p, WRITER) is None  # 5 < half of the 100 in the pieces
    assert next_merge(pieces + infos("0:60"), p, WRITER) is None  # due, but 160 over the limit
    assert writer_slice(pieces + infos("0:60"), p) is None
    over = pieces + infos("3:1", "2:1", "1:1", "0:1", "0:1")  # the two pieces count as one segment
    assert next_merge(over, p, WRITER) is None and writer_slice(over, p) == Slice(7, 7, 0, HASHES // 2)
    assert next_merge(infos("0:10", "0:10", "0:10"), p, WRITER) == (0, 0)  # reaches the oldest: a base
    assert next_merge(infos("0:50", "0:30"), p, WRITER) == (0, 0)  # the oldest stands for the base
    assert next_merge(infos("B10"), p, FULL) is None
    assert next_merge(infos("0:10"), p, FULL) == (0, 0)
    assert next_merge(infos("B10", "0:1"), p, FULL) == (0, 0)
    assert next_merge([], p, WRITER) is None


def test_merge_policy_properties_are_validated():
    assert MergePolicy.of({}) == MergePolicy()
    assert MergePolicy.of({"lineage.key-index.merge-fanout": "4"}).fanout == 4
    with pytest.raises(InvalidArgumentError, match="merge-fanout"):
        MergePolicy.of({"lineage.key-index.merge-fanout": "0"})
    with pytest.raises(InvalidArgumentError, match="not a number"):
        MergePolicy.of({"lineage.key-index.base-fraction": "lots"})
