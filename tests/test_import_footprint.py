"""Importing the library loads only what its first call needs.

``import lineage, cdf`` used to load pyarrow.dataset (through pyiceberg's
pyarrow FileIO), SQLAlchemy (through pyiceberg's SQL catalog), DuckDB and every Spark
path. Those modules now load where they are used: pyiceberg's writer and
FileIO at the first write or table open, the SQL catalog when a catalog is
opened, DuckDB at the first connection (a write's plan, a SQL predicate, a view):
a process that opens a table and reads its change feed or scans it never loads DuckDB. pandas still loads on import, on purpose (:func:`lineage.memory.load_pandas_for_pyarrow`).
Each check runs in a fresh interpreter, since the test process itself has
imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent

# Modules that ``import lineage, cdf`` must not load.
LAZY = ("pyarrow.dataset", "pyiceberg.io.pyarrow", "pyiceberg.catalog.sql", "sqlalchemy", "pyspark", "duckdb")

SCRIPT = """
import json, sys
exec(sys.argv[1])
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def loaded_after(statement: str, modules: tuple[str, ...] = LAZY) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``statement``."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, statement, json.dumps(list(modules))], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_library_loads_no_dataset_module_sql_catalog_or_spark():
    assert loaded_after("import lineage, cdf") == []
    assert loaded_after("import lineage, cdf, lineage.table, cdf.views, cdf.follow, lineage.maintenance") == []


def test_the_check_sees_a_module_that_is_loaded():
    # the same check, on statements that do load them: it is not blind
    assert loaded_after("import lineage, cdf, pyiceberg.io.pyarrow") == ["pyarrow.dataset", "pyiceberg.io.pyarrow"]
    assert loaded_after("import lineage.duck as d; d.connect().close()") == ["duckdb"]
    assert loaded_after("import lineage.catalog as c; c.default_catalog(__import__('tempfile').mkdtemp())") == [
        "pyiceberg.catalog.sql", "sqlalchemy"]


def test_pyarrow_imports_pandas_in_the_importing_thread():
    # not at a feed's first conversion in a decoding thread, under pyarrow's lock, while another thread imports
    assert loaded_after("import lineage.table", ("pandas",)) == ["pandas"]
    assert loaded_after("import cdf", ("pandas",)) == ["pandas"]
    assert loaded_after("import lineage", ("pandas",)) == []


def test_a_table_works_after_the_lazy_imports(tmp_path):
    # a fresh interpreter: create, write and read the feed, with the modules loaded on the way
    statement = (
        "import pyarrow as pa, lineage, cdf\n"
        f"t = lineage.create_table('s.t', pa.schema([pa.field('id', pa.int64(), nullable=False), ('v', pa.string())]), key=['id'], warehouse={str(tmp_path)!r})\n"
        "t.append(pa.table({'id': [1, 2], 'v': ['a', 'b']}))\n"
        "t.upsert(pa.table({'id': [2, 3], 'v': ['c', 'd']}))\n"
        "f = cdf.changes(t, 1, 2)\n"
        "assert sorted(zip(f['_change_type'].to_pylist(), f['id'].to_pylist())) == "
        "[('insert', 3), ('update_postimage', 2), ('update_preimage', 2)], f\n"
    )
    assert "pyiceberg.catalog.sql" in loaded_after(statement, ("pyiceberg.catalog.sql",))  # the statement ran, its asserts held


def test_a_sql_catalog_is_recognised_without_importing_it(tmp_path):
    import lineage.catalog as catalog

    assert catalog.is_sql_catalog(catalog.default_catalog(tmp_path))
    assert not catalog.is_sql_catalog(object())
    assert not catalog.is_sql_catalog(pa.table({}))


def test_reading_a_feed_in_a_process_of_its_own_never_loads_duckdb(tmp_path):
    # a consumer: open a table another process wrote, read its feed (whole, streamed, net), its deleted rows and a scan
    make = (
        "import pyarrow as pa, lineage\n"
        f"t = lineage.create_table('s.t', pa.schema([pa.field('id', pa.int64(), nullable=False), ('v', pa.string())]), key=['id'], warehouse={str(tmp_path)!r})\n"
        "t.append(pa.table({'id': [1, 2, 3], 'v': ['a', 'b', 'c']}))\n"
        "t.update('id = 2', {'v': \"'x'\"})\n"
        "t.delete('id = 3')\n"
    )
    assert loaded_after(make, ("duckdb",)) == ["duckdb"]  # the writes' predicates ran in DuckDB
    read = (
        "import lineage, cdf\n"
        f"t = lineage.open_table('s.t', warehouse={str(tmp_path)!r})\n"
        "f = cdf.decode_change_columns(cdf.changes(t, 1, 3))\n"
        "assert sorted(zip(f['_change_type'].to_pylist(), f['id'].to_pylist(), f['v'].to_pylist())) == "
        "[('delete', 3, 'c'), ('update_postimage', 2, 'x'), ('update_preimage', 2, 'b')], f\n"
        "assert sum(b.num_rows for b in cdf.change_batches(t, 1, 3)) == 3\n"
        "assert cdf.changes(t, 1, 3, net=True).num_rows == 3\n"
        "assert cdf.deleted_rows(t)['id'].to_pylist() == [3]\n"
        "assert sorted(t.scan(columns=['id'])['id'].to_pylist()) == [1, 2]\n"
    )
    assert loaded_after(read) == ["pyarrow.dataset", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow", "sqlalchemy"]


def test_duckdb_errors_are_still_the_projects_when_duckdb_loads_late(tmp_path):
    # DuckDB is first loaded inside the write: a predicate that does not parse, an expression that fails on the data
    statement = (
        "import pyarrow as pa, lineage\n"
        f"t = lineage.create_table('s.t', pa.schema([pa.field('id', pa.int64(), nullable=False), ('v', pa.string())]), key=['id'], warehouse={str(tmp_path)!r})\n"
        "t.append(pa.table({'id': [1, 2], 'v': ['a', 'b']}))\n"
        "for bad, call in (('BadPredicateError', lambda: t.delete('id = = 1')),\n"
        "                  ('InvalidArgumentError', lambda: t.update('id = 1', {'id': \"CAST(v AS BIGINT)\"}))):\n"
        "    try:\n"
        "        call()\n"
        "    except getattr(lineage, bad):\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(bad)\n"
        "assert t.version == 1 and sorted(t.scan(columns=['id'])['id'].to_pylist()) == [1, 2]\n"
    )
    assert loaded_after(statement, ("duckdb",)) == ["duckdb"]
