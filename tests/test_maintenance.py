"""Table maintenance keeps row lineage and the change feed (issue 4, DESIGN.md sections 3, 4 and 7).

* A property test in the style of ``test_cdf_property``: random writes interleaved with random
  compactions, delete-file rewrites, snapshot expiries, vacuums and re-homes, on a table with a
  change-feed retention window. After every step the scan equals the model; after every
  maintenance operation foreign readers agree (``assert_interop``) and a feed spanning it matches the
  model; at the end every checked range inside the window matches, before and after expiring every
  snapshot but the current one and vacuuming, and ranges starting before the window are refused with
  ``RetentionError``.
* One focused test per operation (compaction, delete-file rewrite, expiry + vacuum, re-home), on
  unpartitioned and ``bucket(4, id)`` tables.
* Purge: every file left on disk is read (Parquet with pyarrow, everything else as raw bytes) and none
  holds any historical value of the purged row; the feed flags the erased images.
* Safety: maintenance running in one process while another writes loses no commit; processes
  killed with SIGKILL in the middle of compaction or purge leave a readable table with a correct
  feed, and a vacuum then leaves exactly the referenced files.

The model, the write generator and the expected feeds are ``test_cdf_property``'s.
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing as mp
import os
import queue as queue_mod
import random
import signal
import struct
import time
import traceback
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType

import cdf
import conftest
import lineage
import test_cdf_property as P
from conftest import assert_interop
from lakes import S3_PHASES, S3_PROPERTY_EXAMPLES, Lake, stored_files, temp_lake
import lineage.storage.duckdb_s3 as duckdb_s3
import lineage.storage.files as store
from lineage import duck
from index.deleted_rows import read_index
from lineage.maintenance import referenced_files

NAME = "shop.orders"
RETAIN = 6  # lineage.cdf.retention.versions of the property test's table
ZERO = _dt.timedelta(0)
BUCKETED = ["bucket(4, id)"]
FEED_NAMES = P.DATA_COLS + P.CHANGE_COLS
DELETED_NAMES = P.DATA_COLS + P.DELETED_COLS


# ---------------------------------------------------------------------------- shared helpers


@pytest.fixture(scope="module", autouse=True)
def _one_iceberg_connection():
    """Let ``assert_interop`` reuse one DuckDB database with the iceberg extension loaded.

    Loading the extension costs most of a second per connection; ``assert_interop`` opens one per
    call. It gets cursors of a shared in-memory database instead (same extension, same query).
    """
    shared = duck.connect("iceberg")

    class _Duck:
        @staticmethod
        def connect(*extensions: str):  # noqa: ANN205
            duckdb_s3.attach(shared, duck.load_extension)  # the buckets registered since (tables on S3)
            return shared.cursor()

    with pytest.MonkeyPatch.context() as mpatch:
        mpatch.setattr(conftest, "duck", _Duck)
        yield
    shared.close()


def _drop_caches() -> None:
    """Forget parsed lineage/index files, so reads after a vacuum really go to disk."""
    from index import deleted_rows, purged
    from lineage import state
    from lineage.storage import commit_log, metadata

    for cache in (metadata._SEGMENT_CACHE, metadata._LIST_CACHE, commit_log._CHUNK_CACHE, deleted_rows._CACHE, purged._CACHE):
        cache.clear()
    state.forget_planned_files()  # tables keep their current snapshot's live files in memory


def _root(t: lineage.Table) -> str:
    return t.iceberg.metadata.location.removeprefix("file://")


def _files_on_disk(t: lineage.Table) -> set[str]:
    return stored_files(_root(t))


def _assert_only_referenced_files(t: lineage.Table) -> None:
    """What is on disk is exactly what the table needs: nothing missing, nothing left over."""
    _drop_caches()
    refs = referenced_files(t)
    disk = _files_on_disk(t)
    assert not refs - disk, f"referenced files missing from disk: {sorted(refs - disk)[:5]}"
    assert not disk - refs, f"unreferenced files left after vacuum: {sorted(disk - refs)[:5]}"


def _snapshot_files(t: lineage.Table) -> tuple[list, list]:
    """(data files, delete files) of the current snapshot, from its data and delete manifests."""
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    data, deletes = [], []
    for m in snap.manifests(t.iceberg.io):
        for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
            (deletes if m.content == ManifestContent.DELETES else data).append(e.data_file)
    return data, deletes


def _deleted_paths(delete_file) -> set[str]:  # noqa: ANN001
    return set(pq.read_table(store.source(delete_file.file_path), columns=["file_path"]).column("file_path").to_pylist())


def _state(t: lineage.Table) -> dict[int, tuple]:
    """The live rows by row id: (values, created, last updated)."""
    got = t.scan().to_pylist()
    out = {r["_row_id"]: (tuple(r[c] for c in P.DATA_COLS), r["_row_created_at_version"], r["_row_last_updated_at_version"]) for r in got}
    assert len(out) == len(got), "two live rows share a row id"
    return out


def _feed(t: lineage.Table, a: int, b: int | None = None, net: bool = False) -> Counter:
    return Counter(P._canon(cdf.changes(t, a, b, net=net), FEED_NAMES))


def _deleted(t: lineage.Table, since: int | None = None, until: int | None = None) -> Counter:
    return Counter(P._canon(cdf.deleted_rows(t, since=since, until=until), DELETED_NAMES))


def _feeds(t: lineage.Table, pairs: list[tuple[int, int]]) -> dict:
    """Per-version and net feeds and deleted rows for each range (to compare before/after an operation)."""
    return {(a, b): (_feed(t, a, b), _feed(t, a, b, net=True), _deleted(t, a, b)) for a, b in pairs}


def _assert_same_feeds(before: dict, after: dict, what: str) -> None:
    for key, (per, net, dele) in before.items():
        got_per, got_net, got_del = after[key]
        assert got_per == per, f"{what}: changes{key} differs:\n  lost {sorted((per - got_per).elements(), key=repr)}\n  new {sorted((got_per - per).elements(), key=repr)}"
        assert got_net == net, f"{what}: changes{key} net differs:\n  lost {sorted((net - got_net).elements(), key=repr)}\n  new {sorted((got_net - net).elements(), key=repr)}"
        assert got_del == dele, f"{what}: deleted_rows{key} differs:\n  lost {sorted((dele - got_del).elements(), key=repr)}\n  new {sorted((got_del - dele).elements(), key=repr)}"


def _shifted(before: dict, n: int, m: int) -> dict:
    """Ranges ending at ``n`` re-keyed to end at ``m``: a maintenance commit at n+1..m adds nothing."""
    return {(a, m if b == n else b): v for (a, b), v in before.items()}


def _assert_no_events(t: lineage.Table, a: int, b: int) -> None:
    assert cdf.changes(t, a, b).num_rows == 0, f"maintenance versions ({a}, {b}] produced change events"
    assert cdf.changes(t, a, b, net=True).num_rows == 0
    assert cdf.deleted_rows(t, since=a, until=b).num_rows == 0


def _assert_partitions_hold(t: lineage.Table) -> None:
    """Every row of every data file of a ``bucket(4, id)`` table sits in its file's partition."""
    bucket = BucketTransform(4).transform(LongType())
    data, _ = _snapshot_files(t)
    for f in data:
        ids = pq.read_table(store.source(f.file_path), columns=["id"]).column("id").to_pylist()
        assert {bucket(i) for i in ids} <= {f.partition[0]}, f"{f.file_path} (partition {f.partition}) holds ids {ids}"


def _create(warehouse: str | Lake, partition_by: list[str] | None = None, **props: str) -> lineage.Table:
    where = warehouse.where() if isinstance(warehouse, Lake) else {"warehouse": warehouse}
    return lineage.create_table(NAME, P.SCHEMA, key=["id"], partition_by=partition_by, properties=props, **where)


def _rows(start: int, n: int, qty: int = 1) -> pa.Table:
    return P._batch([(k, qty, "a" if k % 2 else "b", float(k % 7) / 2) for k in range(start, start + n)])


def _maintenance_version(t: lineage.Table, res, model: P.Model, operation: str) -> None:  # noqa: ANN001
    """Record a maintenance commit in the model: a version whose state is the previous one."""
    t.refresh()
    if res.version is None:
        assert t.version == model.version, f"{res} committed nothing but the version moved"
        return
    assert res.version == model.version + 1 == t.version, f"{res} after version {model.version}"
    last = t.history()[-1]
    assert (last.version, last.operation) == (res.version, operation)
    assert (last.inserted, last.updated, last.deleted) == (0, 0, 0)
    model.states.append(dict(model.states[-1]))
    model.ts.append(last.timestamp)


# ---------------------------------------------------------------------------- 1. the property

MAINTENANCE = ["compact", "compact", "rewrite_deletes", "rewrite_deletes", "expire", "vacuum", "rehome", "expire+rehome"]
TARGETS = [None, 1, 2500, 1 << 30]  # table default (512 MiB: merge everything small), rewrite files one by one, mixed, merge all


def _maintain(data: st.DataObject, t: lineage.Table, model: P.Model) -> None:
    kind = data.draw(st.sampled_from(MAINTENANCE), label="maintenance")
    if kind == "expire+rehome":  # re-homing needs pinned files that no retained snapshot references any more
        _maintenance_op(data, t, model, "expire", retain_last=1)
        kind = "rehome"
    _maintenance_op(data, t, model, kind)


def _maintenance_op(data: st.DataObject, t: lineage.Table, model: P.Model, kind: str, retain_last: int | None = None) -> None:
    v = model.version
    if kind == "compact":
        target = data.draw(st.sampled_from(TARGETS), label="target_file_size_bytes")
        res = t.compact(target_file_size_bytes=target)
        _maintenance_version(t, res, model, "compact")
        desc = f"compact(target={target})"
    elif kind == "rewrite_deletes":
        gran = data.draw(st.sampled_from([None, "partition"]), label="granularity")
        res = t.rewrite_deletes(gran)
        _maintenance_version(t, res, model, "rewrite-deletes")
        desc = f"rewrite_deletes({gran})"
    elif kind == "expire":
        keep = retain_last or data.draw(st.integers(1, 3), label="retain_last")
        res = t.expire_snapshots(retain_last=keep)
        _maintenance_version(t, res, model, "expire")
        desc = f"expire_snapshots(retain_last={keep})"
    elif kind == "vacuum":
        res = t.vacuum(older_than=ZERO)
        _maintenance_version(t, res, model, "vacuum")
        _assert_only_referenced_files(t)
        desc = "vacuum(0)"
    else:
        res = t.rehome(max_live_fraction=0.5)
        _maintenance_version(t, res, model, "rehome")
        desc = "rehome(0.5)"
    note(f"v{v}: {desc} -> {res.version} {res.detail.splitlines()[0] if res.detail else ''}")
    committed = res.version is not None
    event(f"maintenance: {kind}" + ("" if kind in ("expire", "vacuum") else " committed" if committed else " (nothing to do)"))
    model.ops.append(desc)
    _drop_caches()
    assert _state(t) == model.states[-1], f"scan after {desc} differs from the model"
    assert_interop(t)
    # a range that spans the operation, starting anywhere in the retention window
    a = data.draw(st.integers(max(0, model.version - RETAIN), model.version), label="a (spanning)")
    P.check_range(t, model, a, model.version)


def _check_window(t: lineage.Table, model: P.Model, pairs: list[tuple[int, int]]) -> None:
    for a, b in pairs:
        P.check_range(t, model, a, b)


@settings(max_examples=15, **P.PROPERTY_SETTINGS)
@given(data=st.data())
def test_cdf_with_random_maintenance_matches_model(data: st.DataObject) -> None:
    _maintenance_matches_model(data, None)


@settings(max_examples=S3_PROPERTY_EXAMPLES, phases=S3_PHASES, **P.PROPERTY_SETTINGS)
@given(data=st.data())
def test_cdf_with_random_maintenance_matches_model_on_s3(moto_server, data: st.DataObject) -> None:  # noqa: ANN001
    _maintenance_matches_model(data, moto_server)


def _maintenance_matches_model(data: st.DataObject, server) -> None:  # noqa: ANN001
    partition_by = data.draw(st.sampled_from([None, None, BUCKETED]), label="partition_by")
    capture = data.draw(st.booleans(), label="capture pre-images")  # captured values must survive every operation too
    event("pre-image capture" if capture else "pointers only")
    with temp_lake(server, "maint-prop-") as lake:
        t = _create(lake, partition_by, **{"lineage.cdf.retention.versions": str(RETAIN), "lineage.cdf.capture-preimages": str(capture).lower()})
        model = P.Model()
        steps = data.draw(st.integers(6, 14), label="steps")
        for i in range(steps):
            if i > 0 and model.live and data.draw(st.sampled_from([False, False, True]), label="maintenance?"):
                _maintain(data, t, model)
            else:
                P._step(data, t, model, first=i == 0)
        n = model.version
        oldest = max(0, n - RETAIN)
        note(f"versions 0..{n}, window starts at {oldest}; ops {model.ops}")
        if partition_by:
            _assert_partitions_hold(t)
        pairs = {(oldest, n), (n, n)}
        if n > oldest:
            v = data.draw(st.integers(oldest + 1, n), label="single version")
            pairs.add((v - 1, v))
        a = data.draw(st.integers(oldest, n), label="a")
        pairs.add((a, data.draw(st.integers(a, n), label="b")))
        pairs = sorted(pairs)
        early = data.draw(st.integers(0, oldest - 1), label="a before the window") if oldest > 0 else None

        def refused() -> None:  # a range starting before the window: RetentionError, never FileNotFoundError
            if early is None:
                return
            for call in (lambda: cdf.changes(t, early), lambda: cdf.changes(t, early, n, net=True), lambda: cdf.deleted_rows(t, since=early)):
                with pytest.raises(lineage.RetentionError, match=f"oldest available version is {oldest}"):
                    call()

        _check_window(t, model, pairs)
        refused()
        # expire everything but the current snapshot and vacuum: the window still answers the same
        t.expire_snapshots(retain_last=1)
        t.vacuum(older_than=ZERO)
        _assert_only_referenced_files(t)
        assert _state(t) == model.states[-1]
        assert_interop(t)
        _check_window(t, model, pairs)
        refused()


# ---------------------------------------------------------------------------- 2. unit tests per operation


def _busy_table(warehouse: str, partition_by: list[str] | None, **props: str) -> tuple[lineage.Table, P.Model]:
    """Several small files, merge-on-read and copy-on-write updates and deletes; a model of every version."""
    t = _create(warehouse, partition_by, **props)
    model = P.Model()

    def commit(ci: lineage.CommitInfo) -> None:
        assert ci.committed
        model.states.append(_state(t))
        model.ts.append(ci.timestamp)

    commit(t.append(_rows(1, 12)))  # 1
    commit(t.append(_rows(13, 6, qty=2)))  # 2
    commit(t.append(_rows(19, 6, qty=3)))  # 3
    commit(t.update("id % 4 = 1", {"qty": "qty + 10"}))  # 4 MoR
    commit(t.delete("id IN (2, 14, 20)"))  # 5 MoR
    commit(t.update("id IN (3, 15)", {"name": "'z'"}, mode="copy-on-write"))  # 6 CoW
    commit(t.update("id = 1", {"amount": "amount + 1"}))  # 7 MoR again on a row updated at 4
    commit(t.delete("id IN (7, 21)", mode="copy-on-write"))  # 8 CoW
    commit(t.upsert(P._batch([(4, 9, "u", 9.5), (40, 1, None, None)])))  # 9 MoR upsert
    return t, model


def _spanning(lo: int, n: int) -> list[tuple[int, int]]:
    """A few ranges ending at ``n`` (the per-version feed from ``lo`` holds every event of the others)."""
    return sorted({(lo, n), ((lo + n) // 2, n), (n - 1, n)})


@pytest.mark.parametrize("partition_by", [None, BUCKETED], ids=["unpartitioned", "bucketed"])
def test_compaction_keeps_lineage_and_feed(warehouse, partition_by) -> None:
    t, model = _busy_table(warehouse, partition_by)
    n = t.version
    lineage_before = _state(t)
    pairs = _spanning(0, n)
    before = _feeds(t, pairs)
    data_before, deletes_before = _snapshot_files(t)
    assert deletes_before, "the setup must leave position delete files"

    res = t.compact()
    assert res.version == n + 1 and t.version == n + 1
    assert [(h.version, h.operation) for h in t.history()][-1] == (n + 1, "compact")
    data_after, deletes_after = _snapshot_files(t)
    assert len(data_after) < len(data_before), (len(data_before), len(data_after))
    live = {f.file_path for f in data_after}
    assert not [d for d in deletes_after if _deleted_paths(d) & live], "compaction merged every delete into the data"
    removed_data = {f.file_path for f in data_before} - live
    assert res.files_removed == len(removed_data) + len(deletes_before) - len(deletes_after)
    # surviving rows keep _row_id, created and updated; nothing else changed
    assert _state(t) == lineage_before
    # new files keep the data sequence number of the snapshot compaction started from (documented choice)
    snap = t.iceberg.metadata.current_snapshot()
    added = [e for m in snap.manifests(t.iceberg.io) for e in m.fetch_manifest_entry(t.iceberg.io)
             if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id]
    assert added and {e.sequence_number for e in added} == {n}
    # the feed over every range spanning the compaction is what it was; the compaction itself is silent
    _assert_no_events(t, n, n + 1)
    _assert_same_feeds(_shifted(before, n, n + 1), _feeds(t, [(a, n + 1 if b == n else b) for a, b in pairs]), "after compact")
    model.states.append(model.states[-1])
    model.ts.append(t.history()[-1].timestamp)
    P.check_range(t, model, 0, n + 1)  # and it is the model's (the compaction is a version without changes)
    assert_interop(t)
    if partition_by:
        _assert_partitions_hold(t)

    # more deletes, then a compaction with a tiny target: files with deletes are rewritten one by one
    ci = t.delete("id IN (5, 17)")
    model.states.append(_state(t))
    model.ts.append(ci.timestamp)
    before_lineage = _state(t)
    data_before, _ = _snapshot_files(t)
    res = t.compact(target_file_size_bytes=1)
    assert res.version == n + 3
    data_after, deletes_after = _snapshot_files(t)
    assert not [d for d in deletes_after if _deleted_paths(d) & {f.file_path for f in data_after}]
    assert len(data_after) == len(data_before)
    assert _state(t) == before_lineage
    _assert_no_events(t, n + 2, n + 3)
    model.states.append(model.states[-1])
    model.ts.append(t.history()[-1].timestamp)
    P.check_range(t, model, n + 1, n + 3)
    assert t.compact().version is None, "nothing left to compact"
    assert_interop(t)


@pytest.mark.parametrize("partition_by", [None, BUCKETED], ids=["unpartitioned", "bucketed"])
def test_rewrite_deletes_merges_delete_files_and_drops_dangling_ones(warehouse, partition_by) -> None:
    t = _create(warehouse, partition_by, **{"lineage.write.delete.merge": "false"})  # each delete its own file
    t.append(_rows(1, 10))
    t.append(_rows(11, 10))
    for where in ("id = 1", "id = 2", "id IN (3, 11)", "id = 12", "id = 4"):  # several delete files per data file
        t.delete(where)
    t.update("id IN (5, 13)", {"qty": "qty + 1"})
    data_before, deletes_before = _snapshot_files(t)
    targets = {p for d in deletes_before for p in _deleted_paths(d)}
    assert len(deletes_before) > len(targets), "the setup must stack delete files"
    lineage_before = _state(t)
    n = t.version
    before = _feeds(t, _spanning(0, n))

    res = t.rewrite_deletes()
    assert res.version == n + 1 and t.history()[-1].operation == "rewrite-deletes"
    data_after, deletes_after = _snapshot_files(t)
    assert {f.file_path for f in data_after} == {f.file_path for f in data_before}, "no data file may be rewritten"
    assert len(deletes_after) == len(targets), "one delete file per data file with deletes"
    assert all(len(_deleted_paths(d)) == 1 for d in deletes_after)
    assert {p for d in deletes_after for p in _deleted_paths(d)} == targets
    gone = {d.file_path for d in deletes_before} - {d.file_path for d in deletes_after}
    new = {d.file_path for d in deletes_after} - {d.file_path for d in deletes_before}
    assert (res.files_removed, res.files_added) == (len(gone), len(new))
    assert _state(t) == lineage_before
    _assert_no_events(t, n, n + 1)
    _assert_same_feeds(_shifted(before, n, n + 1), _feeds(t, [(a, n + 1 if b == n else b) for a, b in _spanning(0, n)]), "after rewrite_deletes")
    assert t.rewrite_deletes().version is None, "already one delete file per data file"
    assert_interop(t)

    # copy-on-write rewrites the data files; the delete files that pointed at them are left dangling
    t.update("id >= 1", {"amount": "coalesce(amount, 0) + 1"}, mode="copy-on-write")
    data_now, deletes_now = _snapshot_files(t)
    live = {f.file_path for f in data_now}
    dangling = [d for d in deletes_now if not _deleted_paths(d) & live]
    lineage_before = _state(t)
    m = t.version
    res = t.rewrite_deletes()
    _, deletes_after = _snapshot_files(t)
    assert dangling, "copy-on-write leaves the delete files of the files it rewrote (README, Known limitations)"
    assert res.version == m + 1
    assert all(_deleted_paths(d) <= live for d in deletes_after), "a delete file still points at a removed data file"
    assert len(deletes_after) <= len({p for d in deletes_after for p in _deleted_paths(d)})
    assert _state(t) == lineage_before
    _assert_no_events(t, m, t.version)
    assert_interop(t)

    if partition_by:  # per-partition granularity: one delete file per partition
        t.delete("id IN (1, 2, 3, 4, 5, 6, 7, 8)")
        t.delete("id IN (11, 12, 13, 14, 15, 16)")
        res = t.rewrite_deletes("partition")
        data_now, deletes_after = _snapshot_files(t)
        parts = {tuple(d.partition) for d in deletes_after}
        assert len(parts) == len(deletes_after), "more than one delete file in a partition"
        deleted_files = {p for d in deletes_after for p in _deleted_paths(d)}
        assert deleted_files <= {f.file_path for f in data_now}
        assert_interop(t)
        _assert_partitions_hold(t)


def test_expire_and_vacuum_keep_the_window_and_refuse_older_ranges(warehouse) -> None:
    t, model = _busy_table(warehouse, None, **{"lineage.cdf.retention.versions": "3"})
    n = t.version  # 9
    oldest = n - 3
    pairs = [(oldest, n), (oldest, oldest + 1), (oldest + 1, n), (n - 1, n)]
    before = _feeds(t, pairs)
    default_deleted = _deleted(t)

    res = t.expire_snapshots(retain_last=1)
    assert res.version is None and t.version == n
    assert len(t.iceberg.metadata.snapshots) == 1
    with pytest.raises(lineage.UnknownVersionError):
        t.scan(as_of=n - 1)
    disk_before = _files_on_disk(t)
    res = t.vacuum(older_than=ZERO)
    assert res.files_removed > 0 and res.bytes_removed > 0
    disk_after = _files_on_disk(t)
    assert len(disk_before - disk_after) == res.files_removed and not disk_after - disk_before
    _assert_only_referenced_files(t)
    # what the window still needs is there: index segments of commits in the window and the files they point at
    for c in t.state().lineage.commits:
        if c.version > oldest and c.index:
            assert os.path.exists(c.index)
    _assert_same_feeds(before, _feeds(t, pairs), "after expire + vacuum")
    assert _deleted(t) == default_deleted
    P.check_range(t, model, oldest, n)
    for a in range(oldest):
        for call in (lambda: cdf.changes(t, a), lambda: cdf.changes(t, a, oldest + 1, net=True), lambda: cdf.deleted_rows(t, since=a)):
            with pytest.raises(lineage.RetentionError, match=f"oldest available version is {oldest}"):
                call()
    with pytest.raises(lineage.RetentionError):
        cdf.changes(t, from_timestamp=model.ts[1])
    assert_interop(t)

    # the table goes on: new writes, the window moves, vacuum again
    ci = t.update("id = 9", {"qty": "CAST(NULL AS BIGINT)"})
    model.states.append(_state(t))
    model.ts.append(ci.timestamp)
    t.expire_snapshots(retain_last=1)
    t.vacuum(older_than=ZERO)
    _assert_only_referenced_files(t)
    P.check_range(t, model, n + 1 - 3, n + 1)
    with pytest.raises(lineage.RetentionError):
        cdf.changes(t, n - 3)
    assert_interop(t)


@pytest.mark.parametrize("partition_by", [None, BUCKETED], ids=["unpartitioned", "bucketed"])
def test_rehome_releases_sparse_pinned_files(warehouse, partition_by) -> None:
    t = _create(warehouse, partition_by)
    model = P.Model()

    def commit(ci) -> None:  # noqa: ANN001
        model.states.append(_state(t))
        model.ts.append(ci.timestamp if isinstance(ci, lineage.CommitInfo) else t.history()[-1].timestamp)

    commit(t.append(_rows(1, 400)))  # 1: one big file (per partition)
    big = {f.file_path for f in _snapshot_files(t)[0]}
    commit(t.append(_rows(1001, 2)))  # 2: a small file whose rows will all be needed
    small = {f.file_path for f in _snapshot_files(t)[0]} - big
    commit(t.delete("id IN (10, 20, 30, 1001)"))  # 3
    commit(t.update("id IN (40, 50, 1002)", {"name": "'r'"}))  # 4
    commit(t.compact())  # 5: the big and the small files leave the snapshot, still pinned by the index
    commit(t.append(_rows(2001, 3)))  # 6
    n = t.version
    assert n == 6
    t.expire_snapshots(retain_last=1)
    # the big files holding removed images (ids 10..50) are pinned; in a bucketed table other big files are not
    big = {p for p in big if {10, 20, 30, 40, 50} & set(pq.read_table(p, columns=["id"]).column("id").to_pylist())}
    _drop_caches()
    refs = referenced_files(t)
    assert big | small <= refs, "pinned files must be kept while the window needs them"
    pairs = _spanning(0, n)
    before = _feeds(t, pairs)

    res = t.rehome(max_live_fraction=0.5)
    assert res.version == n + 1 and t.history()[-1].operation == "rehome"
    assert res.files_added == 1
    commit(res)
    archives = [p for p in _files_on_disk(t) if os.path.basename(p).startswith("archive-")]
    assert len(archives) == 1
    _drop_caches()
    refs = referenced_files(t)
    assert not big & refs, "a big file with few needed images stays pinned after re-homing"
    assert small <= refs, "a file whose rows are all needed is not worth re-homing"
    assert archives[0] in refs
    t.vacuum(older_than=ZERO)
    on_disk = _files_on_disk(t)
    assert not big & on_disk and small <= on_disk
    _assert_only_referenced_files(t)
    _assert_no_events(t, n, n + 1)
    _assert_same_feeds(_shifted(before, n, n + 1), _feeds(t, [(a, n + 1 if b == n else b) for a, b in pairs]), "after rehome + vacuum")
    P.check_range(t, model, 0, n + 1)
    assert t.rehome(max_live_fraction=0.5).version is None
    assert_interop(t)


# ---------------------------------------------------------------------------- 3. purge

PURGE_SCHEMA = pa.schema([("id", pa.int64()), ("email", pa.string()), ("note", pa.string()), ("balance", pa.float64()), ("pin", pa.int64())])
PURGE_COLS = PURGE_SCHEMA.names
# Every value the purged row (id 3) ever had; short (no truncated bounds) and at both ends of the sort order.
EMAILS_3 = ["aaa-p3-v1@x.io", "zzz-p3-v2@x.io", "mmm-p3-v3@x.io", "aab-p3-v4@x.io"]
NOTES_3 = ["p3-note-secret1", "p3-note-secret2"]
BALANCES_3 = [31337.25, 31338.5]
PINS_3 = [7373731, 7373732]


def _purge_batch(rows: list[tuple]) -> pa.Table:
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(PURGE_COLS)}, schema=PURGE_SCHEMA)


def _people(lo: int, hi: int) -> list[tuple]:
    out = []
    for i in range(lo, hi):
        if i == 3:
            out.append((3, EMAILS_3[0], NOTES_3[0], BALANCES_3[0], PINS_3[0]))
        else:
            out.append((i, f"user{i}@mail.test", f"note {i}", float(i), 1000 + i))
    return out


def _find_values(root: str) -> dict[str, list]:
    """Which of the purged row's values any file under ``root`` holds (file -> values found)."""
    strings = EMAILS_3 + NOTES_3
    raw = [s.encode() for s in strings] + [struct.pack("<d", b) for b in BALANCES_3] + [struct.pack("<q", p) for p in PINS_3]
    scalars = set(strings) | set(BALANCES_3) | set(PINS_3)
    found: dict[str, list] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as fh:
                blob = fh.read()
            hits: list = [r for r in raw if r in blob]
            if name.endswith(".parquet"):
                pf = pq.ParquetFile(path)
                table = pf.read()
                for col in table.column_names:
                    values = table.column(col).to_pylist()
                    flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
                    hits += [v for v in flat if isinstance(v, (str, float, int)) and not isinstance(v, bool) and v in scalars]
                    if col in ("id", "value.1") and "deletes" not in name:  # data files, archives, captured values: the purged key is gone too
                        hits += [("id", v) for v in flat if v == 3]
                meta = pf.metadata
                for rg in range(meta.num_row_groups):
                    for c in range(meta.num_columns):
                        stats = meta.row_group(rg).column(c).statistics
                        if stats is not None and stats.has_min_max:
                            hits += [("stats", v) for v in (stats.min, stats.max) if isinstance(v, (str, float, int)) and v in scalars]
            if hits:
                found[path] = hits
    return found


def _purge_history(t: lineage.Table, before_purge: str) -> None:
    t.append(_purge_batch(_people(1, 9)))  # 1
    t.append(_purge_batch(_people(9, 13)))  # 2
    t.update("id = 3", {"email": f"'{EMAILS_3[1]}'", "note": f"'{NOTES_3[1]}'"})  # 3 merge-on-read
    t.update("id = 3", {"email": f"'{EMAILS_3[2]}'", "pin": str(PINS_3[1])}, mode="copy-on-write")  # 4
    t.delete("id = 5")  # 5
    t.update("id IN (2, 3)", {"balance": f"CASE WHEN id = 3 THEN {BALANCES_3[1]} ELSE balance + 1 END"})  # 6
    t.compact()  # 7
    t.update("id = 3", {"email": f"'{EMAILS_3[3]}'"})  # 8
    t.delete("id = 10", mode="copy-on-write")  # 9
    if before_purge == "archived":  # images of row 3 copied into an archive owned by the index
        t.expire_snapshots(retain_last=1)
        t.vacuum(older_than=ZERO)
        assert t.rehome(max_live_fraction=0.5).version == 10, "the setup needs an archive holding images of row 3"
        t.vacuum(older_than=ZERO)
    elif before_purge == "expired":  # old snapshots expired, files not vacuumed yet
        t.expire_snapshots(retain_last=1)


PURGE_SETUPS = [
    "plain",
    "archived",
    "expired",
    "captured",  # pre-image capture: the index segments hold row 3's old values
    "captured-expired",
]


@pytest.mark.parametrize("before_purge", PURGE_SETUPS)
def test_purge_erases_every_value_from_every_file(warehouse, before_purge) -> None:
    capture = before_purge.startswith("captured")
    t = lineage.create_table("crm.people", PURGE_SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"write.avro.compression-codec": "null", "lineage.cdf.capture-preimages": str(capture).lower()})
    _purge_history(t, before_purge.removeprefix("captured-") if capture else before_purge)
    if capture:
        segments = [c.index for c in t.state().lineage.commits if c.index]
        assert segments and all(read_index(t.iceberg.io, s).captured for s in segments), "every index segment captured its values"
    n = t.version
    root = _root(t)
    rid3 = t.scan("id = 3").column("_row_id")[0].as_py()
    found = _find_values(root)
    seen = {v for hits in found.values() for v in hits}
    for needle in EMAILS_3 + NOTES_3:  # the detector works: before the purge every value is somewhere
        assert needle in seen or needle.encode() in seen, f"{needle} not found before the purge: the check would prove nothing"
    if before_purge == "archived":
        assert any(os.path.basename(p).startswith("archive-") for p in found), "an archive holds row 3 before the purge"
    assert any(p.endswith(".avro") for p in found), "manifest bounds hold row 3's values before the purge"
    starts = [0, 1, 2, 4, 7, n]  # before / after each image of row 3 (written at 1, 3, 4, 6, 8)
    feeds_before = {a: P._canon(cdf.changes(t, a), PURGE_COLS + P.CHANGE_COLS) for a in starts}
    net_before = {a: P._canon(cdf.changes(t, a, net=True), PURGE_COLS + P.CHANGE_COLS) for a in starts}
    deleted_before = P._canon(cdf.deleted_rows(t), PURGE_COLS + P.DELETED_COLS)
    live_before = {r["_row_id"]: r for r in t.scan().to_pylist()}
    image3 = live_before[rid3]

    res = t.purge("id = 3")
    p = n + 1
    assert res.version == p and t.version == p and t.history()[-1].operation == "purge"
    assert (t.history()[-1].deleted, t.history()[-1].inserted, t.history()[-1].updated) == (1, 0, 0)

    # 1. no file under the warehouse holds any value row 3 ever had
    leftovers = _find_values(os.path.dirname(os.path.dirname(root)))
    assert not leftovers, f"purged values still on disk: {leftovers}"

    # 2. the table: row 3 gone, every other row untouched (values and lineage)
    live_after = {r["_row_id"]: r for r in t.scan().to_pylist()}
    assert live_after == {k: v for k, v in live_before.items() if k != rid3}
    assert_interop(t)

    # 3. the feed: every range; row 3's images keep row id and lineage, data null, _purged; others as before
    ts_p = t.history()[-1].timestamp
    purged_delete = (None,) * len(PURGE_COLS) + ("delete", p, ts_p, rid3, image3["_row_created_at_version"],
                                                  image3["_row_last_updated_at_version"], None, True)
    names = PURGE_COLS + P.CHANGE_COLS + ["_purged"]
    k_rid, k_changed = len(PURGE_COLS) + 3, len(PURGE_COLS) + 6

    def erased(rows: list[tuple]) -> Counter:
        out = []
        for r in rows:
            if r[k_rid] == rid3:
                r = (None,) * len(PURGE_COLS) + r[len(PURGE_COLS):k_changed] + ("?" if r[k_changed] is not None else None, True)
            else:
                r = r + (False,)
            out.append(r)
        return Counter(out)

    def canon(tbl: pa.Table) -> Counter:
        rows = P._canon(tbl, names)
        for r in rows:
            if r[k_rid] == rid3:
                assert r[-1] is True and all(v is None for v in r[: len(PURGE_COLS)]), f"a purged image reveals values: {r}"
            else:
                assert r[-1] is False, r
        return erased([r[:-1] for r in rows])  # (re-flags; _changed_columns of erased images is not compared)

    writes_of_3 = [1, 3, 4, 6, 8]  # the versions that wrote an image of row 3
    assert (image3["_row_created_at_version"], image3["_row_last_updated_at_version"]) == (1, 8)
    for a in starts + [p]:
        got = canon(cdf.changes(t, a))
        want = erased(feeds_before.get(a, [])) + (Counter([purged_delete]) if a < p else Counter())
        assert got == want, f"changes({a}) after the purge:\n  missing {sorted((want - got).elements(), key=repr)}\n  extra {sorted((got - want).elements(), key=repr)}"
        got_net = canon(cdf.changes(t, a, net=True))
        want_net = erased([r for r in net_before.get(a, []) if r[k_rid] != rid3])
        if 1 <= a < p:  # row 3 existed at a: one delete at the purge, with its (erased) image at a
            want_net[(None,) * len(PURGE_COLS) + ("delete", p, ts_p, rid3, 1, max(u for u in writes_of_3 if u <= a), None, True)] += 1
        assert got_net == want_net, f"changes({a}, net=True) after the purge:\n  missing {sorted((want_net - got_net).elements(), key=repr)}\n  extra {sorted((got_net - want_net).elements(), key=repr)}"
        for net in (False, True):  # streamed in parts of two rows: the same erased rows, the same schema
            assert cdf.change_batches(t, a, net=net, batch_rows=2).read_all().equals(cdf.changes(t, a, net=net)), (a, net)
    for v in range(1, p + 1):  # single versions: never a value of row 3 either
        canon(cdf.changes(t, v - 1, v))
    deleted_after = P._canon(cdf.deleted_rows(t), PURGE_COLS + P.DELETED_COLS + ["_purged"])
    k = len(PURGE_COLS)
    assert Counter(deleted_after) == Counter(
        [r + (False,) for r in deleted_before]
        + [(None,) * k + (p, ts_p, rid3, image3["_row_created_at_version"], image3["_row_last_updated_at_version"], True)]
    )
    assert t.purge("id = 3").version is None, "nothing left to purge"


def test_vacuum_after_purge_keeps_the_change_feed(warehouse) -> None:
    t = _create(warehouse)
    t.append(_rows(1, 4))
    t.update("id = 2", {"name": "'secret'"})
    rid = t.scan("id = 2").column("_row_id")[0].as_py()
    t.purge("id = 2")

    def feed() -> Counter:
        return Counter(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in r.items()) for r in cdf.changes(t, 0).to_pylist())

    before = feed()
    _drop_caches()
    t.vacuum(older_than=ZERO)
    _drop_caches()
    assert referenced_files(t) == _files_on_disk(t)
    assert feed() == before  # raises LineageMetadataError: purged-rows file ... is missing
    assert rid in cdf.deleted_rows(t).column("_row_id").to_pylist()


def test_purge_on_a_bucketed_table(warehouse) -> None:
    t = _create(warehouse, BUCKETED)
    t.append(_rows(1, 12))
    t.update("id = 3", {"name": "'secret-3'"})
    before = _state(t)
    rid = t.scan("id = 3").column("_row_id")[0].as_py()
    res = t.purge("id = 3")
    assert res.version == 3
    assert _state(t) == {k: v for k, v in before.items() if k != rid}
    rows3 = [r for r in cdf.changes(t, 0).to_pylist() if r["_row_id"] == rid]
    assert [r["_change_type"] for r in rows3] == ["insert", "update_preimage", "update_postimage", "delete"]
    assert all(r["_purged"] and r["id"] is None and r["name"] is None for r in rows3)
    assert not _find_strings(_root(t), ["secret-3"])
    _assert_partitions_hold(t)
    assert_interop(t)


def _find_strings(root: str, needles: list[str]) -> list[str]:
    hits = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as fh:
                blob = fh.read()
            if any(n.encode() in blob for n in needles):
                hits.append(path)
            elif name.endswith(".parquet"):
                for col in pq.read_table(path).columns:
                    if any(isinstance(v, str) and v in needles for v in col.to_pylist()):
                        hits.append(path)
    return hits


# ---------------------------------------------------------------------------- 4. safety: concurrent writers


def _writer_ops() -> list[tuple]:
    """Twelve writes, merge-on-read and copy-on-write, on the keys 1..40 the parent appended (and new ones)."""
    ops: list[tuple] = []
    for i in range(12):
        mode = lineage.COPY_ON_WRITE if i % 4 == 3 or i == 5 else None
        kind = i % 4
        if kind == 0:
            ops.append(("append", [(200 + 3 * i + j, 1, "n", 0.5) for j in range(3)], None))
        elif kind == 1:
            ops.append(("update", i % 5, mode))  # qty = coalesce(qty, 0) + 1 where id % 5 = i % 5
        elif kind == 2:
            ops.append(("delete", 3 * i + 1, mode))
        else:
            ops.append(("upsert", [(i, 7, "u", 1.5), (100 + i, 1, "v", 2.5)], mode))
    return ops


def _apply_op(t: lineage.Table, op: tuple) -> lineage.CommitInfo:
    kind, arg, mode = op
    if kind == "append":
        return t.append(P._batch(arg))
    if kind == "update":
        return t.update(f"id % 5 = {arg}", {"qty": "coalesce(qty, 0) + 1"}, mode=mode)
    if kind == "delete":
        return t.delete(f"id = {arg}", mode=mode)
    return t.upsert(P._batch(arg), mode=mode)


def _replay(live: dict[int, tuple], op: tuple) -> tuple[dict[int, tuple], set[int]]:
    """The op in plain Python: new {key: values} and the keys it wrote."""
    kind, arg, _ = op
    live = dict(live)
    if kind in ("append", "upsert"):
        for r in arg:
            live[r[0]] = tuple(r)
        return live, {r[0] for r in arg}
    if kind == "update":
        hit = {k for k in live if k % 5 == arg}
        for k in hit:
            v = live[k]
            live[k] = (v[0], (v[1] or 0) + 1, v[2], v[3])
        return live, hit
    live.pop(arg)
    return live, set()


def _writer_proc(warehouse: str, barrier, done, results, maintained) -> None:  # noqa: ANN001
    try:
        t = lineage.open_table(NAME, warehouse=warehouse)
        barrier.wait(timeout=120)
        log = []
        ops = _writer_ops()
        for i, op in enumerate(ops):
            if i == len(ops) // 2:  # on a loaded machine the writes could all land before maintenance commits once
                maintained.wait(timeout=60)
            ci = _apply_op(t, op)
            # maintenance never changes rows, so the current scan is the state this commit made
            log.append((ci.committed, ci.version, ci.timestamp, ci.attempts, _state(t)))
        results.put(("ok", "writer", log))
    except BaseException:  # noqa: BLE001
        results.put(("error", "writer", traceback.format_exc()))
    finally:
        done.set()


def _maintainer_proc(warehouse: str, barrier, done, results, maintained) -> None:  # noqa: ANN001
    try:
        rng = random.Random(7)
        t = lineage.open_table(NAME, warehouse=warehouse)
        barrier.wait(timeout=120)
        log = []
        while not done.is_set():
            kind = rng.choice(["compact", "compact-small", "rewrite-deletes", "rehome", "expire"])
            try:
                if kind == "compact":
                    res = t.compact()
                elif kind == "compact-small":
                    res = t.compact(target_file_size_bytes=1)
                elif kind == "rewrite-deletes":
                    res = t.rewrite_deletes()
                elif kind == "rehome":
                    res = t.rehome(max_live_fraction=0.5)
                else:
                    res = t.expire_snapshots(retain_last=3)
            except lineage.CommitConflictError as exc:  # refused with a clear error: allowed, nothing committed
                log.append((kind, None, str(exc)))
                continue
            log.append((kind, res.version, res.detail))
            if res.version is not None:
                maintained.set()
        results.put(("ok", "maintainer", log))
    except BaseException:  # noqa: BLE001
        results.put(("error", "maintainer", traceback.format_exc()))


def test_maintenance_concurrent_with_a_writer_loses_no_commit(warehouse) -> None:
    t = _create(warehouse)
    first = t.append(_rows(1, 40))
    initial = _state(t)
    ctx = mp.get_context("spawn")
    barrier, done, results, maintained = ctx.Barrier(2), ctx.Event(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=f, args=(warehouse, barrier, done, results, maintained), daemon=True) for f in (_writer_proc, _maintainer_proc)]
    for p in procs:
        p.start()
    out = {}
    deadline = time.monotonic() + 150
    try:
        while len(out) < 2:
            try:
                kind, who, payload = results.get(timeout=1.0)
            except queue_mod.Empty:
                assert time.monotonic() < deadline, f"workers did not finish (reported: {sorted(out)})"
                assert not [p.exitcode for p in procs if p.exitcode not in (None, 0)] or not results.empty(), "a worker died"
                continue
            assert kind == "ok", f"{who} failed:\n{payload}"
            out[who] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    writes, maint = out["writer"], out["maintainer"]
    t.refresh()
    n = t.version
    w_versions = [v for ok, v, *_ in writes]
    m_versions = [v for _, v, _ in maint if v is not None]
    assert all(ok for ok, *_ in writes), "every write must commit"
    assert m_versions, f"no maintenance commit landed: {maint}"
    assert min(m_versions) < max(w_versions), "maintenance and writes did not interleave"
    assert sorted(w_versions + m_versions) == list(range(2, n + 1)), "versions must be distinct and gap-free"
    ops = {h.version: h.operation for h in t.history()}
    for kind, v, _ in maint:
        if v is not None:
            assert ops[v] == kind.removesuffix("-small")
    # the model: writer states at its versions (checked against a plain replay), maintenance versions unchanged
    model = P.Model()
    by_version = {v: (ts, state) for _, v, ts, _, state in writes}
    history = {h.version: h.timestamp for h in t.history()}
    live = {img[0][0]: img[0] for img in initial.values()}
    model.states.append(initial)
    model.ts.append(first.timestamp)
    ops_iter = iter(_writer_ops())
    for v in range(2, n + 1):
        prev = model.states[-1]
        if v not in by_version:
            model.states.append(dict(prev))
            model.ts.append(history[v])
            continue
        ts, state = by_version[v]
        live, wrote = _replay(live, next(ops_iter))
        assert {img[0][0]: img[0] for img in state.values()} == live, f"version {v}: rows differ from the replay"
        prev_by_key = {img[0][0]: (rid, img) for rid, img in prev.items()}
        for rid, (vals, created, updated) in state.items():
            k = vals[0]
            if k in prev_by_key:
                old_rid, (_, old_created, old_updated) = prev_by_key[k]
                assert (rid, created) == (old_rid, old_created), f"version {v}: key {k} lost its row id or created version"
                assert updated == (v if k in wrote else old_updated), f"version {v}: key {k} last updated {updated}"
            else:
                assert created == updated == v and rid not in {r for s in model.states for r in s}, f"version {v}: new key {k}"
        model.states.append(state)
        model.ts.append(ts)
    assert _state(t) == model.states[-1]
    assert {img[0][0]: img[0] for img in _state(t).values()} == live
    for a, b in ((0, n), (1, n), (n // 2, n)):
        P.check_range(t, model, a, b)
    assert_interop(t)


# ---------------------------------------------------------------------------- 4. safety: crashes

CHILD_OPS = {
    "compact": lambda t: t.compact(),
    "compact-small": lambda t: t.compact(target_file_size_bytes=1),
    "rewrite-deletes": lambda t: t.rewrite_deletes(),
    "purge": lambda t: t.purge("id = 3"),
}


def _crash_child(warehouse: str | Lake, name: str, op: str, kill_at: int | str | None, conn) -> None:  # noqa: ANN001
    """Run one maintenance operation; SIGKILL ourselves at the ``kill_at``-th file write / removal / catalog commit.

    ``kill_at`` is a count of events, or the name of one (``"commit"``: just before the catalog
    commit, ``"committed"``: just after it), or a tuple of both (whichever comes first), or None
    (the parent kills us after a random delay).
    """
    try:
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.io.pyarrow import PyArrowFileIO

        t = lineage.open_table(name, **(warehouse.where() if isinstance(warehouse, Lake) else {"warehouse": warehouse}))
        events: list[str] = []

        def tick(what: str) -> None:
            events.append(what)
            points = kill_at if isinstance(kill_at, tuple) else (kill_at,)
            if len(events) in points or what in points:
                os.kill(os.getpid(), signal.SIGKILL)

        from lineage import catalog

        new_output, remove, commit_table = PyArrowFileIO.new_output, os.remove, SqlCatalog.commit_table
        swap_metadata = catalog.swap_metadata

        def hooked_output(self, location: str):  # noqa: ANN001, ANN202
            tick("write")
            return new_output(self, location)

        def hooked_remove(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            tick("remove")
            return remove(path, *args, **kwargs)

        def hooked_commit(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            tick("commit")
            out = commit_table(self, *args, **kwargs)
            tick("committed")
            return out

        def hooked_metadata(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            tick("commit")  # the library commits to a SqlCatalog itself (lineage.catalog.swap_metadata)
            out = swap_metadata(*args, **kwargs)
            tick("committed")
            return out

        PyArrowFileIO.new_output, os.remove, SqlCatalog.commit_table = hooked_output, hooked_remove, hooked_commit
        catalog.swap_metadata = hooked_metadata
        conn.send("ready")
        CHILD_OPS[op](t)
        conn.send(("done", events))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))


def _forkserver():  # noqa: ANN202
    """Children forked from a server that has imported everything already (a spawn would cost seconds each)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["test_maintenance"])
    return ctx


def _run_killed(ctx, warehouse: str | Lake, name: str, op: str, kill_at: int | str | None = None, delay: float | None = None) -> str:  # noqa: ANN001
    """Run ``op`` in a child process that is SIGKILLed at an event or after ``delay`` seconds: 'killed' or 'finished'."""
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_crash_child, args=(warehouse, name, op, kill_at, child), daemon=True)
    p.start()
    try:
        assert parent.poll(90), "the child did not start"
        msg = parent.recv()
        assert msg == "ready", msg
        if delay is not None:
            time.sleep(delay)
            p.kill()
        p.join(90)
        assert not p.is_alive(), "the child hung"
    finally:
        if p.is_alive():
            p.kill()
            p.join()
    if p.exitcode == -signal.SIGKILL:
        return "killed"
    msg = parent.recv() if parent.poll(5) else ("error", f"exit code {p.exitcode}")
    assert msg[0] == "done", f"the child failed:\n{msg[1]}"
    return "finished"


def test_crash_during_compaction_leaves_a_readable_table(lake) -> None:
    warehouse = lake if lake.kind == "s3" else lake.root
    t = _create(warehouse)
    model = P.Model()
    rng = random.Random(11)

    def commit(ci: lineage.CommitInfo) -> None:
        assert ci.committed
        model.states.append(_state(t))
        model.ts.append(ci.timestamp)

    commit(t.append(_rows(1, 30)))
    ctx = _forkserver()
    outcomes = []
    for trial in range(4):
        commit(t.update(f"id % 5 = {trial}", {"qty": "coalesce(qty, 0) + 1"}))
        commit(t.delete(f"id = {6 * trial + 2}"))
        commit(t.append(_rows(100 + 10 * trial, 2)))
        op = ("compact", "rewrite-deletes", "compact-small")[trial % 3]
        if trial % 2:  # killed from outside at a random moment
            outcome = _run_killed(ctx, warehouse, NAME, op, delay=rng.uniform(0.0, 0.6))
        else:  # killed at a random file write / catalog commit (a compaction makes about 13 such events)
            outcome = _run_killed(ctx, warehouse, NAME, op, kill_at=rng.randint(1, 13))
        t.refresh()
        committed = t.version == model.version + 1
        if committed:
            assert t.history()[-1].operation == op.removesuffix("-small")
            model.states.append(dict(model.states[-1]))
            model.ts.append(t.history()[-1].timestamp)
        else:
            assert t.version == model.version, f"trial {trial}: version {t.version} after {model.version}"
        outcomes.append((op, outcome, committed))
        _drop_caches()
        assert _state(t) == model.states[-1], f"trial {trial} ({op}, {outcome}): the scan differs"
        P.check_range(t, model, 0, t.version)
        assert_interop(t)
        t.vacuum(older_than=ZERO)  # removes what the killed process left behind, nothing else
        _assert_only_referenced_files(t)
        assert _state(t) == model.states[-1]
        P.check_range(t, model, max(0, model.version - 4), model.version)
    assert any(o == "killed" and not c for _, o, c in outcomes), f"no trial was killed before its commit: {outcomes}"
    assert t.compact().version is not None or t.rewrite_deletes().version is None  # the table is still maintainable
    assert_interop(t)


def test_crash_during_purge_before_its_commit_changes_nothing(warehouse) -> None:
    name = "crm.people"
    t = lineage.create_table(name, PURGE_SCHEMA, key=["id"], warehouse=warehouse, properties={"write.avro.compression-codec": "null"})
    _purge_history(t, "plain")
    n = t.version
    live = t.scan().to_pylist()
    feed = Counter(P._canon(cdf.changes(t, 0), PURGE_COLS + P.CHANGE_COLS))
    deleted = Counter(P._canon(cdf.deleted_rows(t), PURGE_COLS + P.DELETED_COLS))
    ctx = _forkserver()
    # a purge writes about 20 files (copies, delete files, archive, index segments, lineage, manifests) before its
    # commit: kill it at a random one of them, or at the latest just before the catalog commit
    for kill_at in [(k, "commit") for k in sorted(random.Random(5).sample(range(1, 20), 3))] + ["commit"]:
        assert _run_killed(ctx, warehouse, name, "purge", kill_at=kill_at) == "killed"
        t.refresh()
        assert t.version == n, f"killed at {kill_at}: the purge must not have committed"
        _drop_caches()
        assert Counter(map(repr, t.scan().to_pylist())) == Counter(map(repr, live))
        assert Counter(P._canon(cdf.changes(t, 0), PURGE_COLS + P.CHANGE_COLS)) == feed
        t.vacuum(older_than=ZERO)
        _assert_only_referenced_files(t)
        assert Counter(P._canon(cdf.changes(t, 0), PURGE_COLS + P.CHANGE_COLS)) == feed
        assert Counter(P._canon(cdf.deleted_rows(t), PURGE_COLS + P.DELETED_COLS)) == deleted
    assert_interop(t)
    # the purge then succeeds and erases everything, the crashed attempts' files included
    assert t.purge("id = 3").version == n + 1
    assert not _find_values(os.path.dirname(os.path.dirname(_root(t))))
    assert_interop(t)


def test_crash_after_purge_commit_then_purge_again_erases_everything(warehouse) -> None:
    name = "crm.people"
    t = lineage.create_table(name, PURGE_SCHEMA, key=["id"], warehouse=warehouse, properties={"write.avro.compression-codec": "null"})
    _purge_history(t, "plain")
    n = t.version
    assert _run_killed(_forkserver(), warehouse, name, "purge", kill_at="committed") == "killed"
    t.refresh()
    assert t.version == n + 1 and t.history()[-1].operation == "purge"
    assert t.scan("id = 3").num_rows == 0
    purged = [r for r in cdf.changes(t, 0).to_pylist() if r["_purged"]]
    assert purged and all(r["email"] is None for r in purged)  # the feed is right at once
    t.purge("id = 3")  # the operator re-runs the purge ...
    t.vacuum(older_than=ZERO)  # ... and vacuums
    leftovers = _find_values(os.path.dirname(os.path.dirname(_root(t))))
    assert not leftovers, f"purged values still on disk after a crash, a second purge and a vacuum: {sorted(leftovers)}"


def test_a_second_purge_after_compaction_with_captured_preimages(warehouse) -> None:
    """A purge re-points the deleted-rows index at its archive; entries whose values the index captured need no archive row."""
    from lineage.maintenance import verify

    t = _create(warehouse, **{"lineage.cdf.capture-preimages": "true"})
    t.append(_rows(0, 20))
    t.append(_rows(20, 15))
    t.purge("id >= 4")
    t.delete("id % 3 = 0")
    t.compact()
    res = t.purge("id IN (1, 2)")  # failed with KeyError: the archive had no row for the captured entries' positions
    assert res.version is not None and t.count() == 0
    assert verify(t).ok
    feed = cdf.changes(t, 0)
    assert feed.num_rows > 0 and all(p for p, i in zip(feed.column("_purged").to_pylist(), feed.column("id").to_pylist(), strict=True) if i is None or i >= 4)
