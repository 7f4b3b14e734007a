"""Expressions whose cost an argument chooses, and the memory limit of sealed DuckDB connections.

``lpad``/``rpad`` widths and ``format``/``printf`` widths and precisions must
be literals of at most ``allowlist.MAX_WIDTH``; ``damerau_levenshtein`` is
refused (its matrix grows with the product of its arguments' lengths). Each
hostile call is made through the API in a fresh process that reports how long
the refusal took and how much its peak resident memory grew; the same process
also makes one unguarded call of the same kind on a plain DuckDB connection,
to show the measurement sees such an allocation. Sealed connections get
``LINEAGE_DUCKDB_MEMORY_LIMIT`` (default: half the memory), which no SQL can
lift, and still spill large operations to disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import duckdb
import pyarrow as pa
import pytest

import lineage
from lineage import BadPredicateError, LineageError, duck
from lineage.sql import allowlist, expressions
from lineage.writes import rows as write_rows

SCHEMA = pa.schema([("k", pa.int64()), ("a", pa.string()), ("x", pa.float64())])
HUGE = 2_000_000_000  # characters: 2 GB per row if it ran

# (id, expression, what the message must name)
HOSTILE = [
    ("lpad-width", f"lpad(a, {HUGE}, 'x') = ''", f"lpad() with the width {HUGE}"),
    ("lpad-column-width", "lpad(a, k * 1000000, 'x') = ''", "lpad() with a width that is not a whole-number literal"),
    ("rpad-width", f"rpad(a, {HUGE}, 'x') = ''", f"rpad() with the width {HUGE}"),
    ("rpad-decimal-width", "rpad(a, 2000000000.0, 'x') = ''", "rpad() with a width that is not a whole-number literal"),
    ("format-width", f"format('{{:>{HUGE}}}', a) = ''", f"width or precision {HUGE}"),
    ("format-precision", f"format('{{:.{HUGE}f}}', x) = ''", f"width or precision {HUGE}"),
    ("format-argument-width", f"format('{{:{{}}}}', a, {HUGE}) = ''", "takes its width or precision from an argument"),
    ("format-column-format", "format(a, k) = ''", "format() with a format string that is not a string literal"),
    ("printf-width", f"printf('%{HUGE}d', k) = ''", f"width or precision {HUGE}"),
    ("printf-zero-padded", f"printf('%0{HUGE}d', k) = ''", f"width or precision 0{HUGE}"),
    ("printf-precision", f"printf('%.{HUGE}f', x) = ''", f"width or precision {HUGE}"),
    ("printf-star", f"printf('%*d', {HUGE}, k) = ''", "takes its width or precision from an argument (*)"),
    # a view's expressions also run in Spark, whose format_string reads the format %-style (Java's flags too)
    ("format-percent-width", f"format('%{HUGE}d', k) = ''", f"width or precision {HUGE}"),
    ("printf-java-flag", f"printf('%,{HUGE}d', k) = ''", f"width or precision {HUGE}"),
    ("damerau-levenshtein", "damerau_levenshtein(a, a || a) > 0", "damerau_levenshtein() (its cost is set by an argument)"),
]

# What one hostile call of each function would allocate if it ran (on a plain, unsealed DuckDB connection).
UNGUARDED = "SELECT length(lpad('a', 300000000, 'x'))"

_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import duckdb, pyarrow as pa
    import lineage, cdf.mv

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    warehouse, cases, unguarded = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    t = lineage.open_table("shop.items", warehouse=warehouse)
    # warm up every path (imports, caches) with allowed calls of the same functions
    t.scan(where="lpad(a, 8, '0') <> format('{:>5}', a) OR printf('%05d', k) = ''")
    t.update("k = 0", {"a": "rpad(a, 6, '.')"})
    cdf.mv.create("shop.warm", t, "SELECT k, lpad(a, 8, '0') AS p FROM items")
    entry = {
        "scan": lambda text: t.scan(where=text),
        "update-set": lambda text: t.update("TRUE", {"a": f"CAST(({text}) AS VARCHAR)"}),
        "delete": lambda text: t.delete(text),
        "view": lambda text: cdf.mv.create("shop.hostile", t, f"SELECT k, ({text}) AS h FROM items"),
    }
    base = peak_mb()
    out = []
    for case_id, text in cases:
        for name, call in entry.items():
            started = time.perf_counter()
            try:
                call(text)
                error = None
            except Exception as exc:
                error = [type(exc).__name__, isinstance(exc, lineage.LineageError), str(exc)]
            out.append({"case": case_id, "entry": name, "seconds": time.perf_counter() - started, "error": error,
                        "growth_mb": peak_mb() - base})
    before = peak_mb()
    duckdb.connect().execute(unguarded).fetchone()
    print(json.dumps({"calls": out, "unguarded_growth_mb": peak_mb() - before, "version": t.refresh().version}))
    """
)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> str:
    wh = str(tmp_path_factory.mktemp("cost") / "wh")
    t = lineage.create_table("shop.items", SCHEMA, key=["k"], warehouse=wh)
    t.append(pa.table({"k": list(range(50)), "a": [f"item-{i}" for i in range(50)], "x": [i / 3 for i in range(50)]}, schema=SCHEMA))
    return wh


def test_hostile_cost_arguments_are_refused_fast_with_bounded_memory(warehouse: str):
    """Each hostile call through scan, update, delete and a view: a clear error, within a second, memory flat."""
    cases = [(case_id, text) for case_id, text, _ in HOSTILE]
    p = subprocess.run([sys.executable, "-c", _CHILD, warehouse, json.dumps(cases), UNGUARDED], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    needles = {case_id: needle for case_id, _, needle in HOSTILE}
    assert len(report["calls"]) == 4 * len(HOSTILE)
    for call in report["calls"]:
        label = f"{call['case']} through {call['entry']}"
        assert call["error"] is not None, f"{label} was not refused"
        kind, is_lineage_error, message = call["error"]
        assert is_lineage_error and kind in ("BadPredicateError", "ViewQueryError"), f"{label}: {kind}: {message}"
        assert needles[call["case"]] in message, f"{label}: the message does not name {needles[call['case']]!r}: {message}"
        assert "its cost is set by" in message, message
        assert call["seconds"] < 1.0, f"{label} took {call['seconds']:.2f} s"
        assert call["growth_mb"] < 50, f"{label}: peak memory grew by {call['growth_mb']:.0f} MB"
    # the measurement does see an allocation of this kind: one unguarded lpad of 300 MB
    assert report["unguarded_growth_mb"] > 150, report["unguarded_growth_mb"]  # peak over the earlier peak: not all of it
    assert report["version"] == 2  # the warm-up update only: nothing hostile committed


@pytest.mark.parametrize("text", [
    "lpad(a, 12, '0')", "rpad(a, 4096, '.')", "lpad(a, -1, 'x')", "format('{:>10}|{:.3f}|{{}}', a, x)", "format('{0}{0}', a)",
    "format('{:x<4096}', a)", "printf('%05d|%-8s|%.2f|100%%', k, a, x)", "printf('%1$4096s', a)", "levenshtein(a, 'item-3')",
])
def test_bounded_calls_are_allowed_and_compute_what_duckdb_computes(text: str):
    checked = expressions.check(text, SCHEMA.names)
    con = duckdb.connect()
    try:
        con.register("rows_", pa.table({"k": [1, 22], "a": ["item-1", None], "x": [0.5, 2 / 3]}, schema=SCHEMA))
        assert con.execute(f"SELECT {checked.sql} FROM rows_").fetchall() == con.execute(f"SELECT {text} FROM rows_").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("text", [f"lpad(a, {allowlist.MAX_WIDTH + 1}, '0')", f"format('{{:>{allowlist.MAX_WIDTH + 1}}}', a)",
                                  f"printf('%.{allowlist.MAX_WIDTH + 1}f', x)", "printf('%*d', 5, k)"])
def test_one_past_the_limit_is_refused(text: str):
    with pytest.raises(BadPredicateError, match="its cost is set by"):
        expressions.check(text, SCHEMA.names)


def test_refused_functions_are_not_allowed_functions():
    assert "damerau_levenshtein" in allowlist.RESOURCE and "damerau_levenshtein" not in allowlist.FUNCTIONS
    assert set(allowlist.BOUNDED) <= allowlist.FUNCTIONS


# ---------------------------------------------------------------- the memory limit of sealed connections


def _sealed_limit() -> str:
    con = duck.connect(isolated=True)
    try:
        duck.seal(con)
        return str(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])
    finally:
        con.close()


def test_sealed_connections_have_a_memory_limit_that_sql_cannot_lift(monkeypatch):
    monkeypatch.delenv(duck.ENV_MEMORY_LIMIT, raising=False)
    half = duck.available_memory() // 2 >> 20
    assert duck.memory_limit() == f"{half}MiB"
    monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, "300MiB")
    assert _sealed_limit() == "300.0 MiB"
    monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, "1.5GB")
    assert duck.memory_limit() == f"{int(1.5e9) >> 20}MiB"
    monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, "10%")
    assert duck.memory_limit() == f"{duck.available_memory() // 10 >> 20}MiB"
    con = duck.connect(isolated=True)
    try:
        duck.seal(con)
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET memory_limit = '100GB'")
    finally:
        con.close()
    for bad in ("lots", "0%", "150%", "0MB", "-1GB", "12 parsecs"):
        monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, bad)
        with pytest.raises(lineage.InvalidArgumentError, match=duck.ENV_MEMORY_LIMIT):
            duck.memory_limit()


def test_large_operations_spill_within_the_limit(monkeypatch, tmp_path):
    """A sort and a temporary table larger than the limit succeed (DuckDB spills to its temp directory)."""
    monkeypatch.chdir(tmp_path)
    spill = tmp_path / "spill here"
    monkeypatch.setenv(duck.ENV_TEMP_DIRECTORY, str(spill))
    monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, "100MiB")
    con = duck.connect(isolated=True)
    try:
        duck.seal(con)
        assert con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == str(spill)
        rows = 3_000_000
        con.execute(f"CREATE TEMP TABLE big AS SELECT i, md5(i::VARCHAR) || md5((i + 1)::VARCHAR) AS s FROM range({rows}) t(i)")
        spilled = con.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()").fetchone()[0]
        assert spilled > 50 * 2**20  # the table (about 220 MB) did not fit in the limit: part of it is on disk
        assert con.execute("SELECT count(*), min(s) < max(s) FROM (SELECT s FROM big ORDER BY s)").fetchone() == (rows, True)
        assert spill.is_dir() and not (tmp_path / ".tmp").exists()  # spilled where it was told, not into the working directory
    finally:
        con.close()


def test_the_default_spill_directory_is_under_the_system_temp_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(duck.ENV_TEMP_DIRECTORY, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its answer
    assert duck.temp_directory() == str(tmp_path / "lineage-duckdb")


def test_reaching_the_limit_is_a_clear_error(monkeypatch, warehouse: str):
    monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, "1MiB")
    t = lineage.open_table("shop.items", warehouse=warehouse)
    with pytest.raises(LineageError, match=f"memory limit of this operation \\(1MiB, set by {duck.ENV_MEMORY_LIMIT}"):
        t.scan(where="k >= 0")


def test_a_write_over_the_memory_limit_fails_with_the_limit_named_and_leaves_the_table_untouched(warehouse, monkeypatch):
    t = lineage.create_table("shop.wide", pa.schema([("id", pa.int64()), ("s", pa.string())]), key=["id"], warehouse=warehouse)
    n = write_rows.BY_POSITION_MAX_ROWS + 50_000  # kept rows of a rewrite this large are read by DuckDB, under its limit
    t.append(pa.table({"id": pa.array(range(n), pa.int64()), "s": [f"row-{i}-" + "x" * 40 for i in range(n)]}))
    before = (t.version, sorted(os.listdir(os.path.join(warehouse, "shop", "wide", "data"))))
    monkeypatch.setenv(duck.ENV_MEMORY_LIMIT, "6MiB")  # the kept rows, read by DuckDB, need more
    with pytest.raises(lineage.LineageError, match=duck.ENV_MEMORY_LIMIT):
        t.update("id % 20 = 0", {"s": "s || '!'"}, mode="copy-on-write")
    monkeypatch.delenv(duck.ENV_MEMORY_LIMIT)
    t.refresh()
    assert (t.version, sorted(os.listdir(os.path.join(warehouse, "shop", "wide", "data")))) == before
    assert t.count("s LIKE '%!'") == 0
