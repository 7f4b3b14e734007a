"""Faults at the catalog boundary, for every commit path (issue 17).

The table is opened through :class:`catalog_faults.FaultyCatalog`, a
pyiceberg catalog wrapper around the embedded SQLite catalog whose
``commit_table`` and ``load_table`` raise ``OperationalError`` (a lost
database connection) on a schedule. Every commit path (writes, maintenance,
snapshot expiry, purge, re-home, materialized-view refresh and its idle
checkpoint) meets every fault:

=============================  ==================================================  ==========================
fault                          what the catalog does                               the caller sees
=============================  ==================================================  ==========================
refused                        the commit raises before landing, once               success (retried)
lost-reply                     the commit lands, its reply is lost                 success (found by its id)
lands-then-refresh-fails       the commit lands, the next read raises once         success
lost-reply-then-refresh-fails  lost reply, and the read-back raises once           success (read-back retried)
late-landing                   the commit raises, then lands late (just before     success (the late one is
                               the retry's commit reaches the catalog)             found; the retry loses)
refused-repeatedly             every commit raises before landing                  CatalogFailedError
lost-reply-catalog-down        lost reply, then every read raises                  CommitStateUnknownError
=============================  ==================================================  ==========================

After each: the table (and view) open through the plain embedded catalog, hold
exactly the state of the same operation run without faults (or the state
before it, when nothing landed), ``verify`` is clean, every file the table
references exists, files of attempts known to be lost are gone, and a retry
by a caller that follows the README (retry after ``CatalogFailedError``;
after ``CommitStateUnknownError`` check ``has_commit`` first, or just re-run
a maintenance operation or refresh) leaves the same state: nothing applied twice.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

import cdf
import cdf.mv
import lineage
import lineage.outcome
from catalog_faults import AFTER, BEFORE, LATE, Fault, FaultyCatalog
from lineage.catalog import default_catalog
from lineage.storage.fileio import local_path
from lineage.maintenance import referenced_files, verify
from lineage.outcome import find_commit

NAME, VIEW = "shop.orders", "shop.totals"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
PROPS = {"commit.retry.num-retries": "2"}  # "refused-repeatedly" gives up after 3 attempts


def _batch(ids: range | list[int], name: str = "a", amount: float = 1.0) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"{name}{i % 3}" for i in ids], "amount": [amount + i for i in ids]}, schema=SCHEMA)


def _base(wh: str) -> lineage.Table:
    """30 rows in one file, 12 of them deleted by two merge-on-read deletes (two delete files: merging them is turned
    off for these two commits only, so the paths under test merge deletes, and rewrite_deletes has two to merge)."""
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=wh, properties={**PROPS, "lineage.write.delete.merge": "false"})
    t.append(_batch(range(30)))
    t.delete("id % 3 = 0")
    t.delete("id % 5 = 0")
    with t.iceberg.transaction() as tx:
        tx.remove_properties("lineage.write.delete.merge")
    return t.refresh()


def _with_view(query: str, prime: Callable[[lineage.Table], Any]) -> Callable[[str], None]:
    def build(wh: str) -> None:
        t = _base(wh)
        view = cdf.mv.create(VIEW, t, query)
        with view.table.iceberg.transaction() as tx:
            tx.set_properties(PROPS)
        view.refresh()
        prime(t)

    return build


def _compacted(wh: str) -> None:
    t = _base(wh)
    t.compact(target_file_size_bytes=1 << 30)
    t.expire_snapshots(retain_last=1)  # the old file is in no snapshot now, only pinned by the index: re-home can copy out


def _small_files(wh: str) -> None:
    """18 one-row files (one append, a tiny target file size), the row of one deleted: an upsert of two keys folds
    untouched small files' rows into the data files of its new images and insert (v2: the faulty catalog wraps
    pyiceberg's, which commits no v3 metadata)."""
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=wh,
                             properties={**PROPS, "lineage.write.fold.min-files": "2", "write.target-file-size-bytes": "64"})
    t.append(_batch(range(18)))
    t.delete("id = 7")


def _folding_upsert(t: lineage.Table, cat: Any) -> lineage.CommitInfo:
    info = t.upsert(_batch([1, 2, 40], "f", 7.0))
    assert info.data_files_removed >= 3, info  # the small files it folds leave
    return info


def _view(cat: Any) -> cdf.mv.MaterializedView:
    return cdf.mv.open_view(VIEW, catalog=cat)


@dataclass(frozen=True)
class Path:
    """A commit path: how to build its table, the operation under test, and whether a blind re-run is safe."""

    run: Callable[[lineage.Table, Any], Any]  # (table opened through the faulty catalog, that catalog)
    build: Callable[[str], Any] = _base
    target: str = NAME  # the table the operation commits to
    rerunnable: bool = False  # maintenance and refreshes may be re-run after an unknown outcome
    overrides: dict[str, tuple[str, type | None]] = field(default_factory=dict)  # fault -> (state, error)


UPSERT = _batch(range(25, 35), "u", 50.0)
AGG = "SELECT name, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY name"
PROJ = "SELECT id, amount FROM orders WHERE amount < 100"
IDLE = {  # a failing idle record is only logged: the refresh still succeeds, the checkpoint stays behind
    "refused-repeatedly": ("old", None),
    "lost-reply-catalog-down": ("new", None),
}

PATHS: dict[str, Path] = {
    "append": Path(lambda t, c: t.append(_batch(range(100, 110)))),
    "delete": Path(lambda t, c: t.delete("id < 8")),
    "update": Path(lambda t, c: t.update("id < 5", {"amount": "amount + 1"})),
    "update-cow": Path(lambda t, c: t.update("id > 20", {"name": "'z'"}, mode=lineage.COPY_ON_WRITE)),
    "upsert": Path(lambda t, c: t.upsert(UPSERT)),
    "merge": Path(
        lambda t, c: t.merge(UPSERT, pa.table({"id": [1, 2]}), properties={"lineage.user.batch": "b1"}, expected_version=t.version)
    ),
    "upsert-fold": Path(_folding_upsert, build=_small_files),
    "compact": Path(lambda t, c: t.compact(target_file_size_bytes=1 << 30), rerunnable=True),
    "rewrite-deletes": Path(lambda t, c: t.rewrite_deletes(), rerunnable=True),
    "rehome": Path(lambda t, c: t.rehome(max_live_fraction=1.0), build=_compacted, rerunnable=True),
    "purge": Path(lambda t, c: t.purge("id = 4"), rerunnable=True),
    "expire": Path(lambda t, c: t.expire_snapshots(retain_last=2), rerunnable=True),
    "mv-refresh": Path(lambda t, c: _view(c).refresh(), build=_with_view(AGG, lambda t: t.upsert(UPSERT)), target=VIEW, rerunnable=True),
    "mv-idle": Path(
        lambda t, c: _view(c).refresh(), build=_with_view(PROJ, lambda t: t.append(_batch(range(200, 205), amount=500.0))),
        target=VIEW, rerunnable=True, overrides=IDLE,
    ),
}


@dataclass(frozen=True)
class FaultCase:
    faults: tuple[Fault, ...]
    state: str = "new"  # the state the table must hold afterwards: "new" (the operation landed once) or "old"
    error: type | None = None
    leftovers_allowed: bool = False  # files of attempts that may still land are kept for vacuum


FAULTS: dict[str, FaultCase] = {
    "refused": FaultCase((Fault("commit_table", BEFORE),)),
    "lost-reply": FaultCase((Fault("commit_table", AFTER),)),
    "lands-then-refresh-fails": FaultCase((Fault("load_table", BEFORE, after_commits=1),)),
    "lost-reply-then-refresh-fails": FaultCase((Fault("commit_table", AFTER), Fault("load_table", BEFORE, after_commits=1))),
    "late-landing": FaultCase((Fault("commit_table", LATE),)),
    "refused-repeatedly": FaultCase((Fault("commit_table", BEFORE, times=None),), "old", lineage.CatalogFailedError, True),
    "lost-reply-catalog-down": FaultCase(
        (Fault("commit_table", AFTER), Fault("load_table", BEFORE, times=None, after_commits=1)), "new", lineage.CommitStateUnknownError, True
    ),
}


@pytest.fixture(autouse=True)
def _short_pauses(monkeypatch):  # noqa: ANN001, ANN202
    """The faults are injected, not real: no need to wait for a catalog to come back between read-backs."""
    monkeypatch.setattr(lineage.outcome, "RELOAD_PAUSE", 0.001)


# ---------------------------------------------------------------------------- observing a warehouse
def _sorted(tbl: pa.Table, drop: tuple[str, ...] = ()) -> list[tuple]:
    cols = [c for c in tbl.column_names if c not in drop]
    return sorted((tuple(r[c] for c in cols) for r in tbl.select(cols).to_pylist()), key=repr)


def observe(wh: str) -> dict[str, Any]:
    """What a reader sees, through the plain embedded catalog (paths, ids and timestamps left out)."""
    t = lineage.open_table(NAME, warehouse=wh)
    out: dict[str, Any] = {
        "version": t.version,
        "rows": _sorted(t.scan()),
        "changes": _sorted(cdf.changes(t, 0, t.version), drop=("_commit_timestamp",)) if t.version else [],
        "history": [(c.version, c.operation, c.inserted, c.updated, c.deleted, c.properties) for c in t.history()],
        "snapshots": len(t.iceberg.metadata.snapshots),
    }
    try:
        v = cdf.mv.open_view(VIEW, warehouse=wh)
    except lineage.TableNotFoundError:
        return out
    out["view"] = _sorted(v.scan())
    out["checkpoint"] = v.checkpoint
    out["view_history"] = [(c.version, c.operation, c.inserted, c.updated, c.deleted) for c in v.table.history()]
    return out


def audit(wh: str) -> list[str]:
    """Assert that verify is clean and every file the table (and view) reference exists; return the unreferenced files."""
    orphans = []
    for name in [NAME] + ([VIEW] if _has_view(wh) else []):
        t = lineage.open_table(name, warehouse=wh)
        report = verify(t)
        assert report.ok, f"{name}: verify found {report.problems}"
        refs = referenced_files(t)
        missing = sorted(p for p in refs if not os.path.exists(p))
        assert not missing, f"{name}: files referenced but missing: {missing[:5]}"
        root = local_path(t.iceberg.metadata.location)
        orphans += [os.path.join(d, f) for d, _, names in os.walk(root) for f in names if os.path.join(d, f) not in refs]
    return orphans


def _has_view(wh: str) -> bool:
    try:
        lineage.open_table(VIEW, warehouse=wh)
        return True
    except lineage.TableNotFoundError:
        return False


@dataclass
class Template:
    """A path's table built once; every test restores the same folder in place (absolute paths stay valid)."""

    warehouse: str
    saved: str
    before: dict[str, Any]
    after: dict[str, Any]

    def restore(self) -> str:
        shutil.rmtree(self.warehouse, ignore_errors=True)
        shutil.copytree(self.saved, self.warehouse)
        return self.warehouse


@pytest.fixture(scope="module")
def template(tmp_path_factory):  # noqa: ANN001, ANN201
    """Per path: the built table (saved aside), its observed state, and the state after the operation ran once without faults."""
    cache: dict[str, Template] = {}

    def get(key: str, spec: Path) -> Template:
        if key not in cache:
            root = tmp_path_factory.mktemp(key)
            wh, saved = str(root / "wh"), str(root / "saved")
            spec.build(wh)
            shutil.copytree(wh, saved)
            before = observe(wh)
            cat = default_catalog(wh)
            spec.run(lineage.open_table(NAME, catalog=cat), cat)
            cache[key] = Template(wh, saved, before, observe(wh))
        return cache[key]

    return get


def check_fault(tpl: Template, spec: Path, fault: str) -> None:
    """Run ``spec`` on a fresh copy of its table under ``fault`` and check everything the module docstring lists."""
    case = FAULTS[fault]
    state, error = spec.overrides.get(fault, (case.state, case.error))
    wh = tpl.restore()
    cat = FaultyCatalog(default_catalog(wh))
    table = lineage.open_table(NAME, catalog=cat)
    target = lineage.open_table(spec.target, catalog=cat)
    cat.arm(*copy.deepcopy(case.faults))
    raised: BaseException | None = None
    try:
        spec.run(table, cat)
    except lineage.LineageError as exc:
        raised = exc
    if raised is None and case.error is None:
        target.scan()  # the first read after the commit (a transient failure there is retried)
    assert any(e.startswith("!") for e in cat.plan.log), f"no fault fired: {cat.plan.log}"
    if fault == "late-landing":
        assert "commit_table:late-landed" in cat.plan.log, f"the held-back commit never reached the catalog: {cat.plan.log}"
    if error is None:
        assert raised is None, f"expected success, got {raised!r}"
    else:
        assert isinstance(raised, error), f"expected {error.__name__}, got {raised!r}"
    cat.heal()

    seen, expected = observe(wh), dict(tpl.after if state == "new" else tpl.before)
    if raised is not None:  # the operation stopped at its commit: follow-up work (purge's expiry) comes with the retry
        seen.pop("snapshots"), expected.pop("snapshots")
    assert seen == expected, "the table is not in exactly the old or the new state"
    # Files left unreferenced by the operation that were not there before (expiry may release old ones).
    left = [p for p in audit(wh) if not os.path.exists(os.path.join(tpl.saved, os.path.relpath(p, wh)))]
    if not case.leftovers_allowed:
        assert left == [], "files of an attempt known to be lost were left behind"
    if raised is None:
        return

    # A caller that follows the README retries; the change must not be applied twice.
    retry = True
    if isinstance(raised, lineage.CommitStateUnknownError):
        if raised.snapshot_ids or not spec.rerunnable:
            assert raised.snapshot_ids, "the error must name the attempts to check"
            landed = any(lineage.open_table(spec.target, warehouse=wh).has_commit(i) for i in raised.snapshot_ids)
            assert landed == (state == "new")
            retry = spec.rerunnable or not landed
    if retry:
        spec.run(lineage.open_table(NAME, catalog=cat), cat)
    assert observe(wh) == tpl.after, "a retry by the caller applied the change twice (or not at all)"
    audit(wh)


# ---------------------------------------------------------------------------- the matrix
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("path", list(PATHS))
def test_fault_leaves_old_or_new_state_once(template, path: str, fault: str) -> None:
    check_fault(template(path, PATHS[path]), PATHS[path], fault)


@pytest.mark.spark
@pytest.mark.parametrize(("op", "fault"), [("append", "late-landing"), ("upsert", "lost-reply-catalog-down")])
def test_spark_writes_under_faults(spark, template, op: str, fault: str) -> None:
    """Spark appends reuse the files executors wrote across attempts; Spark upserts write theirs per attempt.

    (Two cases only: a Spark write costs seconds; the commit machinery is the one the matrix covers.)
    """
    batch = _batch(range(100, 110)) if op == "append" else UPSERT
    spec = Path(lambda t, c: getattr(t, op)(spark.createDataFrame(batch)))
    check_fault(template(f"spark-{op}", spec), spec, fault)


# ---------------------------------------------------------------------------- tokens and re-runs
def test_rerun_of_a_refresh_whose_commit_landed_unseen_is_up_to_date(tmp_path) -> None:
    """The view's checkpoint is its idempotency token: a refresh re-run after an unknown outcome applies nothing."""
    wh = str(tmp_path / "wh")
    PATHS["mv-refresh"].build(wh)
    cat = FaultyCatalog(default_catalog(wh))
    view = cdf.mv.open_view(VIEW, catalog=cat)
    commits = len(view.table.history())
    cat.arm(*copy.deepcopy(FAULTS["lost-reply-catalog-down"].faults))
    with pytest.raises(lineage.CommitStateUnknownError) as info:
        view.refresh()
    assert "has_commit" in str(info.value) and info.value.snapshot_ids
    cat.heal()
    again = cdf.mv.open_view(VIEW, catalog=cat).refresh()
    assert again.status == "up-to-date" and not again.committed
    assert len(view.table.history()) == commits + 1
    source = lineage.open_table(NAME, warehouse=wh)
    assert cdf.mv.open_view(VIEW, warehouse=wh).checkpoint == source.version


def test_commits_are_found_by_snapshot_id_and_by_token_after_expiry(tmp_path) -> None:
    """has_commit and find_commit (for change-stream batch ids) read the lineage commit log, which outlives snapshots."""
    t = _base(str(tmp_path / "wh"))
    info = t.merge(UPSERT, properties={"lineage.user.batch": "b7"})
    assert find_commit(t.iceberg, "lineage.user.batch", "b7").snapshot_id == info.snapshot_id
    assert find_commit(t.iceberg, "lineage.user.batch", "b8") is None
    t.append(_batch(range(100, 103)))
    t.expire_snapshots(retain_last=1)
    t.refresh()
    assert t.iceberg.metadata.snapshot_by_id(info.snapshot_id) is None
    assert t.has_commit(info.snapshot_id)
    assert find_commit(t.iceberg, "lineage.user.batch", "b7").version == info.version
    assert not t.has_commit(info.snapshot_id + 1)
    with pytest.raises(lineage.InvalidArgumentError):
        t.has_commit("1")  # type: ignore[arg-type]


def test_a_catalog_that_itself_reports_an_unknown_state_is_not_retried(tmp_path) -> None:
    """pyiceberg's REST catalog raises CommitStateUnknownException (HTTP 5xx): the server may still commit, so a
    commit not visible yet is reported as unknown, with its files kept, instead of being retried."""
    from pyiceberg.exceptions import CommitStateUnknownException

    wh = str(tmp_path / "wh")
    rows = _base(wh).count()
    before = observe(wh)
    cat = FaultyCatalog(default_catalog(wh)).arm(Fault("commit_table", BEFORE, error=CommitStateUnknownException))
    t = lineage.open_table(NAME, catalog=cat)
    with pytest.raises(lineage.CommitStateUnknownError) as info:
        t.append(_batch(range(100, 110)))
    assert cat.plan.commits == 0 and len(info.value.snapshot_ids) == 1
    assert observe(wh) == before
    assert len(audit(wh)) >= 3, "the attempt's data, lineage and manifest files must be kept"
    assert not t.has_commit(info.value.snapshot_ids[0])
    t.append(_batch(range(100, 110)))  # the caller checked: it did not land, so it retries
    assert t.count() == rows + 10 and t.version == before["version"] + 1
    audit(wh)
