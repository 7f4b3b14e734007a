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


def test_a_write_and_a_feed_release_what_they_freed(warehouse, monkeypatch):
    import cdf
    import lineage

    calls: list[str] = []
    monkeypatch.setattr("lineage.writes.loop.release_if_grown", lambda: calls.append("write"))
    monkeypatch.setattr("cdf.api.release_if_grown", lambda: calls.append("feed"))
    t = lineage.create_table("db.m", pa.schema([("id", pa.int64())]), key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": pa.array(range(1000), pa.int64())}))
    assert calls == ["write"]
    assert cdf.changes(t, 0).num_rows == 1000
    assert calls == ["write", "feed"]
