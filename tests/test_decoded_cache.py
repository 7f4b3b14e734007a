"""The decoded row-group cache (lineage.decoded_cache) and the readers that share it."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cdf
import lineage
from conftest import SCHEMA
from lineage import decoded_cache
from lineage.read import values
from lineage.decoded_cache import DecodedCache
from lineage.errors import InvalidArgumentError

IDS = {"id": 1, "name": 2, "amount": 3}
TARGET = pa.schema([("id", pa.int64()), ("name", pa.large_string()), ("amount", pa.float64())])


def _chunk(n: int) -> pa.ChunkedArray:
    return pa.chunked_array([np.arange(n, dtype=np.int64)])  # 8n bytes


def _seen(cache: DecodedCache, *keys: tuple[str, int, str]) -> None:
    """Decode ``keys`` once, in a read of their own: the cache remembers them, so the next decoding keeps them."""
    with cache.read() as r:
        for k in keys:
            assert not cache.put(k, _chunk(25), r), "a chunk is not kept at its first decoding"


def _write(path: str, rows: int, seed: int, row_group: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    fields = [pa.field(f.name, f.type, metadata={b"PARQUET:field_id": str(IDS[f.name]).encode()}) for f in TARGET]
    t = pa.Table.from_arrays([
        pa.array(np.arange(rows, dtype=np.int64) + 1000 * seed),
        pa.array([f"s{v}" for v in rng.integers(0, 4, rows)], pa.large_string()),
        pa.array(rng.random(rows)),
    ], schema=pa.schema(fields))
    pq.write_table(t, path, row_group_size=row_group)
    return t.cast(TARGET)


@pytest.fixture
def budget(monkeypatch):
    """Set the cache's budget in MB for the test (the cache starts empty and is emptied after)."""
    decoded_cache.clear()

    def set_mb(mb: float) -> None:
        monkeypatch.setenv(decoded_cache.ENV_BUDGET, str(mb))

    yield set_mb
    decoded_cache.clear()


def test_the_cache_keeps_within_its_budget_and_evicts_the_least_recently_used(monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, str(1000 / 2**20))  # 1,000 bytes
    cache = DecodedCache()
    _seen(cache, *[("f", i, "c") for i in range(6)])
    for i in range(5):
        with cache.read() as r:
            assert cache.put(("f", i, "c"), _chunk(25), r)  # 200 bytes each
    with cache.read() as r:
        assert cache.get(("f", 0, "c"), r) is not None  # the oldest, used again: now the most recent
        assert cache.put(("f", 5, "c"), _chunk(25), r)
        assert cache.get(("f", 1, "c"), r) is None, "the least recently used chunk is the one evicted"
        assert not cache.put(("f", 6, "c"), _chunk(40), r), "a chunk over a quarter of the budget is not kept"
    assert cache.held <= 1000 and len(cache) == 5


def test_a_read_that_needs_more_than_the_budget_keeps_what_fits_for_the_next_read(monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, str(1000 / 2**20))
    cache = DecodedCache()
    keys = [("f", i, "c") for i in range(8)]  # 1,600 bytes in all, read again and again in the same order
    hits = []
    for _ in range(4):
        with cache.read() as r:
            found = 0
            for k in keys:
                if cache.get(k, r) is not None:
                    found += 1
                else:
                    cache.put(k, _chunk(25), r)
            hits.append(found)
    # the first read only remembers the keys, the second keeps what fits; plain LRU would evict each chunk
    # just before it is needed again: no hit ever
    assert hits == [0, 0, 5, 5]


def test_small_chunks_displace_much_larger_ones_of_a_running_read_and_claimed_chunks_stay(monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, str(1300 / 2**20))  # 1,300 bytes: four large chunks, or three and the small
    cache = DecodedCache()
    large, small = [("big", i, "c") for i in range(4)], [("small", i, "c") for i in range(4)]
    hits = []
    for _ in range(5):  # one read, again and again: the large chunks first (as gather orders its jobs), then the small
        with cache.read() as r:
            claimed = cache.claim(large + small, r)
            found = 0
            for k, n in [(k, 40) for k in large] + [(k, 8) for k in small]:  # 320 and 64 bytes
                if cache.get(k, r) is not None:
                    found += 1
                else:
                    cache.put(k, _chunk(n), r)
            hits.append((claimed, found))
        assert cache.held <= 1300
    # read 2 keeps the four large chunks, then the first small one displaces a large one of the same read (five times
    # larger); from read 3 on every small chunk stays (claimed first, the large chunk decoded does not evict them)
    assert hits == [(False, 0), (False, 0), (False, 7), (False, 7), (False, 7)]
    assert all(cache.kept(k) for k in small) and sum(cache.kept(k) for k in large) == 3
    with cache.read() as r:
        assert cache.claim(small, r) and not cache.claim(large, r)


def test_a_chunk_is_kept_at_its_second_decoding_by_another_read(monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "1")
    monkeypatch.setattr(decoded_cache, "SEEN_KEYS", 3)
    cache = DecodedCache()
    with cache.read() as r:
        assert not cache.put(("f", 0, "c"), _chunk(25), r)
        assert not cache.put(("f", 0, "c"), _chunk(25), r), "decoded twice by one read: still its first read"
    with cache.read() as r:
        assert cache.put(("f", 0, "c"), _chunk(25), r) and len(cache) == 1
    _seen(cache, *[("g", i, "c") for i in range(4)])  # more keys than it remembers: the oldest is forgotten
    with cache.read() as r:
        assert not cache.put(("g", 0, "c"), _chunk(25), r), "forgotten: seen for the first time again"
        assert cache.put(("g", 3, "c"), _chunk(25), r)
    cache.clear()
    with cache.read() as r:
        assert not cache.put(("g", 2, "c"), _chunk(25), r), "clear() forgets the keys too"


def test_a_lowered_budget_evicts_what_no_running_read_uses(monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, str(1000 / 2**20))
    cache = DecodedCache()
    _seen(cache, ("f", 0, "c"), ("f", 1, "c"))
    with cache.read() as r:
        cache.put(("f", 0, "c"), _chunk(25), r)
    with cache.read() as running:
        cache.put(("f", 1, "c"), _chunk(25), running)
        monkeypatch.setenv(decoded_cache.ENV_BUDGET, "0")
        with cache.read() as off:
            assert off is None
        assert len(cache) == 1 and cache.held == 200, "the idle chunk goes, the running read's stays"
    with cache.read():
        pass
    assert len(cache) == 0 and cache.held == 0


def test_a_budget_of_zero_keeps_nothing_and_a_bad_budget_is_refused(monkeypatch):
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "0")
    cache = DecodedCache()
    with cache.read() as r:
        assert r is None
    for bad in ("lots", "-1", "nan"):
        monkeypatch.setenv(decoded_cache.ENV_BUDGET, bad)
        with pytest.raises(InvalidArgumentError, match=decoded_cache.ENV_BUDGET):
            decoded_cache.budget_bytes()
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "0.5")
    assert decoded_cache.budget_bytes() == 1 << 19


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reads_through_the_cache_equal_reads_without_it(tmp_path, budget, data):
    files = data.draw(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 20)), min_size=1, max_size=3), label="files (rows, row group)")
    budget(data.draw(st.sampled_from([0, 600 / 2**20, 3000 / 2**20, 1]), label="budget MB"))
    tag = len(os.listdir(tmp_path))
    paths, wants = [], []
    for i, (rows, group) in enumerate(files):
        paths.append(str(tmp_path / f"f{tag}-{i}.parquet"))
        wants.append(_write(paths[-1], rows, i, group))
    for _ in range(3):  # cold, then warm, with a different set of positions each time
        picks = data.draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=50), label="picks")
        file_ids = np.array([p % len(files) for p in picks], np.int32)
        pos = np.array([(p // len(files)) % files[f][0] for p, f in zip(picks, file_ids, strict=True)], np.int64)
        want = [wants[f].slice(int(p), 1).to_pylist()[0] for f, p in zip(file_ids, pos, strict=True)]
        assert values.read_at(paths, file_ids, pos, TARGET, IDS).to_pylist() == want
        assert values.read_at(paths, file_ids, pos, TARGET, IDS, cache=False).to_pylist() == want
        assert decoded_cache.CACHE.held <= decoded_cache.budget_bytes()


def test_the_second_read_decodes_only_what_the_first_did_not_keep(tmp_path, budget, monkeypatch):
    budget(1)
    monkeypatch.setattr(values, "ONE_DECODE_BYTES", 0)  # every row group read as a large one: a column at a time
    path = str(tmp_path / "f.parquet")
    want = _write(path, 100, 1, 10)
    decoded: list[tuple[int, tuple[str, ...]]] = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, i, columns=None, **k: decoded.append((i, tuple(columns))) or real(self, i, columns=columns, **k))
    for _ in range(2):  # the first read decodes and keeps nothing; the second decodes again and keeps
        got = values.read_at([path], np.zeros(2, np.int32), np.array([57, 3]), TARGET, IDS)
        assert got.to_pylist() == [want.slice(p, 1).to_pylist()[0] for p in (57, 3)]
        assert sorted(set(decoded)) == [(g, (c,)) for g in (0, 5) for c in ("amount", "id", "name")]  # a column at a time
        decoded.clear()
    got = values.read_at([path], np.zeros(3, np.int32), np.array([51, 59, 95]), pa.schema(list(TARGET)[:2]), IDS)
    assert got.to_pylist() == [{"id": want["id"][p].as_py(), "name": want["name"][p].as_py()} for p in (51, 59, 95)]
    assert sorted(decoded) == [(9, ("id",)), (9, ("name",))], "row group 5's columns were kept; only row group 9 is decoded"
    decoded.clear()
    values.read_at([path], np.zeros(1, np.int32), np.array([52]), TARGET, IDS, cache=False)
    assert sorted(decoded) == [(5, ("amount",)), (5, ("id",)), (5, ("name",))], "cache=False decodes and keeps nothing"


def test_rows_of_a_small_row_group_are_decoded_in_one_read(tmp_path, budget, monkeypatch):
    budget(1)
    path = str(tmp_path / "f.parquet")
    want = _write(path, 100, 3, 10)
    decoded: list[tuple[int, tuple[str, ...]]] = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, i, columns=None, **k: decoded.append((i, tuple(columns))) or real(self, i, columns=columns, **k))
    got = values.read_at([path], np.zeros(3, np.int32), np.array([57, 3, 51]), TARGET, IDS)
    assert got.to_pylist() == [want.slice(p, 1).to_pylist()[0] for p in (57, 3, 51)]
    assert sorted(decoded) == [(0, ("amount", "id", "name")), (5, ("amount", "id", "name"))], "one read per small row group"
    decoded.clear()
    monkeypatch.setattr(values, "ONE_DECODE_BYTES", 0)
    got = values.read_at([path], np.zeros(1, np.int32), np.array([95]), TARGET, IDS, cache=False)
    assert got.to_pylist() == [want.slice(95, 1).to_pylist()[0]]
    assert sorted(decoded) == [(9, ("amount",)), (9, ("id",)), (9, ("name",))], "above the threshold: a column at a time"


def test_jobs_whose_chunks_are_kept_run_in_the_calling_thread(tmp_path, budget, monkeypatch):
    import threading

    budget(1)
    paths = [str(tmp_path / f"f{i}.parquet") for i in range(4)]
    tables = [_write(p, 40, i, 10) for i, p in enumerate(paths)]
    file_index, positions = np.repeat(np.arange(4, dtype=np.int32), 2), np.tile(np.array([5, 35]), 4)
    want = [tables[f].slice(p, 1).to_pylist()[0] for f, p in zip(file_index.tolist(), positions.tolist(), strict=True)]
    threads: list[str] = []
    real = values._read_columns
    monkeypatch.setattr(values, "_read_columns", lambda *a: threads.append(threading.current_thread().name) or real(*a))
    for _ in range(2):  # decoded twice (kept at the second time)
        assert values.read_at(paths, file_index, positions, TARGET, IDS).to_pylist() == want
        assert len(threads) == 8 and any(t != threading.current_thread().name for t in threads), "eight row groups to decode: workers share them"
        threads.clear()
    assert values.read_at(paths, file_index, positions, TARGET, IDS).to_pylist() == want
    assert threads == [threading.current_thread().name] * 8, "every chunk kept: nothing is handed to a worker"
    threads.clear()
    decoded_cache.CACHE.clear()  # chunks gone: the workers decode again
    assert values.read_at(paths, file_index, positions, TARGET, IDS).to_pylist() == want
    assert any(t != threading.current_thread().name for t in threads)


def test_a_replaced_file_is_not_served_and_the_chunks_of_removed_files_are_dropped(tmp_path, budget, monkeypatch):
    budget(1)
    path = str(tmp_path / "f.parquet")
    first = _write(path, 30, 1, 10)
    for _ in range(2):  # kept at the second read
        assert values.read_at([path], np.zeros(1, np.int32), np.array([25]), TARGET, IDS).to_pylist() == first.slice(25, 1).to_pylist()
    second = _write(path, 30, 2, 7)
    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))  # a coarse clock must not hide the change
    for _ in range(2):
        assert values.read_at([path], np.zeros(1, np.int32), np.array([25]), TARGET, IDS).to_pylist() == second.slice(25, 1).to_pylist()
    assert len(decoded_cache.CACHE) == 6  # the stale chunks of the first file are still held...
    assert decoded_cache.CACHE.sweep() == 3  # ...until a sweep finds their stamp gone
    os.remove(path)
    assert decoded_cache.CACHE.sweep() == 3 and len(decoded_cache.CACHE) == 0 and decoded_cache.CACHE.held == 0
    monkeypatch.setattr(decoded_cache, "SWEEP_SECONDS", 0.0)  # a read sweeps first, at most this often
    other, last = str(tmp_path / "g.parquet"), str(tmp_path / "h.parquet")
    _write(other, 30, 3, 10)
    _write(last, 5, 4, 5)
    for _ in range(2):
        values.read_at([other], np.zeros(1, np.int32), np.array([1]), TARGET, IDS)
    os.remove(other)
    for _ in range(2):
        values.read_at([last], np.zeros(1, np.int32), np.array([0]), TARGET, IDS)
    assert {k[0].split("\0")[0] for k in decoded_cache.CACHE._items} == {last}, "the removed file's chunks were swept"


def test_repeated_feeds_agree_with_and_without_the_cache_and_a_purge_empties_it(warehouse, budget, monkeypatch):
    budget(64)
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": pa.array(range(200), pa.int64()), "name": [f"n{i % 7}" for i in range(200)], "amount": [float(i) for i in range(200)]}))
    for k in range(3):
        ids = list(range(k, 200, 9))
        t.upsert(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"m{k}"] * len(ids), "amount": [float(-i) for i in ids]}))
    t.delete("id % 11 = 0")
    expected = {net: cdf.changes(t, 1, net=net) for net in (False, True)}
    assert len(decoded_cache.CACHE) > 0  # the net feed decoded again what the per-version feed had: kept
    for net in (False, True):
        assert cdf.changes(t, 1, net=net).equals(expected[net])  # from the cache
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "0")
    for net in (False, True):
        assert cdf.changes(t, 1, net=net).equals(expected[net])
    assert len(decoded_cache.CACHE) == 0, "a budget of 0 drops what was kept"
    monkeypatch.setenv(decoded_cache.ENV_BUDGET, "64")
    cdf.changes(t, 1)
    cdf.changes(t, 1)
    assert len(decoded_cache.CACHE) > 0
    rid = expected[False].filter(pa.compute.equal(expected[False]["id"], 9))["_row_id"][0]
    t.purge("id = 9")
    assert len(decoded_cache.CACHE) == 0, "a purge drops every decoded chunk: they may hold erased values"
    erased = cdf.changes(t, 0).filter(pa.compute.equal(cdf.changes(t, 0)["_row_id"], rid))
    assert erased.num_rows and all(erased["_purged"].to_pylist()) and not any(erased["name"].to_pylist())


def test_reads_in_several_threads_share_the_cache_and_agree(tmp_path, budget):
    from concurrent.futures import ThreadPoolExecutor

    budget(2500 / 2**20)  # a few chunks: the threads' reads evict each other's chunks all the time
    paths, wants = [], []
    for i in range(3):
        paths.append(str(tmp_path / f"f{i}.parquet"))
        wants.append(_write(paths[-1], 200, i, 20))
    rng = np.random.default_rng(7)
    jobs = []
    for _ in range(40):
        file_ids = rng.integers(0, 3, 30).astype(np.int32)
        pos = rng.integers(0, 200, 30)
        jobs.append((file_ids, pos, [wants[f].slice(int(p), 1).to_pylist()[0] for f, p in zip(file_ids, pos, strict=True)]))

    def run(job) -> bool:  # type: ignore[no-untyped-def]
        file_ids, pos, want = job
        return values.read_at(paths, file_ids, pos, TARGET, IDS).to_pylist() == want

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(run, jobs))
    assert 0 < decoded_cache.CACHE.held <= 2500 and not decoded_cache.CACHE._active
