"""The on-disk lineage format: run-length encodings, O(1) appends, format versions, corruption, the deleted-rows index.

DESIGN.md section 4: lineage is stored per data file as run-length encoded
row ids / created / updated versions (a fresh append costs O(1) metadata per
file), in immutable versioned files; unknown newer formats are refused with a
clear error; the deleted-rows index stores pointers (file, roaring bitmap of
positions, row ids, lineage). Section 7: a missing or corrupt lineage or index
file gives a clear, specific error.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyroaring import BitMap64

import lineage
from conftest import SCHEMA
from index import deleted_rows
from index.deleted_rows import RemovedImages, read_index_segment, write_index_segment
from lineage import state
from lineage.storage import commit_log, metadata
from lineage.storage.fileio import local_path
from lineage.storage.metadata import LIST_FORMAT_VERSION, SUMMARY_LIST, FileLineage, read_list, read_segment, write_segment
from lineage.storage.rle import (
    Runs,
    combined_breakpoints,
    decode_sequence,
    decode_values,
    encode_sequence,
    encode_values,
    sequence_run,
    value_run,
)

PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _clear_caches() -> None:
    metadata._SEGMENT_CACHE.clear()
    metadata._LIST_CACHE.clear()
    commit_log._CHUNK_CACHE.clear()
    deleted_rows._CACHE.clear()
    state.forget_planned_files()  # tables keep their current snapshot's live files in memory


@pytest.fixture(autouse=True)
def fresh_caches():
    _clear_caches()
    yield
    _clear_caches()


@pytest.fixture
def segment_files(monkeypatch):
    """Every commit writes its lineage segment as a file of its own (none is small enough to go inside its list)."""
    monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", -1)


# ====================================================================== rle.py
VERSIONS = st.integers(min_value=0, max_value=2**40)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def value_columns(draw, values=VERSIONS, max_runs=30):
    """Columns made of runs of equal values (adjacent runs may repeat a value)."""
    pool = draw(st.lists(values, min_size=1, max_size=5))
    runs = draw(st.lists(st.tuples(st.sampled_from(pool), st.integers(1, 40)), max_size=max_runs))
    return np.array([v for v, n in runs for _ in range(n)], dtype=np.int64)


@st.composite
def sequence_columns(draw, max_runs=30):
    """Row-id-like columns: runs of consecutive integers, sometimes contiguous with the previous run."""
    out: list[int] = []
    for _ in range(draw(st.integers(0, max_runs))):
        if out and draw(st.booleans()):
            start = out[-1] + 1  # continues the previous run: must merge into it
        else:
            start = draw(st.integers(0, 2**62))
        out.extend(range(start, start + draw(st.integers(1, 40))))
    return np.array(out, dtype=np.int64)


def _assert_well_formed(runs: Runs, n: int) -> None:
    assert runs.values.dtype == np.int64 and runs.lengths.dtype == np.int64
    assert len(runs.values) == len(runs.lengths) == len(runs)
    assert runs.total == n
    assert (runs.lengths > 0).all()


@PROFILE
@given(st.one_of(value_columns(), value_columns(values=INT64), st.lists(INT64, max_size=60).map(lambda xs: np.array(xs, np.int64))))
def test_value_runs_round_trip(col):
    runs = encode_values(col)
    _assert_well_formed(runs, len(col))
    np.testing.assert_array_equal(decode_values(runs), col)
    # maximal: two neighbouring runs never hold the same value
    assert (runs.values[1:] != runs.values[:-1]).all()
    assert len(runs) == (0 if len(col) == 0 else 1 + int((col[1:] != col[:-1]).sum()))


@PROFILE
@given(st.one_of(sequence_columns(), st.lists(st.integers(0, 2**62), max_size=60).map(lambda xs: np.array(xs, np.int64))))
def test_sequence_runs_round_trip(col):
    runs = encode_sequence(col)
    _assert_well_formed(runs, len(col))
    decoded = decode_sequence(runs)
    assert decoded.dtype == np.int64
    np.testing.assert_array_equal(decoded, col)
    # maximal: a run never continues where the previous one ended
    ends = runs.values[:-1] + runs.lengths[:-1]
    assert (runs.values[1:] != ends).all()


@PROFILE
@given(st.integers(0, 2**62), st.integers(0, 10**7))
def test_single_runs_are_what_a_fresh_append_writes(start, n):
    seq = sequence_run(start, n)
    val = value_run(start, n)
    assert len(seq) == len(val) == 1 and seq.total == val.total == n
    if n <= 100_000:
        np.testing.assert_array_equal(decode_sequence(seq), np.arange(start, start + n, dtype=np.int64))
        np.testing.assert_array_equal(decode_values(val), np.full(n, start, dtype=np.int64))
    if n:
        assert encode_sequence(np.arange(start, start + min(n, 1000), dtype=np.int64)).values.tolist() == [start]


def test_empty_encodings():
    empty = np.zeros(0, np.int64)
    for enc, dec in ((encode_values, decode_values), (encode_sequence, decode_sequence)):
        runs = enc(empty)
        assert len(runs) == 0 and runs.total == 0
        assert dec(runs).size == 0
    pos, rid, created, updated = combined_breakpoints(encode_sequence(empty), encode_values(empty), encode_values(empty))
    assert pos.size == rid.size == created.size == updated.size == 0


@st.composite
def lineage_columns(draw):
    """Three equally long columns: row ids (sequence runs), created and updated versions (value runs)."""
    row_ids = draw(sequence_columns())
    n = len(row_ids)

    def versions():
        col = draw(value_columns(max_runs=10))
        col = np.resize(col, n) if len(col) else np.zeros(n, np.int64)
        return col.astype(np.int64)

    return row_ids, versions(), versions()


def _runs_starts(runs: Runs) -> np.ndarray:
    return np.cumsum(runs.lengths) - runs.lengths


@PROFILE
@given(lineage_columns())
def test_combined_breakpoints_reconstruct_every_position(cols):
    row_ids, created, updated = cols
    enc = (encode_sequence(row_ids), encode_values(created), encode_values(updated))
    pos, rid_start, c, u = combined_breakpoints(*enc)
    n = len(row_ids)

    assert len(pos) == len(rid_start) == len(c) == len(u)
    # the breakpoints are exactly the union of the three encodings' run starts
    np.testing.assert_array_equal(pos, np.unique(np.concatenate([_runs_starts(r) for r in enc])))
    if n:
        assert pos[0] == 0 and (np.diff(pos) > 0).all() and pos[-1] < n
    # on each combined run, row ids step by one and both versions are constant
    idx = np.searchsorted(pos, np.arange(n), side="right") - 1
    np.testing.assert_array_equal(rid_start[idx] + (np.arange(n) - pos[idx]), row_ids)
    np.testing.assert_array_equal(c[idx], created)
    np.testing.assert_array_equal(u[idx], updated)


# ====================================================================== segment / index files round trip
FILEIO = PyArrowFileIO()


@PROFILE
@given(st.lists(lineage_columns().filter(lambda c: len(c[0]) > 0), max_size=4))
def test_segment_file_round_trip(tmp_path_factory, files):
    root = tmp_path_factory.getbasetemp()
    lineages = [
        FileLineage(f"s3://bucket/data/{i}-{uuid.uuid4()}.parquet", len(r), encode_sequence(r), encode_values(c), encode_values(u))
        for i, (r, c, u) in enumerate(files)
    ]
    path = str(root / f"{uuid.uuid4()}-segment.parquet")
    size = write_segment(FILEIO, path, lineages)
    assert size == os.path.getsize(path)
    back = read_segment(FILEIO, path)
    assert [fl.file_path for fl in back] == [fl.file_path for fl in lineages]
    for got, want in zip(back, lineages, strict=True):
        assert got.record_count == want.record_count
        for name in ("row_ids", "created", "updated"):
            np.testing.assert_array_equal(getattr(got, name).values, getattr(want, name).values)
            np.testing.assert_array_equal(getattr(got, name).lengths, getattr(want, name).lengths)
    meta = pq.read_schema(path).metadata
    assert meta[b"lineage.format"] == b"lineage-segment" and meta[b"lineage.format-version"] == b"1"


@st.composite
def removed_images(draw):
    n = draw(st.integers(1, 60))
    positions = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n, unique=True))
    row_ids = draw(st.lists(st.integers(0, 2**62), min_size=n, max_size=n, unique=True))
    created = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    valid_from = [c + draw(st.integers(0, 3)) for c in created]
    return RemovedImages(
        f"file:///wh/data/{uuid.uuid4()}.parquet",
        np.array(positions, np.int64),
        np.array(row_ids, np.int64),
        np.array(created, np.int64),
        np.array(valid_from, np.int64),
        draw(st.integers(10, 20)),
    )


@PROFILE
@given(st.lists(removed_images(), min_size=1, max_size=3))
def test_index_segment_round_trip(tmp_path_factory, removed):
    path = str(tmp_path_factory.getbasetemp() / f"{uuid.uuid4()}-deleted-rows.parquet")
    write_index_segment(FILEIO, path, removed)
    back = read_index_segment(FILEIO, path)
    assert len(back) == len(removed)
    for got, want in zip(back, removed, strict=True):
        order = np.argsort(want.positions, kind="stable")
        assert got.file_path == want.file_path and got.valid_to == want.valid_to
        np.testing.assert_array_equal(got.positions, want.positions[order])
        np.testing.assert_array_equal(got.row_ids, want.row_ids[order])
        np.testing.assert_array_equal(got.created, want.created[order])
        np.testing.assert_array_equal(got.valid_from, want.valid_from[order])
    raw = pq.read_table(path)
    for blob, want in zip(raw.column("positions").to_pylist(), removed, strict=True):
        assert list(BitMap64.deserialize(blob)) == sorted(want.positions.tolist())


def test_index_segments_are_cached_within_a_byte_budget(tmp_path, monkeypatch):
    from lineage.storage.fileio import ImmutableFileCache

    rng = np.random.default_rng(7)

    def segment(n: int) -> str:
        path = str(tmp_path / f"{uuid.uuid4()}-deleted-rows.parquet")
        pos = np.sort(rng.choice(10 * n, n, replace=False)).astype(np.int64)
        write_index_segment(FILEIO, path, [RemovedImages("s3://b/f.parquet", pos, pos + 1, np.ones(n, np.int64), np.ones(n, np.int64), 2)])
        return path

    small, other, large = segment(100), segment(100), segment(20_000)
    each = deleted_rows._read(FILEIO, small, False).nbytes
    budget = 4 * each + 100  # two small segments fit; the large one is more than a quarter of it
    real = deleted_rows._CACHE  # its weighing and share, with a smaller budget
    monkeypatch.setattr(deleted_rows, "_CACHE", ImmutableFileCache(budget, weigh=real._weigh, max_share=real._max_share))
    for path in (small, other, large):
        deleted_rows.read_index(FILEIO, path)
    assert deleted_rows._CACHE.peek(small) is not None and deleted_rows._CACHE.peek(other) is not None
    assert deleted_rows._CACHE.peek(large) is None, "a segment larger than a quarter of the budget is read, not kept"
    assert deleted_rows.CACHE_BYTES >= 64 << 20 and deleted_rows._VALUE_CACHE.capacity == deleted_rows.CACHE_BYTES


# ====================================================================== O(1) metadata for a fresh append
def _current_list(table: lineage.Table):
    table.refresh()
    snap = table.iceberg.metadata.current_snapshot()
    path = snap.summary.additional_properties[SUMMARY_LIST]
    return path, read_list(table.iceberg.io, path)


def _batch(n: int, offset: int = 0) -> pa.Table:
    ids = np.arange(offset, offset + n, dtype=np.int64)
    return pa.table({"id": ids, "name": pa.array([f"n{i % 3}" for i in range(n)]), "amount": ids.astype(np.float64) / 4})


@pytest.mark.parametrize(
    "n, properties, partition_by",
    [
        (1, {}, None),
        (200_000, {}, None),
        (200_000, {"write.target-file-size-bytes": str(1 << 20)}, None),  # several files
        (30_000, {}, ["name"]),  # one file per partition
    ],
    ids=["1-row", "200k-rows", "200k-rows-small-files", "partitioned"],
)
@pytest.mark.parametrize("inline", [True, False], ids=["in-list", "segment-file"])
def test_fresh_append_is_one_run_per_column_per_file(warehouse, n, properties, partition_by, inline, monkeypatch):
    if not inline:
        monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", -1)
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], partition_by=partition_by, warehouse=warehouse, properties=properties)
    info = t.append(_batch(n))
    assert info.version == 1 and info.inserted == n

    list_path, lst = _current_list(t)
    assert lst.version == 1 and lst.next_row_id == n
    assert len(lst.segments) == 1
    assert [c.segment for c in lst.commits] == [lst.segments[0]]
    segment = read_segment(t.iceberg.io, lst.segments[0])
    data_files = t.state().all_data_file_paths()
    assert {fl.file_path for fl in segment} == data_files
    assert len(segment) == info.data_files_added
    if properties:
        assert len(segment) > 1
    if partition_by:
        assert len(segment) == 3

    starts = []
    for fl in segment:
        assert (len(fl.row_ids), len(fl.created), len(fl.updated)) == (1, 1, 1), fl
        assert fl.row_ids.lengths.tolist() == fl.created.lengths.tolist() == fl.updated.lengths.tolist() == [fl.record_count]
        assert fl.created.values.tolist() == fl.updated.values.tolist() == [1]
        starts.append((int(fl.row_ids.values[0]), fl.record_count))
    # the files' id ranges tile 0..n-1
    starts.sort()
    assert starts[0][0] == 0
    assert all(a + la == b for (a, la), (b, _) in zip(starts, starts[1:]))
    assert sum(c for _, c in starts) == n

    # O(1): the metadata does not grow with the row count (a 1-row segment is ~4 KiB of Parquet framing;
    # per-row lineage for 200k rows would be hundreds of KiB); a few runs go inside the list (one object fewer)
    assert metadata.is_inline_segment(lst.segments[0]) == inline
    if inline:
        assert lst.segments[0] == metadata.inline_segment_path(list_path) and len(lst.inline_segment) == len(segment)
        assert not [n for n in os.listdir(os.path.dirname(local_path(list_path))) if n.endswith("-segment.parquet")]
    segment_size = lst.segment_bytes[lst.segments[0]] if inline else os.path.getsize(local_path(lst.segments[0]))
    assert segment_size / len(segment) < (1024 if inline else 16 * 1024)
    assert os.path.getsize(local_path(list_path)) - (segment_size if inline else 0) < 4096

    ids = t.scan(columns=["_row_id"]).column("_row_id").to_numpy()
    assert np.array_equal(np.sort(ids), np.arange(n))


# ====================================================================== format versions and corruption
def _seeded(warehouse: str, name: str = "shop.orders") -> lineage.Table:
    """Version 1 appends ids 0..9, version 2 deletes id 4 (so there is an index segment)."""
    t = lineage.create_table(name, SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(10))
    t.delete("id = 4")
    _clear_caches()
    return t


def _paths(t: lineage.Table) -> dict[str, str]:
    list_path, lst = _current_list(t)
    _clear_caches()
    assert len(lst.segments) == 1 and lst.commits[-1].index
    return {"list": list_path, "segment": lst.segments[0], "index": lst.commits[-1].index}


def _rewrite_parquet(path: str, change) -> None:
    """Replace a Parquet file in place with ``change(table)``."""
    local = local_path(path)
    table = change(pq.read_table(local))
    os.remove(local)
    pq.write_table(table, local)


def _with_meta(**updates):
    def change(table: pa.Table) -> pa.Table:
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        meta.update(updates)
        return table.replace_schema_metadata(meta)

    return change


def _rewrite_json(path: str, change) -> None:
    local = local_path(path)
    with open(local) as f:
        obj = json.load(f)
    with open(local, "w") as f:
        f.write(json.dumps(change(obj)))


def _write_raw(path: str, data: bytes) -> None:
    with open(local_path(path), "wb") as f:
        f.write(data)


def _truncate(path: str) -> None:
    local = local_path(path)
    with open(local, "r+b") as f:
        f.truncate(os.path.getsize(local) // 2)


def _state_of(t: lineage.Table):
    snap = t.iceberg.metadata.current_snapshot()
    return t.iceberg.metadata_location, snap.snapshot_id


@pytest.mark.parametrize("kind", ["segment", "list", "index"])
def test_newer_format_version_is_refused(warehouse, kind, segment_files):
    t = _seeded(warehouse)
    paths = _paths(t)
    path = paths[kind]
    if kind == "list":
        _rewrite_json(path, lambda o: {**o, "format-version": 99})
    else:
        _rewrite_parquet(path, _with_meta(**{"lineage.format-version": "99"}))
    _clear_caches()

    readers = {
        "segment": lambda: read_segment(t.iceberg.io, path),
        "list": lambda: read_list(t.iceberg.io, path),
        "index": lambda: read_index_segment(t.iceberg.io, path),
    }
    with pytest.raises(lineage.UnsupportedFormatError) as info:
        readers[kind]()
    message = str(info.value)
    assert path in message and "99" in message, message
    assert isinstance(info.value, lineage.LineageMetadataError)

    if kind in ("segment", "list"):
        # the table's own entry points refuse too, and a write does not commit on top of it
        before = _state_of(t)
        calls = [t.scan, lambda: t.count(), lambda: t.update("id = 1", {"amount": "0"})]
        if kind == "list":
            calls += [lambda: t.append(_batch(1, offset=100)), t.history]
        for call in calls:
            _clear_caches()
            with pytest.raises(lineage.UnsupportedFormatError) as info:
                call()
            assert path in str(info.value) and "99" in str(info.value)
        t.refresh()
        assert _state_of(t) == before


def _as_format_1(obj: dict) -> dict:
    """A current list (log still all in the tail) written the way format 1 wrote it: paths only, the log inline."""
    assert obj["format-version"] == LIST_FORMAT_VERSION and obj["log"]["head"] is None
    old = {k: v for k, v in obj.items() if k not in ("log", "segments")}
    return {**old, "format-version": "1", "segments": [s["path"] for s in obj["segments"]], "commits": obj["log"]["tail"]}


def test_older_or_same_format_version_is_read(warehouse):
    t = _seeded(warehouse)
    paths = _paths(t)
    history = t.history()
    _rewrite_json(paths["list"], _as_format_1)  # a string tag is fine
    _clear_caches()
    assert t.count() == 9
    assert t.history() == history
    # the next commit reads the format-1 list and writes the current format
    t.delete("id = 5")
    _clear_caches()
    list_path, lst = _current_list(t)
    with open(local_path(list_path)) as f:
        assert json.load(f)["format-version"] == LIST_FORMAT_VERSION
    assert [c.version for c in lst.commits] == [1, 2, 3] and t.count() == 8
    for older in ("2", "3"):  # a string tag is fine; format 2 lists are read as format 3 (no list names another)
        _rewrite_json(list_path, lambda o: {**o, "format-version": older})
        _clear_caches()
        assert t.count() == 8 and [c.version for c in _current_list(t)[1].commits] == [1, 2, 3]


LIST_CORRUPTIONS = {
    "missing": lambda p: os.remove(local_path(p)),
    "empty": lambda p: _write_raw(p, b""),
    "garbage": lambda p: _write_raw(p, b"\xff\xfe\x00garbage"),
    "truncated": _truncate,
    "json-array": lambda p: _write_raw(p, b"[]"),
    "wrong-format-tag": lambda p: _rewrite_json(p, lambda o: {**o, "format": "lineage-segment"}),
    "no-format-version": lambda p: _rewrite_json(p, lambda o: {k: v for k, v in o.items() if k != "format-version"}),
    "unreadable-format-version": lambda p: _rewrite_json(p, lambda o: {**o, "format-version": "one"}),
    "missing-key": lambda p: _rewrite_json(p, lambda o: {k: v for k, v in o.items() if k != "next-row-id"}),
    "segments-not-a-list": lambda p: _rewrite_json(p, lambda o: {**o, "segments": 5}),
    "commit-not-an-object": lambda p: _rewrite_json(p, lambda o: {**o, "log": {**o["log"], "tail": [5]}}),
    "commit-bad-version": lambda p: _rewrite_json(
        p, lambda o: {**o, "log": {**o["log"], "tail": [{**c, "version": "x"} for c in o["log"]["tail"]]}}
    ),
    "segment-not-listed": lambda p: _rewrite_json(p, lambda o: {**o, "segments": []}),
}


@pytest.mark.parametrize("corruption", sorted(LIST_CORRUPTIONS))
def test_corrupt_or_missing_list_is_a_metadata_error(warehouse, corruption):
    t = _seeded(warehouse)
    paths = _paths(t)
    before = _state_of(t)
    LIST_CORRUPTIONS[corruption](paths["list"])
    calls = [t.scan, lambda: t.delete("id = 1")]
    if corruption != "segment-not-listed":  # history() reads only the list, not the segments
        calls.append(t.history)
    for call in calls:
        _clear_caches()
        with pytest.raises(lineage.LineageMetadataError) as info:
            call()
        if corruption != "segment-not-listed":  # that one is reported against the data file without lineage
            assert paths["list"] in str(info.value), str(info.value)
    t.refresh()
    assert _state_of(t) == before


def _set_column(name: str, array: pa.Array):
    def change(table: pa.Table) -> pa.Table:
        return table.set_column(table.schema.get_field_index(name), name, array)

    return change


SEGMENT_CORRUPTIONS = {
    "missing": lambda p: os.remove(local_path(p)),
    "empty": lambda p: _write_raw(p, b""),
    "garbage": lambda p: _write_raw(p, b"garbage, not parquet"),
    "truncated": _truncate,
    "json-instead": lambda p: _write_raw(p, b'{"format": "lineage-segment"}'),
    "no-format-tag": lambda p: _rewrite_parquet(p, lambda tb: tb.replace_schema_metadata({})),
    "wrong-format-tag": lambda p: _rewrite_parquet(p, _with_meta(**{"lineage.format": "deleted-rows-segment"})),
    "unreadable-format-version": lambda p: _rewrite_parquet(p, _with_meta(**{"lineage.format-version": "v1"})),
    "record-count-disagrees": lambda p: _rewrite_parquet(p, _set_column("record_count", pa.array([11], pa.int64()))),
    # the file parses as Parquet with the right tags, but its content is damaged
    "missing-column": lambda p: _rewrite_parquet(p, lambda tb: tb.drop_columns(["created_lengths"])),
    "null-run-list": lambda p: _rewrite_parquet(p, _set_column("created_values", pa.array([None], pa.list_(pa.int64())))),
    "runs-arrays-differ-in-length": lambda p: _rewrite_parquet(
        p, _set_column("created_lengths", pa.array([[4, 6]], pa.list_(pa.int64())))
    ),
}


@pytest.mark.parametrize("corruption", sorted(SEGMENT_CORRUPTIONS))
def test_corrupt_or_missing_segment_is_a_metadata_error(warehouse, corruption, segment_files):
    t = _seeded(warehouse)
    paths = _paths(t)
    before = _state_of(t)
    SEGMENT_CORRUPTIONS[corruption](paths["segment"])
    for call in (t.scan, lambda: t.count(as_of=1), lambda: t.update("id = 1", {"amount": "0"})):
        _clear_caches()
        try:
            call()
        except lineage.LineageMetadataError as exc:
            if corruption != "record-count-disagrees":
                assert paths["segment"] in str(exc), str(exc)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"corrupt segment ({corruption}) raised {type(exc).__module__}.{type(exc).__name__}, not LineageMetadataError: {exc}")
        else:
            pytest.fail(f"corrupt segment ({corruption}) was read without an error")
    t.refresh()
    assert _state_of(t) == before


def _in_list(change):
    """A change of the segment rows a list holds (list format 4)."""
    return lambda p: _rewrite_json(p, lambda o: {**o, "segment": change(o["segment"])})


def _first_row(change):
    return _in_list(lambda rows: [change(dict(rows[0]))] + rows[1:])


INLINE_SEGMENT_CORRUPTIONS = {
    "list-missing": lambda p: os.remove(local_path(p)),
    "no-segment-in-list": lambda p: _rewrite_json(p, lambda o: {k: v for k, v in o.items() if k != "segment"}),
    "segment-not-a-list": _in_list(lambda rows: 5),
    "row-not-an-object": _in_list(lambda rows: [5]),
    "missing-key": _first_row(lambda r: {k: v for k, v in r.items() if k != "created_lengths"}),
    "null-runs": _first_row(lambda r: {**r, "created_values": None}),
    "nested-runs": _first_row(lambda r: {**r, "created_values": [[1]], "created_lengths": [10]}),
    "runs-arrays-differ-in-length": _first_row(lambda r: {**r, "created_lengths": [4, 6]}),
    "record-count-disagrees": _first_row(lambda r: {**r, "record_count": 11}),
}


def test_a_small_commit_writes_its_segment_inside_its_list_and_a_new_process_reads_it(warehouse):
    t = _seeded(warehouse)
    list_path, lst = _current_list(t)
    segment = lst.segments[0]
    assert metadata.is_inline_segment(segment) and metadata.segment_object(segment) != list_path  # version 1's list holds it
    assert lst.commits[0].segment == segment and lst.inline_segment is None  # version 2 (a delete) added no data file
    folder = os.path.dirname(local_path(list_path))
    assert not [n for n in os.listdir(folder) if n.endswith("-segment.parquet")]
    before = read_segment(t.iceberg.io, segment)
    _clear_caches()
    assert read_segment(t.iceberg.io, segment) == before and t.count() == 9
    assert sorted(r["id"] for r in t.scan().to_pylist()) == [i for i in range(10) if i != 4]


def test_a_segment_goes_inside_its_list_up_to_the_limit_and_into_a_file_past_it(warehouse, monkeypatch):
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", 2)
    t.append(_batch(10))  # one file: a run of row ids, one of created and one of updated versions
    monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", 3)
    t.append(_batch(10, offset=10))
    _clear_caches()
    segments = _current_list(t)[1].segments
    assert [metadata.is_inline_segment(s) for s in segments] == [False, True] and os.path.exists(local_path(segments[0]))
    got = sorted((r["id"], r["_row_id"], r["_row_created_at_version"]) for r in t.scan().to_pylist())
    assert got == [(i, i, 1 + i // 10) for i in range(20)]


@pytest.mark.parametrize("corruption", sorted(INLINE_SEGMENT_CORRUPTIONS))
def test_a_damaged_or_missing_segment_inside_a_list_is_a_metadata_error(warehouse, corruption):
    t = _seeded(warehouse)
    segment = _paths(t)["segment"]
    before = _state_of(t)
    INLINE_SEGMENT_CORRUPTIONS[corruption](metadata.segment_object(segment))
    for call in (t.scan, lambda: t.count(), lambda: t.update("id = 1", {"amount": "0"})):
        _clear_caches()
        with pytest.raises(lineage.LineageMetadataError) as info:
            call()
        if corruption != "record-count-disagrees":  # names the data file whose runs disagree with it
            assert segment in str(info.value), str(info.value)
    t.refresh()
    assert _state_of(t) == before


def test_a_release_that_reads_lists_up_to_format_3_refuses_format_4(warehouse, monkeypatch):
    t = _seeded(warehouse)
    list_path = _paths(t)["list"]
    with open(local_path(list_path)) as f:
        assert json.load(f)["format-version"] == LIST_FORMAT_VERSION == 4
    monkeypatch.setattr(metadata, "LIST_FORMAT_VERSION", 3)
    monkeypatch.setattr(metadata, "LIST_FORMAT_VERSION_NATIVE", 3)  # nor does it know format 5 (v3 tables)
    monkeypatch.setattr(commit_log, "LIST_FORMAT_VERSION", 3)
    before = _state_of(t)
    for call in (t.scan, t.history, lambda: t.append(_batch(1, offset=100))):
        _clear_caches()
        with pytest.raises(lineage.UnsupportedFormatError) as info:
            call()
        assert "format version 4" in str(info.value) and "up to 3" in str(info.value), str(info.value)
    t.refresh()
    assert _state_of(t) == before


def test_vacuum_keeps_the_list_that_holds_a_segment_a_later_list_names(warehouse):
    import datetime as dt

    from lineage.maintenance.verify import verify

    t = _seeded(warehouse)
    segment = _paths(t)["segment"]
    t.delete("id = 5")
    t.expire_snapshots(retain_last=1)
    t.vacuum(older_than=dt.timedelta(0))
    holder = metadata.segment_object(segment)
    assert _current_list(t)[1].segments == (segment,)
    assert len(t.iceberg.metadata.snapshots) == 1 and os.path.exists(local_path(holder))  # version 1's snapshot is gone
    _clear_caches()
    assert sorted(r["id"] for r in t.scan().to_pylist()) == [i for i in range(10) if i not in (4, 5)]
    assert verify(t).problems == []


INDEX_CORRUPTIONS = {
    "missing": lambda p: os.remove(local_path(p)),
    "garbage": lambda p: _write_raw(p, b"garbage, not parquet"),
    "truncated": _truncate,
    "wrong-format-tag": lambda p: _rewrite_parquet(p, _with_meta(**{"lineage.format": "lineage-segment"})),
    "missing-column": lambda p: _rewrite_parquet(p, lambda tb: tb.drop_columns(["valid_to"])),
    "corrupt-bitmap": lambda p: _rewrite_parquet(p, _set_column("positions", pa.array([b"\x01\x02\x03"], pa.binary()))),
    "bitmap-disagrees-with-row-ids": lambda p: _rewrite_parquet(
        p, _set_column("positions", pa.array([BitMap64([1, 2]).serialize()], pa.binary()))
    ),
}


@pytest.mark.parametrize("corruption", sorted(INDEX_CORRUPTIONS))
def test_corrupt_or_missing_index_segment_is_a_metadata_error(warehouse, corruption):
    t = _seeded(warehouse)
    path = _paths(t)["index"]
    INDEX_CORRUPTIONS[corruption](path)
    _clear_caches()
    try:
        read_index_segment(t.iceberg.io, path)
    except lineage.LineageMetadataError as exc:
        assert path in str(exc), str(exc)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"corrupt index segment ({corruption}) raised {type(exc).__module__}.{type(exc).__name__}, not LineageMetadataError: {exc}")
    else:
        pytest.fail(f"corrupt index segment ({corruption}) was read without an error")


# ====================================================================== what the deleted-rows index records
def _ids_at(data_file: str, positions: np.ndarray) -> list[int]:
    ids = pq.read_table(local_path(data_file), columns=["id"]).column("id").to_numpy()
    return ids[positions].tolist()


def _check_index_entry(t: lineage.Table, version: int, removed_ids: set[int], before: dict[int, dict]) -> tuple[RemovedImages, ...]:
    """The index segment of commit ``version`` points at exactly the images of ``removed_ids`` as they were."""
    commit = next(c for c in t.state().lineage.commits if c.version == version)
    assert commit.index is not None
    images = read_index_segment(t.iceberg.io, commit.index)
    seen = set()
    for img in images:
        assert img.valid_to == version
        assert len(img.positions) == len(img.row_ids) == len(img.created) == len(img.valid_from) > 0
        assert (np.diff(img.positions) > 0).all(), "positions sorted, no duplicates"
        for rid, pos_id, created, valid_from in zip(img.row_ids, _ids_at(img.file_path, img.positions), img.created, img.valid_from, strict=True):
            assert pos_id not in seen
            seen.add(pos_id)
            row = before[pos_id]
            assert (int(rid), int(created), int(valid_from)) == (
                row["_row_id"], row["_row_created_at_version"], row["_row_last_updated_at_version"],
            ), pos_id
    assert seen == removed_ids
    # the positions really are serialized roaring bitmaps
    raw = pq.read_table(local_path(commit.index))
    assert raw.schema.metadata[b"lineage.format"] == b"deleted-rows-segment"
    assert raw.schema.metadata[b"lineage.format-version"] == b"2"
    for blob, img in zip(raw.column("positions").to_pylist(), images, strict=True):
        assert list(BitMap64.deserialize(blob)) == img.positions.tolist()
    return images


@pytest.mark.parametrize("mode", [lineage.MERGE_ON_READ, lineage.COPY_ON_WRITE])
def test_delete_index_holds_exactly_the_removed_images(warehouse, mode):
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(10))  # v1: one file, position = id = row id
    v1 = {r["id"]: r for r in t.scan().to_pylist()}
    t.update("id IN (2, 3, 4)", {"amount": "amount + 100"}, mode=mode)  # v2
    v2 = {r["id"]: r for r in t.scan().to_pylist()}
    info = t.delete("id IN (1, 3, 5, 8)", mode=mode)  # v3: images from both versions
    assert info.version == 3 and info.deleted == 4

    commits = t.state().lineage.commits
    assert [c.index is not None for c in commits] == [False, True, True]
    update_images = _check_index_entry(t, 2, {2, 3, 4}, v1)
    delete_images = _check_index_entry(t, 3, {1, 3, 5, 8}, v2)
    assert {int(x) for img in update_images for x in img.valid_from} == {1}
    assert sorted(int(x) for img in delete_images for x in img.valid_from) == [1, 1, 1, 2]  # id 3 was updated at v2

    if mode == lineage.MERGE_ON_READ:
        first_file = read_segment(t.iceberg.io, commits[0].segment)[0].file_path
        second_file = read_segment(t.iceberg.io, commits[1].segment)[0].file_path
        by_file = {img.file_path: img for img in delete_images}
        assert set(by_file) == {first_file, second_file}
        assert by_file[first_file].positions.tolist() == [1, 5, 8]
        assert by_file[first_file].row_ids.tolist() == [1, 5, 8]
        assert by_file[second_file].positions.tolist() == [1]  # the v2 images of ids 2, 3, 4 are sorted by row id
        assert by_file[second_file].row_ids.tolist() == [3]
        assert by_file[second_file].valid_from.tolist() == [2]
        # the index and the Iceberg position delete files name the same (file, position) pairs
        indexed = {(img.file_path, int(p)) for imgs in (update_images, delete_images) for img in imgs for p in img.positions}
        deletes = set()
        for task in t.iceberg.scan().plan_files():
            for d in task.delete_files:
                tbl = pq.read_table(local_path(d.file_path))
                deletes |= set(zip(tbl.column("file_path").to_pylist(), tbl.column("pos").to_pylist()))
        assert indexed == deletes


def test_large_delete_index_is_exact(warehouse):
    n = 20_000
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(n))
    info = t.delete("id % 7 = 3")
    expected = np.arange(3, n, 7, dtype=np.int64)
    assert info.deleted == len(expected)
    (img,) = read_index_segment(t.iceberg.io, t.state().lineage.commits[-1].index)
    np.testing.assert_array_equal(img.positions, expected)
    np.testing.assert_array_equal(img.row_ids, expected)  # fresh table: row id = position
    assert set(img.created.tolist()) == set(img.valid_from.tolist()) == {1}
    assert img.valid_to == 2


@settings(max_examples=80, deadline=None)
@given(keys=st.lists(st.integers(-(2**62), 2**62 - 1), max_size=60), narrow=st.booleans())
def test_stable_argsort_equals_numpys_stable_argsort(keys, narrow):
    from lineage.arrays import stable_argsort

    arr = np.array([k % 7 for k in keys] if narrow else keys, np.int64)  # narrow: many ties, the packed path
    assert stable_argsort(arr).tolist() == np.argsort(arr, kind="stable").tolist()


def test_a_segment_of_many_runs_is_written_in_row_groups_and_reads_back_the_same(tmp_path, monkeypatch):
    """Files with many runs are encoded a part at a time (a row group each): the segment reads back exactly as one
    written in one piece."""
    rng = np.random.default_rng(5)
    lineages = []
    for i in range(7):
        ids = np.sort(rng.choice(10_000, int(rng.integers(1, 300)), replace=False)).astype(np.int64)
        created = rng.integers(1, 4, len(ids)).astype(np.int64)
        lineages.append(FileLineage(f"file:///wh/data/{i}.parquet", len(ids), encode_sequence(ids), encode_values(created),
                                    encode_values(created + 1)))
    whole = str(tmp_path / "whole-segment.parquet")
    write_segment(FILEIO, whole, lineages)
    monkeypatch.setattr(metadata, "SEGMENT_PART_RUNS", 400)
    parts = str(tmp_path / "parts-segment.parquet")
    write_segment(FILEIO, parts, lineages)
    assert pq.ParquetFile(whole).num_row_groups == 1
    assert pq.ParquetFile(parts).num_row_groups == len(metadata._segment_parts(lineages)) > 2
    assert pq.read_table(parts).equals(pq.read_table(whole))
    for got, want in zip(metadata._read_segment_uncached(FILEIO, parts), lineages, strict=True):  # the file, not the cache
        assert (got.file_path, got.record_count) == (want.file_path, want.record_count)
        for name in ("row_ids", "created", "updated"):
            np.testing.assert_array_equal(getattr(got, name).values, getattr(want, name).values)
            np.testing.assert_array_equal(getattr(got, name).lengths, getattr(want, name).lengths)


@PROFILE
@given(st.lists(st.integers(0, 3), min_size=1, max_size=300), st.integers(1, 40))
def test_breakpoints_are_combined_breakpoints_kept_only_for_files_of_few_runs(gaps, kept_runs):
    """FileLineage.breakpoints: combined_breakpoints of its runs, read-only, the same object again for a file of at
    most BREAKPOINTS_KEPT_RUNS runs and computed afresh (equal) for a larger one."""
    ids = np.cumsum(np.array(gaps, np.int64) + 1)  # ascending row ids, runs broken where a gap is not 0
    n = len(ids)
    fl = FileLineage("f.parquet", n, encode_sequence(ids), encode_values(np.arange(n) % 3 + 1), value_run(5, n))
    want = combined_breakpoints(fl.row_ids, fl.created, fl.updated)
    old = metadata.BREAKPOINTS_KEPT_RUNS
    metadata.BREAKPOINTS_KEPT_RUNS = kept_runs
    try:
        first, again = fl.breakpoints, fl.breakpoints
    finally:
        metadata.BREAKPOINTS_KEPT_RUNS = old
    for got in (first, again):
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)) and not any(a.flags.writeable for a in got)
    assert (first is again) == (len(want[0]) <= kept_runs)
