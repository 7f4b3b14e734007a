"""The key index on real tables: first use, deferred build, staleness, damage, crashes, races, maintenance, the lookup API.

The random-sequence property (every path keeps the index equal to a key
scan) is tests/test_key_index_property.py; the format itself is
tests/test_key_index.py.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.snapshots import Operation

import lineage
from conftest import SCHEMA
from index import key_segment
from index.key_index import PROP_DEFER_ROWS, KeyIndex
from lineage.commits.commit import CommitRequest, commit_change
from lineage.outcome import Attempt
from lineage.errors import InvalidArgumentError, KeyViolationError, LineageMetadataError, UnsupportedFormatError
from lineage.storage.fileio import ImmutableFileCache, local_path
from lineage.maintenance import verify
from lineage.maintenance.key_index import check_key_index
from lineage.storage.writer import write_data_files

commit_module = importlib.import_module("lineage.commits.commit")


def _batch(ids: list[int], name: str = "x", amount: float = 1.0) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [name] * len(ids), "amount": [amount] * len(ids)}, schema=SCHEMA)


def _consistent(t: lineage.Table) -> None:
    state = t.state()
    assert state.lineage.key_index is not None, "the table has no key index"
    problems, checked = check_key_index(state)
    assert not problems, problems
    assert checked["key_index_entries"] == t.count()


@pytest.fixture(autouse=True)
def _fresh_segment_cache(monkeypatch):
    """Segments are cached per process by path; tests that damage files must not see a cached copy."""
    monkeypatch.setattr(key_segment, "_CACHE", ImmutableFileCache(256))


def test_a_table_from_before_the_index_gets_one_on_first_use(warehouse):
    t = lineage.create_table("s.old", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.key-index.enabled": "false"})
    t.append(_batch([1, 2, 3]))
    t.delete("id = 2")
    assert t.state().lineage.key_index is None  # what a table written before the key index looks like
    with t.iceberg.transaction() as tx:
        tx.set_properties({"lineage.key-index.enabled": "true"})
    t.refresh()
    t.delete("id = 3")  # a delete does not need the index, so it does not build it
    assert t.state().lineage.key_index is None
    info = t.upsert(_batch([1, 4], "u"))
    assert (info.inserted, info.updated) == (1, 1)
    _consistent(t)  # built by the upsert's scan and committed with it
    found = KeyIndex.open(t.state(), build=False).lookup(pa.table({"id": [4, 2, 1]}))
    assert found.column("id").to_pylist() == [4, 1] and found.column("__input").to_pylist() == [0, 2]


def test_a_commit_that_does_not_know_the_index_drops_it(warehouse):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([1, 2]))
    _consistent(t)
    # A write path that moves images without a KeyIndexChange (as a future one might): the index is dropped, never stale.
    state = t.state()
    written = write_data_files(t.iceberg, _batch([3]))
    commit_change(t.iceberg, state, CommitRequest("append", Operation.APPEND, written=written, inserted=1), Attempt())
    t.refresh()
    assert t.state().lineage.key_index is None
    assert verify(t).ok
    t.rewrite_deletes()  # nothing moves: nothing to maintain, still none
    with pytest.raises(KeyViolationError, match="already in the table"):
        t.append(_batch([3]))  # the append's check rebuilt the index in memory and found key 3
    t.append(_batch([4]))
    _consistent(t)


def test_tables_without_a_key_index(warehouse):
    keyless = lineage.create_table("s.keyless", SCHEMA, warehouse=warehouse)
    keyless.append(_batch([1, 1]))
    assert keyless.state().lineage.key_index is None
    with pytest.raises(KeyViolationError, match="no key"):
        keyless.reindex()
    off = lineage.create_table("s.off", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.key-index.enabled": "false"})
    off.append(_batch([1]))
    off.upsert(_batch([1, 2]))
    assert off.state().lineage.key_index is None
    with pytest.raises(InvalidArgumentError, match="switched off"):
        off.reindex()
    loose = lineage.create_table("s.loose", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.key.enforce": "false"})
    loose.append(_batch([1]))
    loose.append(_batch([1]))  # duplicate keys are allowed here, so no index could map a key to one row
    assert loose.state().lineage.key_index is None
    assert loose.upsert(_batch([1], "u")).updated == 2  # today's semantics: both rows of the key are updated
    bad = lineage.create_table("s.bad", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.key-index.enabled": "maybe"})
    with pytest.raises(InvalidArgumentError, match="lineage.key-index.enabled"):
        bad.append(_batch([1]))


def test_an_update_cannot_create_a_duplicate_key_in_another_partition(warehouse):
    """The key check covers the whole table, not only the files the update's predicate prunes to."""
    for props in ({}, {"lineage.key-index.enabled": "false"}):
        name = f"s.p{len(props)}"
        t = lineage.create_table(name, SCHEMA, key=["id"], partition_by=["bucket(8, id)"], warehouse=warehouse, properties=props)
        t.append(_batch(list(range(20))))
        with pytest.raises(KeyViolationError, match="same key"):
            t.update("id = 1", {"id": "2"})
        with pytest.raises(KeyViolationError, match="same key"):
            t.update("id IN (1, 2)", {"id": "5"})
        assert t.update("id IN (1, 2)", {"id": "id + 100"}).updated == 2
        assert t.update("id IN (101, 102)", {"id": "203 - id"}).updated == 2  # 101 <-> 102 swap keys: no clash
        assert sorted(t.scan(columns=["id"]).column("id").to_pylist()) == [0] + list(range(3, 20)) + [101, 102]
        if not props:
            _consistent(t)


def test_a_stale_index_is_rebuilt(warehouse):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([1, 2]))
    old = t.state().lineage.key_index
    with t.iceberg.update_schema() as upd:
        upd.rename_column("id", "ident")
    t.refresh()
    assert KeyIndex.open(t.state(), build=False) is None  # written for a key named "id": stale
    t.upsert(pa.table({"ident": pa.array([2, 3], pa.int64()), "name": ["u", "u"], "amount": [0.0, 0.0]}))
    assert t.state().lineage.key_index != old
    _consistent(t)
    assert KeyIndex.open(t.state()).names == ["ident"]


def test_a_damaged_index_is_reported_and_reindex_repairs_it(warehouse, monkeypatch):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([1, 2, 3]))
    t.upsert(_batch([3, 4], "u"))
    (segment,) = t.state().lineage.key_index
    os.remove(local_path(segment))
    report = verify(t)
    assert not report.ok and any("missing" in p and "reindex" in p for p in report.problems)
    with pytest.raises(LineageMetadataError, match="reindex"):
        t.upsert(_batch([5]))
    assert t.reindex().version == 3
    assert verify(t).ok
    t.upsert(_batch([5]))
    _consistent(t)

    # A newer format version is refused, not misread (a new file replaces the old inode: a mapped copy stays valid).
    segment = local_path(t.state().lineage.key_index[-1])
    with open(segment, "rb") as f:
        data = f.read()
    now = f'"lineage.format-version": "{key_segment.SEGMENT_FORMAT_VERSION}"'.encode()
    assert now in data
    with open(segment + ".new", "wb") as f:
        f.write(data.replace(now, f'"lineage.format-version": "{key_segment.SEGMENT_FORMAT_VERSION + 1}"'.encode(), 1))
    os.replace(segment + ".new", segment)
    monkeypatch.setattr(key_segment, "_CACHE", ImmutableFileCache(256))
    with pytest.raises(UnsupportedFormatError):
        t.upsert(_batch([6]))


def test_verify_reports_entries_that_disagree(warehouse, monkeypatch):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([1, 2, 3]))
    t.delete("id = 2")
    state = t.state()
    good = KeyIndex.open(state)
    # An index that misses key 1, points key 3 at the wrong row id and still holds the deleted key 2.
    rows = [{**r, "_row_id": 99} for r in good.live_entries().to_pylist() if r["id"] == 3]
    fake = pa.Table.from_pylist(rows + [{**rows[0], "id": 2}], schema=good.live_entries().schema)
    bogus = KeyIndex(good.key, [key_segment.make_segment(good.key, fake, base=True)], state.version, state.lineage.key_index)
    monkeypatch.setattr(KeyIndex, "open", staticmethod(lambda s, build=True: bogus))
    problems, _ = check_key_index(state)
    text = "\n".join(problems)
    assert "lacks 1 live key" in text and "{'id': 1}" in text
    assert "disagree" in text and "99" in text
    assert "not live" in text and "{'id': 2}" in text


def test_a_crash_leaves_the_commit_with_its_index_delta_or_nothing(warehouse, monkeypatch):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([1, 2]))
    before = (t.version, t.state().lineage.key_index)
    index_dir = os.path.join(local_path(t.iceberg.metadata.location), "metadata", "_index")
    files_before = set(os.listdir(index_dir))

    def crash(*args, **kwargs):
        raise RuntimeError("the process died during the catalog commit")

    monkeypatch.setattr(commit_module, "commit_files", crash)
    with pytest.raises(RuntimeError):
        t.upsert(_batch([2, 3], "u"))
    t.refresh()
    assert (t.version, t.state().lineage.key_index) == before
    assert set(os.listdir(index_dir)) == files_before  # the delta written for it was removed again
    _consistent(t)

    monkeypatch.undo()

    # A process killed right after the catalog accepted its commit: the commit stands, with its delta.
    child = (
        "import os, importlib, pyarrow as pa, lineage\n"
        "cm = importlib.import_module('lineage.commits.commit'); real = cm.commit_files\n"
        "def dies(*a, **k):\n    real(*a, **k)\n    os._exit(3)\n"
        "cm.commit_files = dies\n"
        f"t = lineage.open_table('s.t', warehouse={warehouse!r})\n"
        "t.upsert(pa.table({'id': [2, 3], 'name': ['k', 'k'], 'amount': [0.0, 0.0]}))\n"
    )
    assert subprocess.run([sys.executable, "-c", child], timeout=300).returncode == 3
    t.refresh()
    assert t.version == before[0] + 1
    _consistent(t)
    assert {r["id"]: r["name"] for r in t.scan().to_pylist()} == {1: "x", 2: "k", 3: "k"}


def _race(monkeypatch, winner: lineage.Table, batch: pa.Table) -> dict:
    """Make ``winner.append(race["batch"])`` land between a writer's plan and its next commit attempt.

    ``race["batch"]`` starts as ``batch``; set it again for another race; ``race["lost"]`` counts lost commits.
    """
    real = commit_module.commit_files
    race: dict = {"batch": batch, "lost": 0}

    def racing(*args, **kwargs):
        if race["batch"] is not None:
            pending, race["batch"] = race["batch"], None
            winner.append(pending)
        try:
            return real(*args, **kwargs)
        except CommitFailedException:
            race["lost"] += 1
            raise

    monkeypatch.setattr(commit_module, "commit_files", racing)
    return race


def test_a_writer_that_loses_the_race_replans_with_the_winners_index(warehouse, monkeypatch):
    loser = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    loser.append(_batch([1, 2]))
    race = _race(monkeypatch, lineage.open_table("s.t", warehouse=warehouse), _batch([50], "winner"))
    with pytest.raises(KeyViolationError, match="50"):
        loser.append(_batch([50], "loser"))  # planned when 50 was absent; the re-plan sees the winner's key
    assert race["lost"] == 1
    race["batch"] = _batch([60], "winner")
    info = loser.upsert(_batch([60], "loser"))
    assert (info.attempts, info.inserted, info.updated) == (2, 0, 1)  # updates the winner's row, no duplicate key
    rows = {r["id"]: (r["name"], r["_row_created_at_version"]) for r in loser.scan().to_pylist()}
    assert rows[60] == ("loser", 3)
    _consistent(loser)


def test_merge_key_index_and_the_cli(warehouse):
    props = {"lineage.key-index.writer-merge-limit": "0", "lineage.key-index.max-segments": "100"}
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    for i in range(5):
        t.upsert(_batch([i, i + 100], "u"))
    # Writers may not merge (limit 0): one base of the first build, then a delta per commit.
    assert len(t.state().lineage.key_index) == 5
    result = t.merge_key_index()
    assert result.version == 6 and len(t.state().lineage.key_index) < 5
    _consistent(t)
    assert t.history()[-1].operation == "merge-key-index"
    t.upsert(_batch([7]))
    cli = [sys.executable, "-m", "lineage.cli", "--warehouse", warehouse]
    merged = subprocess.run([*cli, "reindex", "s.t", "--merge", "--full"], capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stderr
    assert "merge-key-index: committed version 8" in merged.stdout and "1 segment(s)" in merged.stdout
    rebuilt = subprocess.run([*cli, "reindex", "s.t"], capture_output=True, text=True, timeout=300)
    assert rebuilt.returncode == 0 and "reindex: committed version 9" in rebuilt.stdout, rebuilt
    t.refresh()
    assert len(t.state().lineage.key_index) == 1
    _consistent(t)
    assert t.vacuum(older_than=dt.timedelta(0)).files_removed >= 0
    _consistent(t)  # vacuum keeps the current list's segments


def test_lookup_api_with_a_multi_column_key(warehouse):
    schema = pa.schema([("region", pa.string()), ("day", pa.date32()), ("n", pa.int64())])
    t = lineage.create_table("s.multi", schema, key=["region", "day"], warehouse=warehouse)
    days = [dt.date(2024, 1, d) for d in (1, 2, 3)]
    t.append(pa.table({"region": ["eu", "eu", "us"], "day": days, "n": [1, 2, 3]}, schema=schema))
    t.upsert(pa.table({"region": ["us", "us"], "day": [days[2], days[0]], "n": [30, 10]}, schema=schema))
    idx = KeyIndex.open(t.state())
    probe = pa.table({"region": ["us", "eu", "eu", "us"], "day": [days[0], days[1], days[2], days[2]]})
    found = idx.lookup(probe)
    assert found.column_names == ["region", "day", "_row_id", "__file_path", "__pos", "_row_created_at_version",
                                  "_row_last_updated_at_version", "__input"]
    assert found.column("__input").to_pylist() == [0, 1, 3]
    live = {(r["region"], r["day"]): r for r in t.scan().to_pylist()}
    for r in found.to_pylist():
        row = live[(r["region"], r["day"])]
        assert (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) == (
            row["_row_id"], row["_row_created_at_version"], row["_row_last_updated_at_version"])
    assert found.to_pylist()[2]["_row_created_at_version"] == 1 and found.to_pylist()[2]["_row_last_updated_at_version"] == 2
    with pytest.raises(KeyViolationError, match="day"):
        idx.lookup(pa.table({"region": ["eu"]}))
    with pytest.raises(KeyViolationError, match="null"):
        idx.lookup(pa.table({"region": ["eu", None], "day": days[:2]}))
    assert idx.lookup(pa.table({"region": pa.array([], pa.string()), "day": pa.array([], pa.date32())})).num_rows == 0

    # Other processes (other string-hash seeds) hash the multi-column key the same way.
    for seed in ("1", "2"):
        child = (
            "import datetime as dt, pyarrow as pa, lineage\n"
            f"t = lineage.open_table('s.multi', warehouse={warehouse!r})\n"
            f"t.upsert(pa.table({{'region': ['us', 'eu'], 'day': [dt.date(2024, 1, 1), dt.date(2024, 2, {seed})], 'n': [{seed}, 0]}}))\n"
        )
        done = subprocess.run([sys.executable, "-c", child], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    t.refresh()
    assert t.count() == 6  # four, plus ('eu', 2024-02-01) and ('eu', 2024-02-02)
    problems, _ = check_key_index(t.state())
    assert not problems, problems


def _events(evs: list[tuple]) -> pa.Table:
    """``(op, id, name, amount)`` tuples as a change-stream batch."""
    cols = list(zip(*evs, strict=True))
    return pa.table({"_op": list(cols[0]), "id": pa.array(cols[1], pa.int64()), "name": list(cols[2]), "amount": pa.array(cols[3], pa.float64())})


def test_change_streams_look_keys_up_in_the_index_and_keep_it(warehouse, monkeypatch):
    from lineage.writes import live_images as key_lookup

    t = lineage.create_table("s.cl", SCHEMA, key=["id"], warehouse=warehouse)
    for first in (1, 11, 21):  # three data files
        t.append(_batch(list(range(first, first + 10))))
    scanned: list[int] = []
    scan = key_lookup.register_live_view
    read_at = key_lookup.values_at
    with monkeypatch.context() as m:
        m.setattr(KeyIndex, "build", lambda state: pytest.fail("the key index was rebuilt: a commit dropped it"))
        m.setattr(key_lookup, "register_live_view", lambda *a, **k: pytest.fail("a data file was scanned"))
        m.setattr(key_lookup, "values_at", lambda paths, *a, **k: scanned.append(len(paths)) or read_at(paths, *a, **k))
        # strict mode checks the -U image: only the files that hold a live key of the batch (5, 12) are read, not the third
        info = t.apply_changelog(_events([("-U", 5, "x", 1.0), ("+U", 5, "y", 2.0), ("-D", 12, "x", 1.0), ("+I", 40, "n", 4.0), ("+I", 41, "n", 4.0), ("-D", 41, "n", 4.0)]))
        assert (info.inserted, info.updated, info.deleted) == (1, 1, 1) and scanned == [2]
        # no image to check: keys resolve from the index alone, no data file is read
        info = t.apply_changelog(_events([("+I", 5, "z", 3.0), ("+U", 40, "z", 3.0), ("-D", 99, None, None), ("-D", 21, None, None)]), upsert=True)
        assert (info.inserted, info.updated, info.deleted, info.ignored) == (0, 2, 1, 1) and scanned == [2]
        t.apply_changelog(_events([("-U", 40, "z", 3.0), ("+U", 40, "w", 5.0), ("+I", 21, "back", 1.0), ("-D", 1, "x", 1.0)]), mode=lineage.COPY_ON_WRITE)
        t.apply_changelog(_events([("-D", 2, "x", 1.0)]), stream=("s", 0))
        assert t.apply_changelog(_events([("-D", 3, "x", 1.0)]), stream=("s", 0)).committed is False  # a replay
        assert t.state().lineage.key_index  # every changelog commit kept the index
    _consistent(t)  # equal to a fresh rebuild from a key scan
    assert verify(t).ok
    live = {r["id"]: (r["name"], r["amount"]) for r in t.scan().to_pylist()}
    assert len(live) == 28 and live[5] == ("z", 3.0) and live[40] == ("w", 5.0) and live[21] == ("back", 1.0)
    assert 1 not in live and 2 not in live and 12 not in live and 41 not in live

    # Tables without an index resolve keys by a scan of every live file, as before.
    for props in ({"lineage.key-index.enabled": "false"}, {"lineage.key.enforce": "false"}):
        off = lineage.create_table(f"s.off{len(scanned)}", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
        off.append(_batch([1, 2]))
        off.append(_batch([3]))
        scanned.clear()
        with monkeypatch.context() as m:
            m.setattr(key_lookup, "register_live_view", lambda con, name, files, *a, **k: scanned.append(len(files)) or scan(con, name, files, *a, **k))
            info = off.apply_changelog(_events([("-U", 1, "x", 1.0), ("+U", 1, "y", 2.0), ("-D", 3, "x", 1.0)]))
        assert (info.updated, info.deleted) == (1, 1) and scanned == [2]
        assert off.state().lineage.key_index is None


# ---------------------------------------------------------------- deferred build (lineage.key-index.defer-rows)
# A bulk append into an empty keyed table commits no index; the first keyed write builds and commits it.


def _table(warehouse: str, defer_rows: int | str, name: str = "s.t") -> lineage.Table:
    return lineage.create_table(name, SCHEMA, key=["id"], warehouse=warehouse, properties={PROP_DEFER_ROWS: str(defer_rows)})


def test_a_bulk_append_into_an_empty_table_defers_the_index_to_its_first_keyed_use(warehouse):
    t = _table(warehouse, 5)
    t.append(_batch(list(range(10))))
    assert t.state().lineage.key_index is None  # deferred: the commit names no index
    assert verify(t).ok
    with pytest.raises(KeyViolationError, match="already in the table"):
        t.append(_batch([3]))  # the check builds the index from a scan and finds the live key
    assert t.state().lineage.key_index is None and t.count() == 10  # a refused write commits nothing
    info = t.upsert(_batch([4, 20], "new"))
    assert (info.updated, info.inserted) == (1, 1)
    _consistent(t)  # the first keyed write committed the whole index
    rows = {r["id"]: r["name"] for r in t.scan().to_pylist()}
    assert rows[4] == "new" and rows[20] == "new" and rows[5] == "x"
    t.append(_batch(list(range(100, 110))))  # no longer empty: an ordinary keyed append, index kept
    _consistent(t)


def test_small_appends_and_defer_rows_zero_keep_the_index_eager(warehouse):
    small = _table(warehouse, 5, "s.small")
    small.append(_batch([1, 2, 3, 4]))  # under the threshold
    _consistent(small)
    never = _table(warehouse, 0, "s.never")
    never.append(_batch(list(range(50))))
    _consistent(never)
    default = lineage.create_table("s.default", SCHEMA, key=["id"], warehouse=warehouse)
    default.append(_batch(list(range(50))))  # the default threshold (100,000 rows) is far above
    _consistent(default)


def test_a_deferred_append_still_refuses_duplicate_and_null_keys(warehouse):
    t = _table(warehouse, 2)
    with pytest.raises(KeyViolationError, match="more than once"):
        t.append(_batch([1, 2, 2, 3]))
    with pytest.raises(KeyViolationError, match="null"):
        t.append(pa.table({"id": pa.array([1, None, 3], pa.int64()), "name": ["a"] * 3, "amount": [1.0] * 3}))
    assert t.version == 0 and t.count() == 0


def test_a_bad_defer_rows_property_is_refused_and_nothing_is_written(warehouse):
    for bad in ("many", "-1"):
        t = _table(warehouse, bad, f"s.bad{bad.strip('-')}")
        with pytest.raises(InvalidArgumentError, match=PROP_DEFER_ROWS):
            t.append(_batch([1, 2, 3]))
        assert t.count() == 0


def test_a_writer_racing_a_deferred_bulk_append_sees_its_keys(warehouse, monkeypatch):
    loser = _table(warehouse, 5)
    winner = lineage.open_table("s.t", warehouse=warehouse)
    race = _race(monkeypatch, winner, _batch(list(range(10)), "winner"))  # a deferred bulk append wins the race
    with pytest.raises(KeyViolationError, match="7"):
        loser.append(_batch([7], "loser"))  # planned on the empty table; the re-plan builds the winner's index
    assert race["lost"] == 1
    assert winner.state().lineage.key_index is None and winner.count() == 10
    loser.append(_batch([70], "loser"))
    _consistent(loser)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(-5, 40), max_size=9), max_size=5), block=st.integers(1, 4),
       key_type=st.sampled_from([pa.int64(), pa.int32(), pa.date32(), pa.timestamp("us")]))
def test_the_batch_key_check_reads_chunks_and_blocks_like_one_sorted_array(chunks, block, key_type):
    """The in-order pass over a batch's key (chunk by chunk, in blocks) answers as a check of the whole column."""
    from lineage.iceberg import schema

    old = schema._BLOCK
    schema._BLOCK = block
    try:
        col = pa.chunked_array([pa.array(c, pa.int32() if key_type == pa.date32() else pa.int64()).cast(key_type) for c in chunks], type=key_type)
        flat = [v for c in chunks for v in c]
        assert schema._strictly_increasing(col) == all(b > a for a, b in zip(flat, flat[1:]))
        found = schema.null_or_duplicate_keys(pa.table({"id": col}), ["id"])
        assert (found is None) == (len(set(flat)) == len(flat)), found
    finally:
        schema._BLOCK = old


_KEY_KINDS = {  # key columns of a keyed table (a composite key included) and how to make them from distinct integers
    "int64": ([("id", pa.int64())], lambda ids: [pa.array(ids, pa.int64())]),
    "string": ([("id", pa.string())], lambda ids: [pa.array([f"k{i:+}" for i in ids], pa.string())]),
    "timestamp": ([("id", pa.timestamp("us"))], lambda ids: [pa.array(ids, pa.int64()).cast(pa.timestamp("us"))]),
    "composite": ([("a", pa.int32()), ("b", pa.string())], lambda ids: [pa.array([i % 7 for i in ids], pa.int32()),
                                                                     pa.array([str(i // 7) for i in ids], pa.string())]),
}


@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=80, unique=True), kind=st.sampled_from(sorted(_KEY_KINDS)),
       partitioned=st.booleans(), updated=st.integers(0, 5))
def test_the_first_build_from_the_key_columns_a_process_kept_equals_one_read_from_the_files(tmp_path_factory, ids, kind, partitioned,
                                                                                            updated):
    """The first keyed write after a deferred bulk append builds the index from the key columns this process kept
    (lineage.storage.written_keys): the same index as a build that reads them from the files (another process), and
    equal to the appended rows; the write that commits it keeps the index equal to a key scan."""
    import lineage.storage.written_keys as written_keys

    fields, make = _KEY_KINDS[kind]
    key = [n for n, _ in fields]
    schema = pa.schema([*(pa.field(n, t, nullable=False) for n, t in fields), ("part", pa.int32()), ("v", pa.int64())])
    t = lineage.create_table("s.kept", schema, key=key, partition_by=["part"] if partitioned else None,
                             warehouse=str(tmp_path_factory.mktemp("kept")), properties={PROP_DEFER_ROWS: "1"})
    data = pa.Table.from_arrays([*make(ids), pa.array([i % 3 for i in ids], pa.int32()), pa.array(ids, pa.int64())], schema=schema)
    t.append(data)
    state = t.state()
    assert state.lineage.key_index is None  # deferred to the first keyed write
    assert all(written_keys.known(f.path, key) is not None for f in state.live_files())
    kept = KeyIndex.build(state).live_entries()
    rows = t.scan(columns=[*key, "_row_id"]).sort_by("_row_id")
    assert kept.sort_by("_row_id").select([*key, "_row_id"]).equals(rows.cast(kept.select([*key, "_row_id"]).schema))
    if updated:  # the first keyed write commits that build (with its own change, one segment)
        batch = data.slice(0, updated).set_column(schema.get_field_index("v"), "v", pa.array([-1] * min(updated, len(ids)), pa.int64()))
        assert t.upsert(batch).updated == batch.num_rows
        _consistent(t)
        assert len(t.state().lineage.key_index) == 1
    written_keys.forget()  # what another process sees: nothing kept, the key columns read from the files
    read = KeyIndex.build(state).live_entries()
    assert kept.sort_by("_row_id").equals(read.sort_by("_row_id"))


def test_an_index_built_from_the_written_keys_equals_one_built_from_the_files(warehouse, monkeypatch):
    """The first keyed write after deferred bulk appends builds the index from the key columns this process kept
    (lineage.storage.written_keys). With a refused write's files (never committed) and another table's in that
    memory, a writer racing in between, and a key column renamed since the files were written, the index is the one
    a process that kept nothing builds by reading the files."""
    import lineage.storage.written_keys as written_keys

    def both(names: tuple[str, ...], rename: bool) -> list[lineage.Table]:
        out = []
        for n in names:
            t = _table(warehouse, 5, n)
            t.append(_batch(list(range(10))))
            other = lineage.open_table(n, warehouse=warehouse)
            other.append(_batch(list(range(10, 20))))  # deferred too: no index yet
            with pytest.raises(KeyViolationError):
                t.append(_batch([25, 25]))  # refused before any file is written
            if rename:
                with t.iceberg.update_schema() as upd:
                    upd.rename_column("id", "ident")
                t.refresh()
            out.append(t)
        return out

    for rename in (False, True):
        kept, fresh = both((f"s.kept{rename}", f"s.fresh{rename}"), rename)
        key = "ident" if rename else "id"
        batch = _batch([3, 30]).rename_columns([key, "name", "amount"])
        kept.upsert(batch)
        written_keys.forget()  # the second table's build reads every file
        fresh.upsert(batch)
        for t in (kept, fresh):
            _consistent(t)
            assert sorted(t.scan(columns=[key]).column(key).to_pylist()) == list(range(20)) + [30]
        shapes = [[(s.level, s.entries) for s in KeyIndex.open(t.state()).segments] for t in (kept, fresh)]
        assert shapes[0] == shapes[1], shapes
