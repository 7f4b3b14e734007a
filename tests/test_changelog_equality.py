"""The ``equality`` change-stream strategy: batches committed like Flink's sink, read by a foreign engine.

Our own readers need the reconciliation of snapshots without a lineage list to read such tables, so what a
table holds after equality commits is checked through the reference engine (Spark 3.5 + Iceberg 1.10) against
a model of upsert-mode semantics.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SCHEMA, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.manifest import DataFileContent

import lineage
from lineage.errors import InvalidArgumentError
from lineage.storage.metadata import SUMMARY_LIST, SUMMARY_OPERATION

EQ = {"write.changelog.strategy": "equality"}


def _events(items: list[tuple[str, int, float | None]]) -> pa.Table:
    return pa.table(
        {
            "_op": [op for op, _, _ in items],
            "id": [k for _, k, _ in items],
            "name": [None if a is None else f"n{k}" for _, k, a in items],
            "amount": [a for _, _, a in items],
        }
    )


def _apply(model: dict[int, tuple], items: list[tuple[str, int, float | None]]) -> None:
    """Upsert-mode semantics: positive events set the key's row, negative ones remove it."""
    for op, k, a in items:
        if op in ("+I", "+U", "u", "c", "r"):
            model[k] = (k, f"n{k}", a)
        else:
            model.pop(k, None)


def _spark_rows(reference, warehouse, name="shop.orders") -> list[tuple]:
    return rows(reference.read(warehouse, name).select(SCHEMA.names).cast(SCHEMA))


def _duckdb_rows(t: lineage.Table) -> list[tuple]:
    """The table as DuckDB's iceberg_scan reads it (it applies equality deletes)."""
    from lineage import duck

    t.refresh()
    con = duck.connect("iceberg")
    try:
        out = con.execute(f"SELECT * FROM iceberg_scan('{t.iceberg.metadata_location}')").to_arrow_table()
    finally:
        con.close()
    return rows(out.select(SCHEMA.names).cast(SCHEMA))


def _new_files(t: lineage.Table) -> dict[DataFileContent, list]:
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    out: dict[DataFileContent, list] = {}
    for manifest in snap.manifests(t.iceberg.io):
        if manifest.added_snapshot_id != snap.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
            out.setdefault(entry.data_file.content, []).append(entry)
    return out


def test_equality_commits_read_by_spark(reference, warehouse):
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    t.append(pa.table({"id": [1, 2, 3, 4], "name": ["n1", "n2", "n3", "n4"], "amount": [1.0, 2.0, 3.0, 4.0]}))
    model = {k: (k, f"n{k}", float(k)) for k in (1, 2, 3, 4)}
    base = t.iceberg.metadata.current_snapshot()

    first = [
        ("+U", 1, 10.0),  # update of a key an earlier commit wrote
        ("-D", 2, None),  # delete of an earlier key
        ("+I", 10, 1.0),  # insert ...
        ("-D", 10, None),  # ... and delete within the batch: a position delete on the new file
        ("-D", 3, None),  # delete ...
        ("+I", 3, 33.0),  # ... and reinsert within the batch
        ("+I", 11, 5.0),
        ("+U", 11, 6.0),  # written twice: the first image is position-deleted
    ]
    info = t.apply_changelog(_events(first), upsert=True, stream=("orders-cdc", 1), properties={"lineage.user.job": "j1"})
    _apply(model, first)
    assert info.committed and info.data_files_added == 1 and info.delete_files_added == 2
    snap = t.iceberg.metadata.current_snapshot()
    assert snap.parent_snapshot_id == base.snapshot_id and snap.snapshot_id == info.snapshot_id
    props = snap.summary.additional_properties
    assert SUMMARY_LIST not in props and props[SUMMARY_OPERATION] == "changelog"
    assert props["lineage.user.stream-id"] == "orders-cdc" and props["lineage.user.stream-batch-id"] == "1"
    assert props["lineage.user.job"] == "j1" and snap.summary.operation.value == "overwrite"

    files = _new_files(t)
    (data,) = files[DataFileContent.DATA]
    (eq,) = files[DataFileContent.EQUALITY_DELETES]
    (pos,) = files[DataFileContent.POSITION_DELETES]
    id_field = t.iceberg.schema().find_field("id").field_id
    assert eq.data_file.equality_ids == [id_field] and eq.sequence_number == snap.sequence_number
    assert sorted(pq.read_table(eq.data_file.file_path).column("id").to_pylist()) == [1, 2, 3, 10, 11]  # every key of the batch
    written = pq.read_table(data.data_file.file_path)
    assert written.column("id").to_pylist() == [1, 10, 3, 11, 11]  # every image, in batch order
    deleted = pq.read_table(pos.data_file.file_path).to_pylist()
    assert {d["file_path"] for d in deleted} == {data.data_file.file_path}
    assert sorted(d["pos"] for d in deleted) == [1, 3]  # key 10's image, key 11's first image
    assert _spark_rows(reference, warehouse) == sorted(model.values(), key=repr)

    # A second equality commit on top: -U/+U of a key the previous equality commit wrote, deletes and inserts.
    second = [("-U", 1, 10.0), ("+U", 1, 12.0), ("-D", 11, None), ("+I", 12, 7.0), ("-D", 99, None), ("+I", 2, 2.5)]
    t.apply_changelog(_events(second), upsert=True, stream=("orders-cdc", 2))
    _apply(model, second)
    assert _spark_rows(reference, warehouse) == sorted(model.values(), key=repr)

    assert _duckdb_rows(t) == sorted(model.values(), key=repr)

    # Exactly once: a replayed batch commits nothing.
    again = t.apply_changelog(_events([("-D", 1, None)]), upsert=True, stream=("orders-cdc", 2))
    assert not again.committed and again.snapshot_id == t.iceberg.metadata.current_snapshot().snapshot_id
    assert _spark_rows(reference, warehouse) == sorted(model.values(), key=repr)
    reference.forget(warehouse)


def test_equality_partitioned_by_key(reference, warehouse):
    t = lineage.create_table(
        "shop.orders", SCHEMA, key=["id"], partition_by=["bucket(4, id)"], warehouse=warehouse, properties=EQ
    )
    t.append(pa.table({"id": list(range(8)), "name": [f"n{k}" for k in range(8)], "amount": [float(k) for k in range(8)]}))
    model = {k: (k, f"n{k}", float(k)) for k in range(8)}
    batch = [("+U", k, k * 10.0) for k in (0, 1, 2)] + [("-D", k, None) for k in (5, 6)] + [("+I", 20, 1.0), ("-D", 20, None)]
    t.apply_changelog(_events(batch), upsert=True)
    _apply(model, batch)
    eqs = _new_files(t)[DataFileContent.EQUALITY_DELETES]
    assert len(eqs) > 1  # one per bucket touched
    assert _spark_rows(reference, warehouse) == sorted(model.values(), key=repr)
    reference.forget(warehouse)


EVENT = st.tuples(st.sampled_from(["+I", "+U", "-U", "-D", "c", "u", "d"]), st.integers(0, 6), st.integers(0, 50).map(float))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(EVENT, min_size=1, max_size=12), min_size=1, max_size=3))
def test_equality_batches_match_a_model(reference, tmp_path_factory, batches):
    """Random upsert-mode batches: after each commit Spark reads exactly the model's rows."""
    warehouse = str(tmp_path_factory.mktemp("wh"))
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    t.append(pa.table({"id": [0, 1, 2], "name": ["n0", "n1", "n2"], "amount": [0.0, 1.0, 2.0]}))
    model = {k: (k, f"n{k}", float(k)) for k in (0, 1, 2)}
    for batch in batches:
        t.apply_changelog(_events(batch), upsert=True)
        _apply(model, batch)
    assert _spark_rows(reference, warehouse) == sorted(model.values(), key=repr) == _duckdb_rows(t)
    reference.forget(warehouse)


def test_equality_strategy_refuses_what_it_cannot_do(warehouse):
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    version = t.version
    with pytest.raises(InvalidArgumentError, match="upsert=True"):
        t.apply_changelog(_events([("+I", 1, 1.0)]))
    tied = _events([("+I", 1, 1.0), ("-D", 1, None)]).append_column("seq", pa.array([5, 5]))
    with pytest.raises(InvalidArgumentError, match="order_by"):
        t.apply_changelog(tied, upsert=True, order_by="seq")
    p = lineage.create_table("shop.parts", SCHEMA, key=["id"], partition_by=["name"], warehouse=warehouse, properties=EQ)
    with pytest.raises(InvalidArgumentError, match="not key columns"):
        p.apply_changelog(_events([("+I", 1, 1.0)]), upsert=True)
    with pytest.raises(InvalidArgumentError, match="equality"):
        lineage.create_table(
            "shop.bad", SCHEMA, key=["id"], warehouse=warehouse, properties={"write.changelog.strategy": "nope"}
        ).apply_changelog(_events([("+I", 1, 1.0)]), upsert=True)
    assert t.version == version and p.version == 0


def test_equality_spark_batches_and_streaming_sink(spark, reference, warehouse):
    """Spark DataFrame batches (collected once, order_by required) and the streaming sink's exactly-once skip."""
    from lineage.streaming import ChangelogSink

    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    t.append(pa.table({"id": [1, 2], "name": ["n1", "n2"], "amount": [1.0, 2.0]}))
    model = {1: (1, "n1", 1.0), 2: (2, "n2", 2.0)}
    items = [("+U", 1, 5.0), ("-D", 2, None), ("+I", 3, 3.0), ("+U", 3, 4.0)]
    df = spark.createDataFrame(_events(items).append_column("seq", pa.array(range(len(items)))).to_pandas())
    with pytest.raises(InvalidArgumentError, match="order_by"):
        t.apply_changelog(df, upsert=True)
    sink = ChangelogSink("shop.orders", warehouse=warehouse, order_by="seq", upsert=True, stream_id="s1")
    sink(df, 7)
    _apply(model, items)
    assert sink.last.committed and _spark_rows(reference, warehouse) == sorted(model.values(), key=repr)
    version = t.version
    sink.last = None
    sink(df, 7)  # a replay: found in the snapshot summaries, nothing applied
    assert sink.last is None and t.version == version
    reference.forget(warehouse)


def test_equality_composite_key_partitioned_by_a_key_column(reference, warehouse):
    """A two-column key, partitioned by one of them: equality deletes per partition on both columns."""
    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("amount", pa.float64())])
    t = lineage.create_table("shop.regional", schema, key=["region", "id"], partition_by=["region"], warehouse=warehouse, properties=EQ)
    t.append(pa.table({"region": ["eu", "eu", "us", "us"], "id": [1, 2, 1, 2], "amount": [1.0, 2.0, 3.0, 4.0]}))
    model = {("eu", 1): 1.0, ("eu", 2): 2.0, ("us", 1): 3.0, ("us", 2): 4.0}
    events = [("+U", "eu", 1, 10.0), ("-D", "us", 1, None), ("+I", "ap", 1, 5.0), ("-D", "eu", 2, None), ("+I", "eu", 2, 20.0)]
    t.apply_changelog(
        pa.table({"_op": [e[0] for e in events], "region": [e[1] for e in events], "id": [e[2] for e in events], "amount": [e[3] for e in events]}),
        upsert=True,
    )
    for op, region, k, amount in events:
        if op == "-D":
            model.pop((region, k), None)
        else:
            model[(region, k)] = amount
    eqs = _new_files(t)[DataFileContent.EQUALITY_DELETES]
    assert len(eqs) == 3 and all(sorted(e.data_file.equality_ids) == [1, 2] for e in eqs)
    want = sorted((r, k, a) for (r, k), a in model.items())
    spark = sorted(tuple(r.values()) for r in reference.read(warehouse, "shop.regional").select(schema.names).to_pylist())
    assert spark == want
    reference.forget(warehouse)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(
        st.tuples(st.sampled_from(["+I", "-U", "+U", "-D"]), st.integers(0, 4), st.sampled_from(["a", "b"]), st.integers(0, 3)),
        min_size=1, max_size=25,
    ),
    composite=st.booleans(),
)
def test_arrow_plan_equals_the_sql_plan(warehouse, events, composite):
    """The equality plan computed in Arrow (a stream's usual batch) is the window query's, for simple and composite keys."""
    import dataclasses

    from lineage import duck
    from lineage.writes.changelog import prepare_batch
    from lineage.writes.changelog_equality import _plan_in_arrow, plan_batch

    name = "shop.plan_c" if composite else "shop.plan_s"
    try:
        t = lineage.open_table(name, warehouse=warehouse)
    except lineage.errors.LineageError:
        schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("region", pa.string(), False), pa.field("amount", pa.int64())])
        t = lineage.create_table(name, schema, key=["id", "region"] if composite else ["id"], warehouse=warehouse, properties=EQ)
    raw = pa.table({"_op": [e[0] for e in events], "id": [e[1] for e in events], "region": [e[2] for e in events], "amount": [e[3] for e in events]})
    batch = prepare_batch(t, raw, "_op", None)
    con = duck.connect()
    try:
        sql = plan_batch(dataclasses.replace(batch, explicit_order=True), t.arrow_schema, con)  # explicit order takes the SQL path
    finally:
        con.close()
    arrow = _plan_in_arrow(batch, t.arrow_schema)
    assert arrow[0].equals(sql[0]), "images differ"
    assert sorted(arrow[1].to_pylist(), key=repr) == sorted(sql[1].to_pylist(), key=repr), "deleted keys differ"
    assert arrow[2].tolist() == sql[2].tolist(), "superseded images differ"
