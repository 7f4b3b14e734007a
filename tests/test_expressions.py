"""User expressions are one scalar expression over the row, nothing more (issue 11).

A ``where`` (scan, delete, update, purge), an update's ``set`` value and the
CLI's ``--where``/``--set`` reach DuckDB only as the re-rendering of a parse
tree that passed :mod:`lineage.sql.expressions`. Checked here:

* the three calls of the report are refused and change nothing;
* a table of hostile expressions (breakouts, stacked statements, subqueries
  in every position, table functions, environment readers, comments,
  unicode look-alikes, ...) is refused with the specific error through every
  entry point, and through the CLI for a representative subset, leaving the
  table exactly as it was;
* every allow-listed function exists in DuckDB and is deterministic;
* generated valid expressions are accepted and select and compute exactly
  what DuckDB computes for the original text on the same rows;
* random text never escapes as anything but a lineage error;
* a sealed connection reads the files it was given and no other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lineage
from lineage import BadPredicateError, LineageError, UnknownColumnError, duck
from lineage.sql import allowlist, expressions
from lineage.sql.predicate import parse_predicate
from conftest import rows

SCHEMA = pa.schema([("k", pa.int64()), ("a", pa.string()), ("x", pa.float64()), ("n", pa.int64())])
N = 90
NAME = "shop.items"
SECRET = "s3cr3t-from-a-file"


def _data() -> pa.Table:
    return pa.table(
        {
            "k": list(range(N)),
            "a": [None if i % 11 == 0 else f"item-{i % 7}" for i in range(N)],
            "x": [None if i % 13 == 0 else (i - 40) / 4 for i in range(N)],
            "n": [None if i % 5 == 0 else i % 9 for i in range(N)],
        },
        schema=SCHEMA,
    )


@dataclass(frozen=True)
class Target:
    warehouse: str
    table: lineage.Table
    csv: str  # a local file a hostile expression would like to read


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Target:
    root = tmp_path_factory.mktemp("expressions")
    csv = str(root / "keys.csv")
    with open(csv, "w") as f:
        f.write("x\n1\n2\n3\n" + SECRET + "\n")
    wh = str(root / "wh")
    t = lineage.create_table(NAME, SCHEMA, key=["k"], warehouse=wh)
    t.append(_data())
    return Target(wh, t, csv)


def _files(warehouse: str) -> set[str]:
    return {os.path.relpath(os.path.join(r, n), warehouse) for r, _, names in os.walk(warehouse) for n in names if not n.startswith("catalog.db")}


def fingerprint(target: Target) -> tuple:
    t = lineage.open_table(NAME, warehouse=target.warehouse)
    return (t.iceberg.metadata_location, t.version, rows(t.scan()), _files(target.warehouse))


# ---------------------------------------------------------------- the report


def test_the_three_reported_calls_are_refused_and_change_nothing(target: Target):
    t = target.table
    before = fingerprint(target)
    assert len(before[2]) == N
    calls = {
        "breakout": (lambda: t.delete("k = 1) OR (TRUE"), "syntax error"),
        "file read in where": (lambda: t.delete(f"k IN (SELECT x FROM read_csv('{target.csv}'))"), "subquery"),
        "file read in set": (lambda: t.update("k = 1", {"a": f"(SELECT x FROM read_csv('{target.csv}'))"}), "subquery"),
    }
    for label, (call, needle) in calls.items():
        with pytest.raises(BadPredicateError) as info:
            call()
        assert needle in str(info.value), (label, str(info.value))
    assert fingerprint(target) == before
    assert SECRET not in str(t.scan().to_pylist())


# ---------------------------------------------------------------- hostile expressions

F = "/etc/hostname"  # any local file; the CSV of the fixture in the CLI cases


@dataclass(frozen=True)
class Hostile:
    id: str
    text: str
    needle: str  # a substring the message must contain (what was refused)
    error: type[LineageError] = BadPredicateError


HOSTILE = [
    # breaking out of the parentheses around the predicate
    Hostile("paren-breakout", "k = 1) OR (TRUE", "syntax error"),
    Hostile("double-paren-breakout", "k = 1)) OR ((TRUE", "syntax error"),
    Hostile("breakout-then-comment", "TRUE) --", "syntax error"),
    Hostile("unbalanced-open", "(k = 1", "syntax error"),
    Hostile("unbalanced-close", "k = 1)", "syntax error"),
    Hostile("trailing-where", "k = 1 WHERE TRUE", "not a single expression"),
    Hostile("trailing-from-file", f"k = 1 FROM read_csv('{F}')", "not a single expression"),
    Hostile("union", "k = 1 UNION SELECT TRUE", "not a single expression"),
    Hostile("second-item", "k = 1, TRUE", "not a single expression"),
    Hostile("distinct-prefix", "DISTINCT k = 1", "not a single expression"),
    # stacked statements
    Hostile("stacked-delete", "k = 1; DELETE FROM live", "another statement"),
    Hostile("stacked-select", "k = 1; SELECT 1", "2 statements"),
    Hostile("stacked-copy", f"TRUE; COPY live TO '{F}.out'", "another statement"),
    Hostile("stacked-attach", "TRUE; ATTACH 'other.db'", "another statement"),
    # subqueries, alone and nested
    Hostile("in-subquery-file", f"k IN (SELECT x FROM read_csv('{F}'))", "subquery"),
    Hostile("exists", "EXISTS (SELECT 1)", "subquery"),
    Hostile("any-subquery", "k = ANY(SELECT 1)", "subquery"),
    Hostile("scalar-subquery-self", "k = (SELECT max(k) FROM live)", "subquery"),
    Hostile("subquery-in-case-then", "CASE WHEN k = 1 THEN (SELECT TRUE) ELSE FALSE END", "subquery"),
    Hostile("subquery-in-case-when", "CASE WHEN k IN (SELECT 1) THEN TRUE END", "subquery"),
    Hostile("subquery-in-coalesce", "coalesce((SELECT TRUE FROM glob('/*')), FALSE)", "subquery"),
    Hostile("subquery-in-cast", "CAST((SELECT 1) AS BOOLEAN)", "subquery"),
    # table functions in every position
    Hostile("read-csv-bare", f"read_csv('{F}') IS NOT NULL", "table function read_csv()"),
    Hostile("read-text-in-function", f"length(read_text('{F}')) > 0", "table function read_text()"),
    Hostile("read-parquet-in-case", f"CASE WHEN TRUE THEN read_parquet('{F}') END IS NULL", "table function read_parquet()"),
    Hostile("glob-in-cast", "CAST(glob('/*') AS VARCHAR) = ''", "table function glob()"),
    Hostile("query-in-in-list", "k IN (query('SELECT 1'))", "table function query()"),
    Hostile("read-blob-in-between", f"k BETWEEN 0 AND read_blob('{F}')", "table function read_blob()"),
    Hostile("schema-qualified-reader", f"main.read_csv('{F}') IS NULL", "table function read_csv()"),
    Hostile("catalog-qualified-function", "system.main.lower(a) = 'x'", "qualified function name"),
    # the environment, settings, time and chance
    Hostile("getenv", "getenv('HOME') IS NOT NULL", "getenv()"),
    Hostile("current-setting", "current_setting('home_directory') = ''", "current_setting()"),
    Hostile("version", "a = version()", "version()"),
    Hostile("current-user-keyword", "a = current_user", "current_user()"),
    Hostile("random", "random() < 2", "non-deterministic function random()"),
    Hostile("now", "now() > TIMESTAMP '2000-01-01'", "non-deterministic function now()"),
    Hostile("current-date-keyword", "current_date > DATE '2000-01-01'", "non-deterministic function current_date()"),
    Hostile("nextval", "nextval('s') > 0", "nextval()"),
    # aggregates, windows, lambdas, parameters, stars, names that are not columns
    Hostile("aggregate", "sum(k) > 0", "aggregate function sum()"),
    Hostile("aggregate-filter", "count(*) FILTER (WHERE TRUE) > 0", "aggregate clause"),
    Hostile("window", "row_number() OVER () > 0", "window function"),
    Hostile("lambda", "list_transform([k], x -> x + 1) = [2]", "list_transform()"),
    Hostile("parameter", "k = $1", "parameter"),
    Hostile("question-parameter", "k = ?", "parameter"),
    Hostile("positional", "#1 = 1", "positional reference"),
    Hostile("star", "*", "star expression"),
    Hostile("alias", "k = 1 AS x", "alias"),
    Hostile("qualified-column", "live.k = 1", "qualified name live.k"),
    Hostile("hidden-view-column", "__file_id = 0", "__file_id", UnknownColumnError),
    Hostile("repeat", "repeat('x', 1000000000) = a", "repeat()"),
    # comments
    Hostile("line-comment", "k = 1 -- ) OR (TRUE", "comment"),
    Hostile("block-comment", "k = 1 /* ) OR (TRUE */", "comment"),
    Hostile("leading-comment", "/* hi */ TRUE", "comment"),
    Hostile("comment-after-backslash", "a = 'x\\' OR TRUE --'", "comment"),
    # unicode look-alikes and invisible characters
    Hostile("fullwidth-parens", "k = 1\uff09OR\uff08TRUE", "alias"),
    Hostile("fullwidth-parens-spaced", "k = 1\uff09 OR \uff08TRUE", "syntax error"),
    Hostile("greek-question-mark", "k = 1\u037e DELETE FROM live", "syntax error"),
    Hostile("fullwidth-function", "\uff52\uff45\uff41\uff44_csv('x') IS NULL", "DuckDB does not know"),
    Hostile("cyrillic-true", "k = 1 OR \u0422RUE", "\u0422RUE", UnknownColumnError),
    Hostile("zero-width-space", "k = 1\u200b) OR (TRUE", "syntax error"),
    Hostile("nul-truncation", "k = 1\x00) OR (TRUE", "NUL"),
]


def test_hostile_list_is_large_and_unique():
    assert len(HOSTILE) >= 30
    assert len({h.id for h in HOSTILE}) == len(HOSTILE)


def _entry_points(t: lineage.Table, text: str) -> dict[str, object]:
    return {
        "scan": lambda: t.scan(where=text),
        "delete": lambda: t.delete(text),
        "update-where": lambda: t.update(text, {"a": "'changed'"}),
        "update-set": lambda: t.update("TRUE", {"a": text}),
        "purge": lambda: t.purge(text),
    }


@pytest.mark.parametrize("case", HOSTILE, ids=[h.id for h in HOSTILE])
def test_hostile_expression_is_refused_everywhere_and_changes_nothing(target: Target, case: Hostile):
    before = fingerprint(target)
    for entry, call in _entry_points(target.table, case.text).items():
        with pytest.raises(LineageError) as info:
            call()  # type: ignore[operator]
        assert isinstance(info.value, case.error), f"{entry}: expected {case.error.__name__}, got {type(info.value).__name__}: {info.value}"
        assert case.needle in str(info.value), f"{entry}: message does not name {case.needle!r}: {info.value}"
    assert fingerprint(target) == before


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LINEAGE_WAREHOUSE", "LINEAGE_PROGRESS")}
    return subprocess.run([sys.executable, "-m", "lineage.cli", *args], capture_output=True, text=True, env=env, input="", timeout=300)


CLI_CASES = ["paren-breakout", "in-subquery-file", "subquery-in-case-then", "glob-in-cast", "getenv", "line-comment", "stacked-delete",
             "fullwidth-parens"]


def test_hostile_expressions_through_the_cli(target: Target):
    """--where of scan/delete/update/purge and --set, as an operator would type them (``--debug`` shows the error class)."""
    w = ("--debug", "--warehouse", target.warehouse)
    by_id = {h.id: h for h in HOSTILE}
    commands = []
    for i, case_id in enumerate(CLI_CASES):
        text = by_id[case_id].text.replace(F, target.csv)
        commands.append((case_id, [
            (*w, "delete", NAME, "--where", text),
            (*w, "scan", NAME, "--where", text),
            (*w, "update", NAME, "--where", "k = 1", "--set", f"a={text}"),
            (*w, "purge", NAME, "--yes", "--where", text),
        ][i % 4]))
    before = fingerprint(target)
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _cli(*c[1]), commands))
    for (case_id, args), p in zip(commands, results, strict=True):
        case = by_id[case_id]
        assert p.returncode == 2, f"{case_id} {args[3]}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        assert case.error.__name__ in p.stderr, f"{case_id}: {p.stderr}"
        assert case.needle in p.stderr, f"{case_id}: the message does not name {case.needle!r}: {p.stderr}"
        assert SECRET not in p.stdout + p.stderr
    assert fingerprint(target) == before


# ---------------------------------------------------------------- the allow-list


def test_every_allowed_function_is_a_deterministic_duckdb_scalar():
    con = duckdb.connect()
    try:
        found = {}
        for name, kind, stability in con.execute("SELECT function_name, function_type, stability FROM duckdb_functions()").fetchall():
            found.setdefault(name, set()).add((kind, stability))
    finally:
        con.close()
    for name in sorted(allowlist.FUNCTIONS | allowlist.OPERATORS):
        assert name in found, f"{name} is not a DuckDB function"
        for kind, stability in found[name]:
            assert kind in ("scalar", "macro"), (name, kind)
            assert stability in ("CONSISTENT", None), (name, stability)  # macros have no stability: read each one when adding it
    refused = allowlist.ENVIRONMENT | allowlist.NONDETERMINISTIC | allowlist.RESOURCE | allowlist.TABLE_FUNCTIONS
    assert not (allowlist.FUNCTIONS & refused)
    volatile = {n for n, v in found.items() if any(s in ("VOLATILE", "CONSISTENT_WITHIN_QUERY") for _, s in v)}
    assert not (volatile & allowlist.FUNCTIONS)


def test_the_rendered_text_is_checked_as_it_runs():
    """A string that looks like a breakout stays a string; pyiceberg expressions pass the same check."""
    from pyiceberg.expressions import And, EqualTo, In

    cols = SCHEMA.names
    c = expressions.check("a = E'\\x27) OR (TRUE'", cols)
    assert c.sql.startswith("(") and c.columns == ("a",)
    assert expressions.check(c.sql, cols).sql == c.sql  # checked text is a fixed point
    assert expressions.check('"K" = 1', cols).sql == "((k = 1))"  # bound to the real column
    assert expressions.check("a", cols).sql == '"a"'
    assert parse_predicate(And(EqualTo("k", 1), In("a", ["x", "y"])), SCHEMA).sql.startswith("(")
    with pytest.raises(UnknownColumnError):
        parse_predicate(EqualTo("nope", 1), SCHEMA)


# ---------------------------------------------------------------- valid expressions keep their meaning

NUM_COLS = ["k", "x", "n"]


def _num_literal() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-50, 50).map(str),
        st.sampled_from(["1.5", "-0.25", "2e1", "1e-3", "2.5E0", "0", "NULL::BIGINT"]),
    )


def _str_literal() -> st.SearchStrategy[str]:
    return st.sampled_from(["'item-1'", "'item-3'", "'x'", "''", "'it''s'", "'é'"])


def _num(depth: int = 2) -> st.SearchStrategy[str]:
    base = st.one_of(st.sampled_from(NUM_COLS), _num_literal())
    if depth == 0:
        return base
    sub = _num(depth - 1)
    return st.one_of(
        base,
        st.tuples(sub, st.sampled_from(["+", "-", "*", "/", "%"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        sub.map(lambda s: f"abs({s})"),
        st.tuples(sub, sub).map(lambda t: f"coalesce({t[0]}, {t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"greatest({t[0]}, {t[1]})"),
        sub.map(lambda s: f"round(CAST({s} AS DOUBLE), 1)"),
        sub.map(lambda s: f"TRY_CAST({s} AS INTEGER)"),
        _str(depth - 1).map(lambda s: f"length({s})"),
        st.tuples(_bool(depth - 1), sub, sub).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
    )


def _str(depth: int = 2) -> st.SearchStrategy[str]:
    base = st.one_of(st.just("a"), _str_literal())
    if depth == 0:
        return base
    sub = _str(depth - 1)
    return st.one_of(
        base,
        sub.map(lambda s: f"upper({s})"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]} || {t[1]})"),
        sub.map(lambda s: f"substr({s}, 2, 3)"),
        sub.map(lambda s: f"replace({s}, 'item', 'I')"),
        _num(depth - 1).map(lambda s: f"CAST({s} AS VARCHAR)"),
        st.tuples(sub, sub).map(lambda t: f"nullif({t[0]}, {t[1]})"),
    )


def _bool(depth: int = 2) -> st.SearchStrategy[str]:
    num, text = _num(max(depth - 1, 0)), _str(max(depth - 1, 0))
    atoms = st.one_of(
        st.tuples(num, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), num).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(text, st.sampled_from(["=", "<>", "<"]), text).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(num, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(lambda t: f"{t[0]} {t[1]}"),
        st.tuples(num, num, num).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(num, st.lists(st.integers(-5, 50), min_size=1, max_size=4)).map(lambda t: f"{t[0]} NOT IN ({', '.join(map(str, t[1]))})"),
        st.tuples(text, st.sampled_from(["LIKE 'item-%'", "ILIKE 'ITEM-_'", "NOT LIKE '%3'", "SIMILAR TO 'item-[12]'"])).map(" ".join),
        st.tuples(num, num).map(lambda t: f"{t[0]} IS DISTINCT FROM {t[1]}"),
        text.map(lambda s: f"starts_with({s}, 'item')"),
        st.sampled_from(["TRUE", "FALSE", "NULL", "(x > 0) IS TRUE", "(n = 1) IS NOT FALSE", "x::INTEGER % 2 = 0"]),
    )
    if depth == 0:
        return atoms
    sub = _bool(depth - 1)
    return st.one_of(
        atoms,
        st.tuples(sub, st.sampled_from(["AND", "OR"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        sub.map(lambda s: f"NOT ({s})"),
        st.tuples(sub, sub, sub).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
    )


def _evaluate(con: duckdb.DuckDBPyConnection, sql: str) -> list | str:
    try:
        return [repr(v) for v in con.execute(f"SELECT k, {sql} FROM rows_ ORDER BY k").fetchall()]
    except duckdb.Error as exc:
        return f"error: {type(exc).__name__}"


@pytest.fixture(scope="module")
def reference() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register("rows_", _data())
    yield con
    con.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(expr=st.one_of(_bool(2), _num(2), _str(2)))
def test_valid_expressions_are_accepted_and_compute_the_same_values(reference: duckdb.DuckDBPyConnection, expr: str):
    checked = expressions.check(expr, SCHEMA.names)
    assert _evaluate(reference, checked.sql) == _evaluate(reference, f"({expr})"), (expr, checked.sql)
    assert expressions.check(checked.sql, SCHEMA.names).columns == checked.columns  # the rendering passes the same check


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(expr=_bool(2))
def test_valid_predicates_select_the_same_rows_through_the_api(target: Target, reference: duckdb.DuckDBPyConnection, expr: str):
    try:
        expected = sorted(r[0] for r in reference.execute(f"SELECT k FROM rows_ WHERE ({expr})").fetchall())
    except duckdb.Error:
        with pytest.raises(LineageError):
            target.table.scan(where=expr, columns=["k"])
        return
    assert sorted(target.table.scan(where=expr, columns=["k"]).column("k").to_pylist()) == expected, expr


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.sampled_from(list("ka x1();'\"-*/=<>|,.$?#%\\\n\uff08\u200b") + [" OR ", " IN ", " NOT ", "TRUE", "SELECT ",
                                                                                       " FROM ", "lower", "read_csv", "--", "/*", "*/", "E'"]),
                      max_size=25))
def test_any_text_is_accepted_or_refused_with_a_lineage_error(pieces: list[str]):
    text = "".join(pieces)
    try:
        checked = expressions.check(text, SCHEMA.names)
    except LineageError:
        return
    again = expressions.check(checked.sql, SCHEMA.names)  # what runs passes the same check
    assert again.columns == checked.columns


# ---------------------------------------------------------------- defence in depth


def test_a_sealed_connection_reads_only_its_files(target: Target, tmp_path):
    t = target.table
    with pytest.raises(LineageError, match="isolated"):
        duck.seal(duck.connect())  # sealing the shared database would lock every other connection out
    con = duck.connect(isolated=True)
    try:
        from lineage.read.scan import register_live_view

        paths = register_live_view(con, "live", t.state().live_files(), t.arrow_schema)
        duck.seal(con, paths)
        assert con.execute("SELECT count(*) FROM live").fetchone()[0] == N
        for sql in (f"SELECT * FROM read_csv('{target.csv}')", f"SELECT * FROM glob('{tmp_path}/*')", f"COPY (SELECT 1) TO '{tmp_path}/o.csv'"):
            with pytest.raises(duckdb.PermissionException):
                con.execute(sql)
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.PermissionException):  # its database allows unsigned extensions: it loads none once sealed
            con.execute(f"LOAD '{duck.extension_path('avro')}'")
    finally:
        con.close()
    assert not os.path.exists(tmp_path / "o.csv")
    shared = duck.connect()  # the sealed database was its own: the shared one still reads files
    try:
        assert shared.execute(f"SELECT count(*) FROM read_csv('{target.csv}')").fetchone()[0] >= 0
    finally:
        shared.close()


def test_a_sealed_database_is_reused_only_by_the_same_seal_and_shows_nothing_of_its_last_caller(target: Target, monkeypatch):
    """duck.sealed lends a cached database to one caller at a time; each caller's connection starts empty, sealed to
    the same files, with the settings of the seal; another set of files or exact_floats gets another database."""
    from lineage.read.scan import file_paths, register_live_view

    import collections

    monkeypatch.setattr(duck, "_SEALED", collections.OrderedDict())  # none kept by earlier tests
    t = target.table
    files = t.state().live_files()
    paths = file_paths(files)
    with duck.sealed(paths) as con:
        register_live_view(con, "live", files, t.arrow_schema)
        con.register("secret_rows", pa.table({"x": [SECRET]}))
        con.execute("CREATE TEMP TABLE kept AS SELECT 1 AS one")
        assert con.execute("SELECT count(*) FROM live").fetchone()[0] == N
    kept = {key[0]: db for key, db in duck._SEALED.items()}
    assert tuple(sorted(set(paths))) in kept  # given back
    with duck.sealed(paths) as again:
        assert tuple(sorted(set(paths))) not in {key[0] for key in duck._SEALED}  # lent again: the same database
        names = {r[0] for r in again.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert not names & {"live", "secret_rows", "kept"}, names
        assert again.execute("SELECT current_setting('asof_loop_join_threshold')").fetchone()[0] == 0
        assert again.execute("SELECT current_setting('disabled_optimizers')").fetchone()[0] == ""
        with pytest.raises(duckdb.PermissionException):
            again.execute(f"SELECT * FROM read_csv('{target.csv}')")
        with pytest.raises(duckdb.Error, match="locked"):
            again.execute("SET enable_external_access = true")
        register_live_view(again, "live", files, t.arrow_schema)  # its files are still allowed
        assert again.execute("SELECT count(*) FROM live").fetchone()[0] == N
        with duck.sealed(paths) as rival:  # the same seal while the first is lent: a database of its own
            rival.execute("CREATE TEMP TABLE mine AS SELECT 1 AS one")
            assert "mine" not in {r[0] for r in again.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    with duck.sealed(paths, exact_floats=True) as exact:
        assert exact.execute("SELECT current_setting('disabled_optimizers')").fetchone()[0] == "filter_pushdown,statistics_propagation"
    with duck.sealed([]) as other:  # another seal: the table's files are refused
        with pytest.raises(duckdb.PermissionException):
            other.execute(f"SELECT count(*) FROM read_parquet('{paths[0]}')")
    assert len(duck._SEALED) <= duck.SEALED_IDLE
    with pytest.raises(RuntimeError), duck.sealed(paths):
        db_count = len(duck._SEALED)
        raise RuntimeError("the caller failed")
    assert len(duck._SEALED) == db_count  # a database whose caller raised is closed, not given back


def test_an_extension_is_loaded_only_after_duckdb_checked_its_signature_and_again_once_changed(tmp_path, monkeypatch):
    """Isolated databases skip DuckDB's signature check of an extension file it checked before in this process;
    a file changed since, or never checked, is checked again and a bad one refused, in a new database each time."""
    import shutil

    copy = str(tmp_path / "avro.duckdb_extension")
    shutil.copyfile(duck.extension_path("avro"), copy)
    real = duck.extension_path  # other extensions (httpfs, once a test of this process registered a bucket) as they are
    monkeypatch.setattr(duck, "extension_path", lambda name: copy if name == "avro" else real(name))
    monkeypatch.setattr(duck, "_VERIFIED", {})
    for _ in range(2):  # checked by the first, trusted unchanged by the second
        con = duck.connect("avro", isolated=True)
        con.close()
    assert copy in duck._VERIFIED
    with open(copy, "r+b") as f:  # one byte of the code changed: the signature no longer matches
        f.seek(os.path.getsize(copy) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    for _ in range(2):
        with pytest.raises(duckdb.Error, match="signature"):
            duck.connect("avro", isolated=True)
    shared = duck.connect()  # a cursor of a database that allows unsigned extensions: checked all the same
    try:
        with pytest.raises(duckdb.Error, match="signature"):
            duck.load_extension(shared, "avro")
    finally:
        shared.close()
    assert duck._VERIFIED[copy] != duck._fingerprint(copy)


# ---------------------------------------------------------------- materialized views

MV_HOSTILE = {
    "getenv-item": ("SELECT k, getenv('HOME') AS h FROM items", "getenv()"),
    "current-setting-item": ("SELECT k, current_setting('threads') AS h FROM items", "current_setting()"),
    "read-text-item": (f"SELECT k, read_text('{F}') AS x FROM items", "table function read_text()"),
    "query-item": ("SELECT k, query('SELECT 1') AS x FROM items", "table function query()"),
    "version-where": ("SELECT k FROM items i WHERE i.k > 0 AND version() = 'x'", "version()"),
    "random-aggregate-arg": ("SELECT a, SUM(k * random()) AS s FROM items GROUP BY a", "non-deterministic"),
    "read-csv-from": (f"SELECT * FROM read_csv('{F}')", "plain table"),
    "file-as-table": (f"SELECT * FROM '{F}'", "source table"),
    "other-table": ("SELECT * FROM other", "source table"),
    "comma-join-reader": (f"SELECT k FROM items, read_csv('{F}')", "joins"),
    "subquery-where": (f"SELECT k FROM items WHERE k IN (SELECT column0 FROM read_csv('{F}'))", "subqueries"),
    "subquery-in-case": ("SELECT k, CASE WHEN k > 0 THEN (SELECT count(*) FROM glob('/*')) END AS x FROM items", "subqueries"),
    "subquery-in-aggregate": ("SELECT a, SUM((SELECT 1)) AS s FROM items GROUP BY a", "subqueries"),
    "lineage-column": ("SELECT k, _row_id AS r FROM items", "lineage columns"),
}


@pytest.mark.parametrize("case", sorted(MV_HOSTILE))
def test_hostile_view_queries_are_refused_at_create(target: Target, case: str):
    import cdf.mv

    query, needle = MV_HOSTILE[case]
    with pytest.raises(cdf.mv.ViewQueryError) as info:
        cdf.mv.create("shop.hostile_view", target.table, query)
    assert needle in str(info.value), str(info.value)
    with pytest.raises(cdf.mv.ViewNotFoundError):
        cdf.mv.open_view("shop.hostile_view", catalog=target.table.catalog)


def test_a_tampered_view_definition_is_checked_when_opened(tmp_path):
    """Stored fragments are pasted into refresh SQL: each is checked again when the view is opened."""
    import json

    import cdf.mv
    from cdf.mv.view import PROP_DEFINITION

    wh = str(tmp_path / "wh")
    src = lineage.create_table("shop.src", SCHEMA, key=["k"], warehouse=wh)
    src.append(_data())
    view = cdf.mv.create("shop.v", src, "SELECT a, SUM(x) AS total FROM src WHERE k > 3 GROUP BY a")
    view.refresh()
    stored = json.loads(view.table.properties[PROP_DEFINITION])
    assert cdf.mv.open_view("shop.v", warehouse=wh).definition.spark_ok

    def tamper(change: Callable[[dict], None]) -> None:
        obj = json.loads(json.dumps(stored))
        change(obj)
        with view.table.iceberg.transaction() as tx:
            tx.set_properties({PROP_DEFINITION: json.dumps(obj)})

    def set_where(o: dict) -> None:
        o["where"]["duckdb"] = f"k IN (SELECT x FROM read_csv('{F}'))"

    def set_type(o: dict) -> None:
        o["types"]["total"] = "DOUBLE) AS total, (SELECT 1"

    def set_spark(o: dict) -> None:
        o["where"]["spark"] = "reflect('java.lang.System', 'getenv', 'HOME') IS NOT NULL"

    for change, needle in ((set_where, "subquery"), (set_type, "stored type of view column")):
        tamper(change)
        with pytest.raises(cdf.mv.ViewQueryError, match=needle):
            cdf.mv.open_view("shop.v", warehouse=wh)
    tamper(set_spark)
    opened = cdf.mv.open_view("shop.v", warehouse=wh)
    assert not opened.definition.spark_ok and "reflect()" in (opened.definition.spark_problem or "")
    with pytest.raises(cdf.mv.ViewQueryError, match="cannot be refreshed with Spark"):
        opened.refresh(engine="spark", spark=object())
    tamper(lambda o: None)
    assert cdf.mv.open_view("shop.v", warehouse=wh).refresh(full=True).status == "rebuilt"  # the untouched definition still works
