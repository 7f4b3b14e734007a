"""Shared fixtures and checks for the test suite."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import lineage
from lineage import duck

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


@pytest.fixture
def warehouse(tmp_path):
    """A fresh local warehouse folder (embedded SQLite catalog inside it)."""
    return str(tmp_path / "wh")


@pytest.fixture
def table(warehouse):
    """An empty keyed table ``shop.orders(id, name, amount)``."""
    return lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)


def lose_next_commit(monkeypatch, rival) -> dict:  # noqa: ANN001
    """Make this process's next Iceberg commit lose a race: ``rival()`` (another writer's commit) runs just
    before it. Returns counters: ``winner`` (what ``rival`` returned) and ``failures`` (commits that failed)."""
    from pyiceberg.exceptions import CommitFailedException

    import lineage.commits.commit as commit_module

    real_commit = commit_module.commit_files
    seen: dict[str, object] = {"armed": True, "winner": None, "failures": 0}

    def racing_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
        if seen["armed"]:
            seen["armed"] = False
            seen["winner"] = rival()
        try:
            return real_commit(*args, **kwargs)
        except CommitFailedException:
            seen["failures"] += 1  # type: ignore[operator]
            raise

    monkeypatch.setattr(commit_module, "commit_files", racing_commit)
    return seen


def rows(tbl: pa.Table, columns: list[str] | None = None) -> list[tuple]:
    """Rows of an Arrow table as sorted tuples (order-insensitive comparison)."""
    columns = columns or tbl.column_names
    data = tbl.select(columns).to_pylist()
    return sorted((tuple(r[c] for c in columns) for r in data), key=repr)


def rename_and_add_a_column(t: lineage.Table) -> None:
    """Four commits on an empty ``SCHEMA`` table around a schema change (``note`` added, ``name`` renamed ``label``).

    Version 1 appends ids 1-3, version 2 updates id 1's amount; then the
    schema changes; version 3 sets id 2's note, version 4 deletes id 3. The
    images of versions 1 and 2 live in files (and segments) written under
    the old names.
    """
    from pyiceberg.types import StringType

    t.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.0, 2.0, 3.0]}, schema=SCHEMA))
    t.update("id = 1", {"amount": "amount + 1"})
    with t.iceberg.update_schema() as u:
        u.add_column("note", StringType())
        u.rename_column("name", "label")
    t.refresh()
    t.update("id = 2", {"note": "'x'"})
    t.delete("id = 3")


@contextlib.contextmanager
def evolve_schema(t: lineage.Table):  # type: ignore[no-untyped-def]
    """pyiceberg's ``UpdateSchema`` for ``t``, committed through the library's catalog path on leaving the block.

    pyiceberg 0.12 evolves the schema of format version 2 tables only (it cannot
    write v3 metadata); this commits the same updates on v2 and v3 alike.
    """
    from pyiceberg.table import Transaction
    from pyiceberg.table.update.schema import UpdateSchema

    import lineage.catalog as catalog

    update = UpdateSchema(Transaction(t.iceberg, autocommit=False))
    yield update
    updates, requirements = update._commit()
    catalog.commit_metadata(t.iceberg, updates, requirements)
    t.refresh()


def assert_interop(table: lineage.Table) -> None:
    """pyiceberg's scan and DuckDB's iceberg_scan return exactly our scan's rows."""
    table.refresh()
    ours = table.scan(with_lineage=False)
    names = ours.column_names
    theirs = table.iceberg.scan().to_arrow()
    assert rows(theirs, names) == rows(ours, names), "pyiceberg scan differs from ours"
    con = duck.connect("iceberg")
    try:
        if table.iceberg.metadata.current_snapshot() is None:
            return
        cols = ", ".join(f'"{c}"' for c in names)
        ddb = con.execute(f"SELECT {cols} FROM iceberg_scan('{table.iceberg.metadata_location}')").to_arrow_table()
        if table.iceberg.metadata.format_version >= 3:  # native row lineage: DuckDB's _row_id and sequence numbers are ours
            native = con.execute(
                f"SELECT {cols}, _row_id, _last_updated_sequence_number AS _row_last_updated_at_version "
                f"FROM iceberg_scan('{table.iceberg.metadata_location}')"
            ).to_arrow_table()
            lin = names + ["_row_id", "_row_last_updated_at_version"]
            assert rows(native, lin) == rows(table.scan(), lin), "DuckDB's native row lineage differs from ours"
    finally:
        con.close()
    assert rows(ddb, names) == rows(ours, names), "DuckDB iceberg_scan differs from ours"


@contextlib.contextmanager
def key_hash_mask(mask: np.uint64):  # noqa: ANN201
    """Narrow the key index's hash for a block (forces hash collisions; see index/key_hash.py)."""
    from index import key_hash

    old = key_hash._MASK
    key_hash._MASK = mask
    try:
        yield
    finally:
        key_hash._MASK = old


def local_spark_builder(app: str):  # type: ignore[no-untyped-def]
    """A builder of the small local Spark session the tests use (also in child processes)."""
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
    )


def start_job(script: str, *args: str, stderr_path: str) -> subprocess.Popen:
    """Run ``tests/<script> ARGS`` as a child process in a process group of its own (with its JVM and Python workers).

    Its stderr goes to ``stderr_path`` (a pipe could fill up and stall a long-running job).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with open(stderr_path, "a") as err:
        return subprocess.Popen([sys.executable, os.path.join(here, script), *args], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a job of :func:`start_job`, its whole process group, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def finish_job(proc: subprocess.Popen, stderr_path: str, timeout: float = 600) -> int:
    """Wait for a job of :func:`start_job`: its exit code, 0 or -SIGKILL (it killed itself); else AssertionError with its stderr."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc)
        raise
    if proc.returncode not in (0, -signal.SIGKILL):
        with open(stderr_path) as f:
            raise AssertionError(f"job failed ({proc.returncode}): {f.read()[-3000:]}")
    return proc.returncode


@pytest.fixture(scope="session")
def spark():
    """One local Spark session shared by every test that needs it (started on first use)."""
    session = local_spark_builder("lineage-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def reference():
    """The Spark 3.5 + Iceberg 1.10 reference engine (tests/reference/), one server for the whole session.

    Started on first use (built first if missing: ``make reference-engine``); stopped at the end of the
    session. Tests using it are marked ``reference`` automatically (``-m "not reference"`` skips them).
    """
    from reference import ReferenceEngine

    engine = ReferenceEngine()
    yield engine
    engine.close()
    _REFERENCE_STATS.update(engine.stats())


_REFERENCE_STATS: dict = {}


def pytest_terminal_summary(terminalreporter):
    """One line on what the reference engine cost, when a test used it."""
    if _REFERENCE_STATS.get("ops"):
        s = _REFERENCE_STATS
        ops = ", ".join(f"{op} {n}x {sec:.1f}s" for op, (n, sec) in sorted(s["ops"].items()))
        terminalreporter.write_line(
            f"reference engine: build check {s.get('build', 0):.1f}s, start {s.get('start', 0):.1f}s, {ops}; "
            f"server+JVM CPU {s['cpu_seconds']:.1f}s"
        )


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses the ``reference`` fixture with ``@pytest.mark.reference``; run slow modules first."""
    for item in items:
        if "reference" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.reference)
    items[:] = slowest_modules_first(items)


# Seconds of the slowest tests on the last full run (`make test`'s --durations), by test function.
SLOW_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_tests.json")


def slowest_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the modules holding the slowest recorded tests (:data:`SLOW_TESTS`) first, the rest in order.

    pytest-xdist hands tests out in collection order, in chunks; a long test handed out last is the run's tail,
    with the other worker idle. Whole modules move, their tests in pytest's order, so module-scoped fixtures
    are still set up once per module and worker. A test missing from the record counts as fast.
    """
    with open(SLOW_TESTS) as f:
        recorded: dict[str, float] = json.load(f)
    weight: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        seconds = recorded.get(item.nodeid.split("[", 1)[0], 0.0)
        weight[module] = max(weight.get(module, 0.0), seconds)
    return sorted(items, key=lambda item: -weight[item.nodeid.split("::", 1)[0]])


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """A real S3 HTTP server (moto) on a free 127.0.0.1 port for the whole session, stopped at its end."""
    from lakes import MotoServer

    server = MotoServer(str(tmp_path_factory.mktemp("moto") / "server.log"))
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    """A fresh lake, once on a local warehouse and once on a bucket of the moto server (``lakes.Lake``)."""
    from lakes import Lake, s3_lake

    if request.param == "local":
        return Lake("local", str(tmp_path / "wh"), str(tmp_path / "wh"))
    return s3_lake(request.getfixturevalue("moto_server"), str(tmp_path / "catalog"))


@pytest.fixture
def s3(moto_server, tmp_path):
    """A fresh lake on a new bucket of the moto server."""
    from lakes import s3_lake

    return s3_lake(moto_server, str(tmp_path / "catalog"))


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL cluster (``pg.PostgresServer``) for the whole session, removed at its end."""
    import tempfile

    from pg import PostgresServer

    # not under pytest's temporary folder: that one is private to root, and the server runs as nobody
    server = PostgresServer(tempfile.mkdtemp(prefix="lineage-pg-"))
    yield server
    server.close()


@pytest.fixture
def pg_lake(postgres, moto_server, tmp_path):
    """A lake with its catalog in a new PostgreSQL database and its data in a new bucket of the moto server."""
    import uuid

    from lakes import s3_lake

    database = f"t_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {database}")
    return s3_lake(moto_server, str(tmp_path / "catalog"), postgres.uri.rsplit("/", 1)[0] + f"/{database}")
