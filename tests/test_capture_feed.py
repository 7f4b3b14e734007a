"""The per-version feed of a table that captures pre-images, assembled from each commit's stored pieces (cdf.captured).

Hypothesis draws the writes of tests/test_cdf_property.py (append, delete,
update, upsert; merge-on-read or copy-on-write per call), now and then a
compaction (files of earlier versions rewritten: their images move) or an
expiry and vacuum (files of expired snapshots removed: those versions fall
back to the engine's plan), on Iceberg format v2 and v3 tables with capture
on, and checks that the assembled feed is the engine's feed
(:func:`cdf.engine_duckdb.changes`, which plans from the live files and every
index segment) row for row, in the same order, for every range; that
``cdf.changes`` and ``cdf.change_batches`` return it; and that most versions
were indeed assembled, so that the comparison is not of the engine with itself.
"""

from __future__ import annotations

import datetime as _dt

import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import cdf
import cdf.captured as captured
import cdf.engine_duckdb as engine_duckdb
import lineage
from test_cdf_property import PROPERTY_SETTINGS, SCHEMA, Model, _step

CAPTURE = {"lineage.cdf.capture-preimages": "true"}


def _engine(table: lineage.Table, a: int, b: int) -> pa.Table:
    return engine_duckdb.changes(table.state(), a, b, table.arrow_schema, False)


def _check_all_ranges(table: lineage.Table) -> int:
    """Compare every range's assembled feed with the engine's; the number of versions assembled from stored pieces."""
    state = table.state()
    n = state.version
    stored = sum(isinstance(s, captured.Stored) for s in captured.stored(state, 0, n))
    for a in range(n + 1):
        for b in range(a, n + 1):
            want = _engine(table, a, b)
            got = captured.changes(table.state(), a, b, table.arrow_schema)
            if got is None:  # no version of the range can be assembled
                assert not any(isinstance(s, captured.Stored) for s in captured.stored(state, a, b)), (a, b)
            else:
                assert got.equals(want), f"assembled feed ({a}, {b}] differs from the engine's"
            assert cdf.changes(table, a, b).equals(want)
            streamed = cdf.change_batches(table, a, b, batch_rows=1 + (a + b) % 3).read_all()
            assert streamed.equals(want), f"change_batches({a}, {b}) differs from the engine's feed"
    return stored


@pytest.mark.parametrize("format_version", ["2", "3"])
@settings(max_examples=12, **PROPERTY_SETTINGS)
@given(data=st.data())
def test_assembled_feed_is_the_engines_feed(tmp_path_factory, format_version: str, data: st.DataObject) -> None:
    warehouse = str(tmp_path_factory.mktemp("capfeed") / "wh")
    table = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse,
                                 properties={**CAPTURE, "format-version": format_version})
    model = Model()
    for i in range(data.draw(st.integers(3, 8), label="steps")):
        extra = data.draw(st.sampled_from(["write"] * 6 + ["compact", "vacuum"]), label="maintenance") if i else "write"
        if extra == "compact":
            before = table.version
            table.compact()
            if table.version != before:  # a version of its own, no change event: the model's state carries over
                model.states.append(dict(model.states[-1]))
                model.ts.append(table.history()[-1].timestamp)
                event("compaction")
        elif extra == "vacuum":
            table.expire_snapshots(retain_last=1)
            table.vacuum(older_than=_dt.timedelta(0))
            event("expire and vacuum")
        _step(data, table, model, first=i == 0)
    stored = _check_all_ranges(table)
    assert stored or table.version <= 1, "no version was assembled from its stored pieces"
    event(f"versions assembled: {'all' if stored == table.version else 'some'}")


def test_a_version_without_captured_values_is_planned_by_the_engine(warehouse: str) -> None:
    """Capture switched on after an update: that update comes from the engine (its segment holds no values), the
    other versions are assembled (the append removed nothing)."""
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": [1, 2, 3], "qty": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.0, 2.0, 3.0]}, schema=SCHEMA))
    t.update("id = 1", {"qty": "10"})
    with t.iceberg.transaction() as tx:
        tx.set_properties(CAPTURE)
    t.refresh()
    t.update("id = 2", {"name": "'z'"})
    t.delete("id = 3")
    kinds = [s if isinstance(s, int) else "stored" for s in captured.stored(t.state(), 0, t.version)]
    assert kinds == ["stored", 2, "stored", "stored"], kinds
    assert captured.changes(t.state(), 0, t.version, t.arrow_schema).equals(_engine(t, 0, t.version))
    assert cdf.changes(t, 0, t.version).column("_change_type").to_pylist() == [
        "insert", "insert", "insert", "update_preimage", "update_postimage", "update_preimage", "update_postimage", "delete"]


def test_a_table_without_capture_is_left_to_the_engine(warehouse: str) -> None:
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": [1], "qty": [1], "name": ["a"], "amount": [1.0]}, schema=SCHEMA))
    assert captured.changes(t.state(), 0, 1, t.arrow_schema) is None
