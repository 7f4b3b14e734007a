"""Importing the library loads only what its first call needs.

``import lineage, cdf`` used to load pyarrow.dataset (through pyiceberg's
pyarrow FileIO), SQLAlchemy (through pyiceberg's SQL catalog) and every Spark
path. Those modules now load where they are used: pyiceberg's writer and
FileIO at the first write or table open, the SQL catalog when a catalog is
opened. pandas still loads on import, on purpose (:func:`lineage.memory.load_pandas_for_pyarrow`).
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
LAZY = ("pyarrow.dataset", "pyiceberg.io.pyarrow", "pyiceberg.catalog.sql", "sqlalchemy", "pyspark")

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
