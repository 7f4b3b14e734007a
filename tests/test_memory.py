"""Freed memory is returned after large operations, and only then (lineage.memory)."""

from __future__ import annotations

import pyarrow as pa

from lineage import memory

MB = 1 << 20


def test_release_runs_only_after_the_process_grew_by_more_than_the_slack(monkeypatch, caplog):
    trims: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: trims.append(1))
    monkeypatch.setattr(memory, "_floor", [None])
    monkeypatch.setenv(memory.ENV_SLACK, "10")
    assert memory.release_if_grown(resident=100 * MB)  # never released: the first call sets the floor
    assert not memory.release_if_grown(resident=109 * MB)
    assert not memory.release_if_grown(resident=95 * MB)  # the floor follows the lowest point
    assert memory.release_if_grown(resident=106 * MB)  # 11 MB above 95
    assert len(trims) == 2
    monkeypatch.setenv(memory.ENV_SLACK, "-1")  # off
    assert not memory.release_if_grown(resident=900 * MB)
    monkeypatch.setenv(memory.ENV_SLACK, "lots")  # a bad setting is logged, never raised after a commit
    assert not memory.release_if_grown(resident=900 * MB)
    assert "LINEAGE_MEMORY_SLACK_MB must be a whole number" in caplog.text
    assert len(trims) == 2


def test_a_feed_does_not_count_what_a_cache_keeps_as_growth_and_counts_what_it_frees(monkeypatch):
    trims: list[int] = []
    held = [0]
    monkeypatch.setattr(memory, "_malloc_trim", lambda: trims.append(1))
    monkeypatch.setattr(memory, "_floor", [None])
    monkeypatch.setattr(memory, "_floor_kept", [0])
    monkeypatch.setattr(memory, "_KEPT", [])
    memory.count_as_kept(lambda: held[0])
    monkeypatch.setenv(memory.ENV_SLACK, "10")
    assert memory.release_if_grown(resident=100 * MB)  # the floor: 100 MB, the cache empty
    held[0] = 40 * MB
    assert not memory.release_if_grown(resident=148 * MB, discount_kept=True)  # 48 MB more, 40 kept by the cache
    assert memory.release_if_grown(resident=148 * MB)  # a write counts all growth
    assert memory._floor == [148 * MB] and memory._floor_kept == [40 * MB]
    assert not memory.release_if_grown(resident=140 * MB, discount_kept=True)  # the floor follows the lowest point
    assert memory._floor == [140 * MB] and memory._floor_kept == [40 * MB]
    held[0] = 70 * MB
    assert memory.release_if_grown(resident=181 * MB, discount_kept=True)  # 41 MB more, 30 kept: 11 MB grown
    held[0] = 50 * MB  # the cache evicted 20 MB: freed pages, though the process did not grow
    assert memory.release_if_grown(resident=181 * MB, discount_kept=True)
    monkeypatch.setattr(memory, "_floor", [100 * MB])
    monkeypatch.setattr(memory, "_floor_kept", [0])
    assert memory.release_within(resident=130 * MB)  # within an operation (a write): all growth counts
    assert memory._floor == [100 * MB] and memory._floor_kept == [0]  # the floor stays where the operation started
    assert len(trims) == 5


def test_a_write_and_a_feed_release_what_they_freed(warehouse, monkeypatch):
    import cdf
    import lineage

    calls: list[str] = []
    monkeypatch.setattr("lineage.writes.loop.release_if_grown", lambda: calls.append("write"))
    # a feed discounts what the decoded row-group cache keeps (count_as_kept)
    monkeypatch.setattr("cdf.api.release_if_grown", lambda discount_kept=False: calls.append("feed" if discount_kept else "feed, cache counted"))
    t = lineage.create_table("db.m", pa.schema([("id", pa.int64())]), key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": pa.array(range(1000), pa.int64())}))
    assert calls == ["write"]
    assert cdf.changes(t, 0).num_rows == 1000
    assert calls == ["write", "feed"]


def test_a_write_leaves_no_reference_cycle_holding_its_plan(warehouse):
    """A cycle (attempt -> describe closure -> attempt) kept a write's plan, and the key index it built
    (about 250 MB at 10M rows), alive until Python's next full garbage collection."""
    import gc

    import lineage

    t = lineage.create_table("db.c", pa.schema([("id", pa.int64()), ("v", pa.int64())]), key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": pa.array(range(100), pa.int64()), "v": pa.array(range(100), pa.int64())}))
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds in gc.garbage instead of freeing it
    try:
        t.merge(upserts=pa.table({"id": pa.array([1, 200], pa.int64()), "v": pa.array([7, 8], pa.int64())}), deletes=pa.table({"id": pa.array([5], pa.int64())}))
        t.update("id = 2", {"v": "v + 1"})
        t.delete("id = 3")
        gc.collect()
        cyclic = sorted({type(o).__name__ for o in gc.garbage} & {"Plan", "Attempt", "CommitResult", "KeyIndex", "WrittenFile"})
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    assert cyclic == [], f"objects of a write left in reference cycles: {cyclic}"


def test_malloc_is_tuned_once_unless_the_environment_or_the_settings_say_otherwise(monkeypatch):
    import subprocess
    import sys

    code = "import lineage.memory as m; print(m.tune_malloc())"

    def tuned(**env: str) -> str:
        import os

        base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", memory.ENV_SLACK)}
        return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True).stdout.strip()

    expected = "True" if sys.platform.startswith("linux") and memory._libc_trim() is not None else "False"
    assert tuned() == expected  # glibc: tuned at import
    assert tuned(MALLOC_TRIM_THRESHOLD_="1000000") == "False"  # the user tunes malloc: left alone
    assert tuned(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000") == "False"
    assert tuned(**{memory.ENV_SLACK: "-1"}) == "False"  # releases off: memory is left as glibc manages it
    assert tuned(**{memory.ENV_SLACK: "lots"}) == "False"


def test_a_streamed_feed_releases_between_parts_and_at_its_end_whatever_the_slack(warehouse, monkeypatch):
    import cdf
    import lineage

    calls: list[str] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: calls.append("trim"))
    monkeypatch.setattr(memory, "_floor", [None])
    monkeypatch.setenv(memory.ENV_SLACK, "100000")  # no growth reaches it
    t = lineage.create_table("db.s", pa.schema([("id", pa.int64())]), warehouse=warehouse)
    t.append(pa.table({"id": pa.array(range(1000), pa.int64())}))
    release = memory.release_if_grown
    monkeypatch.setattr("cdf.stream.release_if_grown", lambda: calls.append("part") or release())
    reader = cdf.change_batches(t, 0, batch_rows=400)
    calls.clear()
    assert sum(b.num_rows for b in reader) == 1000
    assert calls == ["part", "part", "part", "trim"], "a check after each of the 3 parts, one release at the end"
    monkeypatch.setenv(memory.ENV_SLACK, "-1")  # off: not even at the end
    calls.clear()
    assert cdf.change_batches(t, 0).read_all().num_rows == 1000
    assert "trim" not in calls


def test_a_decoding_worker_returns_a_large_chunks_buffers_and_only_a_large_ones(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow.parquet as pq

    import lineage.read.values as values

    calls: list[int] = []
    monkeypatch.setattr(values, "release_pool", lambda: calls.append(1) or True)
    big, small = str(tmp_path / "big.parquet"), str(tmp_path / "small.parquet")
    n = 400_000  # two int64 columns, in one row group: 6.4 MB decoded, above SPLIT_BYTES
    pq.write_table(pa.table({"a": np.arange(n), "b": np.arange(n) * 2}), big, row_group_size=n, use_dictionary=False)
    assert values.layout(big).metadata.row_group(0).total_byte_size > values.SPLIT_BYTES
    pq.write_table(pa.table({"a": np.arange(10), "b": np.arange(10) * 2}), small)
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64())])
    want = np.array([3, 7, n - 1])
    # a job per file, in two workers: the large group's worker hands its buffers back once its rows are taken
    got = values.gather([big, small], np.array([0, 0, 0, 1]), np.append(want, 9), schema, cache=False)
    rows = values.take_rows(got.pieces, got.rows, schema)
    assert rows.column("b").to_pylist() == [6, 14, 2 * (n - 1), 18]
    assert len(calls) >= 1
    calls.clear()
    got = values.gather([small, small], np.array([0, 1]), np.array([1, 2]), schema, cache=False)
    assert values.take_rows(got.pieces, got.rows, schema).column("a").to_pylist() == [1, 2]
    assert calls == []


def test_releasing_the_pool_follows_the_release_setting(monkeypatch):
    monkeypatch.setenv(memory.ENV_SLACK, "64")
    assert memory.release_pool()
    monkeypatch.setenv(memory.ENV_SLACK, "-1")  # releases off
    assert not memory.release_pool()
    monkeypatch.setenv(memory.ENV_SLACK, "lots")  # a bad setting: no release, no error in a read
    assert not memory.release_pool()


def test_a_release_within_an_operation_leaves_the_floor_for_its_end(monkeypatch):
    trims: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: trims.append(1))
    monkeypatch.setattr(memory, "_floor", [None])
    monkeypatch.setenv(memory.ENV_SLACK, "10")
    assert memory.release_if_grown(resident=100 * MB)  # the end of an earlier operation: floor 100 MB
    assert not memory.release_within(resident=108 * MB)  # within the slack
    assert memory.release_within(resident=130 * MB)  # mid-way through a large one
    assert memory._floor[0] == 100 * MB  # not raised to what the operation holds mid-way
    assert memory.release_if_grown(resident=115 * MB)  # so its end still returns what it freed
    monkeypatch.setattr(memory, "_floor", [None])
    assert memory.release_within(resident=500 * MB)
    assert memory._floor[0] is None  # never released at an operation's end: its first end releases
    monkeypatch.setenv(memory.ENV_SLACK, "-1")  # off
    assert not memory.release_within(resident=900 * MB)
    monkeypatch.setenv(memory.ENV_SLACK, "lots")  # a bad setting is ignored mid-way too
    assert not memory.release_within(resident=900 * MB)
    assert len(trims) == 4
