"""A change feed planned one group of row ids at a time: the streamed feed and the Spark feed, against the whole feed."""

from __future__ import annotations

import pyarrow as pa
import pytest

import cdf
import cdf.engine_spark as engine_spark
import cdf.groups as groups
import cdf.pointers as pointers
import cdf.spark_groups as spark_groups
import lineage
from cdf.api import _feed_args
from conftest import SCHEMA


def _history(t: lineage.Table) -> int:
    """Four files of 50 rows, then a delete skewed to the low ids, an update, an upsert and a copy-on-write update;
    returns the version before the writes."""
    for start in range(0, 200, 50):
        t.append(pa.table({"id": list(range(start, start + 50)), "name": [f"n{i % 7}" for i in range(start, start + 50)],
                           "amount": [float(i) for i in range(start, start + 50)]}, schema=SCHEMA))
    base = t.version
    t.delete("id < 30 OR id % 17 = 0")
    t.update("id % 3 = 0", {"amount": "amount + 1"})
    t.upsert(pa.table({"id": list(range(180, 230, 2)), "name": ["u"] * 25, "amount": [9.0] * 25}, schema=SCHEMA))
    t.update("id % 5 = 1", {"name": "'c'"}, mode="copy-on-write")
    t.update("id % 4 = 2", {"name": "'same'", "amount": "amount"})  # a net pair equal in some columns
    return base


@pytest.fixture(params=[False, True], ids=["pointers", "captured"])
def grouped(request, warehouse) -> tuple[lineage.Table, int]:
    t = lineage.create_table("g.t", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.capture-preimages": str(request.param).lower()})
    return t, _history(t)


@pytest.mark.parametrize("net", [False, True])
@pytest.mark.parametrize("group_rows", [2, 7, 40])
def test_a_feed_streamed_in_groups_is_the_whole_feed_in_order(grouped, monkeypatch, net, group_rows):
    t, base = grouped
    state, a, b, _ = _feed_args(t, base, None, net, None, None, None)
    assert len(list(groups.units(state, a, b, net, group_rows))) > b - a  # every version cut in several groups
    for start in (0, base, base + 2):
        whole = cdf.changes(t, start, net=net)
        monkeypatch.setattr(groups, "GROUP_ROWS", group_rows)
        streamed = cdf.change_batches(t, start, net=net, batch_rows=3).read_all()
        monkeypatch.undo()
        assert whole.num_rows > 0 and streamed.equals(whole), (start, net, group_rows)


def test_each_group_holds_at_most_its_rows_even_when_the_changes_are_skewed(grouped):
    t, base = grouped
    state = t.state()
    for v in range(base + 1, state.version + 1):
        ranges = groups.row_ranges(state, v - 1, v, 6)
        assert ranges[0][0] == 0 and ranges[-1][1] == groups.ALL_ROWS[1]
        assert all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))  # consecutive: no row id left out
        sizes = [len(pointers.change_pointers(state, v - 1, v, r)) for r in ranges]
        assert max(sizes) <= 6 and sum(sizes) == len(pointers.change_pointers(state, v - 1, v)), (v, sizes)
    # the delete matched ids 0-29 densely and a few others: its groups are narrow at the low row ids
    first = groups.row_ranges(state, base, base + 1, 6)
    assert first[0][1] <= 10 and len(first) >= 5


def test_a_lost_file_of_a_later_group_is_named_by_the_call(warehouse, monkeypatch):
    import os

    t = lineage.create_table("g.lost", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": list(range(40)), "name": ["a"] * 40, "amount": [1.0] * 40}, schema=SCHEMA))
    first = t.state().all_data_file_paths()
    t.append(pa.table({"id": list(range(40, 80)), "name": ["b"] * 40, "amount": [2.0] * 40}, schema=SCHEMA))
    (second,) = t.state().all_data_file_paths() - first  # row ids 40-79: not in the feed's first group
    base = t.version
    t.delete("id >= 0")
    os.remove(second.removeprefix("file://"))  # as another engine's remove_orphan_files would
    monkeypatch.setattr(groups, "GROUP_ROWS", 10)
    assert len(list(groups.units(t.state(), base, t.version, False, 10))) > 2
    with pytest.raises(lineage.LostFileError, match="no longer exists"):
        cdf.change_batches(t, base)


@pytest.mark.spark
@pytest.mark.parametrize("net", [False, True])
def test_the_spark_feed_in_many_tasks_is_the_embedded_feed_in_order(spark, grouped, monkeypatch, net):
    t, base = grouped
    monkeypatch.setattr(engine_spark, "TASK_IMAGES", 7)
    for start in (0, base):
        ours = cdf.decode_change_columns(cdf.changes(t, start, net=net))  # Spark's string types
        theirs = cdf.changes(t, start, net=net, engine="spark", spark=spark).toArrow()
        assert theirs.cast(ours.schema).equals(ours), (start, net)


@pytest.mark.spark
def test_the_spark_feed_builds_no_pointer_on_the_driver_and_collects_nothing(spark, warehouse, monkeypatch):
    """Planning the Spark feed reads metadata files' names and the commit log: the pointers of the changed rows
    are built by executors, and no row crosses to the driver while the feed is planned and written."""
    from pyspark import cloudpickle
    from test_spark_rewrite import _collected_rows

    shipped = {}
    for n in (40, 400):
        t = lineage.create_table(f"g.d{n}", SCHEMA, key=["id"], warehouse=warehouse)
        t.append(pa.table({"id": list(range(n)), "name": ["a"] * n, "amount": [1.0] * n}, schema=SCHEMA))
        t.update("id % 2 = 0", {"amount": "amount + 1"})
        t.delete("id % 3 = 0")

        def built_on_the_driver(*args, **kwargs):  # executors run in their own processes: this spy is the driver's
            raise AssertionError("the driver built pointers of changed rows")

        reader = spark_groups.group_reader

        def measured(*args, **kwargs):  # the function every task is sent, pickled as Spark pickles it
            fn = reader(*args, **kwargs)
            shipped[n] = len(cloudpickle.dumps(fn))
            return fn

        counts = _collected_rows(monkeypatch, spark)
        with monkeypatch.context() as m:
            m.setattr(pointers.PointerSources, "pointers", built_on_the_driver)
            m.setattr(pointers, "change_pointers", built_on_the_driver)
            m.setattr(spark_groups, "group_reader", measured)
            df = cdf.changes(t, 1, engine="spark", spark=spark)
            df.write.format("noop").mode("overwrite").save()
        assert counts == [], counts  # nothing collected
        monkeypatch.undo()
        assert df.count() == n // 2 * 2 + len(range(0, n, 3))
    assert shipped[400] <= shipped[40] + 200  # what the tasks are sent does not grow with the changed rows
