"""One table, many writers on a shared PostgreSQL catalog, data on S3 (moto): nothing lost, row ids unique.

And the catalog failing for real: the server connection killed
(``pg_terminate_backend``) at the commit point of every kind of commit, and
the server restarted while writers and maintenance run.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import threading
import time
import traceback

import pyarrow as pa
import pytest

import cdf
import lineage
from conftest import SCHEMA, assert_interop, rows
from lineage.maintenance.verify import verify

NAME = "shop.orders"
WRITERS = 4
ROUNDS = 2
PER_ROUND = 5
PROPS = {"commit.retry.num-retries": "60"}  # six committers on one table: lost races are re-planned, not given up


def _batch(ids: list[int], name: str, amount: float = 0.0) -> pa.Table:
    return pa.table({"id": ids, "name": [name] * len(ids), "amount": [amount] * len(ids)}, schema=SCHEMA)


# ---------------------------------------------------------------------- child processes
def _persist(op, outages: list[str]):  # noqa: ANN001, ANN202
    """Run ``op`` as a job would through a catalog outage: retry what failed because the catalog was away.

    Every write here is idempotent (upserts, updates that set a value), so
    running one again after an unknown outcome is safe; what the library
    raised is recorded in ``outages`` (its own errors only: a raw database
    error reaching the caller fails the test).
    """
    deadline = time.monotonic() + 120
    while True:
        try:
            return op()
        except (lineage.CommitStateUnknownError, lineage.CatalogFailedError, lineage.CatalogUnavailableError) as exc:
            outages.append(type(exc).__name__)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _writer(lake, w: int, barrier, results) -> None:  # noqa: ANN001
    """ROUNDS rounds on this writer's own key range: upsert PER_ROUND new rows, then set the amount of all its rows to the round."""
    try:
        t = lineage.open_table(NAME, **lake.where())
        base = (w + 1) * 1000
        barrier.wait(timeout=120)
        outages: list[str] = []
        mode = lineage.COPY_ON_WRITE if w % 2 else lineage.MERGE_ON_READ
        for r in range(ROUNDS):
            rows_ = _batch([base + r * PER_ROUND + i for i in range(PER_ROUND)], f"w{w}")
            _persist(lambda: t.upsert(rows_), outages)
            _persist(lambda: t.update(f"id >= {base} AND id < {base + 1000}", {"amount": f"{r + 1}.0 + 0 * amount"}, mode=mode),
                     outages)
        results.put(("ok", w, outages))
    except BaseException:  # noqa: BLE001 - everything goes to the parent
        results.put(("error", w, traceback.format_exc()))


def _maintainer(lake, done, barrier, results) -> None:  # noqa: ANN001
    """Compact, rewrite deletes and expire old snapshots in a loop until ``done`` is set."""
    try:
        t = lineage.open_table(NAME, **lake.where())
        barrier.wait(timeout=120)
        runs, outages = 0, []
        while not done.is_set():
            _persist(t.compact, outages)
            _persist(t.rewrite_deletes, outages)
            _persist(lambda: t.expire_snapshots(retain_last=40), outages)
            runs += 1
            time.sleep(0.2)
        results.put(("ok", "maintenance", (runs, outages)))
    except BaseException:  # noqa: BLE001
        results.put(("error", "maintenance", traceback.format_exc()))


def _collect(results, expected: set, procs: list, timeout: float) -> dict:  # noqa: ANN001
    out: dict = {}
    deadline = time.monotonic() + timeout
    while set(out) != expected:
        try:
            kind, who, payload = results.get(timeout=1.0)
        except queue_mod.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead and results.empty():
                pytest.fail(f"a process died without reporting (exit codes {dead})")
            if time.monotonic() > deadline:
                pytest.fail(f"processes did not finish within {timeout}s (reported: {sorted(map(str, out))})")
            continue
        assert kind == "ok", f"{who} failed:\n{payload}"
        out[who] = payload
    return out


@pytest.mark.spark
def test_writers_maintenance_and_spark_share_a_postgresql_catalog(pg_lake, postgres, spark) -> None:
    table = lineage.create_table(NAME, SCHEMA, key=["id"], properties=PROPS, **pg_lake.where())
    table.append(_batch(list(range(10)), "seed"))
    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    barrier = ctx.Barrier(WRITERS + 2)  # the writers, the maintenance loop and this process (the Spark writer)
    procs = [ctx.Process(target=_writer, args=(pg_lake, w, barrier, results), daemon=True) for w in range(WRITERS)]
    procs.append(ctx.Process(target=_maintainer, args=(pg_lake, done, barrier, results), daemon=True))
    for p in procs:
        p.start()
    restarted = threading.Event()

    def restart_the_server_mid_run() -> None:
        time.sleep(4.0)
        postgres.restart("immediate")  # every open connection dies; writers in a commit see a lost connection
        restarted.set()

    try:
        barrier.wait(timeout=180)
        restarter = threading.Thread(target=restart_the_server_mid_run, daemon=True)
        restarter.start()
        outages: list[str] = []
        for r in range(2):  # the Spark writer: upserts of keys 0..4 (updates) and 90000+ (inserts)
            batch = spark.createDataFrame(_batch([0, 1, 2, 3, 4, 90000 + r], "spark", float(r + 1)))
            _persist(lambda: table.upsert(batch), outages)
        out = _collect(results, set(range(WRITERS)), procs, timeout=600)
        restarter.join(60)
        assert restarted.is_set()
        done.set()
        out.update(_collect(results, {"maintenance"}, procs, timeout=300))
    finally:
        done.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()

    table = lineage.open_table(NAME, **pg_lake.where())
    final = table.scan().to_pylist()
    row_ids = [r["_row_id"] for r in final]
    assert len(row_ids) == len(set(row_ids)), "two live rows share a row id"
    by_id = {r["id"]: r for r in final}
    expected = {i: ("spark", 2.0) if i < 5 else ("seed", 0.0) for i in range(10)}
    expected[90000], expected[90001] = ("spark", 1.0), ("spark", 2.0)
    for w in range(WRITERS):
        base = (w + 1) * 1000
        for r in range(ROUNDS):
            for i in range(PER_ROUND):
                expected[base + r * PER_ROUND + i] = (f"w{w}", float(ROUNDS))  # the last round's update
    assert {k: (v["name"], v["amount"]) for k, v in by_id.items()} == expected, "a write was lost"
    assert out["maintenance"][0] >= 1
    history = table.history()
    assert [c.version for c in history] == list(range(1, len(history) + 1))
    assert not verify(table).problems
    assert_interop(table)


# ---------------------------------------------------------------------- real catalog faults
def _kill_at_commit(catalog, postgres, times: int = 1) -> dict:  # noqa: ANN001
    """Kill this catalog's server connection just before its next ``times`` transaction commits (the commit point).

    The backend dies before the COMMIT reaches it, so the transaction (the
    catalog's compare-and-swap) is rolled back and the caller sees a lost connection.
    """
    from sqlalchemy import event

    seen = {"left": times, "killed": 0}

    def before_commit(conn) -> None:  # noqa: ANN001
        if seen["left"] <= 0:
            return
        seen["left"] -= 1
        pid = conn.connection.dbapi_connection.get_backend_pid()
        postgres.psql(f"SELECT pg_terminate_backend({pid})")
        seen["killed"] += 1

    event.listen(catalog.engine, "commit", before_commit)
    return seen


OPERATIONS = {
    "append": lambda t: t.append(_batch([100, 101], "new")),
    "update": lambda t: t.update("id < 3", {"amount": "amount + 10"}),
    "delete": lambda t: t.delete("id = 4"),
    "upsert": lambda t: t.upsert(_batch([5, 102], "up", 7.0)),
    "rewrite-deletes": lambda t: t.rewrite_deletes(),
    "compact": lambda t: t.compact(),
    "expire": lambda t: t.expire_snapshots(retain_last=2),
    "purge": lambda t: t.purge("id = 6"),
}


def test_a_connection_killed_at_the_commit_point_and_a_restarted_server(pg_lake, postgres, tmp_path) -> None:
    catalog = pg_lake.catalog()
    # each delete keeps its own delete file, so rewrite-deletes has two to merge (merged deletes under faults:
    # tests/test_commit_faults.py)
    apart = {"lineage.write.delete.merge": "false"}
    twin = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=str(tmp_path / "twin"), properties=apart)  # no faults
    table = lineage.create_table(NAME, SCHEMA, key=["id"], catalog=catalog, properties=apart)
    for t in (twin, table):
        t.append(_batch(list(range(10)), "seed"))
        t.delete("id = 9")
    data = ["id", "name", "amount", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
    for i, (name, op) in enumerate(OPERATIONS.items()):
        op(twin)
        seen = _kill_at_commit(catalog, postgres)
        op(table)
        assert seen["killed"] == 1, f"{name}: no commit reached the catalog"
        if i == 3:  # and once, the server itself goes down and comes back between two commits
            postgres.restart("immediate")
        catalog = pg_lake.catalog()  # a new process's view of the table
        table = lineage.open_table(NAME, catalog=catalog)
        assert table.version == twin.refresh().version, f"{name}: a commit was lost or landed twice"
        assert rows(table.scan(), data) == rows(twin.scan(), data), f"{name}: the table differs from the one without faults"
        assert [(c.version, c.operation) for c in table.history()] == [(c.version, c.operation) for c in twin.history()]
    assert rows(cdf.changes(table, 2), ["id", "name", "amount", "_change_type", "_commit_version"]) == \
        rows(cdf.changes(twin, 2), ["id", "name", "amount", "_change_type", "_commit_version"])
    assert not verify(table).problems
    assert_interop(table)


def test_the_demo_on_a_postgresql_catalog_and_an_s3_warehouse(pg_lake) -> None:
    import subprocess
    import sys

    from lakes import SECRET_KEY

    p = subprocess.run([sys.executable, "-m", "lineage.cli", *pg_lake.cli(), "demo", "--rows", "2000"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"location            {pg_lake.warehouse}/shop/orders" in p.stdout
    assert SECRET_KEY not in p.stdout + p.stderr
    t = lineage.open_table("shop.orders", **pg_lake.where())
    assert t.version >= 5 and not verify(t).problems


def test_reads_and_writes_after_a_server_restart_and_while_it_is_down(pg_lake, postgres) -> None:
    from pg import wait_for

    catalog = pg_lake.catalog()
    table = lineage.create_table(NAME, SCHEMA, key=["id"], catalog=catalog)
    table.append(_batch(list(range(10)), "seed"))
    other = pg_lake.catalog()
    assert lineage.open_table(NAME, catalog=other).scan().num_rows == 10
    postgres.restart("immediate")  # the pools' connections are stale now: a read or write retries on a fresh one
    assert lineage.open_table(NAME, catalog=other).scan().num_rows == 10
    assert table.scan().num_rows == 10
    table.upsert(_batch([1, 20], "after"))
    assert lineage.open_table(NAME, catalog=catalog).scan().num_rows == 11
    postgres.stop("immediate")
    try:
        steps = (lambda: table.scan(), lambda: table.upsert(_batch([2], "down")),
                 lambda: lineage.open_table(NAME, catalog=catalog))
        for step in steps:
            with pytest.raises(lineage.CatalogUnavailableError, match="could not be reached.*nothing was changed.*retry"):
                step()
    finally:
        postgres.start()
        wait_for(postgres)
    assert table.scan().num_rows == 11  # the write while it was down did not land
    table.upsert(_batch([2], "back"))
    got = {r["id"]: r["name"] for r in table.scan().to_pylist()}
    assert len(got) == 11 and got[2] == "back" and got[20] == "after"


def test_the_unavailable_error_names_the_catalog_without_its_password() -> None:
    from sqlalchemy.exc import OperationalError

    from lineage.catalog import unavailable

    class Catalog:
        name = "shared"
        properties = {"uri": "postgresql+psycopg2://app:s3cret@db.internal:5432/lake"}

    err = unavailable(Catalog(), "open shop.orders", OperationalError("SELECT 1", {}, Exception("server closed the connection")))
    assert isinstance(err, lineage.CatalogUnavailableError)
    assert "s3cret" not in str(err) and "app:***@db.internal" in str(err) and "server closed the connection" in str(err)
