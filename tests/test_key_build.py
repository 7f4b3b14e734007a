"""The bounded key index build (index.key_build) against the in-memory build.

A tiny ``lineage.key-index.build-memory-bytes`` forces the bounded build with
many hash ranges and one spilled run per group of files; a large one keeps
today's in-memory build. Both must give the same segment: byte for byte for
keys the hash gives back, the same lookups for keys stored beside their hash
(strings, composite keys), with hash collisions, and with keys that were
deleted and written again (several images of one key, one of them live).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from conftest import key_hash_mask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO

import index.key_build as key_build
import index.key_index as key_index
import lineage
from index.key_index import KeyIndex
from index.key_packed import SpooledStore
from index.key_store import ArrayStore
from index.key_segment import write_key_segment
from lineage.errors import KeyViolationError
from lineage.maintenance.key_index import check_key_index
from lineage.maintenance.verify import verify
from lineage.properties import KEY_INDEX_BUILD_MEMORY

TINY, LARGE = "1", str(1 << 40)
IO_LOCAL = PyArrowFileIO()


def _budget(t: lineage.Table, budget: str) -> None:
    with t.iceberg.transaction() as tx:
        tx.set_properties({KEY_INDEX_BUILD_MEMORY: budget})
    t.refresh()


def _rows(kind: str, keys: list[int], tag: str) -> pa.Table:
    ids = pa.array(keys, pa.int64())
    if kind == "int":
        cols = {"id": ids}
    elif kind == "string":
        cols = {"id": pa.array([f"key-{k}" for k in keys], pa.string())}
    else:
        cols = {"id": pa.array([k // 3 for k in keys], pa.int64()), "part": pa.array([f"p{k % 3}" for k in keys], pa.string())}
    cols["n"] = ids  # the number the key is made of
    cols["v"] = pa.array([f"{tag}{k}" for k in keys], pa.string())
    return pa.table(cols)


def _key(kind: str) -> list[str]:
    return ["id", "part"] if kind == "composite" else ["id"]


def _builds(t: lineage.Table, monkeypatch: pytest.MonkeyPatch) -> tuple[KeyIndex, KeyIndex]:
    """The bounded build (tiny budget, a run per file) and the in-memory build of the table's current state."""
    monkeypatch.setattr(key_index, "MIN_CHUNK_ROWS", 1)
    _budget(t, TINY)
    bounded = KeyIndex.build(t.state())
    _budget(t, LARGE)
    in_memory = KeyIndex.build(t.state())
    if in_memory.entries:
        assert isinstance(bounded.segments[0].store, SpooledStore)
        assert isinstance(in_memory.segments[0].store, ArrayStore)
    return bounded, in_memory


def _segment_bytes(t: lineage.Table, index: KeyIndex, path: str) -> bytes:
    write_key_segment(t.iceberg.io, path, index.segments[0], 7)
    with open(path, "rb") as f:
        return f.read()


def test_bounded_build_writes_the_same_bytes_as_the_in_memory_build(tmp_path, monkeypatch):
    spills = []
    real_spill = key_build._Runs.spill
    monkeypatch.setattr(key_build._Runs, "spill", lambda self: (spills.append(len(self.pending)), real_spill(self))[1])
    t = lineage.create_table("db.t", _rows("int", [], "").schema, key=["id"], warehouse=str(tmp_path))
    rng = np.random.default_rng(3)
    keys = rng.choice(10**9, 4000, replace=False)
    for part in np.array_split(keys, 5):
        t.append(_rows("int", part.tolist(), "a"))
    t.delete(f"id IN ({', '.join(map(str, keys[:300].tolist()))})")  # files with position deletes: read through the live view
    t.update(f"id IN ({', '.join(map(str, keys[300:600].tolist()))})", {"v": "'b'"})  # later versions
    bounded, in_memory = _builds(t, monkeypatch)
    assert len([s for s in spills if s]) >= 5  # a run per group of files
    assert bounded.entries == in_memory.entries == 3700
    a = _segment_bytes(t, bounded, str(tmp_path / "bounded.kix"))
    b = _segment_bytes(t, in_memory, str(tmp_path / "memory.kix"))
    assert a == b
    # The bounded index answers lookups before it is written (memory-mapped from its temporary file).
    probe = pa.table({"id": pa.array(np.concatenate([keys[::7], np.arange(50)]), pa.int64())})
    assert bounded.lookup(probe).equals(in_memory.lookup(probe))


def test_reindex_and_the_first_keyed_write_use_the_bounded_build(tmp_path, monkeypatch):
    calls = []
    real = key_build.spooled_base
    monkeypatch.setattr(key_build, "spooled_base", lambda *a, **k: (calls.append(k["rows"]), real(*a, **k))[1])
    props = {KEY_INDEX_BUILD_MEMORY: "1000", "lineage.key-index.defer-rows": "100"}
    t = lineage.create_table("db.t", _rows("string", [], "").schema, key=["id"], warehouse=str(tmp_path), properties=props)
    t.append(_rows("string", list(range(2000)), "a"))  # deferred: no index yet
    assert t.state().lineage.key_index is None
    r = t.upsert(_rows("string", list(range(1990, 2010)), "u"))  # builds the index (bounded), then uses it
    assert (r.updated, r.inserted) == (10, 10)
    assert calls == [2000]
    assert t.state().lineage.key_index
    t.reindex()
    assert calls == [2000, 2020]  # the rows of the live files: 10 of them deleted by the upsert
    assert check_key_index(t.state())[0] == []
    assert verify(t).ok


def test_bounded_build_refuses_duplicate_keys_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    t = lineage.create_table("db.t", _rows("int", [], "").schema, key=["id"], warehouse=str(tmp_path / "wh"),
                             properties={"lineage.key.enforce": "false", KEY_INDEX_BUILD_MEMORY: TINY})
    t.append(_rows("int", list(range(500)), "a"))
    t.append(_rows("int", [77, 1000, 1001], "b"))
    with pytest.raises(KeyViolationError, match="several live rows with the same key.*'id': 77"):
        KeyIndex.build(t.state())
    assert os.listdir(scratch) == []
    t.delete("id = 77")
    t.append(_rows("int", [77], "c"))
    built = KeyIndex.build(t.state())
    assert built.entries == 502
    del built
    assert os.listdir(scratch) == []  # the segment's file is unlinked while mapped


def test_an_empty_or_all_deleted_table_builds_an_empty_index(tmp_path, monkeypatch):
    t = lineage.create_table("db.t", _rows("int", [], "").schema, key=["id"], warehouse=str(tmp_path))
    t.append(_rows("int", list(range(300)), "a"))
    t.delete("id >= 0")
    bounded, in_memory = _builds(t, monkeypatch)
    assert bounded.entries == in_memory.entries == 0
    t.reindex()
    assert check_key_index(t.state())[0] == []


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(0, 1500), min_size=1, max_size=400, unique=True)),
        st.tuples(st.just("delete"), st.integers(0, 1500), st.integers(1, 400)),
    ),
    min_size=1, max_size=5,
)


@settings(max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "10")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["int", "string", "composite"]), OPS, st.booleans())
def test_bounded_build_gives_the_lookups_of_the_in_memory_build(tmp_path_factory, monkeypatch, kind, ops, tiny_hash):
    """Random keys, appended, deleted and appended again (a key's older images are dead rows of other files):
    the bounded build with a tiny budget finds exactly what the in-memory build finds, for every key ever
    written and some never written, with hash collisions when the hash is narrowed to 3 bits."""
    root = tmp_path_factory.mktemp("wh")
    t = lineage.create_table("db.t", _rows(kind, [], "").schema, key=_key(kind), warehouse=str(root))
    live: set[int] = set()
    seen: set[int] = set()
    for i, op in enumerate(ops):
        if op[0] == "append":
            new = [k for k in op[1] if k not in live]
            if new:
                t.append(_rows(kind, new, f"a{i}-"))
                live |= set(new)
                seen |= set(new)
        else:
            lo, hi = op[1], op[1] + op[2]
            gone = sorted(k for k in live if lo <= k < hi)
            if gone:
                t.delete(f"n >= {lo} AND n < {hi}")
                live -= set(gone)
    mask = np.uint64(0b111) if tiny_hash else np.uint64(2**64 - 1)
    with key_hash_mask(mask):
        bounded, in_memory = _builds(t, monkeypatch)
        probe_keys = sorted(seen | {1501, 1502, 99999})
        probe = _rows(kind, probe_keys, "").select(_key(kind))
        got, want = bounded.lookup(probe), in_memory.lookup(probe)
        assert got.equals(want)
        assert sorted(got.column("__input").to_pylist()) == [i for i, k in enumerate(probe_keys) if k in live]
        assert bounded.live_entries().sort_by("_row_id").equals(in_memory.live_entries().sort_by("_row_id"))


def test_the_bounded_build_holds_the_same_memory_for_a_table_four_times_larger(tmp_path, monkeypatch):
    """Peak numpy memory (tracemalloc sees numpy's allocations) of a build: flat from 3 to 12 files of 40,000
    rows with a 1 MiB budget, about four times larger for the in-memory build."""
    import tracemalloc

    def peak(files: int, budget: str) -> int:
        t = lineage.create_table(f"db.t{files}_{budget}", _rows("int", [], "").schema, key=["id"], warehouse=str(tmp_path),
                                 properties={"lineage.key-index.enabled": "false"})
        for i in range(files):
            t.append(_rows("int", list(range(i * 40_000, (i + 1) * 40_000)), "a"))
        with t.iceberg.transaction() as tx:
            tx.set_properties({"lineage.key-index.enabled": "true", KEY_INDEX_BUILD_MEMORY: budget})
        t.refresh()
        state = t.state()
        state.live_files()
        tracemalloc.start()
        try:
            built = KeyIndex.build(state)
            assert built.entries == files * 40_000
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(3, str(1 << 20)), peak(12, str(1 << 20))
    assert large < 1.3 * small, (small, large)
    small, large = peak(3, LARGE), peak(12, LARGE)
    assert large > 3 * small, (small, large)


def _mapped_kib(path: str) -> int:
    """Resident KiB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split()[0] if line.split() else ""
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_a_large_lookup_releases_the_pages_it_mapped(tmp_path, monkeypatch):
    """A lookup of every key of a 300,000-key segment: the same answers sliced, and afterwards almost none of
    the file's pages resident (a lookup below the slice leaves them mapped, as before)."""
    from index.key_segment import make_segment, read_key_segment
    from test_key_merge import KEYS

    keys = np.random.default_rng(5).permutation(300_000).astype(np.int64)
    entries = pa.table({"id": keys, "_row_id": keys, "__file_path": pa.array(["f.parquet"] * len(keys)), "__pos": keys,
                        "_row_created_at_version": np.ones(len(keys), np.int64), "_row_last_updated_at_version": np.ones(len(keys), np.int64)})
    path = str(tmp_path / "s-keys.kix")
    write_key_segment(IO_LOCAL, path, make_segment(KEYS["int"], entries, level=0, base=True), 1)
    probe = pa.table({"id": keys[::-1].copy()})
    index = KeyIndex(KEYS["int"], [read_key_segment(IO_LOCAL, path)])
    monkeypatch.setattr(key_index, "LOOKUP_SLICE", 10**9)
    whole = index.lookup(probe)
    assert _mapped_kib(path) > os.path.getsize(path) // 2048  # unsliced: most pages stay mapped
    monkeypatch.setattr(key_index, "LOOKUP_SLICE", 4096)
    sliced = index.lookup(probe)
    assert sliced.equals(whole) and sliced.num_rows == 300_000
    assert sliced.column("_row_id").to_pylist() == keys[::-1].tolist()
    assert _mapped_kib(path) < os.path.getsize(path) // 8192  # under an eighth of the file


@pytest.mark.parametrize("mask", [None, np.uint64(0x3F)], ids=["hashes", "collisions"])
def test_lookups_sliced_at_every_boundary_equal_one_pass(warehouse, monkeypatch, mask):
    """Lookups cut into slices of 4 probes (an index of 300 entries in three segments: base, deletes' tombstones, an
    upsert's delta) give the one-pass answer for 3, 4, 5, 8 and 9 keys, with keys repeated across a slice boundary, keys
    deleted or never written, and (``collisions``) a hash narrowed to 6 bits."""
    with key_hash_mask(mask) if mask is not None else nullcontext():
        t = lineage.create_table("s.sliced", pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())]), key=["id"],
                                 warehouse=warehouse)
        t.append(pa.table({"id": np.arange(300), "v": ["a"] * 300}))
        t.delete("id % 7 = 0")
        t.upsert(pa.table({"id": np.arange(290, 320), "v": ["b"] * 30}))
        index = KeyIndex.open(t.state())
        assert len(index.segments) >= 2 and index.entries > 4 * 64
        rng = np.random.default_rng(3)
        for n in (3, 4, 5, 8, 9):
            for _ in range(4):
                probe = pa.table({"id": rng.choice(np.arange(-5, 330), n)})
                probe = pa.table({"id": np.concatenate([probe["id"].to_numpy(), [7, 7, 291]])[:n]})  # repeats, a tombstone
                monkeypatch.setattr(key_index, "LOOKUP_SLICE", 10**9)
                whole = index.lookup(probe)
                monkeypatch.setattr(key_index, "LOOKUP_SLICE", 4)
                sliced = index.lookup(probe)
                assert sliced.equals(whole)
                ids = probe["id"].to_pylist()
                live = [i for i in ids if 0 <= i < 320 and (i % 7 or i >= 290)]
                assert sliced.column("id").to_pylist() == live
