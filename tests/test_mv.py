"""Materialized views refreshed from the change feed (issue 7).

* A Hypothesis property: random writes on a source (append, update, delete,
  upsert; keys deleted and re-inserted; nulls in keys and arguments) with
  refreshes at random points (some forced full). After every refresh each view
  equals its query evaluated from scratch by DuckDB over ``source.scan()`` at
  the source version the view's checkpoint names: a projection/filter view
  (with its source row ids), a grouped aggregate with SUM/COUNT/AVG/MIN/MAX
  over a nullable key, a global aggregate, and an aggregate grouped by an
  expression (``qty % 3``, null for null qty).
* Exactly once: a refresh process is killed (SIGKILL) at every stage, inside
  the Iceberg commit, and after random delays; the next refresh always gives
  the from-scratch answer and the view's commit log never applies a source
  range twice (the refreshes run in processes forked from one that imported
  the library once, to keep the test fast). Racing refreshes: the loser
  reports ``concurrent`` and writes nothing, whether it loses before its merge
  or inside the merge's re-plan after a lost commit race.
* Retention fallback, idle checkpoints, purged rows, chained views, the cron
  entry point, one Spark-engine refresh, and refused queries.
"""

from __future__ import annotations

import decimal
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import cdf.mv
import cdf.mv.view as mv_view  # where the refresh's fault hook lives
import lineage
import lineage.commits.commit as commit_module
from cdf.mv import ViewQueryError

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("qty", pa.int64()), ("amount", pa.float64())])
GROUPS = [None, "a", "b", "c"]
QTYS = [None, 0, 1, 2, 3, 5]
AMOUNTS = [None, 0.0, 0.5, 1.0, 2.5, 4.0, 7.5]  # exact in binary: sums are exact, so incremental == from scratch

# name -> query (the source is "orders"); {extra} is "" for the view and ", _row_id" for the projection's row-id check.
VIEWS = {
    "proj": "SELECT id, qty * 2 AS q2, upper(grp) AS g, amount FROM orders WHERE amount < 4 OR qty IS NULL",
    "bygrp": (
        "SELECT grp, COUNT(*) AS n, SUM(qty) AS s, COUNT(qty) AS nq, AVG(amount) AS av, MIN(amount) AS lo, "
        "MAX(qty) AS hi, MIN(grp) AS first_grp FROM orders WHERE id % 7 <> 3 GROUP BY grp"
    ),
    "total": "SELECT COUNT(*) AS n, SUM(amount) AS s, MIN(qty) AS lo, MAX(amount) AS hi FROM orders WHERE qty IS NOT NULL",
    "bucket": "SELECT qty % 3 AS b, MAX(amount) AS hi, MIN(amount) AS lo, SUM(amount) AS s FROM orders GROUP BY qty % 3",
}


# ---------------------------------------------------------------- helpers


def _norm(value: object) -> object:
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float):
        return round(value + 0.0, 9)
    return value


def _rows(tbl: pa.Table) -> list[tuple]:
    return sorted((tuple(_norm(v) for v in row.values()) for row in tbl.to_pylist()), key=repr)


def oracle(source: lineage.Table, query: str, version: int) -> pa.Table:
    """The query evaluated from scratch by DuckDB over the source at ``version``."""
    con = duckdb.connect()
    try:
        con.register("orders", source.scan(as_of=version))
        return con.execute(query).to_arrow_table()
    finally:
        con.close()


def assert_view_matches(view: cdf.mv.MaterializedView, source: lineage.Table, query: str) -> None:
    version = view.checkpoint
    assert version is not None
    expected = oracle(source, query, version)
    assert _rows(view.scan()) == _rows(expected), f"view {view.name} differs from its query at source version {version}"
    if view.shape == "projection":
        ids = oracle(source, query.replace(" FROM orders", ", _row_id FROM orders"), version)
        got = view.table.scan(columns=[*view.columns, "_src_row_id"])
        assert _rows(got) == _rows(ids), "projection rows are not keyed by their source row ids"


def make_source(warehouse: str, properties: dict[str, str] | None = None) -> lineage.Table:
    return lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=properties)


def batch(ids: list[int], rnd: random.Random) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "grp": pa.array([rnd.choice(GROUPS) for _ in ids], pa.string()),
            "qty": pa.array([rnd.choice(QTYS) for _ in ids], pa.int64()),
            "amount": pa.array([rnd.choice(AMOUNTS) for _ in ids], pa.float64()),
        }
    )


def checkpoints(view: cdf.mv.MaterializedView) -> list[int]:
    return [int(c.properties["mv.source-version"]) for c in view.table.history() if "mv.source-version" in c.properties]


# ---------------------------------------------------------------- the property

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("update"), st.integers(2, 4), st.integers(0, 3), st.sampled_from(["qty", "amount", "grp", "qty_inc"])),
        st.tuples(st.just("delete"), st.integers(2, 5), st.integers(0, 4)),
        st.tuples(st.just("upsert"), st.integers(1, 4), st.integers(0, 2)),
        st.tuples(st.just("refresh"), st.booleans(), st.integers(0, 9)),
    ),
    min_size=3,
    max_size=9,
)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_refreshed_views_equal_their_query_from_scratch(ops, seed):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        wh = os.path.join(tmp, "wh")
        source = make_source(wh)
        source.append(batch(list(range(1, 7)), rnd))
        next_key = 7
        views = {name: cdf.mv.create(f"shop.{name}", source, query) for name, query in VIEWS.items()}
        for op in [*ops, ("refresh", False, 0)]:
            note(f"op {op}")
            kind = op[0]
            if kind == "append":
                source.append(batch(list(range(next_key, next_key + op[1])), rnd))
                next_key += op[1]
            elif kind == "update":
                _, m, r, col = op
                value = {"qty": str(rnd.choice(QTYS[1:])), "amount": str(rnd.choice(AMOUNTS[1:])), "grp": rnd.choice(["'a'", "'c'", "CAST(NULL AS VARCHAR)"]),
                         "qty_inc": "qty + 1"}[col]
                source.update(f"id % {m} = {r % m}", {col if col != "qty_inc" else "qty": value})
            elif kind == "delete":
                source.delete(f"id % {op[1]} = {op[2] % op[1]}")
            elif kind == "upsert":
                old = rnd.sample(range(1, next_key), min(op[1], next_key - 1))  # live or deleted keys
                new = list(range(next_key, next_key + op[2]))
                next_key += op[2]
                source.upsert(batch(old + new, rnd))
            else:
                full = op[1] and op[2] < 3
                for name, view in views.items():
                    result = view.refresh(full=full)
                    note(f"  {result}")
                    assert result.to_version == source.version
                    assert view.checkpoint == source.version
                    assert_view_matches(view, source, VIEWS[name])
        for view in views.values():
            history = checkpoints(view)
            assert history == sorted(set(history)), f"a source range was applied twice: {history}"


# ---------------------------------------------------------------- exactly once under crashes

# One process imports the library once, then forks one refresh per job and lets it die (SIGKILL) at the
# job's stage, or kills it itself after a random delay; it prints each refresh's exit code as JSON.
_CRASHER = r"""
import json, os, signal, sys, time
import cdf.mv as m
import cdf.mv.view as mv_view
import lineage.writes.loop as write_loop  # where a write calls commit_change

warehouse, jobs = sys.argv[1], json.loads(sys.argv[2])
stage = None

def die():
    os.kill(os.getpid(), signal.SIGKILL)

real = write_loop.commit_change

def commit_change(*args, **kwargs):
    if stage == "iceberg-before":
        die()
    out = real(*args, **kwargs)
    if stage == "iceberg-after":
        die()
    return out

write_loop.commit_change = commit_change
mv_view._FAULT_HOOK = lambda at: die() if at == stage else None
codes = {}
for view, job_stage, delay in jobs:
    pid = os.fork()
    if pid == 0:
        stage = job_stage
        code = 1
        try:
            code = m.main(["refresh", view, "--warehouse", warehouse, "-q"])
        finally:
            os._exit(code)
    if delay is not None:
        time.sleep(delay)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    codes[view] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


def _crash(warehouse: str, jobs: list[tuple[str, str, float | None]]) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CRASHER, warehouse, json.dumps(jobs)], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _write_something(source: lineage.Table, rnd: random.Random, next_key: int) -> int:
    source.update(f"id % 3 = {rnd.randrange(3)}", {"amount": str(rnd.choice(AMOUNTS[1:])), "qty": "qty + 1"})
    source.delete(f"id % 5 = {rnd.randrange(5)}")
    source.upsert(batch([rnd.randrange(1, next_key), next_key, next_key + 1], rnd))
    return next_key + 2


STAGES = ["feed", "delta", "commit", "iceberg-before", "iceberg-after", "committed"]


def test_killed_refreshes_are_applied_exactly_once(warehouse):
    """One view per crash point, and two refreshes killed after a random delay."""
    rnd = random.Random(17)
    source = make_source(warehouse)
    source.append(batch(list(range(1, 40)), rnd))
    cases = [(stage, "bygrp" if i % 2 == 0 else "proj") for i, stage in enumerate(STAGES)] + [("random", "bygrp"), ("random", "proj")]
    views = []
    for i, (_, shape) in enumerate(cases):
        view = cdf.mv.create(f"shop.v{i}", source, VIEWS[shape])
        view.refresh()
        views.append(view)
    _write_something(source, rnd, 40)
    before, target = 1, source.version

    jobs = [(view.name, stage, rnd.uniform(0.1, 1.5) if stage == "random" else None) for view, (stage, _) in zip(views, cases, strict=True)]
    codes = _crash(warehouse, jobs)
    for view, (stage, shape) in zip(views, cases, strict=True):
        if stage != "random":
            assert codes[view.name] == -signal.SIGKILL, (stage, codes)
        landed = view.checkpoint
        assert landed in (before, target), stage  # all or nothing
        if stage in ("iceberg-after", "committed"):
            assert landed == target, stage
        elif stage != "random":
            assert landed == before, stage
        assert_view_matches(view, source, VIEWS[shape])  # whichever state is visible is a correct one

        result = view.refresh()
        assert result.status == ("up-to-date" if landed == target else "refreshed"), (stage, result)
        assert view.checkpoint == target
        assert_view_matches(view, source, VIEWS[shape])
        assert checkpoints(view) == [before, target], stage  # one commit per range: never applied twice


def _race(warehouse: str, stage: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(7)
    source = make_source(warehouse)
    source.append(batch(list(range(1, 25)), rnd))
    view = cdf.mv.create("shop.bygrp", source, VIEWS["bygrp"])
    view.refresh()
    _write_something(source, rnd, 25)
    rival = cdf.mv.open_view("shop.bygrp", warehouse=warehouse)
    results = []

    def rival_wins() -> None:
        results.append(None)
        results.append(rival.refresh())  # the rival wins while this refresh is between reading and committing

    if stage == "inside-merge":
        # The rival commits after the merge planned against the old view version: the Iceberg
        # commit fails, the merge re-plans, and expected_version stops it there.
        real_commit = commit_module.commit_files

        def racing_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
            if not results:
                rival_wins()
            return real_commit(*args, **kwargs)

        monkeypatch.setattr(commit_module, "commit_files", racing_commit)
    else:
        mv_view._FAULT_HOOK = lambda at: rival_wins() if at == stage and not results else None
    try:
        with caplog.at_level(logging.INFO, logger="lineage.table"):
            loser = view.refresh()
    finally:
        mv_view._FAULT_HOOK = None
    replanned = any("lost a race" in r.getMessage() for r in caplog.records)
    assert replanned == (stage == "inside-merge")
    winner = results[1]
    assert winner.status == "refreshed" and winner.committed
    assert loser.status == "concurrent" and not loser.committed, loser
    assert view.table.version == winner.view_version  # the loser wrote nothing
    assert checkpoints(view) == [1, source.version]
    assert_view_matches(view, source, VIEWS["bygrp"])
    assert view.refresh().status == "up-to-date"


def test_racing_refresh_loses_before_its_merge(warehouse, caplog, monkeypatch):
    _race(warehouse, "commit", caplog, monkeypatch)


def test_racing_refresh_loses_inside_the_merge_replan(warehouse, caplog, monkeypatch):
    _race(warehouse, "inside-merge", caplog, monkeypatch)


# ---------------------------------------------------------------- fallbacks and bookkeeping


def test_checkpoint_beyond_retention_triggers_a_logged_full_rebuild(warehouse, caplog):
    rnd = random.Random(3)
    source = make_source(warehouse, {"lineage.cdf.retention.versions": "2"})
    source.append(batch(list(range(1, 20)), rnd))
    view = cdf.mv.create("shop.bucket", source, VIEWS["bucket"])
    view.refresh()
    for _ in range(2):
        _write_something(source, rnd, 20 + _ * 2)
    with caplog.at_level(logging.WARNING, logger="cdf.mv"):
        result = view.refresh()
    assert result.status == "rebuilt" and result.full and "retention" in result.reason
    assert any("retention" in r.getMessage() and "full rebuild" in r.getMessage() for r in caplog.records)
    assert_view_matches(view, source, VIEWS["bucket"])
    source.delete("id = 2")
    assert view.refresh().status == "refreshed"  # back to incremental
    assert_view_matches(view, source, VIEWS["bucket"])


def test_changes_the_view_ignores_advance_the_checkpoint_without_a_snapshot(warehouse):
    rnd = random.Random(5)
    source = make_source(warehouse)
    source.append(batch(list(range(1, 10)), rnd))
    view = cdf.mv.create("shop.counts", source, "SELECT grp, COUNT(*) AS n FROM orders GROUP BY grp")
    view.refresh()
    snapshots = len(view.table.history())
    source.update("TRUE", {"qty": "qty + 1"})  # a column the view does not read
    result = view.refresh()
    assert result.status == "unchanged" and not result.committed
    assert len(view.table.history()) == snapshots and view.checkpoint == source.version
    assert view.refresh().status == "up-to-date"
    source.delete("id = 1")
    assert view.refresh().status == "refreshed"
    assert_view_matches(view, source, "SELECT grp, COUNT(*) AS n FROM orders GROUP BY grp")


def test_an_empty_initial_build_records_its_checkpoint(warehouse):
    source = make_source(warehouse)
    source.append(batch([1, 2], random.Random(1)))
    view = cdf.mv.create("shop.none", source, "SELECT id FROM orders WHERE id > 100")
    first = view.refresh()
    assert first.status == "rebuilt" and not first.committed and view.checkpoint == source.version
    assert view.refresh().status == "up-to-date"


def test_views_chain_and_the_cron_entry_point_refreshes(warehouse, capsys):
    rnd = random.Random(11)
    source = make_source(warehouse)
    source.append(batch(list(range(1, 15)), rnd))
    totals = cdf.mv.create("shop.totals", source, "SELECT grp, SUM(amount) AS s, COUNT(*) AS n FROM orders GROUP BY grp")
    big = cdf.mv.create("shop.big", totals.table, "SELECT grp, s FROM totals WHERE n >= 2")  # a view over a view
    assert cdf.mv.main(["refresh", "shop.totals", "--warehouse", warehouse, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "rebuilt"
    big.refresh()
    source.delete("id % 2 = 0")
    assert cdf.mv.main(["refresh", "shop.totals", "--warehouse", warehouse]) == 0
    assert "refreshed" in capsys.readouterr().out
    assert big.refresh().status in ("refreshed", "unchanged")
    con = duckdb.connect()
    con.register("orders", source.scan())
    expected = con.execute("SELECT grp, s FROM (SELECT grp, SUM(amount) AS s, COUNT(*) AS n FROM orders GROUP BY grp) WHERE n >= 2")
    assert _rows(big.scan()) == _rows(expected.to_arrow_table())
    assert cdf.mv.main(["refresh", "shop.missing", "--warehouse", warehouse]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.spark
def test_spark_engine_refresh_matches_duckdb(warehouse, spark):
    rnd = random.Random(13)
    source = make_source(warehouse)
    source.append(batch(list(range(1, 40)), rnd))
    on_spark = cdf.mv.create("shop.spark_bygrp", source, VIEWS["bygrp"])
    on_duck = cdf.mv.create("shop.duck_bygrp", source, VIEWS["bygrp"])
    proj = cdf.mv.create("shop.spark_proj", source, VIEWS["proj"])
    on_spark.refresh()  # the initial build with DuckDB, then incremental refreshes with Spark
    on_duck.refresh()
    proj.refresh()
    source.update("grp = 'a'", {"amount": "amount + 1", "qty": "NULL"})
    source.delete("id % 4 = 1")
    source.upsert(batch([2, 3, 50, 51], rnd))
    assert on_spark.refresh(engine="spark", spark=spark).status == "refreshed"
    assert proj.refresh(engine="spark", spark=spark).status == "refreshed"
    on_duck.refresh()
    assert_view_matches(on_spark, source, VIEWS["bygrp"])
    assert_view_matches(proj, source, VIEWS["proj"])
    assert _rows(on_spark.table.scan(with_lineage=False)) == _rows(on_duck.table.scan(with_lineage=False))


# ---------------------------------------------------------------- refused queries and bad input

REFUSED = {
    "join": ("SELECT o.id FROM orders o JOIN orders p ON o.id = p.id", "joins"),
    "comma join": ("SELECT id FROM orders, orders", "joins"),
    "subquery": ("SELECT id FROM orders WHERE id IN (SELECT id FROM orders)", "subqueries"),
    "from subquery": ("SELECT id FROM (SELECT id FROM orders) s", "subqueries"),
    "cte": ("WITH x AS (SELECT id FROM orders) SELECT id FROM orders", "WITH"),
    "union": ("SELECT id FROM orders UNION SELECT id FROM orders", "UNION"),
    "window": ("SELECT id, row_number() OVER (ORDER BY id) AS r FROM orders", "window"),
    "distinct": ("SELECT DISTINCT grp FROM orders", "DISTINCT"),
    "count distinct": ("SELECT grp, COUNT(DISTINCT qty) AS n FROM orders GROUP BY grp", "DISTINCT"),
    "having": ("SELECT grp, COUNT(*) AS n FROM orders GROUP BY grp HAVING COUNT(*) > 1", "HAVING"),
    "order by": ("SELECT id FROM orders ORDER BY id", "ORDER BY"),
    "limit": ("SELECT id FROM orders LIMIT 3", "LIMIT"),
    "random": ("SELECT id, random() AS r FROM orders", "non-deterministic"),
    "now": ("SELECT id, now() AS t FROM orders", "non-deterministic"),
    "current_date": ("SELECT id FROM orders WHERE current_date > DATE '2020-01-01'", "non-deterministic"),
    "median": ("SELECT grp, median(qty) AS m FROM orders GROUP BY grp", "MEDIAN"),
    "filter clause": ("SELECT grp, SUM(qty) FILTER (WHERE qty > 1) AS s FROM orders GROUP BY grp", "FILTER"),
    "rollup": ("SELECT grp, COUNT(*) AS n FROM orders GROUP BY ROLLUP (grp)", "ROLLUP"),
    "mixed aggregate": ("SELECT grp, SUM(qty) / COUNT(*) AS x FROM orders GROUP BY grp", "mixes an aggregate"),
    "key not selected": ("SELECT COUNT(*) AS n FROM orders GROUP BY grp", "not one of the selected"),
    "selected non-key": ("SELECT grp, qty, COUNT(*) AS n FROM orders GROUP BY grp", "neither aggregates"),
    "no group by": ("SELECT grp, COUNT(*) AS n FROM orders", "GROUP BY"),
    "unknown column": ("SELECT nope FROM orders", "not a data column"),
    "lineage column": ("SELECT id, _row_id AS r FROM orders", "lineage columns"),
    "other table": ("SELECT id FROM customers", "source table"),
    "table function": ("SELECT * FROM read_parquet('x.parquet')", "plain table"),
    "unnamed expression": ("SELECT qty * 2 FROM orders", "needs a name"),
    "reserved name": ("SELECT id AS _src_row_id FROM orders", "reserved"),
    "duplicate names": ("SELECT id, qty AS id FROM orders", "several columns"),
    "not boolean where": ("SELECT id FROM orders WHERE qty", "boolean"),
    "sum of text": ("SELECT grp, SUM(grp) AS s FROM orders GROUP BY grp", "does not work"),
    "two statements": ("SELECT id FROM orders; SELECT id FROM orders", "exactly one"),
    "not sql": ("SELEC id FROM orders", "SQL"),
    "insert": ("INSERT INTO orders VALUES (1)", "INSERT"),
}


@pytest.fixture(scope="module")
def orders(tmp_path_factory):
    return make_source(str(tmp_path_factory.mktemp("refused") / "wh"))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_queries_are_refused_at_creation(orders, case):
    table = orders
    query, words = REFUSED[case]
    with pytest.raises(ViewQueryError) as info:
        cdf.mv.create("shop.v", table, query)
    assert words.lower() in str(info.value).lower(), str(info.value)
    assert isinstance(info.value, lineage.InvalidArgumentError)
    with pytest.raises(cdf.mv.ViewNotFoundError):
        cdf.mv.open_view("shop.v", catalog=table.catalog)  # nothing was created


def test_supported_spellings_and_bad_arguments(table, warehouse):
    ok = {
        "star": "SELECT * FROM orders WHERE amount > 1",
        "qualified": "SELECT o.id, o.name FROM shop.orders AS o WHERE o.amount > 0",
        "ordinal": "SELECT name, SUM(amount) AS s FROM orders GROUP BY 1",
        "group by all": "SELECT lower(name) AS n, MAX(id) AS m FROM orders GROUP BY ALL",
        "expression key": "SELECT id % 3 AS b, COUNT(*) FROM orders GROUP BY id % 3",
        "default names": "SELECT name, COUNT(*), SUM(amount), AVG(id), MIN(name), MAX(amount) FROM orders GROUP BY name",
    }
    for i, query in enumerate(ok.values()):
        view = cdf.mv.create(f"shop.ok{i}", table, query)
        assert view.checkpoint is None and view.scan().num_rows == 0
    assert cdf.mv.open_view("shop.ok5", warehouse=warehouse).columns == ["name", "count", "sum_amount", "avg_id", "min_name", "max_amount"]
    with pytest.raises(lineage.InvalidArgumentError, match="engine"):
        cdf.mv.open_view("shop.ok0", warehouse=warehouse).refresh(engine="pandas")
    with pytest.raises(lineage.InvalidArgumentError, match="lineage.Table"):
        cdf.mv.create("shop.x", "shop.orders", "SELECT id FROM orders")
    with pytest.raises(cdf.mv.ViewNotFoundError, match="not a materialized view"):
        cdf.mv.open_view("shop.orders", warehouse=warehouse)
    with pytest.raises(lineage.TableAlreadyExistsError):
        cdf.mv.create("shop.ok0", table, "SELECT id FROM orders")


def test_purged_rows_leave_projections_by_row_id_and_rebuild_aggregates(warehouse):
    rnd = random.Random(19)
    source = make_source(warehouse)
    source.append(batch(list(range(1, 20)), rnd))
    proj = cdf.mv.create("shop.proj", source, "SELECT id, amount FROM orders WHERE qty IS NOT NULL OR qty IS NULL")
    agg = cdf.mv.create("shop.bygrp", source, VIEWS["bygrp"])
    proj.refresh()
    agg.refresh()
    source.update("id = 4", {"qty": "7"})
    source.purge("id IN (3, 4, 5)")  # GDPR: the values are erased; the feed flags the rows _purged
    result = proj.refresh()
    assert result.status == "refreshed" and result.deleted == 3
    assert_view_matches(proj, source, "SELECT id, amount FROM orders WHERE qty IS NOT NULL OR qty IS NULL")
    result = agg.refresh()
    assert result.status == "rebuilt" and "purged" in result.reason
    assert_view_matches(agg, source, VIEWS["bygrp"])
