"""The embedded change feed's parallel paths give exactly the rows of its serial ones, in the same order.

From ``PARALLEL_ROWS`` rows a per-version feed reads its values in a second
thread, then orders and compares them in two halves of its columns, one per
thread. The histories here are small, so the threshold is set to 1 and to
more than any feed, and every feed of a history (per version and net, every
start, all columns and a few) must come out equal, row order included: with
pre-image capture on and off, with nulls, NaNs, repeated strings and a
renamed column. The property tests (tests/test_cdf_property.py) compare both
modes with a model.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import cdf
import cdf.engine_duckdb as engine_duckdb
import lineage

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())])
CAPTURE = {"lineage.cdf.capture-preimages": "true"}


def _history(t: lineage.Table) -> None:
    n = 40
    t.append(pa.table({"id": list(range(n)), "name": [None if i % 7 == 0 else "abc"[i % 3] for i in range(n)],
                       "amount": [float("nan") if i % 5 == 0 else float(i) for i in range(n)],
                       "qty": [None if i % 4 == 0 else i for i in range(n)]}, schema=SCHEMA))
    t.update("id % 3 = 0", {"amount": "amount + 1"})
    t.update("id % 4 = 1", {"name": "'z'", "qty": "qty + 1"})
    t.delete("id IN (1, 4, 9)")
    t.update("id % 5 = 0", {"name": "name"}, mode="copy-on-write")  # an update that changes nothing
    t.merge(upserts=pa.table({"id": [2, 3, 50, 51], "name": ["u", None, "n", "n"], "amount": [0.5, float("nan"), 2.0, None],
                              "qty": [1, 2, None, 4]}, schema=SCHEMA), deletes=pa.table({"id": [5, 6]}))
    t.upsert(pa.table({"id": [2, 7, 52], "name": ["v", "w", "x"], "amount": [1.5, 7.0, None], "qty": [9, 9, 9]}, schema=SCHEMA))


def _feeds(t: lineage.Table) -> list[pa.Table]:
    n = t.version
    out = []
    for a in range(n):
        for columns in (None, ["amount", "name"], ["quantity"]):
            out.append(cdf.changes(t, a, n, columns=columns))
            out.append(cdf.changes(t, a, n, columns=columns, net=True))
    return out


@pytest.mark.parametrize("properties", [{}, CAPTURE], ids=["pointers", "capture"])
def test_parallel_paths_give_the_serial_rows(warehouse, monkeypatch, properties):
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse, properties=properties)
    _history(t)
    with t.iceberg.update_schema() as u:  # values are matched by field id
        u.rename_column("qty", "quantity")
    t.refresh()
    t.update("id = 8", {"quantity": "quantity * 2"})
    monkeypatch.setattr(engine_duckdb, "PARALLEL_ROWS", 10**9)
    serial = _feeds(t)
    monkeypatch.setattr(engine_duckdb, "PARALLEL_ROWS", 1)
    parallel = _feeds(t)
    assert len(serial) == len(parallel)
    for s, p in zip(serial, parallel, strict=True):
        assert s.schema == p.schema
        assert repr(s.to_pylist()) == repr(p.to_pylist())  # NaN is not equal to itself: compared as text
    assert any(s.num_rows > 20 and "update_preimage" in s.column("_change_type").to_pylist() for s in serial)
