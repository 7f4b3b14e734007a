"""Foreign commits on a lineage table (DESIGN section 8): Spark 3.5 + Iceberg 1.10 and Flink-style commits
through the reference engine write the table; this library reconciles their snapshots.

After every foreign commit: our scan equals Spark's read; untouched rows keep their row ids and updated keys
keep row id and created version; ``history()`` shows the commit marked foreign with its counts; the change
feed (per version and net) matches a model of the commit; ``verify`` is clean; our next write succeeds and
sees the foreign rows. Spark is slow: tables are tiny and the reference engine is shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from conftest import SCHEMA, assert_interop, lose_next_commit, rows

import cdf
import lineage
from lineage.maintenance import verify
from lineage.reconcile import reconciled_list_path

pytestmark = pytest.mark.reference

NAME = "shop.orders"


def _batch(items: list[tuple[int, str, float]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "amount": a} for i, n, a in items], schema=SCHEMA)


def _ids(t: lineage.Table) -> dict[int, tuple[int, int, int]]:
    """key -> (row id, created version, updated version)."""
    out = t.scan()
    return {
        r["id"]: (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"])
        for r in out.select(["id", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]).to_pylist()
    }


def _same_as_spark(reference, warehouse: str, t: lineage.Table) -> None:
    t.refresh()
    ours = t.scan(with_lineage=False)
    theirs = reference.read(warehouse, NAME).cast(SCHEMA)
    assert rows(ours) == rows(theirs), "our scan differs from Spark's read"


def _feed(t: lineage.Table, a: int, b: int | None = None, *, net: bool = False) -> list[tuple]:
    out = cdf.changes(t, a, b, net=net)
    return sorted((r["id"], r["_change_type"], r["_row_id"]) for r in out.to_pylist())


def _foreign_entry(t: lineage.Table):  # noqa: ANN202
    last = t.history()[-1]
    assert last.version == t.version
    return last


@pytest.fixture
def keyed(warehouse):
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0), (4, "d", 4.0)]))
    return t


@pytest.mark.parametrize("mode", ["merge-on-read", "copy-on-write"])
def test_spark_dml_is_reconciled(reference, warehouse, keyed, mode):
    """INSERT, DELETE, UPDATE and MERGE by Spark in one write mode: lineage, history, feed, verify, our next write."""
    t = keyed
    reference.sql(
        warehouse,
        f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.delete.mode'='{mode}', 'write.update.mode'='{mode}', 'write.merge.mode'='{mode}')",
    )
    t.refresh()
    before = _ids(t)
    v0 = t.version

    reference.sql(warehouse, f"INSERT INTO {NAME} VALUES (5, 'e', 5.0), (6, 'f', 6.0)")
    _same_as_spark(reference, warehouse, t)
    after = _ids(t)
    assert {k: after[k] for k in before} == before  # untouched rows keep their lineage
    v1 = t.version
    assert after[5][1:] == after[6][1:] == (v1, v1) and len({after[5][0], after[6][0]} | {r[0] for r in before.values()}) == 6
    entry = _foreign_entry(t)
    assert entry.foreign == "spark" and entry.operation == "append" and (entry.inserted, entry.updated, entry.deleted) == (2, 0, 0)
    assert _feed(t, v1 - 1) == sorted([(5, "insert", after[5][0]), (6, "insert", after[6][0])])

    reference.sql(warehouse, f"DELETE FROM {NAME} WHERE id = 2")
    _same_as_spark(reference, warehouse, t)
    v2 = t.version
    now = _ids(t)
    assert 2 not in now and {k: now[k] for k in (1, 3, 4, 5, 6)} == {k: after[k] for k in (1, 3, 4, 5, 6)}
    assert _feed(t, v2 - 1) == [(2, "delete", after[2][0])]
    assert _foreign_entry(t).deleted == 1 and _foreign_entry(t).inserted == 0

    reference.sql(warehouse, f"UPDATE {NAME} SET amount = amount * 10 WHERE id IN (1, 5)")
    _same_as_spark(reference, warehouse, t)
    v3 = t.version
    now3 = _ids(t)
    for k in (1, 5):
        assert now3[k] == (after[k][0], after[k][1], v3), f"key {k} must keep row id and created version"
    for k in (3, 4, 6):
        assert now3[k] == after[k]
    assert _feed(t, v3 - 1) == sorted(
        [(k, c, after[k][0]) for k in (1, 5) for c in ("update_preimage", "update_postimage")]
    )
    e3 = _foreign_entry(t)
    assert (e3.inserted, e3.updated, e3.deleted) == (0, 2, 0)

    src = _batch([(3, "c2", 30.0), (7, "g", 7.0)])
    reference.sql(
        warehouse,
        f"MERGE INTO {NAME} t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        views={"src": src},
    )
    _same_as_spark(reference, warehouse, t)
    v4 = t.version
    now4 = _ids(t)
    assert now4[3] == (after[3][0], after[3][1], v4) and now4[7][1:] == (v4, v4)
    assert {k: now4[k] for k in (1, 4, 5, 6)} == {k: now3[k] for k in (1, 4, 5, 6)}
    assert _feed(t, v4 - 1) == sorted(
        [(3, "update_preimage", after[3][0]), (3, "update_postimage", after[3][0]), (7, "insert", now4[7][0])]
    )
    # Net over all four foreign commits: 2 deleted, 1 and 3 updated (5 inserted then updated: an insert), 5, 6, 7 inserted.
    net = _feed(t, v0, net=True)
    assert sorted({(k, c) for k, c, _ in net}) == sorted(
        [(1, "update_preimage"), (1, "update_postimage"), (2, "delete"), (3, "update_preimage"), (3, "update_postimage"),
         (5, "insert"), (6, "insert"), (7, "insert")]
    )
    assert [h.foreign for h in t.history()][-4:] == ["spark"] * 4
    assert not verify(t).problems

    # Our next writes build on the foreign snapshots and keep them in the commit log.
    t.upsert(_batch([(4, "d2", 40.0), (8, "h", 8.0)]))
    t.delete("id = 6")
    now5 = _ids(t)
    assert now5[4][0] == after[4][0] and now5[7] == now4[7] and 6 not in now5
    assert [h.foreign for h in t.history()][-6:] == ["spark"] * 4 + [None, None]
    _same_as_spark(reference, warehouse, t)
    assert not verify(t).problems
    # The reconciled list is persisted where every reader finds it.
    foreign = [s for s in t.iceberg.metadata.snapshots if "lineage.list" not in s.summary.additional_properties]
    assert len(foreign) == 4 and all(os.path.exists(reconciled_list_path(t.iceberg, s.snapshot_id)) for s in foreign)
    assert_interop(t)  # pyiceberg's scan and DuckDB's iceberg_scan read Spark's files and position deletes
    reference.forget(warehouse)


@pytest.mark.parametrize("partition_by", [None, ["bucket(2, id)"]])
def test_flink_equality_deletes_are_reconciled_and_read(reference, warehouse, partition_by):
    """Flink-style checkpoints with equality deletes: our readers apply them; an upserted key, and a key deleted
    and written again in one checkpoint, keep their row ids (updates); a key written and deleted within the
    checkpoint never appears; the feed shows one event per key."""
    t = lineage.create_table(NAME, SCHEMA, key=["id"], partition_by=partition_by, warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0), (4, "d", 4.0)]))
    before = _ids(t)
    reference.flink_commit(
        warehouse,
        NAME,
        [
            ("+I", {"id": 1, "name": "a2", "amount": 10.0}),  # upsert of a live key: equality delete + new image
            ("-D", {"id": 2}),  # equality delete only
            ("-D", {"id": 4}),  # deleted ...
            ("+I", {"id": 4, "name": "d2", "amount": 40.0}),  # ... and written again: an update
            ("+I", {"id": 10, "name": "j", "amount": 100.0}),
            ("+I", {"id": 11, "name": "k", "amount": 110.0}),
            ("-D", {"id": 11}),  # written and deleted within the checkpoint: a position delete
        ],
        upsert=True,
    )
    _same_as_spark(reference, warehouse, t)
    v = t.version
    now = _ids(t)
    assert sorted(now) == [1, 3, 4, 10]
    assert now[1] == (before[1][0], before[1][1], v) and now[4] == (before[4][0], before[4][1], v) and now[3] == before[3]
    assert now[10][1:] == (v, v) and now[10][0] not in {r[0] for r in before.values()}
    entry = _foreign_entry(t)
    assert entry.foreign == "flink" and (entry.inserted, entry.updated, entry.deleted) == (1, 2, 1)
    assert _feed(t, v - 1) == sorted(
        [(1, "update_preimage", before[1][0]), (1, "update_postimage", before[1][0]), (2, "delete", before[2][0]),
         (4, "update_preimage", before[4][0]), (4, "update_postimage", before[4][0]), (10, "insert", now[10][0])]
    )
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(1, "a2", 10.0), (3, "c", 3.0), (4, "d2", 40.0), (10, "j", 100.0)]))
    assert not verify(t).problems
    _third_party_readers_on_equality_deletes(t)
    resolved = t.state().lineage.resolved_deletes
    assert resolved and all(os.path.exists(p) for p in resolved)

    # Non-upsert mode: -U/+U of a key and a full-row delete.
    reference.flink_commit(
        warehouse, NAME,
        [("-U", {"id": 3, "name": "c", "amount": 3.0}), ("+U", {"id": 3, "name": "c3", "amount": 33.0}),
         ("-D", {"id": 10, "name": "j", "amount": 100.0})],
        upsert=False,
    )
    _same_as_spark(reference, warehouse, t)
    v2 = t.version
    now2 = _ids(t)
    assert now2[3] == (before[3][0], before[3][1], v2) and 10 not in now2 and now2[1] == now[1]
    assert _feed(t, v2 - 1) == sorted(
        [(3, "update_preimage", before[3][0]), (3, "update_postimage", before[3][0]), (10, "delete", now[10][0])]
    )
    # Net over both checkpoints: 10 inserted then deleted nets to nothing.
    assert sorted({(k, c) for k, c, _ in _feed(t, v - 1, net=True)}) == sorted(
        [(1, "update_preimage"), (1, "update_postimage"), (2, "delete"), (3, "update_preimage"), (3, "update_postimage"),
         (4, "update_preimage"), (4, "update_postimage")]
    )
    # Our writes on top: they see the foreign rows through the equality deletes.
    t.upsert(_batch([(2, "b2", 20.0), (3, "c4", 34.0)]))
    t.delete("id = 1")
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(2, "b2", 20.0), (3, "c4", 34.0), (4, "d2", 40.0)]))
    assert _ids(t)[3][0] == before[3][0]
    _same_as_spark(reference, warehouse, t)
    assert not verify(t).problems
    # Purging key 3 copies the first data file (its old images live there): the copy must keep the rows the
    # equality deletes removed deleted, for every reader, whatever its data sequence number.
    t.purge("id = 3")
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(2, "b2", 20.0), (4, "d2", 40.0)]))
    _same_as_spark(reference, warehouse, t)
    # Compaction drops the equality-deleted rows with their data files; nothing changes for any reader.
    t.compact()
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(2, "b2", 20.0), (4, "d2", 40.0)]))
    _same_as_spark(reference, warehouse, t)
    assert not verify(t).problems
    reference.forget(warehouse)


def test_spark_rewrite_data_files_is_moves_only(reference, warehouse, keyed):
    """rewrite_data_files and rewrite_position_delete_files (replace snapshots): lineage kept, no change events."""
    t = keyed
    t.delete("id = 4")
    reference.sql(warehouse, f"INSERT INTO {NAME} VALUES (5, 'e', 5.0)")
    reference.sql(warehouse, f"DELETE FROM {NAME} WHERE id = 1")
    # The CLI derives and stores the foreign commits' lineage explicitly.
    cli = subprocess.run(
        [sys.executable, "-m", "lineage.cli", "--warehouse", warehouse, "-f", "json", "reconcile", NAME],
        capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    t.refresh()
    assert json.loads(cli.stdout)["foreign_versions"] == [t.version - 1, t.version]
    before = _ids(t)
    v0 = t.version
    reference.sql(warehouse, f"CALL system.rewrite_position_delete_files(table => '{NAME}', options => map('rewrite-all', 'true'))")
    reference.sql(warehouse, f"CALL system.rewrite_data_files(table => '{NAME}', options => map('rewrite-all', 'true'))")
    t.refresh()
    assert t.iceberg.metadata.current_snapshot().summary.operation.value == "replace"
    _same_as_spark(reference, warehouse, t)
    assert _ids(t) == before
    assert _feed(t, v0) == []
    assert all((h.inserted, h.updated, h.deleted) == (0, 0, 0) for h in t.history() if h.version > v0)
    assert not verify(t).problems
    t.upsert(_batch([(2, "b2", 2.5)]))
    assert _ids(t)[2][0] == before[2][0]
    reference.forget(warehouse)


def test_keyless_table_pairs_identical_rows(reference, warehouse):
    """A table without a key: copy-on-write carry-over pairs identical rows (duplicates included) as moves;
    a changed row is a delete and an insert."""
    t = lineage.create_table(NAME, SCHEMA, warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]))
    reference.sql(
        warehouse,
        f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.delete.mode'='copy-on-write', 'write.update.mode'='copy-on-write')",
    )
    before = t.scan()
    v0 = t.version
    reference.sql(warehouse, f"UPDATE {NAME} SET amount = 30.0 WHERE id = 3")
    _same_as_spark(reference, warehouse, t)
    after = t.scan()
    kept = {(r["id"], r["_row_id"]) for r in after.to_pylist() if r["id"] != 3}
    assert kept == {(r["id"], r["_row_id"]) for r in before.to_pylist() if r["id"] != 3}
    feed = cdf.changes(t, v0)
    assert sorted((r["id"], r["_change_type"], r["amount"]) for r in feed.to_pylist()) == [(3, "delete", 3.0), (3, "insert", 30.0)]
    assert not verify(t).problems
    reference.forget(warehouse)


def test_our_write_that_loses_to_a_foreign_commit_replans_on_top_of_it(reference, warehouse, keyed, monkeypatch):
    """Between our planning and our commit Spark commits an UPDATE; our upsert fails once, re-plans on the
    reconciled foreign snapshot and lands; both changes are in the table and the commit log."""
    t = keyed
    before = _ids(t)
    seen = lose_next_commit(monkeypatch, lambda: reference.sql(warehouse, f"UPDATE {NAME} SET amount = -1.0 WHERE id = 1"))
    t.upsert(_batch([(2, "b2", 20.0), (9, "z", 9.0)]))
    assert seen["failures"] == 1
    assert rows(t.scan(with_lineage=False)) == rows(
        _batch([(1, "a", -1.0), (2, "b2", 20.0), (3, "c", 3.0), (4, "d", 4.0), (9, "z", 9.0)])
    )
    now = _ids(t)
    assert now[1][0] == before[1][0] and now[2][0] == before[2][0]
    assert [h.foreign for h in t.history()][-2:] == ["spark", None]
    _same_as_spark(reference, warehouse, t)
    assert not verify(t).problems
    reference.forget(warehouse)


def test_foreign_versions_in_every_engine_and_reader(reference, warehouse, keyed, spark):
    """The Spark CDF engine agrees with DuckDB across foreign commits; to_spark applies equality deletes;
    DuckDB's iceberg_scan reads the table (position deletes); the reconciled list survives a truncated file."""
    t = keyed
    v0 = t.version
    reference.sql(warehouse, f"UPDATE {NAME} SET name = 'x' WHERE id = 3")
    reference.row_delta(warehouse, NAME, upserts=[{"id": 4, "name": "d2", "amount": 4.5}], deletes=[{"id": 1}])
    t.refresh()
    duck_feed = cdf.changes(t, v0)
    spark_feed = cdf.changes(t, v0, engine="spark", spark=spark).toPandas()
    key = ["id", "_change_type", "_commit_version", "_row_id"]
    assert sorted(map(tuple, spark_feed[key].values.tolist())) == sorted(
        tuple(r[k] for k in key) for r in duck_feed.to_pylist()
    )
    assert {r["_change_type"] for r in duck_feed.to_pylist()} == {"update_preimage", "update_postimage", "delete"}
    df = t.to_spark(spark)
    assert sorted(r["id"] for r in df.select("id").collect()) == [2, 3, 4]
    # A truncated reconciled list is treated as absent by the next reader and written again by reconcile().
    t.reconcile()
    foreign = t.iceberg.metadata.current_snapshot()
    path = reconciled_list_path(t.iceberg, foreign.snapshot_id)
    with open(path, "w") as f:
        f.write("{\"form")
    from lineage.storage.metadata import _LIST_CACHE
    import lineage.reconcile as rec

    _LIST_CACHE.clear()
    rec._CACHE.clear()
    again = lineage.open_table(NAME, warehouse=warehouse)
    assert rows(again.scan()) == rows(t.scan())
    assert os.path.getsize(path) < 10  # reads write nothing under the table's location
    again.reconcile()
    assert os.path.getsize(path) > 10
    reference.forget(warehouse)


def _third_party_readers_on_equality_deletes(t: lineage.Table) -> None:
    """pyiceberg 0.12 refuses to plan a snapshot with equality deletes (the README says so); DuckDB's
    iceberg_scan reads it, with our rows."""
    with pytest.raises(ValueError, match="[Ee]quality"):
        t.iceberg.scan().to_arrow()
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    assert "pyiceberg" in readme and "equality delete" in readme.lower()
    from lineage import duck

    ours = t.scan(with_lineage=False)
    con = duck.connect("iceberg")
    try:
        ddb = con.execute(f"SELECT id, name, amount FROM iceberg_scan('{t.iceberg.metadata_location}')").to_arrow_table()
    finally:
        con.close()
    assert rows(ddb) == rows(ours), "DuckDB iceberg_scan differs from ours on equality deletes"


# ---------------------------------------------------------------------- property: interleaved writers


def _net(before: dict[int, tuple], after: dict[int, tuple]) -> list[tuple]:
    """Expected net feed between two states given as row id -> (key, name, amount)."""
    out = []
    for rid in before.keys() | after.keys():
        if rid not in after:
            out.append((before[rid][0], "delete", rid))
        elif rid not in before:
            out.append((after[rid][0], "insert", rid))
        elif before[rid] != after[rid]:
            out += [(after[rid][0], "update_preimage", rid), (after[rid][0], "update_postimage", rid)]
    return sorted(out)


def _by_row_id(t: lineage.Table) -> dict[int, tuple]:
    return {r["_row_id"]: (r["id"], r["name"], r["amount"]) for r in t.scan().to_pylist()}


OPS = st.sampled_from(["upsert", "delete", "spark_insert", "spark_update", "spark_delete", "spark_merge", "flink"])


@settings(
    max_examples=int(os.environ.get("LINEAGE_RECONCILE_EXAMPLES", "3")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(mode=st.sampled_from(["merge-on-read", "copy-on-write"]), ops=st.lists(st.tuples(OPS, st.sets(st.integers(1, 8), min_size=1, max_size=3)), min_size=2, max_size=5))
def test_interleaved_writers_match_a_model(reference, mode, ops):
    """Property: random writes of ours and of Spark/Flink, interleaved. After every step our scan is the model,
    keys that stay live keep their row id, and the change feed of the step is the difference of the two states
    (by row id); at the end the net feed over everything and Spark's read agree with the model."""
    with tempfile.TemporaryDirectory(prefix="rec-prop-") as tmp:
        warehouse = os.path.join(tmp, "wh")
        t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
        t.append(_batch([(k, f"n{k}", float(k)) for k in (1, 2, 3, 4)]))
        reference.sql(
            warehouse,
            f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.delete.mode'='{mode}', 'write.update.mode'='{mode}', 'write.merge.mode'='{mode}')",
        )
        note(f"mode={mode}")
        start, v_start = _by_row_id(t), t.version
        counter = [100.0]

        def value() -> float:
            counter[0] += 1
            return counter[0]

        for kind, keys in ops:
            before, v_before = _by_row_id(t), t.version
            live = {k for k, _, _ in before.values()}
            hit, miss = sorted(keys & live), sorted(keys - live)
            note(f"v{v_before}: {kind} {sorted(keys)}")
            if kind == "upsert":
                t.upsert(_batch([(k, f"u{k}", value()) for k in sorted(keys)]))
            elif kind == "delete":
                if not hit:
                    continue
                t.delete(f"id IN ({', '.join(map(str, hit))})")
            elif kind == "spark_insert":
                if not miss:
                    continue
                values = ", ".join(f"({k}, 's{k}', {value()})" for k in miss)
                reference.sql(warehouse, f"INSERT INTO {NAME} VALUES {values}")
            elif kind in ("spark_update", "spark_delete"):
                if not hit:
                    continue
                where = f"id IN ({', '.join(map(str, hit))})"
                stmt = f"UPDATE {NAME} SET amount = amount + {value()}, name = 'x' WHERE {where}" if kind == "spark_update" else f"DELETE FROM {NAME} WHERE {where}"
                reference.sql(warehouse, stmt)
            elif kind == "spark_merge":
                reference.sql(
                    warehouse,
                    f"MERGE INTO {NAME} t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
                    views={"src": _batch([(k, f"m{k}", value()) for k in sorted(keys)])},
                )
            else:
                half = sorted(keys)[: len(keys) // 2]
                reference.row_delta(
                    warehouse, NAME,
                    upserts=[{"id": k, "name": f"f{k}", "amount": value()} for k in sorted(keys) if k not in half],
                    deletes=[{"id": k} for k in half],
                )
            t.refresh()
            after = _by_row_id(t)
            # Every live key keeps its row id unless this step removed it without writing it again.
            for rid, (k, _, _) in after.items():
                if k in live and rid not in before:
                    old = next(r for r, v in before.items() if v[0] == k)
                    raise AssertionError(f"key {k} changed row id {old} -> {rid} at {kind}")
            assert _feed(t, v_before) == _net(before, after), f"feed of {kind} differs from the model"
            assert _feed(t, v_before, net=True) == _net(before, after)
        assert _feed(t, v_start, net=True) == _net(start, _by_row_id(t))
        _same_as_spark(reference, warehouse, t)
        assert not verify(t).problems
        reference.forget(warehouse)
