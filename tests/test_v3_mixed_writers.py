"""A model-based test of one Iceberg v3 table written by this library and by Spark, turn and turn about.

Hypothesis draws short sequences of steps on one keyed v3 table (all write
modes merge-on-read, so Spark writes deletion vectors): our append, update,
delete and upsert (merge-on-read or copy-on-write per call) and compaction;
the reference engine's (Spark 3.5 + Iceberg 1.10) INSERT, UPDATE, DELETE,
MERGE INTO, ``rewrite_data_files`` and ``expire_snapshots``. A plain model
holds key -> (values, row id, last updated sequence number, created version):
a row keeps its ``_row_id`` through updates by anyone and through rewrites; a
new row (also one re-using a deleted key) gets an id never used before, at or
above the table's ``next-row-id`` before the step.

After every step, against the model:

* Spark's ``SELECT ..., _row_id, _last_updated_sequence_number``, DuckDB's
  ``iceberg_scan`` and our scan (which reads Spark's commits through their
  native lineage) return exactly the model's rows, ids and sequence numbers;
  pyiceberg's scan returns the model's rows; our created version is the
  version of the row's insert;
* our change feed over the step (``cdf.changes(t, before, after)``) is the
  model's net change: inserts, deletes, and update pre/post images paired by
  ``_row_id``; a compaction, a rewrite or an expiry changes nothing.

Set ``LINEAGE_PROPERTY_EXAMPLES`` to run more examples than the default.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pytest
from conftest import rows
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

import cdf
import lineage
import lineage.duck as duck

pytestmark = pytest.mark.reference

NAME = "shop.items"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("qty", pa.int64())])
MOR = {p: "merge-on-read" for p in ("write.delete.mode", "write.update.mode", "write.merge.mode")}
INITIAL_ROWS = 30
NAMES = st.sampled_from(["a", "b", "c"])
MODES = st.sampled_from([None, lineage.MERGE_ON_READ, lineage.COPY_ON_WRITE])


@dataclass(frozen=True)
class Row:
    name: str
    qty: int
    row_id: int | None  # None until the scan after its insert reveals it
    seq: int  # _last_updated_sequence_number: the version that inserted or last updated it
    created: int


@dataclass
class Model:
    live: dict[int, Row] = field(default_factory=dict)
    ever: set[int] = field(default_factory=set)
    next_key: int = 0
    seen_row_ids: set[int] = field(default_factory=set)

    def fresh_key(self) -> int:
        self.next_key += 1
        return self.next_key - 1

    @property
    def dead(self) -> list[int]:
        return sorted(self.ever - set(self.live))


@dataclass
class Change:
    """What one step must do: keys inserted (with values), updated (new values), deleted."""

    inserted: dict[int, tuple[str, int]] = field(default_factory=dict)
    updated: dict[int, tuple[str, int]] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)

    def empty(self) -> bool:
        return not (self.inserted or self.updated or self.deleted)


def _batch(values: dict[int, tuple[str, int]]) -> pa.Table:
    ks = sorted(values)
    return pa.table({"id": ks, "name": [values[k][0] for k in ks], "qty": [values[k][1] for k in ks]}, schema=SCHEMA)


def _in(keys: list[int]) -> str:
    return f"id IN ({', '.join(map(str, keys))})"


def _sql_values(values: dict[int, tuple[str, int]], extra: dict[int, str] | None = None) -> str:
    if extra is None:
        return ", ".join(f"({k}, '{n}', {q})" for k, (n, q) in sorted(values.items()))
    return ", ".join(f"({k}, '{n}', {q}, {extra[k]})" for k, (n, q) in sorted(values.items()))


# ------------------------------------------------------------------ drawing steps


def _new_rows(data: st.DataObject, model: Model, lo: int, hi: int) -> dict[int, tuple[str, int]]:
    """Rows with keys that are not live: fresh keys or keys deleted earlier."""
    out: dict[int, tuple[str, int]] = {}
    for _ in range(data.draw(st.integers(lo, hi), label="new rows")):
        dead = [k for k in model.dead if k not in out]
        if dead and data.draw(st.booleans(), label="re-use a deleted key"):
            k = data.draw(st.sampled_from(dead), label="deleted key")
        else:
            k = model.fresh_key()
        out[k] = (data.draw(NAMES, label="name"), data.draw(st.integers(0, 9), label="qty"))
    return out


def _some_keys(data: st.DataObject, model: Model, hi: int = 4) -> list[int]:
    """Live keys to touch (possibly none), and now and then a deleted key that must match nothing."""
    live = sorted(model.live)
    keys = data.draw(st.lists(st.sampled_from(live), unique=True, min_size=0, max_size=min(hi, len(live))), label="keys") if live else []
    if model.dead and data.draw(st.integers(0, 3), label="add a deleted key") == 0:
        keys.append(data.draw(st.sampled_from(model.dead), label="deleted key"))
    return keys


def _changed(model: Model, k: int, data: st.DataObject) -> tuple[str, int]:
    """New values of a live row: qty always changes, name may."""
    old = model.live[k]
    return data.draw(NAMES, label="name"), old.qty + data.draw(st.integers(1, 5), label="qty increment")


OPERATIONS = [
    "our append", "our update", "our delete", "our upsert", "our compaction",
    "spark insert", "spark update", "spark delete", "spark merge", "spark rewrite", "spark expire",
]


def _run_step(data: st.DataObject, reference, warehouse: str, t: lineage.Table, model: Model) -> Change:  # noqa: ANN001
    """Draw one step, run it, and return what the model expects of it (the model itself is not changed here)."""
    op = data.draw(st.sampled_from(OPERATIONS), label="operation")
    event(op)
    ch = Change()
    if op in ("our append", "spark insert"):
        ch.inserted = _new_rows(data, model, 1, 4)
        note(f"{op}: {ch.inserted}")
        if op == "our append":
            t.append(_batch(ch.inserted))
        else:
            reference.sql(warehouse, f"INSERT INTO {NAME} VALUES {_sql_values(ch.inserted)}")
    elif op in ("our update", "spark update"):
        keys = _some_keys(data, model)
        inc = data.draw(st.integers(1, 5), label="qty increment")
        name = data.draw(st.sampled_from([None, "a", "u"]), label="set name")
        sets = {"qty": f"qty + {inc}"} | ({"name": f"'{name}'"} if name else {})
        live = [k for k in keys if k in model.live]
        ch.updated = {k: (name or model.live[k].name, model.live[k].qty + inc) for k in live}
        if not keys:
            return ch
        mode = data.draw(MODES, label="mode") if op == "our update" else None
        note(f"{op}: where {_in(keys)} set {sets} mode={mode}")
        if op == "our update":
            t.update(_in(keys), sets, mode=mode)
        else:
            reference.sql(warehouse, f"UPDATE {NAME} SET {', '.join(f'{c} = {e}' for c, e in sets.items())} WHERE {_in(keys)}")
    elif op in ("our delete", "spark delete"):
        keys = _some_keys(data, model)
        ch.deleted = {k for k in keys if k in model.live}
        if not keys:
            return ch
        mode = data.draw(MODES, label="mode") if op == "our delete" else None
        note(f"{op}: where {_in(keys)} mode={mode}")
        if op == "our delete":
            t.delete(_in(keys), mode=mode)
        else:
            reference.sql(warehouse, f"DELETE FROM {NAME} WHERE {_in(keys)}")
    elif op == "our upsert":
        existing = _some_keys(data, model, 3)
        ch.updated = {k: _changed(model, k, data) for k in existing if k in model.live}
        ch.inserted = _new_rows(data, model, 0, 3)
        ch.inserted |= {k: (data.draw(NAMES, label="name"), 1) for k in existing if k not in model.live}
        if ch.empty():
            return ch
        mode = data.draw(MODES, label="mode")
        note(f"{op}: updates {ch.updated} inserts {ch.inserted} mode={mode}")
        t.upsert(_batch(ch.updated | ch.inserted), mode=mode)
    elif op == "spark merge":
        # WHEN MATCHED AND s.del THEN DELETE / WHEN MATCHED THEN UPDATE / WHEN NOT MATCHED AND NOT s.del THEN INSERT
        touched = _some_keys(data, model, 4)
        dels = {k for k in touched if k in model.live and data.draw(st.integers(0, 2), label="delete it") == 0}
        ch.deleted = dels
        ch.updated = {k: _changed(model, k, data) for k in touched if k in model.live and k not in dels}
        ch.inserted = _new_rows(data, model, 0, 3)
        ch.inserted |= {k: (data.draw(NAMES, label="name"), 2) for k in touched if k not in model.live}
        source = ch.updated | ch.inserted | {k: (model.live[k].name, 0) for k in dels}
        if not source:
            return ch
        flags = {k: "true" if k in dels else "false" for k in source}
        note(f"{op}: updates {ch.updated} inserts {ch.inserted} deletes {sorted(dels)}")
        reference.sql(
            warehouse,
            f"MERGE INTO {NAME} t USING (SELECT * FROM VALUES {_sql_values(source, flags)} AS s(id, name, qty, del)) s "
            "ON t.id = s.id WHEN MATCHED AND s.del THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET t.name = s.name, t.qty = s.qty "
            "WHEN NOT MATCHED AND NOT s.del THEN INSERT (id, name, qty) VALUES (s.id, s.name, s.qty)",
        )
    elif op == "our compaction":
        note(op)
        t.compact()
    elif op == "spark rewrite":
        note(op)
        reference.sql(warehouse, f"CALL system.rewrite_data_files(table => '{NAME}', options => map('rewrite-all', 'true'))")
    else:
        note(op)
        reference.sql(warehouse, f"CALL system.expire_snapshots(table => '{NAME}', retain_last => 1, "
                                 "older_than => TIMESTAMP '2999-01-01 00:00:00')")
    return ch


# ------------------------------------------------------------------ checks

COLUMNS = ["id", "name", "qty", "_row_id", "_seq"]


def _spark_rows(reference, warehouse: str) -> list[tuple]:  # noqa: ANN001
    got = reference.sql(warehouse, f"SELECT id, name, qty, _row_id, _last_updated_sequence_number FROM {NAME}")
    return rows(got.rename_columns(COLUMNS))


def _duckdb_rows(t: lineage.Table) -> list[tuple]:
    con = duck.connect("iceberg")
    try:
        got = con.execute("SELECT id, name, qty, _row_id, _last_updated_sequence_number "
                          f"FROM iceberg_scan('{t.iceberg.metadata_location}')").to_arrow_table()
    finally:
        con.close()
    return rows(got.rename_columns(COLUMNS))


def _apply(model: Model, ch: Change, version: int, next_row_id_before: int, ours: list[dict]) -> None:
    """Apply the step's change to the model; new rows learn their ids from our scan (fresh, never used)."""
    for k in ch.deleted:
        del model.live[k]
    for k, (name, qty) in ch.updated.items():
        model.live[k] = replace(model.live[k], name=name, qty=qty, seq=version)
    by_key = {r["id"]: r for r in ours}
    for k, (name, qty) in ch.inserted.items():
        assert k in by_key, f"inserted key {k} missing from our scan"
        rid = by_key[k]["_row_id"]
        assert rid is not None and rid not in model.seen_row_ids, f"new row {k} got row id {rid}, used before"
        assert rid >= next_row_id_before, f"new row {k} got row id {rid} below the next-row-id {next_row_id_before}"
        model.seen_row_ids.add(rid)
        model.live[k] = Row(name, qty, rid, version, version)
        model.ever.add(k)


def _check_readers(reference, warehouse: str, t: lineage.Table, model: Model, ours: list[dict]) -> None:  # noqa: ANN001
    want = sorted(((k, r.name, r.qty, r.row_id, r.seq) for k, r in model.live.items()), key=repr)
    mine = sorted(((r["id"], r["name"], r["qty"], r["_row_id"], r["_row_last_updated_at_version"]) for r in ours), key=repr)
    assert mine == want, "our scan differs from the model"
    assert _spark_rows(reference, warehouse) == want, "Spark's native row lineage differs from the model"
    assert _duckdb_rows(t) == want, "DuckDB's native row lineage differs from the model"
    assert rows(t.iceberg.scan().to_arrow(), ["id", "name", "qty"]) == [w[:3] for w in want], "pyiceberg's scan differs"
    created = {r["id"]: r["_row_created_at_version"] for r in ours}
    assert created == {k: r.created for k, r in model.live.items()}, "created versions differ from the model"
    assert t.iceberg.metadata.next_row_id == t.state().lineage.next_row_id


def _check_feed(t: lineage.Table, model_before: dict[int, Row], model: Model, ch: Change, before: int, after: int) -> None:
    want = []
    for k in ch.deleted:
        r = model_before[k]
        want.append(("delete", k, r.name, r.qty, r.row_id))
    for k in ch.inserted:
        r = model.live[k]
        want.append(("insert", k, r.name, r.qty, r.row_id))
    for k in ch.updated:
        old, new = model_before[k], model.live[k]
        want.append(("update_preimage", k, old.name, old.qty, old.row_id))
        want.append(("update_postimage", k, new.name, new.qty, new.row_id))
    if after == before:
        assert not want, "the step changed rows but made no version"
        return
    feed = cdf.changes(t, before, after)
    got = rows(feed, ["_change_type", "id", "name", "qty", "_row_id"])
    assert got == sorted(want, key=repr), f"change feed of versions ({before}, {after}] differs from the model"
    assert set(feed.column("_commit_version").to_pylist()) <= {after}


# ------------------------------------------------------------------ the property

SETTINGS = settings(
    max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "10")),
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: every step costs Spark seconds; note() lists the steps
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(data=st.data())
def test_our_writes_and_sparks_on_one_v3_table_match_the_model(reference, data: st.DataObject) -> None:  # noqa: ANN001
    with tempfile.TemporaryDirectory(prefix="lineage-v3-mixed-") as root:
        warehouse = os.path.join(root, "wh")
        try:
            _mixed_writers(reference, warehouse, data)
        finally:
            reference.forget(warehouse)


def _mixed_writers(reference, warehouse: str, data: st.DataObject) -> None:  # noqa: ANN001
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse, format_version=3, properties=MOR)
    model = Model()
    first = {model.fresh_key(): (f"n{i}", i % 10) for i in range(INITIAL_ROWS)}
    t.append(_batch(first))
    _apply(model, Change(inserted=first), 1, 0, t.scan().to_pylist())
    _check_readers(reference, warehouse, t, model, t.scan().to_pylist())
    for _ in range(data.draw(st.integers(3, 8), label="steps")):
        before = t.refresh().version
        next_row_id = t.iceberg.metadata.next_row_id
        ch = _run_step(data, reference, warehouse, t, model)
        after = t.refresh().version
        note(f"  versions {before} -> {after}")
        model_before = dict(model.live)
        ours = t.scan().to_pylist()
        _apply(model, ch, after, next_row_id, ours)
        _check_readers(reference, warehouse, t, model, ours)
        _check_feed(t, model_before, model, ch, before, after)
