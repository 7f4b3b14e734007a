"""The bounded merge into a base (index.key_merge) against the in-memory merge, and through the table's commits.

Random histories of deltas (entries and tombstones, several data files, keys
rewritten by later deltas) become segments, in memory or written to files
(format 3, or format 2 for an older base); merged into one base range by
range with a tiny budget they give the segment :func:`merge_segments`
gives: the same bytes for an integer key, the same lookups for a string key
or under a narrowed hash (collisions).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from conftest import key_hash_mask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO

import index.key_index as key_index
import lineage
from index.key_index import KeyIndex
from index.key_merge import bounded_base_merge
from index.key_packed import SpooledStore
from index.key_segment import KeyField, Segment, make_segment, merge_segments, read_key_segment, write_key_segment
from lineage.maintenance.key_index import check_key_index
from lineage.properties import KEY_INDEX_BUILD_MEMORY

IO = PyArrowFileIO()
KEYS = {"int": (KeyField(1, "id", pa.int64()),), "string": (KeyField(1, "id", pa.string()),)}


def _key_values(kind: str, keys: list[int]) -> pa.Array:
    return pa.array(keys, pa.int64()) if kind == "int" else pa.array([f"k{k:05d}" for k in keys], pa.string())


def _segment(kind: str, delta: dict[int, int | None], version: int) -> Segment:
    live = sorted(k for k, v in delta.items() if v is not None)
    dead = sorted(k for k, v in delta.items() if v is None)
    n = len(live)
    entries = pa.table({
        "id": _key_values(kind, live),
        "_row_id": pa.array([delta[k] for k in live], pa.int64()),
        "__file_path": pa.array([f"data-{version}-{k % 3}.parquet" for k in live], pa.string()),
        "__pos": pa.array([k * 7 % 1000 for k in live], pa.int64()),
        "_row_created_at_version": pa.array([version] * n, pa.int64()),
        "_row_last_updated_at_version": pa.array([version + k % 2 for k in live], pa.int64()),
    })
    return make_segment(KEYS[kind], entries, pa.table({"id": _key_values(kind, dead)}), level=0, base=version == 0)


HISTORY = st.lists(st.dictionaries(st.integers(0, 3000), st.one_of(st.none(), st.integers(0, 10**9)), min_size=1, max_size=300),
                   min_size=1, max_size=5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["int", "string"]), HISTORY, st.sampled_from(["memory", "files", "format 2 base"]), st.booleans())
def test_bounded_merge_gives_the_in_memory_merge(tmp_path_factory, kind, history, where, tiny_hash):
    root = tmp_path_factory.mktemp("segments")
    with key_hash_mask(np.uint64(0b111) if tiny_hash else np.uint64(2**64 - 1)):
        history = [{k: v for k, v in history[0].items() if v is not None} or {0: 1}] + history[1:]  # the base: entries only
        segments = [_segment(kind, delta, i) for i, delta in enumerate(history)]
        if where != "memory":
            for i, s in enumerate(segments):
                path = str(root / f"s{i}.kix")
                write_key_segment(IO, path, s, i, format_version=2 if where == "format 2 base" and i == 0 else 3)
                segments[i] = read_key_segment(IO, path)
        want = merge_segments(segments, base=True, level=0)
        got = bounded_base_merge(segments, level=0, budget=1, chunk_rows=64)
        assert isinstance(got.store, SpooledStore) or got.entries == want.entries == 0
        a, b = str(root / "want.kix"), str(root / "got.kix")
        write_key_segment(IO, a, want, 9)
        write_key_segment(IO, b, got, 9)
        if kind == "int" and not tiny_hash:
            assert open(a, "rb").read() == open(b, "rb").read()
        model: dict[int, int] = {}
        for delta in history:
            for k, v in delta.items():
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
        probe = pa.table({"id": _key_values(kind, list(range(0, 3002, 3)) + sorted(model))})
        found = KeyIndex(KEYS[kind], [read_key_segment(IO, b)]).lookup(probe)
        assert found.equals(KeyIndex(KEYS[kind], [read_key_segment(IO, a)]).lookup(probe))
        ids = probe.column("id").to_pylist()
        assert {ids[i]: r for i, r in zip(found.column("__input").to_pylist(), found.column("_row_id").to_pylist(), strict=True)} == {
            _key_values(kind, [k])[0].as_py(): v for k, v in model.items()}


def test_a_bounded_segment_is_written_through_fileio_to_object_storage(tmp_path):
    from test_key_index import _MemoryIO

    mem = _MemoryIO()
    segments = [_segment("string", {k: k * 10 for k in range(0, 900, 2)}, 0), _segment("string", {k: None for k in range(0, 300, 4)}, 1)]
    got = bounded_base_merge(segments, level=0, budget=1, chunk_rows=50)
    assert isinstance(got.store, SpooledStore)
    write_key_segment(mem, "mem://bucket/s-keys.kix", got, 3)
    write_key_segment(IO, str(tmp_path / "s-keys.kix"), got, 3)
    assert mem.files["mem://bucket/s-keys.kix"] == (tmp_path / "s-keys.kix").read_bytes()
    back = read_key_segment(mem, "mem://bucket/s-keys.kix")
    probe = pa.table({"id": _key_values("string", [0, 4, 6, 302, 304, 901])})
    assert KeyIndex(KEYS["string"], [back]).lookup(probe).column("_row_id").to_pylist() == [60, 3020, 3040]


def test_a_full_merge_of_a_table_index_runs_range_by_range(tmp_path, monkeypatch):
    calls = []
    real = key_index.key_merge.bounded_base_merge
    monkeypatch.setattr(key_index.key_merge, "bounded_base_merge", lambda *a, **k: (calls.append(len(a[0])), real(*a, **k))[1])
    t = lineage.create_table("db.t", pa.schema([("id", pa.int64()), ("v", pa.string())]), key=["id"], warehouse=str(tmp_path),
                             properties={"lineage.key-index.defer-rows": "0"})
    t.append(pa.table({"id": pa.array(range(3000), pa.int64()), "v": ["a"] * 3000}))
    t.upsert(pa.table({"id": pa.array(range(2900, 3100), pa.int64()), "v": ["b"] * 200}))
    t.delete("id < 100")
    assert len(t.state().lineage.key_index) == 3
    with t.iceberg.transaction() as tx:
        tx.set_properties({KEY_INDEX_BUILD_MEMORY: "1000"})
    t.refresh()
    t.merge_key_index(full=True)
    assert calls == [3]
    assert len(t.state().lineage.key_index) == 1
    assert check_key_index(t.state())[0] == []
    assert t.upsert(pa.table({"id": pa.array([50, 150], pa.int64()), "v": ["c", "c"]})).updated == 1
