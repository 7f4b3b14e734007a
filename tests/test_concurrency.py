"""Concurrent writers: real processes committing to one table at once.

DESIGN.md sections 3 and 7: every commit gets the next version, row ids are
unique forever and survive updates, a lost commit race is re-planned (or, once
the retries are spent, fails with CommitConflictError having committed
nothing), and readers that know nothing of lineage see exactly our rows.

Workers are started with the ``spawn`` start method and open the table by
name through the embedded SQLite catalog, as independent jobs would.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
import traceback
from collections import Counter

import pyarrow as pa
import pytest

import lineage
from conftest import SCHEMA, assert_interop, lose_next_commit, rows
from lineage.storage.metadata import SUMMARY_LIST, SUMMARY_VERSION, read_list, read_segment
from lineage.state import main_branch_snapshots


NAME = "shop.orders"
WORKERS = 4
DATA = ["id", "name", "amount"]
SHARED_KEYS = (100, 101, 102, 103)


# ---------------------------------------------------------------------- helpers (parent side)
def _run_workers(target, args_per_worker: list[tuple], timeout: float = 150.0) -> dict[int, object]:
    """Start one spawned process per argument tuple, release them together, collect their results."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    barrier = ctx.Barrier(len(args_per_worker))
    procs = [ctx.Process(target=target, args=(*args, barrier, results), daemon=True) for args in args_per_worker]
    for p in procs:
        p.start()
    out: dict[int, tuple[str, object]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < len(procs):
            try:
                kind, worker, payload = results.get(timeout=1.0)
            except queue_mod.Empty:
                crashed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if crashed and results.empty():
                    pytest.fail(f"a worker process died without reporting (exit codes {crashed})")
                if time.monotonic() > deadline:
                    pytest.fail(f"workers did not finish within {timeout}s (reported: {sorted(out)})")
                continue
            out[worker] = (kind, payload)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    failures = {w: payload for w, (kind, payload) in out.items() if kind != "ok"}
    assert not failures, "worker(s) failed:\n" + "\n".join(f"--- worker {w}\n{tb}" for w, tb in failures.items())
    return {w: payload for w, (kind, payload) in out.items()}


def _info_tuple(op: str, info: lineage.CommitInfo) -> dict:
    return {
        "op": op,
        "version": info.version,
        "snapshot_id": info.snapshot_id,
        "committed": info.committed,
        "attempts": info.attempts,
        "inserted": info.inserted,
        "updated": info.updated,
        "deleted": info.deleted,
        "operation": info.operation,
    }


def _check_log(table: lineage.Table, commits: list[dict], first_version: int) -> None:
    """Versions are distinct and gap-free, and history()/snapshots tell the same story."""
    assert all(c["committed"] for c in commits), [c for c in commits if not c["committed"]]
    versions = [c["version"] for c in commits]
    dupes = [v for v, n in Counter(versions).items() if n > 1]
    assert not dupes, f"two commits reported the same version: {dupes}"
    last = first_version + len(commits) - 1
    assert sorted(versions) == list(range(first_version, last + 1))
    assert table.version == last

    history = table.history()
    assert [h.version for h in history] == list(range(1, last + 1))
    by_version = {h.version: h for h in history}
    for c in commits:
        h = by_version[c["version"]]
        assert (h.snapshot_id, h.operation) == (c["snapshot_id"], c["operation"]), c
        assert (h.inserted, h.updated, h.deleted) == (c["inserted"], c["updated"], c["deleted"]), c

    snaps = main_branch_snapshots(table.iceberg)
    assert [s.sequence_number for s in snaps] == list(range(1, last + 1))
    for s in snaps:
        assert s.summary.additional_properties[SUMMARY_VERSION] == str(s.sequence_number)
        assert by_version[s.sequence_number].snapshot_id == s.snapshot_id


def _check_metadata_readable(table: lineage.Table) -> None:
    snap = table.iceberg.metadata.current_snapshot()
    lst = read_list(table.iceberg.io, snap.summary.additional_properties[SUMMARY_LIST])
    assert lst.version == snap.sequence_number
    described = {fl.file_path for seg in lst.segments for fl in read_segment(table.iceberg.io, seg)}
    assert table.state().all_data_file_paths() <= described


# ---------------------------------------------------------------------- workers (child side)
def _batch(ids, names, amounts) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": names, "amount": pa.array(amounts, pa.float64())})


def _mixed_worker(warehouse: str, w: int, barrier, results) -> None:
    """Five writes on this worker's own key range: append, update, delete, upsert, append."""
    try:
        t = lineage.open_table(NAME, warehouse=warehouse)
        mode = lineage.COPY_ON_WRITE if w % 2 else lineage.MERGE_ON_READ
        base = (w + 1) * 1000
        mine = f"id >= {base} AND id < {base + 1000}"
        log = []
        barrier.wait(timeout=90)

        log.append(_info_tuple("append", t.append(_batch([base + i for i in range(10)], [f"w{w}"] * 10, [float(i) for i in range(10)]))))
        # Only this worker touches these rows, so this read is stable: the row ids every later state must keep.
        first = t.scan(where=mine, columns=["id", "_row_id", "_row_created_at_version"]).to_pylist()
        log.append(_info_tuple("update", t.update(f"id >= {base} AND id < {base + 5}", {"amount": "amount + 100", "name": "'upd'"}, mode=mode)))
        log.append(_info_tuple("delete", t.delete(f"id >= {base + 8} AND id < {base + 1000}", mode=mode)))
        log.append(_info_tuple("upsert", t.upsert(_batch([base, base + 20], ["ups", "new"], [7.0, 20.0]), mode=mode)))
        log.append(_info_tuple("append2", t.append(_batch([base + 30 + i for i in range(5)], [f"w{w}b"] * 5, [30.0 + i for i in range(5)]))))
        results.put(("ok", w, {"log": log, "first": first}))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put(("error", w, traceback.format_exc()))


def _increment_worker(warehouse: str, w: int, times: int, barrier, results) -> None:
    """``times`` updates of every row (amount = amount + 1; all workers hit the same rows), with one
    upsert of keys that every worker upserts (100..103) after the first increment."""
    try:
        t = lineage.open_table(NAME, warehouse=warehouse)
        mode = lineage.COPY_ON_WRITE if w % 2 else lineage.MERGE_ON_READ
        log = []
        barrier.wait(timeout=90)
        for i in range(times):
            log.append(_info_tuple("update", t.update("TRUE", {"amount": "amount + 1"}, mode=mode)))
            if i == 0:
                batch = _batch(list(SHARED_KEYS), [f"w{w}"] * len(SHARED_KEYS), [1000.0 + w] * len(SHARED_KEYS))
                log.append(_info_tuple("upsert", t.upsert(batch, mode=mode)))
        results.put(("ok", w, {"log": [{**c, "worker": w} for c in log]}))
    except BaseException:  # noqa: BLE001
        results.put(("error", w, traceback.format_exc()))


# ---------------------------------------------------------------------- tests
def test_parallel_writers_on_disjoint_rows(warehouse):
    table = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
    out = _run_workers(_mixed_worker, [(warehouse, w) for w in range(WORKERS)])
    table.refresh()

    commits = [c for w in range(WORKERS) for c in out[w]["log"]]
    assert len(commits) == WORKERS * 5
    _check_log(table, commits, first_version=1)

    final = table.scan()
    row_ids = final.column("_row_id").to_pylist()
    assert len(row_ids) == len(set(row_ids)), "duplicate live row ids"

    expected = []
    by_id = {r["id"]: r for r in final.to_pylist()}
    ever_assigned = []
    for w in range(WORKERS):
        base = (w + 1) * 1000
        v = {c["op"]: c["version"] for c in out[w]["log"]}
        first = {r["id"]: r for r in out[w]["first"]}
        assert sorted(first) == [base + i for i in range(10)]
        assert all(r["_row_created_at_version"] == v["append"] for r in first.values())
        ever_assigned += [r["_row_id"] for r in first.values()]
        for i in range(8):
            rid = first[base + i]["_row_id"]
            if i == 0:
                expected.append((base, "ups", 7.0, rid, v["append"], v["upsert"]))
            elif i < 5:
                expected.append((base + i, "upd", 100.0 + i, rid, v["append"], v["update"]))
            else:
                expected.append((base + i, f"w{w}", float(i), rid, v["append"], v["append"]))
        new = by_id[base + 20]
        expected.append((base + 20, "new", 20.0, new["_row_id"], v["upsert"], v["upsert"]))
        ever_assigned.append(new["_row_id"])
        for i in range(5):
            r = by_id[base + 30 + i]
            expected.append((base + 30 + i, f"w{w}b", 30.0 + i, r["_row_id"], v["append2"], v["append2"]))
            ever_assigned.append(r["_row_id"])
        # counts reported by each write
        log = {c["op"]: c for c in out[w]["log"]}
        assert (log["append"]["inserted"], log["update"]["updated"], log["delete"]["deleted"]) == (10, 5, 2)
        assert (log["upsert"]["updated"], log["upsert"]["inserted"], log["append2"]["inserted"]) == (1, 1, 5)

    cols = DATA + ["_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
    assert rows(final, cols) == sorted(expected, key=repr)
    assert len(ever_assigned) == len(set(ever_assigned)), "a row id was handed out twice"
    assert table.state().lineage.next_row_id > max(ever_assigned)

    _check_metadata_readable(table)
    assert_interop(table)


def test_parallel_increments_of_the_same_rows_lose_nothing(warehouse):
    times = 3
    table = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
    table.append(_batch(list(range(8)), [f"r{i}" for i in range(8)], [0.0] * 8))
    initial = {r["id"]: r["_row_id"] for r in table.scan().to_pylist()}

    out = _run_workers(_increment_worker, [(warehouse, w, times) for w in range(WORKERS)])
    table.refresh()

    commits = sorted((c for w in range(WORKERS) for c in out[w]["log"]), key=lambda c: c["version"])
    increments = [c for c in commits if c["op"] == "update"]
    upserts = [c for c in commits if c["op"] == "upsert"]
    assert (len(increments), len(upserts)) == (WORKERS * times, WORKERS)
    _check_log(table, commits, first_version=2)
    last = 1 + len(commits)

    # the shared keys were inserted exactly once (a racing upsert re-plans into an update)
    assert [c["inserted"] for c in upserts] == [len(SHARED_KEYS)] + [0] * (WORKERS - 1)
    assert [c["updated"] for c in upserts] == [0] + [len(SHARED_KEYS)] * (WORKERS - 1)
    first_upsert = upserts[0]["version"]
    for c in increments:
        assert c["updated"] == 8 + (len(SHARED_KEYS) if c["version"] > first_upsert else 0), c

    final = table.scan().to_pylist()
    assert sorted(r["id"] for r in final) == list(range(8)) + list(SHARED_KEYS)
    ids = [r["_row_id"] for r in final]
    assert len(ids) == len(set(ids))
    by_id = {r["id"]: r for r in final}
    # nothing lost, nothing applied twice
    for i in range(8):
        r = by_id[i]
        assert r["amount"] == float(len(increments)), r
        assert (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) == (initial[i], 1, increments[-1]["version"])
    shared_row_ids = {by_id[k]["_row_id"] for k in SHARED_KEYS}
    assert len(shared_row_ids) == len(SHARED_KEYS) and not shared_row_ids & set(initial.values())
    assert {by_id[k]["_row_created_at_version"] for k in SHARED_KEYS} == {first_upsert}

    # time travel: every version shows exactly the writes committed up to it, in version order
    for v in range(1, last + 1):
        done = [c for c in increments if c["version"] <= v]
        latest = [c for c in upserts if c["version"] <= v]
        snapshot = {r["id"]: r for r in table.scan(as_of=v).to_pylist()}
        assert {snapshot[i]["amount"] for i in range(8)} == {float(len(done))}, v
        if not latest:
            assert set(snapshot) == set(range(8)), v
            continue
        u = latest[-1]
        after = sum(1 for c in done if c["version"] > u["version"])
        for k in SHARED_KEYS:
            assert (snapshot[k]["name"], snapshot[k]["amount"]) == (f"w{u['worker']}", 1000.0 + u["worker"] + after), (v, k)
            assert snapshot[k]["_row_id"] == by_id[k]["_row_id"], (v, k)

    _check_metadata_readable(table)
    assert_interop(table)


# ---------------------------------------------------------------------- a forced, deterministic race
SEED = _batch([1, 2, 3, 4], ["a", "b", "c", "d"], [1.0, 2.0, 3.0, 4.0])  # version 1, row ids 0..3
WINNER = _batch([1, 50], ["W", "W"], [100.0, 50.0])  # upsert: updates id 1 and inserts id 50 (row id 4)

# Each loser write, and what it does to {id: (name, amount)}.
LOSERS = {
    "append": (lambda t, mode: t.append(_batch([10], ["L"], [10.0])), lambda s: {**s, 10: ("L", 10.0)}),
    "update": (
        lambda t, mode: t.update("id <= 2", {"amount": "amount * 2", "name": "'L'"}, mode=mode),
        lambda s: {k: (("L", a * 2) if k <= 2 else (n, a)) for k, (n, a) in s.items()},
    ),
    "delete": (lambda t, mode: t.delete("id IN (1, 3)", mode=mode), lambda s: {k: v for k, v in s.items() if k not in (1, 3)}),
    "upsert": (
        lambda t, mode: t.upsert(_batch([1, 11], ["L", "L"], [0.0, 11.0]), mode=mode),
        lambda s: {**s, 1: ("L", 0.0), 11: ("L", 11.0)},
    ),
}
SEED_STATE = {1: ("a", 1.0), 2: ("b", 2.0), 3: ("c", 3.0), 4: ("d", 4.0)}
WINNER_STATE = {**SEED_STATE, 1: ("W", 100.0), 50: ("W", 50.0)}


def _state(table: lineage.Table) -> dict:
    return {r["id"]: (r["name"], r["amount"]) for r in table.scan(columns=DATA).to_pylist()}


def _race(monkeypatch, warehouse: str, retries: int | None):
    """A table whose next write from ``loser`` loses to one upsert from ``winner``, landing in between."""
    props = {} if retries is None else {"commit.retry.num-retries": str(retries)}
    loser = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    loser.append(SEED)
    winner = lineage.open_table(NAME, warehouse=warehouse)
    # Between the loser's planning and its commit, another writer commits.
    return loser, lose_next_commit(monkeypatch, lambda: winner.upsert(WINNER))


@pytest.mark.parametrize("op", sorted(LOSERS))
def test_lost_race_without_retries_raises_and_commits_nothing(monkeypatch, warehouse, op):
    loser, seen = _race(monkeypatch, warehouse, retries=0)
    write, effect = LOSERS[op]

    with pytest.raises(lineage.CommitConflictError) as info:
        write(loser, None)
    assert "commit.retry.num-retries" in str(info.value)
    assert seen["failures"] == 1

    won: lineage.CommitInfo = seen["winner"]
    assert won.committed and won.version == 2
    fresh = lineage.open_table(NAME, warehouse=warehouse)
    for t in (loser, fresh):
        t.refresh()
        assert t.version == 2
        assert t.iceberg.metadata.current_snapshot().snapshot_id == won.snapshot_id
        assert [(h.version, h.operation) for h in t.history()] == [(1, "append"), (2, "upsert")]
        assert _state(t) == WINNER_STATE
        ids = t.scan(columns=["_row_id"]).column("_row_id").to_pylist()
        assert sorted(ids) == [0, 1, 2, 3, 4]
    assert len(main_branch_snapshots(fresh.iceberg)) == 2
    assert len(fresh.iceberg.metadata.snapshots) == 2, "the loser left a snapshot in the table metadata"
    _check_metadata_readable(fresh)
    assert_interop(fresh)

    # The handle that lost is not poisoned: the same write now lands on top of the winner.
    again = write(loser, None)
    assert again.committed and again.version == 3 and again.attempts == 1
    assert _state(fresh) == effect(WINNER_STATE)
    assert_interop(fresh)


@pytest.mark.parametrize(
    "op, mode",
    [("append", None), ("update", "merge-on-read"), ("update", "copy-on-write"), ("delete", "merge-on-read"),
     ("delete", "copy-on-write"), ("upsert", "merge-on-read"), ("upsert", "copy-on-write")],
)
def test_lost_race_is_replanned_against_the_winner(monkeypatch, warehouse, op, mode):
    loser, seen = _race(monkeypatch, warehouse, retries=None)
    write, effect = LOSERS[op]

    info = write(loser, mode)
    won: lineage.CommitInfo = seen["winner"]
    assert seen["failures"] == 1
    assert info.committed and info.attempts == 2
    assert (won.version, info.version) == (2, 3)

    fresh = lineage.open_table(NAME, warehouse=warehouse)
    assert fresh.version == 3
    assert [(h.version, h.operation) for h in fresh.history()] == [(1, "append"), (2, "upsert"), (3, op)]
    # re-planned: the loser's write applies to the winner's rows, not to the state it first planned against
    assert _state(fresh) == effect(WINNER_STATE)
    live = fresh.scan().to_pylist()
    ids = [r["_row_id"] for r in live]
    assert len(ids) == len(set(ids))
    by_id = {r["id"]: r for r in live}
    assert by_id[50]["_row_id"] == 4  # the winner's insert
    if op in ("append", "upsert"):
        new_key = 10 if op == "append" else 11
        assert by_id[new_key]["_row_id"] == 5, "a retried commit must reassign row ids after the winner's"
        assert by_id[new_key]["_row_created_at_version"] == 3
    if op in ("update", "upsert"):
        assert (by_id[1]["_row_id"], by_id[1]["_row_created_at_version"], by_id[1]["_row_last_updated_at_version"]) == (0, 1, 3)
    _check_metadata_readable(fresh)
    assert_interop(fresh)


def test_merge_with_expected_version_is_a_compare_and_set(monkeypatch, warehouse):
    loser, seen = _race(monkeypatch, warehouse, retries=None)
    before = loser.version
    with pytest.raises(lineage.VersionMovedError) as info:
        # Planned at version 1; the winner commits version 2 before the first commit attempt.
        loser.merge(_batch([1, 11], ["L", "L"], [0.0, 11.0]), expected_version=before)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert isinstance(info.value, lineage.CommitConflictError) and "version 2" in str(info.value)
    fresh = lineage.open_table(NAME, warehouse=warehouse)
    assert fresh.version == 2 and _state(fresh) == WINNER_STATE  # the loser wrote nothing
    assert [(h.version, h.operation) for h in fresh.history()] == [(1, "append"), (2, "upsert")]

    # Stale from the start: refused before planning; current: commits.
    with pytest.raises(lineage.VersionMovedError):
        fresh.merge(deletes=pa.table({"id": [2]}), expected_version=1)
    with pytest.raises(lineage.InvalidArgumentError, match="expected_version"):
        fresh.merge(deletes=pa.table({"id": [2]}), expected_version="2")
    done = fresh.merge(deletes=pa.table({"id": [2]}), expected_version=2)
    assert done.committed and done.version == 3 and done.deleted == 1
    assert_interop(fresh)
