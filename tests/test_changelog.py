"""Change-stream ingest (``Table.apply_changelog``): semantics per event sequence, errors, exactly-once positions."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from conftest import SCHEMA, assert_interop, rows

import cdf
import lineage

A, B, C = ("a", 1.0), ("b", 2.0), ("c", 3.0)


def events(*evs: tuple) -> pa.Table:
    """``(op, id, (name, amount))`` tuples as a batch."""
    return pa.table(
        {
            "_op": [e[0] for e in evs],
            "id": pa.array([e[1] for e in evs], pa.int64()),
            "name": [e[2][0] for e in evs],
            "amount": pa.array([e[2][1] for e in evs], pa.float64()),
        }
    )


@pytest.fixture
def seeded(table: lineage.Table) -> lineage.Table:
    """Key 1 live with image A (row id 0, version 1)."""
    table.append(pa.table({"id": [1], "name": [A[0]], "amount": [A[1]]}, schema=SCHEMA))
    return table


def feed_of(t: lineage.Table, version: int, net: bool = False) -> list[tuple]:
    f = cdf.changes(t, version - 1, version, net=net).to_pylist()
    return [(r["_change_type"], r["id"], r["name"], r["amount"], r["_row_id"], r["_changed_columns"]) for r in f]


# One key, live with image A (row id 0) or absent before the batch: the event sequence and the commit's feed.
SEMANTICS = [
    # live before and after: an update pair that keeps row id 0
    ("live", [("-U", A), ("+U", B)], [("update_preimage", *A, 0), ("update_postimage", *B, 0)]),
    ("live", [("-U", A), ("+U", A)], [("update_preimage", *A, 0), ("update_postimage", *A, 0)]),  # equal values: still a pair
    ("live", [("-D", A), ("+I", B)], [("update_preimage", *A, 0), ("update_postimage", *B, 0)]),
    ("live", [("-U", A), ("+U", B), ("-U", B), ("+U", C)], [("update_preimage", *A, 0), ("update_postimage", *C, 0)]),
    ("live", [("u", B)], [("update_preimage", *A, 0), ("update_postimage", *B, 0)]),  # Debezium update (after image)
    ("live", [("UPDATE_BEFORE", A), ("UPDATE_AFTER", B)], [("update_preimage", *A, 0), ("update_postimage", *B, 0)]),
    # live before, absent after: a delete
    ("live", [("-D", A)], [("delete", *A, 0)]),
    ("live", [("d", A)], [("delete", *A, 0)]),
    ("live", [("-U", A)], [("delete", *A, 0)]),  # a retraction never followed by +U
    ("live", [("-U", A), ("+U", B), ("-D", B)], [("delete", *A, 0)]),
    # absent before, live after: an insert with a fresh row id (1)
    ("absent", [("+I", A)], [("insert", *A, 1)]),
    ("absent", [("c", A)], [("insert", *A, 1)]),
    ("absent", [("r", A)], [("insert", *A, 1)]),  # Debezium snapshot read
    ("absent", [("+U", A)], [("insert", *A, 1)]),  # +U whose -U came in an earlier batch
    ("absent", [("+I", A), ("-U", A), ("+U", B)], [("insert", *B, 1)]),
    # absent before and after: nothing
    ("absent", [("+I", A), ("-D", A)], []),
]


def test_net_effect_per_key(table: lineage.Table) -> None:
    """Every sequence of SEMANTICS on a key of its own, interleaved in one batch: one commit whose feed is each key's net effect."""
    live = [k for k, (start, _, _) in enumerate(SEMANTICS, 1) if start == "live"]
    table.append(pa.table({"id": live, "name": [A[0]] * len(live), "amount": [A[1]] * len(live)}, schema=SCHEMA))
    first_new_id = len(live)
    row_id = {k: i for i, k in enumerate(live)}
    queues = [[(op, k, img) for op, img in seq] for k, (_, seq, _) in enumerate(SEMANTICS, 1)]
    batch = []
    while any(queues):  # round robin: the events of different keys interleave, each key's stay in order
        for q in queues:
            if q:
                batch.append(q.pop(0))
    info = table.apply_changelog(events(*batch))
    assert info.committed and info.version == 2

    inserted = sorted(k for k, (_, _, exp) in enumerate(SEMANTICS, 1) if any(e[0] == "insert" for e in exp))
    row_id.update({k: first_new_id + i for i, k in enumerate(inserted)})  # fresh ids in key order of the batch's inserts
    per_key: dict[int, list] = {}
    for r in feed_of(table, 2):
        per_key.setdefault(r[1], []).append(r)
    fresh_ids = {r[4] for rs in per_key.values() for r in rs if r[0] == "insert"}
    assert fresh_ids.isdisjoint(set(range(first_new_id))), "an insert re-used an existing row id"
    net = {r[1]: r for r in feed_of(table, 2, net=True)}
    for k, (start, seq, expected) in enumerate(SEMANTICS, 1):
        got = sorted(r[:4] for r in per_key.get(k, []))
        assert got == sorted((c, k, n, a) for c, n, a, _ in expected), f"key {k}: {start} {seq}"
        for r in per_key.get(k, []):
            if r[0] != "insert":
                assert r[4] == row_id[k], f"key {k}: row id changed"
        if seq == [("-U", A), ("+U", A)]:
            assert {repr(r[5]) for r in per_key[k]} == {"[]"}  # equal images: an update pair with no changed column
            assert k not in net  # net mode drops it
    assert (info.inserted, info.updated, info.deleted) == tuple(
        sum(any(e[0] == kind for e in exp) for _, _, exp in SEMANTICS) for kind in ("insert", "update_postimage", "delete")
    )
    assert_interop(table)


def test_nothing_to_commit(seeded: lineage.Table) -> None:
    info = seeded.apply_changelog(events(("+I", 5, A), ("-D", 5, A)))
    assert not info.committed and info.version == 1 and seeded.version == 1


STRICT_VIOLATIONS = [
    ("live", [("+I", B)], "adds key {'id': 1} that is already live"),
    ("live", [("+U", B)], "adds key {'id': 1} that is already live"),
    ("live", [("-U", B)], "retracts key {'id': 1} with an image that differs from its live row"),
    ("live", [("-U", A), ("+U", B), ("-U", A)], "differs from its live row"),  # checked against the batch's image
    ("live", [("-D", A), ("-D", A)], "deletes key {'id': 1} that is not live"),
    ("absent", [("-D", A)], "deletes key {'id': 1} that is not live"),
    ("absent", [("-U", A)], "retracts key {'id': 1} that is not live"),
    ("absent", [("u", A)], "updates key {'id': 1} that is not live"),
    ("absent", [("+I", A), ("+I", B)], "adds key {'id': 1} that is already live"),
]


def test_strict_mode_refuses_and_writes_nothing(table: lineage.Table) -> None:
    """Each violation alone in a batch of otherwise valid events: KeyViolationError naming it, and nothing written."""
    table.append(pa.table({"id": [1, 2], "name": [A[0], "z"], "amount": [A[1], 9.0]}, schema=SCHEMA))
    before, scan = table.version, rows(table.scan())
    for start, seq, message in STRICT_VIOLATIONS:
        key = 1 if start == "live" else 5
        with pytest.raises(lineage.KeyViolationError, match="nothing was written") as err:
            table.apply_changelog(events(("-D", 2, ("z", 9.0)), *[(op, key, img) for op, img in seq]))
        assert message.replace("'id': 1", f"'id': {key}") in str(err.value), (seq, str(err.value))
        assert "upsert=True" in str(err.value)
    assert table.version == before and rows(table.scan()) == scan


def test_upsert_mode(seeded: lineage.Table) -> None:
    """+I/+U of a live key update it; -U/-D of an absent key are ignored and counted; -U images are not checked."""
    info = seeded.apply_changelog(events(("+I", 1, B), ("-D", 7, A), ("-U", 8, A), ("+U", 9, C)), upsert=True)
    assert (info.inserted, info.updated, info.deleted, info.ignored) == (1, 1, 0, 2)
    assert rows(seeded.scan(columns=["id", "name", "_row_id"])) == [(1, "b", 0), (9, "c", 1)]
    info = seeded.apply_changelog(events(("-U", 1, A)), upsert=True)  # image differs from the live row (B): still removed
    assert info.deleted == 1
    info = seeded.apply_changelog(events(("-D", 1, A), ("-D", 1, A)), upsert=True)
    assert not info.committed and info.ignored == 2


def test_batch_order_from_order_by_columns(seeded: lineage.Table) -> None:
    """With order_by, events apply in that order whatever the row order; ties inside a key are refused."""
    batch = events(("+U", 1, C), ("-U", 1, A), ("+I", 4, A)).append_column("seq", pa.array([2, 1, 1]))
    seeded.apply_changelog(batch, order_by="seq")
    assert rows(seeded.scan(columns=["id", "name", "_row_id"])) == [(1, "c", 0), (4, "a", 1)]
    tie = events(("-U", 1, C), ("+U", 1, A)).append_column("seq", pa.array([5, 5]))
    with pytest.raises(lineage.InvalidArgumentError, match="order is ambiguous"):
        seeded.apply_changelog(tie, order_by=["seq"])


def test_pandas_batch_and_composite_key(warehouse: str) -> None:
    schema = pa.schema([("region", pa.string()), ("id", pa.int32()), ("qty", pa.int64())])
    t = lineage.create_table("s.stock", schema, key=["region", "id"], warehouse=warehouse)
    t.append(pa.table({"region": ["eu", "us"], "id": [1, 1], "qty": [5, 6]}, schema=schema))
    df = pd.DataFrame({"op": ["-U", "+U", "+I", "-D"], "region": ["eu", "eu", "eu", "us"], "id": [1, 1, 2, 1], "qty": [5, 7, 1, 6]})
    info = t.apply_changelog(df, op_column="op")
    assert (info.inserted, info.updated, info.deleted) == (1, 1, 1)
    assert rows(t.scan(columns=["region", "id", "qty", "_row_id"])) == [("eu", 1, 7, 0), ("eu", 2, 1, 2)]


@pytest.mark.parametrize("mode", [lineage.MERGE_ON_READ, lineage.COPY_ON_WRITE])
def test_partitioned_table_and_interop(warehouse: str, mode: str) -> None:
    t = lineage.create_table("s.p", SCHEMA, key=["id"], partition_by=["bucket(4, id)"], warehouse=warehouse)
    t.append(pa.table({"id": range(20), "name": ["x"] * 20, "amount": [float(i) for i in range(20)]}, schema=SCHEMA))
    before = {r["id"]: r["_row_id"] for r in t.scan().to_pylist()}
    batch = events(*[("-U", i, ("x", float(i))) for i in range(0, 20, 3)], *[("+U", i, ("y", 0.5)) for i in range(0, 20, 3)],
                   *[("-D", i, ("x", float(i))) for i in range(1, 20, 6)], ("+I", 30, ("n", 1.0)))
    info = t.apply_changelog(batch, mode=mode)
    assert (info.inserted, info.updated, info.deleted) == (1, 7, 4)
    assert (info.data_files_removed > 0) == (mode == lineage.COPY_ON_WRITE)
    assert_interop(t)
    ids = {r["id"]: r["_row_id"] for r in t.scan().to_pylist()}
    assert all(ids[i] == before[i] for i in range(0, 20, 3)) and 30 in ids and 1 not in ids


def test_bad_batches_are_refused_before_anything_is_written(seeded: lineage.Table, warehouse: str) -> None:
    ok = events(("+I", 2, A))
    cases = [
        (ok.drop_columns(["_op"]), lineage.UnknownColumnError, "no operation column '_op'"),
        (ok.set_column(0, "_op", pa.array(["+X"])), lineage.InvalidArgumentError, r"'\+X'.*first at row 0"),
        (ok.set_column(0, "_op", pa.array([None], pa.string())), lineage.InvalidArgumentError, "no change operation"),
        (ok.set_column(0, "_op", pa.array([1])), lineage.SchemaMismatchError, "must hold strings"),
        (ok.append_column("extra", pa.array([1])), lineage.UnknownColumnError, "extra"),
        (events(("+I", None, A)), lineage.KeyViolationError, "null"),
        (ok.set_column(2, "name", pa.array([7])), lineage.SchemaMismatchError, "name"),
    ]
    for batch, error, match in cases:
        with pytest.raises(error, match=match):
            seeded.apply_changelog(batch)
    with pytest.raises(lineage.UnknownColumnError, match="order_by"):
        seeded.apply_changelog(ok, order_by="seq")
    with pytest.raises(lineage.InvalidArgumentError, match="op_column"):
        seeded.apply_changelog(ok, op_column="id")
    with pytest.raises(lineage.InvalidArgumentError, match="upsert"):
        seeded.apply_changelog(ok, upsert="yes")  # type: ignore[arg-type]
    plain = lineage.create_table("s.nokey", SCHEMA, warehouse=warehouse)
    with pytest.raises(lineage.KeyViolationError, match="no key"):
        plain.apply_changelog(ok)
    assert seeded.version == 1


def test_required_columns_may_be_missing_only_from_removing_events(warehouse: str) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string(), nullable=False)])
    t = lineage.create_table("s.req", schema, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": [1, 2], "name": ["a", "b"]}, schema=schema))
    with pytest.raises(lineage.SchemaMismatchError, match="required"):
        t.apply_changelog(pa.table({"_op": ["+I"], "id": [3], "name": pa.array([None], pa.string())}))
    info = t.apply_changelog(pa.table({"_op": ["-D", "d"], "id": [1, 2]}))  # Debezium-style deletes carrying only the key
    assert info.deleted == 2 and t.count() == 0


def test_stream_positions_make_replays_no_ops(seeded: lineage.Table) -> None:
    first = seeded.apply_changelog(events(("+I", 2, A)), stream=("orders-cdc", 0))
    assert first.committed
    replay = seeded.apply_changelog(events(("+I", 2, A)), stream=("orders-cdc", 0))  # strict mode would refuse it
    assert not replay.committed and seeded.version == first.version
    seeded.delete("id = 1")  # another writer commits in between
    assert not seeded.apply_changelog(events(("+I", 2, A)), stream=("orders-cdc", 0)).committed
    nxt = seeded.apply_changelog(events(("-U", 2, A), ("+U", 2, B)), stream=("orders-cdc", 1))
    assert nxt.committed
    other = seeded.apply_changelog(events(("+I", 3, C)), stream=("other", 0))  # streams are independent
    assert other.committed
    props = [c.properties for c in seeded.history() if c.operation == "changelog"]
    assert [(p["lineage.user.stream-id"], p["lineage.user.stream-batch-id"]) for p in props] == [
        ("orders-cdc", "0"), ("orders-cdc", "1"), ("other", "0")
    ]
    snap = seeded.iceberg.metadata.current_snapshot()
    assert snap.summary.additional_properties["lineage.user.stream-id"] == "other"
    for bad in [("s",), ("", 1), ("s", -1), ("s", "1"), ("s", True)]:
        with pytest.raises(lineage.InvalidArgumentError, match="stream"):
            seeded.apply_changelog(events(("+I", 9, A)), stream=bad)  # type: ignore[arg-type]
    with pytest.raises(lineage.InvalidArgumentError, match="set by stream="):
        seeded.apply_changelog(events(("+I", 9, A)), stream=("s", 1), properties={"lineage.user.stream-id": "x"})


def test_cli_apply_changelog(tmp_path, warehouse: str) -> None:
    """``lineage apply-changelog``: Flink events from CSV, Debezium events from JSON lines in upsert mode, a refused batch."""
    import json
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lineage.cli", "--warehouse", warehouse, *args], capture_output=True, text=True, timeout=300)

    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": [1, 2], "name": ["ann", "bob"], "amount": [10.0, 20.0]}, schema=SCHEMA))
    (tmp_path / "a.csv").write_text("_op,id,name,amount\n-U,1,ann,10\n+U,1,ann,11\n-D,2,bob,20\n+I,3,cy,30\n")
    p = run("apply-changelog", "shop.orders", str(tmp_path / "a.csv"))
    assert p.returncode == 0, p.stderr
    assert "version 2 (changelog): 1 inserted, 1 updated, 1 deleted" in p.stdout
    (tmp_path / "b.jsonl").write_text('{"op": "u", "id": 1, "name": "ann", "amount": 12}\n{"op": "d", "id": 9}\n{"op": "c", "id": 3, "name": "cy", "amount": 31}\n')
    p = run("--format", "json", "apply-changelog", "shop.orders", str(tmp_path / "b.jsonl"), "--op-column", "op", "--upsert")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["version"], out["updated"], out["ignored"]) == (3, 2, 1)
    p = run("apply-changelog", "shop.orders", str(tmp_path / "a.csv"))  # a replay in strict mode
    assert p.returncode == 2 and "nothing was written" in p.stderr and "Traceback" not in p.stderr
    assert rows(t.scan(columns=["id", "amount", "_row_id"])) == [(1, 12.0, 0), (3, 31.0, 2)]
