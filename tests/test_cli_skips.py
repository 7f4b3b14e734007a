"""Nothing is skipped in silence: ``lineage tables``, ``mv list`` and ``mv refresh --all`` over a catalog with problems.

A table the catalog cannot load, a namespace whose tables or sub-namespaces
cannot be listed, a view whose stored definition is refused: each is named on
stderr with the reason, on one ``lineage: error:`` line (also with --quiet),
the rest of the work is done, and the exit code is 1. What is left out for a
benign reason (an Iceberg table without lineage, a view with nothing to
refresh) is not an error: exit code 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

import cdf.mv
import lineage
from lineage.catalog import CATALOG_FILE, default_catalog
from test_cli import SCHEMA, fails, ok, run, run_many

TESTS = str(Path(__file__).parent)


def _build(wh: str, broken: bool) -> str:
    """shop.orders with two views, locked.t, shop.plain (an Iceberg table without lineage) and, if ``broken``,
    shop.broken: a lineage table whose metadata file is gone."""
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=wh)
    t.append(pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "ann"], "amount": [10.0, 20.0, 30.0]}))
    cdf.mv.create("shop.totals", t, "SELECT name, SUM(amount) AS total FROM orders GROUP BY name").refresh()
    cdf.mv.create("shop.names", t, "SELECT id, upper(name) AS up FROM orders").refresh()
    lineage.create_table("locked.t", SCHEMA, key=["id"], warehouse=wh)
    default_catalog(wh).create_table("shop.plain", pa.schema([("x", pa.int64())]))
    if broken:
        gone = lineage.create_table("shop.broken", SCHEMA, key=["id"], warehouse=wh)
        os.remove(gone.iceberg.metadata_location.removeprefix("file://"))
    return wh


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> str:
    return _build(str(tmp_path_factory.mktemp("healthy") / "wh"), broken=False)


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> str:
    """Read only: the tests that change a warehouse build their own."""
    return _build(str(tmp_path_factory.mktemp("broken") / "wh"), broken=True)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lineage: error:")]


def test_a_healthy_catalog_lists_everything_and_exits_0(healthy: str):
    w = ("--warehouse", healthy)
    tables, views, refreshed = run_many((*w, "-f", "json", "tables"), (*w, "-f", "json", "mv", "list"), (*w, "mv", "refresh", "--all"))
    assert [r["table"] for r in json.loads(ok(tables).stdout)] == ["locked.t", "shop.names", "shop.orders", "shop.totals"]
    assert "shop.plain" in tables.stderr and "without lineage" in tables.stderr and not _errors(tables.stderr)
    assert [v["view"] for v in json.loads(ok(views).stdout)] == ["shop.names", "shop.totals"] and not _errors(views.stderr)
    assert "shop.names: up-to-date" in ok(refreshed).stdout and "shop.totals: up-to-date" in refreshed.stdout  # benign: exit 0
    assert not _errors(refreshed.stderr)
    quiet = ok(run(*w, "--quiet", "tables"))
    assert quiet.stderr == ""  # the note about shop.plain is not an error


def test_a_table_that_cannot_be_loaded_is_named_and_exits_1(broken: str):
    w = ("--warehouse", broken)
    tables, quiet, views, refreshed = run_many(
        (*w, "-f", "json", "tables"), (*w, "--quiet", "tables"), (*w, "mv", "list"), (*w, "mv", "refresh", "--all"),
    )
    for p in (tables, quiet, views, refreshed):
        assert p.returncode == 1, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        assert "Traceback" not in p.stderr
        errors = _errors(p.stderr)
        assert len(errors) == 1 and errors[0].startswith("lineage: error: table shop.broken: skipped: it could not be loaded ("), p.stderr
        assert "FileNotFoundError" in errors[0] or "No such file" in errors[0], errors[0]
    assert [r["table"] for r in json.loads(tables.stdout)] == ["locked.t", "shop.names", "shop.orders", "shop.totals"]  # the rest
    assert "shop.totals" in quiet.stdout and "without lineage" not in quiet.stderr  # --quiet drops notes, not errors
    assert "shop.names" in views.stdout and "shop.totals" in views.stdout
    assert "shop.names: up-to-date" in refreshed.stdout and "shop.totals: up-to-date" in refreshed.stdout


def test_a_namespace_that_cannot_be_listed_is_named_and_exits_1(broken: str):
    faulty = ("--catalog", "py-catalog-impl=catalog_faults.ListingFaultCatalog", "--catalog", f"uri=sqlite:///{Path(broken) / CATALOG_FILE}",
              "--catalog", f"warehouse={broken}")
    env = {"PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    tables, subs, one, missing = run_many(
        (*faulty, "--catalog", "fail-list-tables=locked", "tables"),
        (*faulty, "--catalog", "fail-list-namespaces=shop", "mv", "refresh", "--all"),
        (*faulty, "--catalog", "fail-list-tables=locked", "tables", "--namespace", "locked"),
        (*faulty, "tables", "--namespace", "nope"),
        env=env,
    )
    assert tables.returncode == 1, tables.stderr
    assert "lineage: error: namespace locked: skipped: its tables could not be listed (OperationalError" in tables.stderr
    assert "lineage: error: table shop.broken: skipped" in tables.stderr and "shop.orders" in tables.stdout
    assert "locked.t" not in tables.stdout
    assert subs.returncode == 1, subs.stderr
    assert "lineage: error: namespace shop: skipped: its sub-namespaces could not be listed (OperationalError" in subs.stderr
    assert "shop.totals: up-to-date" in subs.stdout  # the namespace's own tables are still listed
    fails(one, 1, "the tables of namespace locked could not be listed", "OperationalError")
    fails(missing, 1, "namespace nope does not exist in this catalog")


def test_a_view_whose_definition_is_refused_fails_alone(tmp_path):
    broken = _build(str(tmp_path / "wh"), broken=True)
    view = lineage.open_table("shop.names", warehouse=broken)
    definition = json.loads(view.properties["mv.definition"])
    definition["columns"][1]["kind"] = "max(1)) --"
    with view.iceberg.transaction() as tx:
        tx.set_properties({"mv.definition": json.dumps(definition)})
    w = ("--warehouse", broken)
    lineage.open_table("shop.orders", warehouse=broken).update("id = 1", {"amount": "amount + 1"})
    refreshed, listed, single = run_many((*w, "mv", "refresh", "--all"), (*w, "mv", "list"), (*w, "mv", "refresh", "shop.names"))
    assert refreshed.returncode == 1 and "Traceback" not in refreshed.stderr
    assert "shop.totals: refreshed (source 1 -> 2" in refreshed.stdout  # the other view is refreshed
    assert "shop.names: failed: view shop.names: the stored definition" in refreshed.stdout
    errors = _errors(refreshed.stderr)
    assert any(e.startswith("lineage: error: refreshing shop.names failed: view shop.names: the stored definition") and
               "columns[1].kind is 'max(1)) --'" in e for e in errors), refreshed.stderr
    assert any("table shop.broken: skipped" in e for e in errors)
    assert listed.returncode == 1 and "shop.names" in listed.stdout and "shop.totals" in listed.stdout
    assert any(e.startswith("lineage: error: view shop.names: listed without the version it reflects: view shop.names: the stored")
               for e in _errors(listed.stderr)), listed.stderr
    fails(single, 2, "view shop.names: the stored definition", "columns[1].kind")
