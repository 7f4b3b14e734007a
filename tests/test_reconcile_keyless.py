"""Spark's statements on a table without a key (DESIGN section 8): removed and added images pair only when every
column is equal (a multiset match: duplicates pair one to one), as moves; the rest are deletes and inserts.

After INSERT, DELETE, UPDATE and MERGE (merge-on-read and copy-on-write) and after ``rewrite_data_files`` and
``rewrite_position_delete_files``: our scan equals Spark's read; every row the statement did not touch keeps its
row id and versions (as many of each value as stayed); the change feed of the step is the multiset difference
of the two states (deletes carry the old row ids, inserts fresh ones); ``verify`` is clean; our next write
succeeds. One table per mode, reused across statements: Spark is slow.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from conftest import SCHEMA, rows

import cdf
import lineage
from lineage.maintenance import verify

pytestmark = pytest.mark.reference

NAME = "shop.orders"


def _batch(items: list[tuple[int, str, float]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "amount": a} for i, n, a in items], schema=SCHEMA)


def _state(t: lineage.Table) -> dict[int, tuple]:
    """row id -> ((id, name, amount), created, updated)."""
    return {
        r["_row_id"]: ((r["id"], r["name"], r["amount"]), r["_row_created_at_version"], r["_row_last_updated_at_version"])
        for r in t.scan().to_pylist()
    }


def _values(state: dict[int, tuple]) -> Counter:
    return Counter(v for v, _, _ in state.values())


def _feed(t: lineage.Table, a: int, b: int | None = None, *, net: bool = False) -> Counter:
    return Counter(((r["id"], r["name"], r["amount"]), r["_change_type"], r["_row_id"]) for r in cdf.changes(t, a, b, net=net).to_pylist())


def _check_step(reference, warehouse: str, t: lineage.Table, before: dict[int, tuple], v_before: int, *, moves_only: bool = False) -> dict:
    """The checks every statement must pass; returns the new state."""
    t.refresh()
    assert rows(t.scan(with_lineage=False)) == rows(reference.read(warehouse, NAME).cast(SCHEMA)), "our scan differs from Spark's read"
    after = _state(t)
    kept = [rid for rid in after if rid in before]
    for rid in kept:
        assert after[rid] == before[rid], "a row the statement did not change must keep its values and versions"
    stayed = _values(before) & _values(after)
    assert len(kept) == sum(stayed.values()), "every unchanged row (duplicates included) keeps its row id"
    v = t.version
    for rid in after.keys() - before.keys():
        assert after[rid][1:] == (v, v), "a new row is created at the statement's version"
    deleted = _values(before) - _values(after)
    inserted = _values(after) - _values(before)
    expected = Counter(
        [(before[rid][0], "delete", rid) for rid in before.keys() - after.keys()]
        + [(after[rid][0], "insert", rid) for rid in after.keys() - before.keys()]
    )
    assert Counter(x[0] for x in expected.elements() if x[1] == "delete") == deleted
    assert Counter(x[0] for x in expected.elements() if x[1] == "insert") == inserted
    assert _feed(t, v_before) == expected
    if moves_only:
        assert not expected and after == before
    entry = t.history()[-1]
    assert entry.foreign == "spark" and (entry.inserted, entry.updated, entry.deleted) == (sum(inserted.values()), 0, sum(deleted.values()))
    assert not verify(t).problems
    return after


@pytest.mark.parametrize("mode", ["merge-on-read", "copy-on-write"])
def test_spark_dml_on_a_keyless_table(reference, warehouse, mode):
    """INSERT, DELETE, UPDATE, MERGE by Spark on a keyless table holding duplicates; then (merge-on-read)
    rewrite_position_delete_files and rewrite_data_files are moves only; our writes on top succeed."""
    t = lineage.create_table(NAME, SCHEMA, warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0), (4, "d", 4.0)]))
    reference.sql(
        warehouse,
        f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.delete.mode'='{mode}', 'write.update.mode'='{mode}', 'write.merge.mode'='{mode}')",
    )
    t.refresh()
    start, v0 = _state(t), t.version
    state, v = start, v0

    statements = [
        f"INSERT INTO {NAME} VALUES (1, 'a', 1.0), (5, 'e', 5.0)",  # a third copy of an existing row
        f"DELETE FROM {NAME} WHERE id = 2",
        f"UPDATE {NAME} SET amount = 10.0 WHERE id = 1 AND name = 'a'",  # all three copies change
        "MERGE",
    ]
    for sql in statements:
        if sql == "MERGE":
            reference.sql(
                warehouse,
                f"MERGE INTO {NAME} t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
                views={"src": _batch([(3, "c2", 30.0), (7, "g", 7.0), (7, "g", 7.0)])},
            )
        else:
            reference.sql(warehouse, sql)
        state, v = _check_step(reference, warehouse, t, state, v), t.version

    # Net over the four statements: the multiset difference of the first and last states.
    net = _feed(t, v0, net=True)
    assert Counter((vals, c) for vals, c, _ in net.elements()) == Counter(
        [(x, "delete") for x in (_values(start) - _values(state)).elements()]
        + [(x, "insert") for x in (_values(state) - _values(start)).elements()]
    )

    if mode == "merge-on-read":
        for proc in ("rewrite_position_delete_files", "rewrite_data_files"):
            reference.sql(warehouse, f"CALL system.{proc}(table => '{NAME}', options => map('rewrite-all', 'true'))")
            t.refresh()
            assert t.iceberg.metadata.current_snapshot().summary.operation.value == "replace"
            state, v = _check_step(reference, warehouse, t, state, v, moves_only=True), t.version

    # Our writes on top of the foreign snapshots.
    t.append(_batch([(8, "h", 8.0), (1, "a", 10.0)]))
    t.delete("id = 4")
    now = _state(t)
    assert all(now[rid] == state[rid] for rid in now.keys() & state.keys())
    assert len(now.keys() & state.keys()) == len(state) - 1
    t.refresh()
    assert rows(t.scan(with_lineage=False)) == rows(reference.read(warehouse, NAME).cast(SCHEMA))
    assert not verify(t).problems
    reference.forget(warehouse)
