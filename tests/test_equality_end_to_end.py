"""Issue 13 end to end with our own readers: equality-strategy commits, reconciliation and CONVERT together.

A table written with ``write.changelog.strategy=equality`` has no lineage list on its changelog commits; the
reconciler derives it. These tests read such tables through every reader of ours (scan, history, the change
feed per version and net, deleted_rows, a materialized view, verify, the key index through a position write on
top) and require what the position strategy gives. CONVERT is a commit of ours: it carries a lineage list,
changes no row, makes no feed event and drops the resolved-delete files.

The property test applies the same random changelog batches to two tables, one per strategy, with CONVERT or
compaction at random points on the equality table. **How the two are compared:** those add versions to the
equality table only, so its versions are mapped to the position table's by commit (batch i's version on one
table to batch i's on the other; a maintenance version maps to the batch before it, and makes no event). Row ids of keys that exist are
kept by both strategies, but the ids the two assign to *new* keys may differ (a key written and deleted within one
equality batch consumes ids the position strategy never assigns), so row ids are compared through a bijection
built as rows appear: one equality-table id always stands for the same position-table id, in every scan and
every feed. Feeds over random batch ranges, per version and net, must be equal after mapping versions and ids.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from conftest import SCHEMA, rows
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pyiceberg.manifest import DataFileContent

import cdf
import cdf.mv
import lineage
from lineage.maintenance import verify

EQ = {"write.changelog.strategy": "equality"}
FEED = ["id", "name", "amount", "_change_type", "_commit_version", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]


def _events(items: list[tuple[str, int, float | None]]) -> pa.Table:
    return pa.table(
        {
            "_op": [op for op, _, _ in items],
            "id": pa.array([k for _, k, _ in items], pa.int64()),
            "name": [f"n{k}" for _, k, _ in items],
            "amount": pa.array([a for _, _, a in items], pa.float64()),
        }
    )


def _apply(model: dict[int, tuple], items: list[tuple[str, int, float | None]]) -> None:
    for op, k, a in items:
        if op in ("+I", "+U"):
            model[k] = (k, f"n{k}", a)
        else:
            model.pop(k, None)


def _first(t: lineage.Table) -> None:
    t.append(pa.Table.from_pylist([{"id": k, "name": f"n{k}", "amount": float(k)} for k in (1, 2, 3, 4)], schema=SCHEMA))


def _lineage(t: lineage.Table) -> dict[int, tuple[int, int, int]]:
    """key -> (row id, created version, updated version)."""
    return {
        r["id"]: (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"])
        for r in t.scan(columns=["id", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]).to_pylist()
    }


def _feed(t: lineage.Table, a: int, b: int | None = None, net: bool = False) -> list[tuple]:
    return rows(cdf.changes(t, a, b, net=net), FEED)


def _live_contents(t: lineage.Table) -> set[DataFileContent]:
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    return {e.data_file.content for m in snap.manifests(t.iceberg.io) for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=True)}


def test_equality_stream_with_our_readers(warehouse):
    """Scan, lineage, history counts, feeds, deleted_rows, MV, verify, CONVERT and a position write on top."""
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    _first(t)
    model = {k: (k, f"n{k}", float(k)) for k in (1, 2, 3, 4)}
    view = cdf.mv.create("shop.totals", t, "SELECT name, SUM(amount) AS total FROM orders GROUP BY name")
    view.refresh()
    b1 = [("+U", 1, 10.0), ("-D", 2, None), ("+I", 5, 5.0), ("-D", 5, None), ("+I", 6, 6.0), ("-U", 3, None), ("+U", 3, 30.0)]
    t.apply_changelog(_events(b1), upsert=True)
    _apply(model, b1)
    v1 = t.version
    assert rows(t.scan(with_lineage=False)) == sorted(model.values(), key=repr)
    ids = _lineage(t)
    assert ids[1] == (0, 1, v1) and ids[3] == (2, 1, v1) and ids[4] == (3, 1, 1)
    assert 5 not in ids
    last = t.history()[-1]
    assert (last.version, last.operation, last.inserted, last.updated, last.deleted, last.foreign) == (v1, "changelog", 1, 2, 1, None)
    feed = cdf.changes(t, 1, v1).to_pylist()
    assert sorted((r["id"], r["_change_type"], r["_row_id"]) for r in feed) == sorted(
        [(1, "update_preimage", 0), (1, "update_postimage", 0), (3, "update_preimage", 2), (3, "update_postimage", 2),
         (2, "delete", 1), (6, "insert", ids[6][0])]
    )
    b2 = [("+I", 2, 22.0), ("-D", 6, None), ("+U", 4, 40.0), ("+U", 4, 41.0)]
    t.apply_changelog(_events(b2), upsert=True)
    _apply(model, b2)
    v2 = t.version
    last = t.history()[-1]
    assert (last.inserted, last.updated, last.deleted) == (1, 1, 1)
    assert all(5 != r["id"] for r in cdf.changes(t, 0, net=False).to_pylist())
    assert len(t.state().lineage.resolved_deletes or ()) == 2
    before = {(a, b, net): _feed(t, a, b, net) for a in range(0, v2) for b in range(a + 1, v2 + 1) for net in (False, True)}
    lineage_before = _lineage(t)
    deleted_before = rows(cdf.deleted_rows(t, 0), ["id", "_row_id"])

    result = t.convert_equality_deletes()
    assert result.equality_files == 2 and result.version == v2 + 1
    assert DataFileContent.EQUALITY_DELETES not in _live_contents(t)
    last = t.history()[-1]
    assert (last.version, last.operation, last.inserted, last.updated, last.deleted, last.foreign) == (v2 + 1, "convert-deletes", 0, 0, 0, None)
    assert not t.state().lineage.resolved_deletes
    assert _lineage(t) == lineage_before
    assert _feed(t, v2, v2 + 1) == [] and _feed(t, v2, v2 + 1, net=True) == []
    for (a, b, net), expected in before.items():
        assert _feed(t, a, b, net) == expected, (a, b, net)
        if b == v2:
            assert _feed(t, a, v2 + 1, net) == expected, (a, "through the CONVERT", net)
    assert rows(cdf.deleted_rows(t, 0), ["id", "_row_id"]) == deleted_before
    assert verify(t).ok, verify(t).problems
    assert t.convert_equality_deletes().version is None  # nothing left

    # A position-strategy write on top (the key index must be exact after reconciliation and CONVERT).
    t.upsert(pa.Table.from_pylist([{"id": 3, "name": "n3", "amount": 33.0}, {"id": 7, "name": "n7", "amount": 7.0}], schema=SCHEMA))
    model[3], model[7] = (3, "n3", 33.0), (7, "n7", 7.0)
    t.delete("id = 1")
    model.pop(1)
    assert rows(t.scan(with_lineage=False)) == sorted(model.values(), key=repr)
    assert _lineage(t)[3][:2] == (2, 1)
    with pytest.raises(lineage.errors.LineageError):
        t.append(pa.Table.from_pylist([{"id": 4, "name": "x", "amount": 0.0}], schema=SCHEMA))  # key 4 exists
    assert verify(t).ok, verify(t).problems

    view.refresh()
    expected = {}
    for _, name, amount in model.values():
        expected[name] = expected.get(name, 0.0) + amount
    assert sorted((r["name"], r["total"]) for r in view.scan().to_pylist()) == sorted(expected.items())


def test_spark_feed_of_an_equality_table(warehouse, spark):
    """The Spark engine gives the DuckDB engine's feed on a reconciled and converted equality table."""
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    _first(t)
    t.apply_changelog(_events([("+U", 1, 10.0), ("-D", 2, None), ("+I", 5, 5.0), ("-D", 5, None), ("+I", 6, 6.0)]), upsert=True)
    t.convert_equality_deletes()
    t.apply_changelog(_events([("+I", 2, 2.5), ("-D", 6, None)]), upsert=True)
    for net in (False, True):
        theirs = cdf.changes(t, 0, net=net, engine="spark", spark=spark).select(FEED).collect()
        assert sorted((tuple(r) for r in theirs), key=repr) == _feed(t, 0, net=net), net


# --- the two strategies side by side -------------------------------------------------------------------------

KEYS = st.integers(1, 6)
EVENT = st.one_of(
    st.tuples(st.sampled_from(["+I", "+U"]), KEYS, st.integers(0, 3).map(float)),
    st.tuples(st.sampled_from(["-D", "-U"]), KEYS, st.none()),
)
MAINTENANCE = st.sampled_from(["none", "none", "convert", "compact", "expire", "vacuum"])
STEPS = st.lists(st.tuples(st.lists(EVENT, min_size=1, max_size=6), MAINTENANCE), min_size=1, max_size=4)


class _Ids:
    """A bijection between the row ids of the equality table and those of the position table."""

    def __init__(self) -> None:
        self.fwd: dict[int, int] = {}
        self.back: dict[int, int] = {}

    def same(self, eq: int, pos: int) -> None:
        assert self.fwd.setdefault(eq, pos) == pos, f"equality row id {eq} stands for {self.fwd[eq]} and {pos}"
        assert self.back.setdefault(pos, eq) == eq, f"position row id {pos} stands for {self.back[pos]} and {eq}"


def _mapped(tbl: pa.Table, ids: _Ids, version_map: dict[int, int], pos_side: list[dict]) -> list[tuple]:
    """Rows of an equality-table feed/scan with versions mapped and row ids paired with the position side's."""
    out = []
    for r in tbl.to_pylist():
        out.append({**r, **{c: version_map[r[c]] for c in ("_commit_version", "_row_created_at_version", "_row_last_updated_at_version") if c in r}})
    key = lambda r: (r["id"], r.get("_change_type", ""), r.get("_commit_version", 0))  # noqa: E731
    eq_sorted, pos_sorted = sorted(out, key=key), sorted(pos_side, key=key)
    assert [key(r) for r in eq_sorted] == [key(r) for r in pos_sorted]
    for e, p in zip(eq_sorted, pos_sorted):
        ids.same(e["_row_id"], p["_row_id"])
        e["_row_id"] = p["_row_id"]
    return eq_sorted


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS, data=st.data())
def test_both_strategies_agree(tmp_path_factory, steps, data):
    """Same batches, two strategies, CONVERT, compaction, expiry or vacuum at random points: same scans, lineage and feeds."""
    _both_strategies(str(tmp_path_factory.mktemp("wh")), steps, data)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS, data=st.data())
def test_both_strategies_agree_and_spark_reads_every_state(reference, tmp_path_factory, steps, data):
    """The same, and after every step Spark + Iceberg 1.10 reads exactly our rows from the equality table."""
    wh = str(tmp_path_factory.mktemp("wh"))

    def spark_reads_ours(eq: lineage.Table) -> None:
        theirs = reference.read(wh, "shop.eq").cast(SCHEMA)
        assert rows(eq.scan(with_lineage=False)) == rows(theirs), "Spark's read differs from our scan"

    try:
        _both_strategies(wh, steps, data, after_step=spark_reads_ours)
    finally:
        reference.forget(wh)


def _both_strategies(wh: str, steps, data, after_step=None) -> None:  # noqa: ANN001
    """Apply ``steps`` to one table per strategy and compare them (``after_step(eq)`` runs after each step)."""
    eq = lineage.create_table("shop.eq", SCHEMA, key=["id"], warehouse=wh, properties=EQ)
    pos = lineage.create_table("shop.pos", SCHEMA, key=["id"], warehouse=wh)
    _first(eq)
    _first(pos)
    if after_step is not None:
        after_step(eq)
    ids = _Ids()
    version_map = {0: 0, eq.version: pos.version}  # equality version -> position version
    batch_versions = [(eq.version, pos.version)]
    for events, maintenance in steps:
        eq.apply_changelog(_events(events), upsert=True)
        pos.apply_changelog(_events(events), upsert=True)
        if after_step is not None:
            after_step(eq)
        version_map[eq.version] = pos.version
        batch_versions.append((eq.version, pos.version))
        # A batch that changes nothing commits nothing on the position table; the equality table commits
        # anyway (it cannot know) and reconciliation finds no change in it.
        e_last, p_last = eq.history()[-1], pos.history()[-1]
        p_counts = (p_last.inserted, p_last.updated, p_last.deleted) if p_last.version == pos.version and batch_versions[-2][1] != pos.version else (0, 0, 0)
        assert (e_last.inserted, e_last.updated, e_last.deleted) == p_counts, events
        if maintenance == "convert":
            by_scan = _scan_resolution(eq)
            eq.convert_equality_deletes()
            version_map[eq.version] = pos.version
            assert not eq.state().lineage.resolved_deletes
            assert _converted_positions(eq) == by_scan, "CONVERT through the key index differs from a scan of the equality columns"
        elif maintenance == "compact":
            eq.compact(min_file_size_bytes=1 << 30)  # every file is small: rewrite them all, dropping deleted rows
            version_map[eq.version] = pos.version
        elif maintenance == "expire":
            eq.expire_snapshots(retain_last=1)  # the feed outlives the snapshots (commit log, deleted-rows index)
        elif maintenance == "vacuum":
            eq.vacuum(older_than=dt.timedelta(0))  # must keep reconciled lineage and pinned files
        p_scan = pos.scan().to_pylist()
        assert _mapped(eq.scan(), ids, version_map, p_scan) == sorted(p_scan, key=lambda r: (r["id"], "", 0))
        if after_step is not None and maintenance != "none":
            after_step(eq)
        # After every step: the key index agrees with the table, and the feeds of the last batch (per version)
        # and of a random range ending now (net or per version) are the position table's.
        assert verify(eq).ok, verify(eq).problems
        n = len(batch_versions)
        _same_feed(eq, pos, ids, version_map, batch_versions, n - 2, n - 1, False)
        i = data.draw(st.integers(0, n - 2), label="from batch")
        _same_feed(eq, pos, ids, version_map, batch_versions, i, n - 1, data.draw(st.booleans(), label="net"))
    n = len(batch_versions)
    for _ in range(2):
        i = data.draw(st.integers(0, n - 2), label="from batch")
        j = data.draw(st.integers(i + 1, n - 1), label="to batch")
        _same_feed(eq, pos, ids, version_map, batch_versions, i, j, data.draw(st.booleans(), label="net"))


def _same_feed(eq, pos, ids: _Ids, version_map: dict[int, int], batch_versions: list[tuple[int, int]], i: int, j: int, net: bool) -> None:  # noqa: ANN001
    """The equality table's feed from batch ``i`` to batch ``j`` is the position table's (versions and row ids mapped)."""
    # The equality range ends at the newest version of batch j (a CONVERT after it included), or at the head.
    e_to = max(v for v, p in version_map.items() if p == batch_versions[j][1])
    note(f"batches {i}..{j} net={net}: equality {batch_versions[i][0]}..{e_to}, position {batch_versions[i][1]}..{batch_versions[j][1]}")
    p_from, p_to = batch_versions[i][1], batch_versions[j][1]
    p_feed = cdf.changes(pos, p_from, p_to, net=net).to_pylist() if p_to > p_from else []
    e_feed = _mapped(cdf.changes(eq, batch_versions[i][0], e_to, net=net), ids, version_map, p_feed)
    expected = sorted(p_feed, key=lambda r: (r["id"], r["_change_type"], r["_commit_version"]))
    assert [{c: r[c] for c in FEED} for r in e_feed] == [{c: r[c] for c in FEED} for r in expected], (i, j, net)


def _scan_resolution(t: lineage.Table) -> dict[str, list[int]]:
    """What CONVERT must write, resolved independently: a scan of the equality columns, less positions already deleted."""
    from lineage.storage.deletes import positions_for
    from lineage.maintenance.convert import resolve_snapshot

    t.refresh()
    files = t.state().files().files
    out: dict[str, set[int]] = {}
    for r in resolve_snapshot(t.iceberg, t.iceberg.metadata.current_snapshot())[0]:
        out.setdefault(r.data_file.file_path, set()).update(int(p) for p in r.positions)
    deleted = {p: set(positions_for(p, [d.file_path for d in files[p].deletes]).tolist()) for p in out}
    return {p: sorted(v - deleted[p]) for p, v in out.items() if v - deleted[p]}


def _converted_positions(t: lineage.Table) -> dict[str, list[int]]:
    """Data file -> positions of the position delete files the head snapshot (a CONVERT) added."""
    from lineage.storage.deletes import read_position_deletes

    snap = t.iceberg.metadata.current_snapshot()
    out: dict[str, list[int]] = {}
    for m in snap.manifests(t.iceberg.io):
        for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
            if e.data_file.content == DataFileContent.POSITION_DELETES and e.snapshot_id == snap.snapshot_id:
                for path, p in read_position_deletes(e.data_file.file_path).items():
                    out[path] = sorted(set(out.get(path, [])) | set(p.tolist()))
    return out


def test_adopted_table_with_equality_stream(warehouse):
    """Versions before an adoption are never reconciled; the equality strategy and CONVERT work after it."""
    import os

    from lineage.catalog import resolve_catalog
    from lineage.reconcile import reconciled_list_path

    cat = resolve_catalog(warehouse, None)
    cat.create_namespace("shop")
    ice = cat.create_table("shop.plain", schema=SCHEMA)
    ice.append(pa.Table.from_pylist([{"id": k, "name": f"n{k}", "amount": float(k)} for k in (1, 2, 3)], schema=SCHEMA))
    ice.delete("id = 2")
    before = [s.snapshot_id for s in ice.metadata.snapshots]
    adopted = lineage.adopt("shop.plain", key=["id"], warehouse=warehouse)
    t = lineage.open_table("shop.plain", warehouse=warehouse)
    with t.iceberg.transaction() as tx:
        tx.set_properties(EQ)
    t.refresh()
    t.apply_changelog(_events([("+U", 1, 10.0), ("-D", 3, None), ("+I", 4, 4.0)]), upsert=True)
    assert t.reconcile() == [t.version]
    assert [(c.operation, c.inserted, c.updated, c.deleted) for c in t.history()] == [("adopt", 0, 0, 0), ("changelog", 1, 1, 1)]
    assert t.convert_equality_deletes().equality_files == 1
    assert [c.operation for c in t.history()] == ["adopt", "changelog", "convert-deletes"]
    changelog_id = t.history()[1].snapshot_id
    assert os.path.exists(reconciled_list_path(t.iceberg, changelog_id).removeprefix("file://"))
    for sid in before:
        assert not os.path.exists(reconciled_list_path(t.iceberg, sid).removeprefix("file://")), sid
    with pytest.raises(lineage.errors.RetentionError):
        cdf.changes(t, adopted.version - 1)
    assert sorted((r["id"], r["_change_type"]) for r in cdf.changes(t, adopted.version).to_pylist()) == [
        (1, "update_postimage"), (1, "update_preimage"), (3, "delete"), (4, "insert")
    ]
    assert verify(t).ok, verify(t).problems


def test_convert_without_lineage_list_is_reconciled_to_no_change(warehouse):
    """A CONVERT snapshot without a lineage list (adoption's, or another tool's) reconciles to no row change."""
    from lineage.maintenance.convert import convert_equality_deletes

    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, properties=EQ)
    _first(t)
    t.apply_changelog(_events([("+U", 1, 10.0), ("-D", 2, None), ("+I", 5, 5.0), ("-D", 5, None), ("+I", 6, 6.0)]), upsert=True)
    t.apply_changelog(_events([("+I", 2, 2.5), ("-D", 6, None)]), upsert=True)
    feeds = {(a, net): _feed(t, a, None, net) for a in range(t.version) for net in (False, True)}
    ids = _lineage(t)
    convert_equality_deletes(t.iceberg, lambda: t.refresh().iceberg, t.name)
    t.refresh()
    last = t.history()[-1]
    assert (last.version, last.inserted, last.updated, last.deleted) == (t.version, 0, 0, 0)
    assert _feed(t, t.version - 1) == [] and _lineage(t) == ids
    for (a, net), expected in feeds.items():
        assert _feed(t, a, None, net) == expected, (a, net)
    assert verify(t).ok, verify(t).problems
