"""Long histories: what a commit writes and what a snapshot names must not grow with the number of commits.

Structure only, never timing (benchmarks/history.py measures time and bytes):

* manifests are merged on commit by Iceberg's rule, so after many small
  commits a snapshot holds at most ``commit.manifest.min-count-to-merge``
  manifests of each kind, with every entry's snapshot id and data and file
  sequence numbers preserved;
* lineage segments are merged the same way and the commit log is chunked, so
  the newest lineage list stays under a bound that does not depend on the
  number of commits;
* history(), timestamp resolution and the change feed answer exactly as they
  did with format-1 lists (the whole log inline), which still read;
* maintain() and rewrite_manifests() keep answers unchanged.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

import cdf
import lineage
from conftest import SCHEMA, assert_interop, rows
from index import deleted_rows
from lineage import state
from lineage.storage import commit_log, metadata
from lineage.storage.commit_log import CHUNK_ENTRIES, LIST_FORMAT_VERSION
from lineage.storage.fileio import local_path
from lineage.storage.metadata import SUMMARY_LIST, read_list

MIN_COUNT = 6  # small, so that a few dozen commits exercise several merges


def _forget() -> None:
    for cache in (metadata._SEGMENT_CACHE, metadata._LIST_CACHE, commit_log._CHUNK_CACHE, deleted_rows._CACHE):
        cache.clear()
    state.forget_planned_files()


def _batch(ids, amount: float = 1.0) -> pa.Table:
    ids = np.asarray(ids, np.int64)
    return pa.table({"id": ids, "name": [f"n{i % 5}" for i in ids], "amount": np.full(len(ids), amount)}, schema=SCHEMA)


def _list_of(t: lineage.Table) -> tuple[str, metadata.LineageList]:
    t.refresh()
    path = t.iceberg.metadata.current_snapshot().summary.additional_properties[SUMMARY_LIST]
    return path, read_list(t.iceberg.io, path)


def _manifests(t: lineage.Table) -> dict[str, list]:
    t.refresh()
    out: dict[str, list] = {"data": [], "deletes": []}
    for m in t.iceberg.metadata.current_snapshot().manifests(t.iceberg.io):
        out["deletes" if m.content == ManifestContent.DELETES else "data"].append(m)
    return out


def _small_commits(t: lineage.Table, n: int, start: int = 0, on_commit=None) -> None:
    """``n`` cheap commits: appends of two rows, and every third commit a one-row delete (a delete manifest)."""
    for i in range(start, start + n):
        if i % 3 == 2:
            t.delete(f"id = {2 * (i - 1)}")
        else:
            t.append(_batch([2 * i, 2 * i + 1], float(i)))
        if on_commit:
            on_commit(t)


@pytest.fixture
def merging(warehouse):
    props = {"commit.manifest.min-count-to-merge": str(MIN_COUNT), "lineage.segment.min-count-to-merge": str(MIN_COUNT)}
    return lineage.create_table("shop.stream", SCHEMA, warehouse=warehouse, properties=props)


def test_manifests_segments_and_lists_stay_bounded_over_300_commits(merging):
    t = merging
    sizes: list[int] = []
    worst = {"data": 0, "deletes": 0, "segments": 0}

    def observe(t: lineage.Table) -> None:
        path, lst = _list_of(t)
        sizes.append(os.path.getsize(local_path(path)))
        worst["segments"] = max(worst["segments"], len(lst.segments))
        for kind, ms in _manifests(t).items():
            worst[kind] = max(worst[kind], len(ms))

    _small_commits(t, 300, on_commit=observe)
    assert t.version == 300
    # Iceberg's rule: the bin holding the new manifest is merged once it reaches min-count
    assert worst["data"] <= MIN_COUNT and worst["deletes"] <= MIN_COUNT, worst
    assert worst["segments"] <= MIN_COUNT, worst
    # a list names at most MIN_COUNT segments and CHUNK_ENTRIES log entries: its size stops growing
    assert max(sizes[200:]) <= 1.05 * max(sizes[50:150]), (max(sizes[50:150]), max(sizes[200:]))
    assert max(sizes) < 16 * 1024
    _forget()
    assert len(t.history()) == 300 and [c.version for c in t.history()] == list(range(1, 301))
    appended = {j for i in range(300) if i % 3 != 2 for j in (2 * i, 2 * i + 1)}
    expected = sorted(appended - {2 * (i - 1) for i in range(300) if i % 3 == 2})
    assert sorted(t.scan(columns=["id"]).column("id").to_pylist()) == expected
    assert_interop(t)


def test_merged_manifests_keep_snapshot_ids_and_sequence_numbers(warehouse):
    # small files not folded: every appended file stays, with the snapshot that added it
    props = {"commit.manifest.min-count-to-merge": str(MIN_COUNT), "lineage.write.fold.max-rows": "0"}
    t = lineage.create_table("shop.stream", SCHEMA, warehouse=warehouse, properties=props)
    added_at: dict[str, tuple[int, int]] = {}  # data file -> (snapshot id, version) that added it
    for i in range(3 * MIN_COUNT):
        info = t.append(_batch([i]))
        for m in _manifests(t)["data"]:
            for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
                if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == info.snapshot_id:
                    added_at[e.data_file.file_path] = (info.snapshot_id, info.version)
    manifests = _manifests(t)["data"]
    assert len(manifests) < 3 * MIN_COUNT, "merged"
    seen = 0
    for m in manifests:
        for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
            snapshot_id, version = added_at[e.data_file.file_path]
            assert (e.snapshot_id, e.sequence_number, e.file_sequence_number) == (snapshot_id, version, version)
            seen += 1
    assert seen == 3 * MIN_COUNT
    # the newest merge happened in some commit: its entries are EXISTING, not re-ADDED
    statuses = {e.status for m in manifests for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=False)}
    assert ManifestEntryStatus.EXISTING in statuses


def _feed(t: lineage.Table, a: int, b: int | None = None, **kw) -> list[tuple]:
    out = cdf.changes(t, a, b, **kw)
    return rows(out.drop_columns(["_commit_timestamp"])) + [("ts", str(v)) for v in sorted(set(out.column("_commit_timestamp").to_pylist()))]


def _answers(t: lineage.Table) -> dict[str, object]:
    """history, timestamp resolution and feeds: what must not change with the list format."""
    from cdf.retention import resolve_range

    history = t.history()
    stamps = [c.timestamp for c in history]
    st = t.state()
    return {
        "history": history,
        "resolved": [resolve_range(st, from_timestamp=s, to_timestamp=u) for s in stamps[::5] for u in stamps[-3:]],
        "ranges": [_feed(t, a, b) for a, b in ((0, None), (5, 9), (CHUNK_ENTRIES - 2, CHUNK_ENTRIES + 3), (len(history) - 3, None))],
        "by_time": rows(cdf.changes(t, from_timestamp=stamps[3], to_timestamp=stamps[-2]).drop_columns(["_commit_timestamp"])),
        "net": _feed(t, 2, None, net=True),
        "deleted": rows(cdf.deleted_rows(t, 0)),
    }


def _rewrite_all_lists_as_format_1(t: lineage.Table) -> int:
    """Rewrite every lineage list of the table the way format 1 wrote it: segment paths, the whole log inline."""
    n = 0
    for snap in t.iceberg.metadata.snapshots:
        path = snap.summary.additional_properties[SUMMARY_LIST]
        lst = read_list(t.iceberg.io, path)
        obj = {"format": "lineage-list", "format-version": 1, "version": lst.version, "next-row-id": lst.next_row_id,
               "segments": list(lst.segments), "commits": [c.to_json() for c in lst.commits]}
        with open(local_path(path), "w") as f:
            json.dump(obj, f)
        n += 1
    return n


def test_history_timestamps_and_feeds_match_format_1_lists(merging, monkeypatch):
    monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", -1)  # segments in files of their own, as format 1 wrote them
    t = merging
    _small_commits(t, CHUNK_ENTRIES + 12)  # the log has a sealed chunk and a tail
    _, lst = _list_of(t)
    assert lst.log.head is not None and 0 < len(lst.log.tail) < CHUNK_ENTRIES
    _forget()
    new_format = _answers(t)
    assert _rewrite_all_lists_as_format_1(t) == t.version
    _forget()
    assert _list_of(t)[1].log.head is None, "read as format 1: the log is all inline"
    assert _answers(t) == new_format
    # writes on top of format-1 lists go on in the current format, with the same answers for the old versions
    before = _feed(t, 0, t.version)
    _small_commits(t, 3, start=CHUNK_ENTRIES + 12)
    path, lst = _list_of(t)
    with open(local_path(path)) as f:
        assert json.load(f)["format-version"] == LIST_FORMAT_VERSION
    assert lst.log.head is not None, "the inline log was sealed into chunks"
    _forget()
    assert _feed(t, 0, t.version - 3) == before
    assert [c.version for c in t.history()] == list(range(1, t.version + 1))


def test_a_full_tail_makes_the_parent_list_the_head_chunk_so_no_commit_writes_a_chunk_file(merging):
    """Sealing the log writes nothing: the commit whose parent list holds CHUNK_ENTRIES entries names that list as
    its head chunk. After the snapshots are expired and vacuumed, the lists the log names stay and read."""
    import datetime as dt

    t = merging
    lists: dict[int, str] = {}
    _small_commits(t, 2 * CHUNK_ENTRIES + 5, on_commit=lambda t: lists.__setitem__(t.version, _list_of(t)[0]))
    folder = os.path.dirname(local_path(lists[1]))
    assert not [n for n in os.listdir(folder) if n.endswith("-log.json")]
    _, lst = _list_of(t)
    assert len(lst.log.tail) == 5 and [c.version for c in lst.log.tail] == list(range(t.version - 4, t.version + 1))
    head = lst.log.head
    assert (head.path, head.first_version, head.last_version, head.count) == (lists[2 * CHUNK_ENTRIES], CHUNK_ENTRIES + 1, 2 * CHUNK_ENTRIES, CHUNK_ENTRIES)
    _forget()
    first = commit_log._read_chunk(t.iceberg.io, head.path).previous
    assert (first.path, first.first_version, first.last_version) == (lists[CHUNK_ENTRIES], 1, CHUNK_ENTRIES)
    history = t.history()
    assert [c.version for c in history] == list(range(1, t.version + 1))
    feed = _feed(t, 0)
    t.expire_snapshots(retain_last=1)
    t.vacuum(older_than=dt.timedelta(0))
    left = set(os.listdir(folder))
    assert {os.path.basename(lists[v]) for v in (CHUNK_ENTRIES, 2 * CHUNK_ENTRIES, t.version)} <= left
    assert os.path.basename(lists[CHUNK_ENTRIES + 1]) not in left, "a list no log names is vacuumed"
    _forget()
    assert t.history() == history and _feed(t, 0) == feed


def test_expired_log_follows_retention_and_keeps_checkpoints(warehouse):
    t = lineage.create_table("shop.kv", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.retention.versions": "20"})
    t.append(_batch(range(4)))
    t.merge(_batch([0], 5.0), properties={"mv.checkpoint": "cp-1"})
    for i in range(CHUNK_ENTRIES + 20):
        t.upsert(_batch([i % 4], float(i)))
    v = t.version
    feed = _feed(t, v - 10)
    dry = t.maintain(dry_run=True)
    assert t.version == v and any(s.name == "expire-log" and s.status == "would run" for s in dry.steps), str(dry)
    report = t.maintain()
    step = next(s for s in report.steps if s.name == "expire-log")
    assert step.status == "done", str(report)
    _forget()
    history = t.history()
    kept = [c for c in history if c.properties]
    assert [c.properties for c in kept] == [{"mv.checkpoint": "cp-1"}], "the newest entry of each property key survives"
    window = [c.version for c in history if not c.properties]
    assert window[0] <= t.version - 20 and window == list(range(window[0], t.version + 1))
    assert window[0] > 20, "entries older than the window were dropped"
    # maintenance commits (at most a few) moved the window; the feed of v-10..v is still inside it
    assert _feed(t, v - 10, v) == feed
    with pytest.raises(lineage.RetentionError):
        cdf.changes(t, 3)
    # the chunks no retained list reaches are gone after vacuum; the rest still reads
    t.vacuum(older_than=__import__("datetime").timedelta(0))
    _forget()
    assert _feed(t, v - 10, v) == feed
    assert lineage.maintenance.verify(t).ok


def test_maintain_dry_run_changes_nothing_and_maintain_keeps_answers(warehouse):
    # merge disabled, and each commit's delete file kept apart (not merged into the data file's previous one), so
    # that manifests accumulate for maintain to merge
    props = {"commit.manifest-merge.enabled": "false", "lineage.write.delete.merge": "false",
             "lineage.maintain.rewrite-data-files.min-input-files": "3",
             "history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "2"}
    t = lineage.create_table("shop.up", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    t.append(_batch(range(50)))
    for i in range(12):
        t.upsert(_batch([i, 100 + i], float(i)))
    before_scan = rows(t.scan())
    before_feed = _feed(t, 0)
    n_manifests = sum(len(m) for m in _manifests(t).values())
    assert n_manifests > MIN_COUNT, "merge disabled: one more manifest per commit"
    version = t.version
    dry = t.maintain(dry_run=True)
    assert t.version == version and len(t.iceberg.metadata.snapshots) == version, str(dry)
    assert {s.name: s.status for s in dry.steps}["expire-snapshots"] == "would run"
    report = t.maintain()
    statuses = {s.name: s.status for s in report.steps}
    assert statuses["expire-snapshots"] == "done" and statuses["rewrite-data-files"] == "done", str(report)
    assert len(t.iceberg.metadata.snapshots) <= 2 + len(report.committed)
    _forget()
    assert rows(t.scan()) == before_scan
    assert _feed(t, 0, version) == before_feed
    assert_interop(t)
    # merge disabled, so the manifests are left for rewrite_manifests
    t.rewrite_manifests()
    counts = {k: len(v) for k, v in _manifests(t).items()}
    assert counts["data"] <= 1 and counts["deletes"] <= 1, counts
    _forget()
    assert rows(t.scan()) == before_scan and _feed(t, 0, version) == before_feed
    assert_interop(t)
    assert lineage.maintenance.verify(t).ok


def test_a_long_lived_table_plans_from_memory_and_notices_other_writers(merging):
    t = merging
    other = lineage.open_table("shop.stream", catalog=t.catalog)
    _small_commits(t, 6)
    plans = []
    original = state._plan

    def counting(table, snapshot_id):
        plans.append(snapshot_id)
        return original(table, snapshot_id)

    state._plan = counting
    try:
        _small_commits(t, 6, start=6)
        assert plans == [], "a table's own commits carry its live files: no manifest planning"
        other.append(_batch([1000, 1001]))
        plans.clear()  # the other writer planned its own (fresh) state: a small append looks for small files to fold
        t.delete("id = 1000")
        assert len(plans) == 1, "another writer's commit makes the carried files stale"
        t.delete("id = 0")
        assert len(plans) == 1
    finally:
        state._plan = original
    ids = t.scan(columns=["id"]).column("id").to_pylist()
    assert 1001 in ids and 1000 not in ids and 0 not in ids
    assert_interop(t)


def test_maintain_merges_the_key_index_over_1000_small_commits(warehouse):
    """maintain() every 100 commits keeps the key index in a few segments; writers alone would not merge them."""
    from index.key_index import KeyIndex
    from lineage.maintenance.key_index import check_key_index

    # Writers merge nothing (limit 0) until max-segments, and compaction (which rebuilds the index of the files it moves)
    # is off: the merging is the merge-key-index step's to do.
    props = {"lineage.key-index.writer-merge-limit": "0", "lineage.key-index.max-segments": "64"}
    props.update({f"lineage.maintain.{step}.enabled": "false" for step in ("rewrite-data-files", "rewrite-position-deletes", "vacuum")})
    t = lineage.create_table("s.k", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    t.append(pa.table({"id": list(range(100)), "name": ["a"] * 100, "amount": [0.0] * 100}, schema=SCHEMA))
    t.reindex()
    most, after_maintain, merged = 0, [], 0
    for i in range(1, 1001):
        t.upsert(pa.table({"id": [i % 150], "name": ["b"], "amount": [float(i)]}, schema=SCHEMA))
        most = max(most, len(KeyIndex.open(t.state(), build=False).segments))
        if i % 100 == 0:
            step = next(s for s in t.maintain().steps if s.name == "merge-key-index")
            merged += step.status == "done"
            after_maintain.append(len(KeyIndex.open(t.state(), build=False).segments))
    assert merged >= 9, merged
    assert max(after_maintain) <= 9, after_maintain  # a base plus at most merge-fanout (8) deltas
    assert most <= 64 + 1, most  # between two maintain() runs writers let them grow to max-segments
    assert not check_key_index(t.state())[0]
    assert t.count() == 150


@pytest.mark.parametrize("seed", range(int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "3"))))
def test_random_histories_across_chunk_boundaries_with_expiry_and_vacuum_keep_their_answers(warehouse, monkeypatch, seed):
    """Random runs of commits (appends, deletes, upserts) over several log chunks (chunks of 3 entries here), with
    snapshot expiry plus vacuum and log expiry at random points: each retained version's feed and deleted rows, read
    afresh from storage, are what they were right after its commit; history is the retention window without a gap,
    and verify is clean. LINEAGE_PROPERTY_EXAMPLES runs more seeds."""
    import datetime as dt
    import random

    from lineage.maintenance import expire_log, verify
    from lineage.retention import window

    monkeypatch.setattr(commit_log, "CHUNK_ENTRIES", 3)
    rnd = random.Random(seed)
    t = lineage.create_table(f"shop.rand{seed}", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.retention.versions": "4", "commit.manifest.min-count-to-merge": "3"})
    seen: dict[int, tuple] = {}
    for i in range(rnd.randint(5, 20)):
        kind = rnd.choice(["append", "append", "delete", "upsert", "expire", "expire-log"])
        if kind == "append" or t.count() == 0:
            t.append(_batch([3 * i, 3 * i + 1], float(i)))
        elif kind == "delete":
            t.delete(f"id = {rnd.choice(t.scan(columns=['id']).column('id').to_pylist())}")
        elif kind == "upsert":
            t.upsert(_batch([rnd.choice(t.scan(columns=["id"]).column("id").to_pylist()), 3 * i + 2], float(-i)))
        elif kind == "expire":
            t.expire_snapshots(retain_last=1)
            t.vacuum(older_than=dt.timedelta(0))
            continue
        else:
            expire_log(t, min_entries=1)
        v = t.version
        seen[v] = (_feed(t, v - 1, v), rows(cdf.deleted_rows(t, v - 1, v)))
    _forget()
    history = [c.version for c in t.history() if not c.properties]
    assert history == list(range(history[0], t.version + 1))
    oldest = window(t.state()).oldest
    assert history[0] <= oldest + 1  # a feed from version 0 starts before the first commit
    for v, (feed, deleted) in seen.items():
        if v - 1 >= oldest:
            assert (_feed(t, v - 1, v), rows(cdf.deleted_rows(t, v - 1, v))) == (feed, deleted), v
    assert verify(t).ok, verify(t).problems
    assert_interop(t)
