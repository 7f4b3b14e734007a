"""Foreign maintenance that deletes files, with the reference engine (Spark 3.5 + Iceberg 1.10): Spark's
``expire_snapshots`` (which deletes the files only expired snapshots used) after foreign commits we reconciled
(lost files: verify names them, the feed over their versions raises, later ranges work) and before we
reconciled them (a gap); ``remove_orphan_files`` never lists our lineage and index files."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import SCHEMA, rows

import cdf
import lineage
from lineage.maintenance import verify

pytestmark = pytest.mark.reference

NAME = "shop.orders"
EXPIRE = f"CALL system.expire_snapshots(table => '{NAME}', older_than => TIMESTAMP '2200-01-01 00:00:00', retain_last => 1)"


def _batch(items: list[tuple[int, str, float]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "amount": a} for i, n, a in items], schema=SCHEMA)


def _ids(t: lineage.Table) -> dict[int, int]:
    return {r["id"]: r["_row_id"] for r in t.scan().select(["id", "_row_id"]).to_pylist()}


def _feed(t: lineage.Table, a: int) -> list[tuple]:
    return sorted((r["id"], r["_change_type"], r["_row_id"]) for r in cdf.changes(t, a).to_pylist())


def _table(reference, warehouse: str, mode: str) -> lineage.Table:
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]))  # v1
    reference.sql(warehouse, f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.delete.mode'='{mode}', 'write.update.mode'='{mode}')")
    return t


def test_spark_expiry_loses_pinned_files(reference, warehouse):
    t = _table(reference, warehouse, "copy-on-write")
    reference.sql(warehouse, f"UPDATE {NAME} SET amount = 10.0 WHERE id = 1")  # v2: rewrites the file
    reference.sql(warehouse, f"DELETE FROM {NAME} WHERE id = 2")  # v3: rewrites it again
    t.refresh()
    assert t.reconcile() == [2, 3]
    t.append(_batch([(4, "d", 4.0)]))  # v4, ours
    ids = _ids(t)
    full = _feed(t, 0)

    orphans = reference.remove_orphan_files(warehouse, NAME, older_than_ms=2**62)  # a dry run
    assert not [p for p in orphans if "/_lineage/" in p or "/_index/" in p]

    reference.sql(warehouse, EXPIRE)  # deletes the files of v1 and v2 that no snapshot references any more
    t.refresh()
    assert _ids(t) == ids and rows(t.scan(with_lineage=False)) == rows(reference.read(warehouse, NAME).cast(SCHEMA))
    problems = verify(t).problems
    assert problems and all("data file lost" in p for p in problems)
    assert {p.split("index of version ")[1].split()[0] for p in problems} == {"2", "3"}
    for a in (0, 1, 2):  # every range that needs a removed image of version 2 or 3
        with pytest.raises(lineage.LostFileError, match=r"version\(s\) .*(2|3).*lineage verify"):
            cdf.changes(t, a)
    assert _feed(t, 3) == [(4, "insert", ids[4])]  # after the affected versions: still served
    assert [r for r in full if r[0] == 4] == _feed(t, 3)
    t.upsert(_batch([(3, "c2", 3.5)]))
    assert [r[1] for r in _feed(t, 4)] == ["update_postimage", "update_preimage"]
    reference.forget(warehouse)


def test_spark_expiry_before_reconciliation_makes_a_gap(reference, warehouse):
    t = _table(reference, warehouse, "merge-on-read")
    before = _ids(t)
    reference.sql(warehouse, f"UPDATE {NAME} SET amount = 10.0 WHERE id = 1")  # v2 (position delete + new file)
    reference.sql(warehouse, f"INSERT INTO {NAME} VALUES (4, 'd', 4.0)")  # v3
    reference.sql(warehouse, f"DELETE FROM {NAME} WHERE id = 2")  # v4
    reference.sql(warehouse, EXPIRE)  # v1..v3 expired before any reader of ours reconciled v2..v4
    t.refresh()
    assert rows(t.scan(with_lineage=False)) == rows(reference.read(warehouse, NAME).cast(SCHEMA))
    ids = _ids(t)
    assert ids[1] == before[1] and ids[3] == before[3] and ids[4] >= 3  # the update kept its row id
    h = t.history()
    assert [c.version for c in h] == [1, 4] and h[-1].gap and h[-1].foreign == "spark"
    assert (h[-1].inserted, h[-1].updated, h[-1].deleted) == (1, 1, 1)
    with pytest.raises(lineage.HistoryGapError, match="after version 1 up to version 4"):
        cdf.changes(t, 1)
    report = verify(t)
    assert not report.problems and any("gap at version 4" in n for n in report.notes)
    t.upsert(_batch([(3, "c2", 3.5)]))
    assert _feed(t, 4) == [(3, "update_postimage", ids[3]), (3, "update_preimage", ids[3])]
    reference.forget(warehouse)


@pytest.mark.parametrize("partition_by", [None, ["bucket(2, id)"]])
def test_equality_deletes_inside_a_gap_are_resolved(reference, warehouse, partition_by):
    """Flink checkpoints with equality deletes and a Spark insert, all expired by Spark before any reader of ours
    reconciled them: the equality deletes committed inside the gap are resolved against the survivor's data files
    (sequence-number rule, by scanning: they remove rows of our file, of a gap checkpoint's file and of Spark's
    file) and folded into the one net step. A reader derives it in memory; our write persists it."""
    t = lineage.create_table(NAME, SCHEMA, key=["id"], partition_by=partition_by, warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0), (4, "d", 4.0)]))  # v1
    before = _ids(t)
    reference.flink_commit(  # v2: upsert 1, delete 2, insert 10
        warehouse, NAME,
        [("+I", {"id": 1, "name": "a2", "amount": 10.0}), ("-D", {"id": 2}), ("+I", {"id": 10, "name": "j", "amount": 100.0})],
        upsert=True,
    )
    reference.sql(warehouse, f"INSERT INTO {NAME} VALUES (5, 'e', 5.0), (6, 'f', 6.0)")  # v3
    reference.flink_commit(  # v4: deletes rows added inside the gap (10 by Flink, 5 by Spark), upserts 3 and 6
        warehouse, NAME,
        [("-D", {"id": 10}), ("-D", {"id": 5}), ("+I", {"id": 3, "name": "c3", "amount": 33.0}), ("+I", {"id": 6, "name": "f2", "amount": 66.0})],
        upsert=True,
    )
    reference.sql(warehouse, EXPIRE)  # v1..v3 expired before any reader of ours reconciled v2..v4
    t.refresh()
    assert rows(t.scan(with_lineage=False)) == rows(reference.read(warehouse, NAME).cast(SCHEMA))
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(1, "a2", 10.0), (3, "c3", 33.0), (4, "d", 4.0), (6, "f2", 66.0)]))
    ids = _ids(t)
    assert ids[1] == before[1] and ids[3] == before[3] and ids[4] == before[4] and ids[6] not in before.values()
    h = t.history()
    assert [c.version for c in h] == [1, 4] and h[-1].gap and h[-1].foreign == "flink"
    assert (h[-1].inserted, h[-1].updated, h[-1].deleted) == (1, 2, 1)  # 6 new; 1 and 3 updated; 2 deleted
    with pytest.raises(lineage.HistoryGapError, match="after version 1 up to version 4"):
        cdf.changes(t, 1)
    with pytest.raises(lineage.HistoryGapError):
        cdf.deleted_rows(t)
    assert not verify(t).problems
    t.upsert(_batch([(2, "b2", 2.5), (4, "d2", 4.5)]))  # persists the gap step, then commits on top of it
    assert _feed(t, 4) == sorted([(2, "insert", _ids(t)[2]), (4, "update_postimage", ids[4]), (4, "update_preimage", ids[4])])
    t.delete("id = 3")
    assert [(r["id"], r["_row_id"]) for r in cdf.deleted_rows(t, 4).to_pylist()] == [(3, before[3])]
    assert rows(t.scan(with_lineage=False)) == rows(reference.read(warehouse, NAME).cast(SCHEMA))
    assert not verify(t).problems
    reference.forget(warehouse)
