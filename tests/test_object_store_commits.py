"""A long-lived writer's small commits on an object store: what they read back of what the writer wrote itself.

The proxy of the benchmark counts the requests. A writer keeps the small
objects it wrote in memory (:mod:`lineage.storage.objects`, up to 4 MiB
each); the key index segment its first upsert builds can be larger (12 MB
for a million keys) and is kept as the index it built, so the next commit
reads nothing back.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import lineage
import lineage.storage.objects as objects
from conftest import SCHEMA
from test_object_store_requests import SMALL_COMMIT_BUDGET, _rows, counted  # noqa: F401 - the fixture


def test_the_next_commit_reads_back_no_key_index_segment_the_writer_wrote(counted, monkeypatch) -> None:  # noqa: F811
    lake, proxy = counted
    monkeypatch.setattr(objects, "RECENT_MAX_OBJECT", 0)  # as if every object were too large to keep
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **lake.where())
    t.append(_rows(np.arange(1000), "a"))
    logs = []
    for i in range(3):
        proxy.reset()
        t.upsert(_rows(np.array([10 * i + 1, 2000 + i]), f"u{i}"))
        logs.append(proxy.counts(log=True)["log"])
    for log in logs[1:]:
        assert not [e for e in log if e[0] == "GET" and e[1].endswith("-keys.kix")], [e[:2] for e in log]
    fresh = lineage.open_table("shop.orders", **lake.where())  # another writer reads the index from the store
    info = fresh.upsert(_rows(np.array([1, 11, 2001, 5000]), "x"))
    assert (info.updated, info.inserted) == (3, 1)
    got = fresh.scan(columns=["id", "_row_id"])
    assert got.num_rows == 1004 and len(set(got.column("_row_id").to_pylist())) == 1004


def test_segments_a_writer_keeps_equal_what_a_reader_reads_back(s3) -> None:
    """A writer's commits keep the key index segments they write (not read back); segments merge two at a time here.
    After every commit the index the writer opens (kept segments) equals the one read from the store, and so do the
    lookups and the rows a fresh reader scans."""
    import index.key_segment as key_segment
    from index.key_index import KeyIndex

    t = lineage.create_table("shop.kept", SCHEMA, key=["id"], properties={"lineage.key-index.merge-fanout": "2"}, **s3.where())
    t.append(_rows(np.arange(100), "a"))
    rng = np.random.default_rng(11)
    for i in range(6):
        if i % 3 == 2:
            t.delete(f"id % 9 = {i}")
        else:
            t.upsert(_rows(np.unique(rng.integers(0, 140, 12)), f"u{i}"))
        state = t.state()
        kept = KeyIndex.open(state).live_entries().sort_by("id")
        key_segment._CACHE.clear()  # as a reader: every segment read from the store
        assert KeyIndex.open(state).live_entries().sort_by("id").equals(kept)
        probe = pa.table({"id": np.arange(-2, 142)})
        assert KeyIndex.open(state).lookup(probe).equals(KeyIndex.open(t.state()).lookup(probe))
    scan = lineage.open_table("shop.kept", **s3.where()).scan(columns=["id", "_row_id"]).sort_by("id")
    assert kept.select(["id", "_row_id"]).to_pylist() == scan.to_pylist()


def test_the_key_columns_a_process_wrote_are_kept_within_their_budget(monkeypatch) -> None:
    import pyarrow as pa

    import lineage.storage.written_keys as written_keys

    monkeypatch.setattr(written_keys, "BUDGET", 3 * 8000)
    monkeypatch.setattr(written_keys, "MAX_FILE_BYTES", 8000)
    written_keys.forget()
    keys = {f"s3://b/f{i}.parquet": pa.table({"id": np.arange(1000, dtype=np.int64) + 1000 * i, "x": np.zeros(1000)}) for i in range(4)}
    for path, table in keys.items():
        written_keys.remember(path, table.select(["id"]))  # 8000 bytes each: three fit
    written_keys.remember("s3://b/big.parquet", pa.table({"id": np.arange(1001, dtype=np.int64)}))  # over the per-file limit
    assert written_keys.known("s3://b/f0.parquet", ["id"]) is None, "the least recently used left"
    assert written_keys.known("s3://b/big.parquet", ["id"]) is None
    assert written_keys.known("s3://b/f3.parquet", ["id"]).equals(keys["s3://b/f3.parquet"].select(["id"]))
    assert written_keys.known("s3://b/f3.parquet", ["other"]) is None  # not the columns asked for: read from the file
    written_keys.forget()
    assert written_keys.known("s3://b/f3.parquet", ["id"]) is None


def test_a_capture_commit_reads_the_pre_images_of_a_file_the_writer_wrote_with_one_get(counted, monkeypatch) -> None:  # noqa: F811
    """Pre-image capture, the first upsert after a bulk load whose file is too large to keep whole: the writer kept
    that file's footer when it wrote it, so the pre-images cost one ranged GET (not a footer GET first) and the
    commit stays within the budget; the feed gives the values the rows had."""
    import cdf
    import lineage.storage.s3_reader as s3_reader

    lake, proxy = counted
    monkeypatch.setattr(objects, "RECENT_MAX_OBJECT", 16 << 10)
    rng = np.random.default_rng(5)
    n = 40_000
    base = pa.table({"id": np.arange(n, dtype=np.int64), "name": [f"a{i}" for i in range(n)],
                     "amount": rng.uniform(0, 1000, n)}, schema=SCHEMA)
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **lake.where(),
                             properties={"lineage.cdf.capture-preimages": "true"})
    t.append(base)
    [loaded] = t.state().live_files()
    assert loaded.data_file.file_size_in_bytes > 2 * s3_reader.TAIL_BYTES  # neither held whole nor read by the tail
    updated = np.array([7, 1234, 20_001, 39_999, 31_000])
    proxy.reset()
    info = t.upsert(_rows(np.concatenate([updated, np.arange(n, n + 5)]), "u"))
    got = proxy.counts(log=True)
    assert (info.updated, info.inserted) == (5, 5)
    gets = [e[1] for e in got["log"] if e[0] == "GET"]
    assert gets == ["/" + loaded.path.split("://", 1)[1]], [e[:2] for e in got["log"]]
    assert got["total"] <= SMALL_COMMIT_BUDGET, [e[:2] for e in got["log"]]
    feed = cdf.changes(t, t.version - 1).to_pylist()
    before = {r["id"]: (r["name"], r["amount"]) for r in feed if r["_change_type"] == "update_preimage"}
    assert before == {int(i): (f"a{i}", base["amount"][int(i)].as_py()) for i in updated}


def test_queued_removals_ride_only_on_a_commit_with_room(counted, monkeypatch) -> None:  # noqa: F811
    """Old metadata files queued for removal go with a commit only when its own requests leave room (a commit
    touching two data files sends ten: it carries none); none is lost: the queue empties at the end."""
    import pyarrow.fs as pafs

    import lineage.storage.files as files
    import lineage.storage.removals as removals

    removals.wait()  # what earlier tests queued
    monkeypatch.setattr(removals, "BATCH", 2)
    lake, proxy = counted
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **lake.where(),
                             properties={"write.metadata.previous-versions-max": "1"})
    t.append(_rows(np.arange(1000), "a"))
    commits = []
    for i in range(12):
        ids = [100 + i, 5000 + i] if i % 3 == 0 else [100 + i, 5000 + i - 1, 5000 + i]  # also a row of the last file
        queued = len(removals.pending())
        proxy.reset()
        t.upsert(_rows(np.array(ids), f"u{i}"))
        got = proxy.counts()
        commits.append((queued, got["requests"].get("PUT", 0), got["requests"].get("POST", 0), got["total"]))
    assert all(total <= SMALL_COMMIT_BUDGET for *_, total in commits), commits
    assert sum(post for _, _, post, _ in commits) >= 3, commits  # removals do go, on commits with room
    assert any(queued >= 2 and put == SMALL_COMMIT_BUDGET and post == 0 for queued, put, post, _ in commits), commits
    removals.wait()
    assert removals.pending() == []
    fs, root = files.filesystem(t.iceberg.metadata.location + "/metadata")
    names = [f.path for f in fs.get_file_info(pafs.FileSelector(root)) if f.path.endswith(".metadata.json")]
    assert len(names) == 2, names  # the current file and one previous version
    assert t.scan().num_rows == 1012
