"""Property-based tests of the change data feed against a plain Python model.

Hypothesis draws short sequences of writes (append, delete, update, upsert;
merge-on-read by default, copy-on-write per call) over a keyed table with an
int, a string and a float column whose values come from small domains, so
that updates that change nothing, updates that set a column to the value it
already had, writes that match nothing, and keys deleted then re-inserted all
happen. The model keeps, for every version, the full set of live rows
``{row_id: (values, created_version, last_updated_version)}``. Row ids of
inserted rows are learnt from ``scan()`` right after the insert (by key).

From the model alone we derive, per DESIGN.md section 3:

* the per-version feed over ``(a, b]``: for each version v, state v-1 vs v per
  row id (insert / delete / update pre+post with ``_changed_columns``);
* the net feed over ``(a, b]``: state a vs state b per row id;
* ``deleted_rows(since=a, until=b)``;

and compare them, as multisets, with ``cdf.changes`` / ``cdf.deleted_rows``
for random pairs ``a <= b`` (always including ``a == b``, ``(0, current)`` and
a single-version range). The timestamp form of ``changes`` must equal the
version form. A few focused examples follow the property.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import cdf
import lineage
from lakes import S3_PHASES, S3_PROPERTY_EXAMPLES, temp_lake

SCHEMA = pa.schema([("id", pa.int64()), ("qty", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
DATA_COLS = SCHEMA.names
CHANGE_COLS = [
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
    "_row_id",
    "_row_created_at_version",
    "_row_last_updated_at_version",
    "_changed_columns",
]
DELETED_COLS = [
    "_row_deleted_at_version",
    "_row_deleted_at_timestamp",
    "_row_id",
    "_row_created_at_version",
    "_row_last_updated_at_version",
]
BEFORE_EVERYTHING = _dt.datetime(2000, 1, 1, tzinfo=_dt.timezone.utc)

Values = tuple  # (id, qty, name, amount)
Image = tuple  # (values, created, updated)


# ---------------------------------------------------------------- the model


@dataclass
class Model:
    """Live rows by key, plus the state at every version (by row id)."""

    live: dict[int, list] = field(default_factory=dict)  # key -> [row_id | None, values, created, updated]
    states: list[dict[int, Image]] = field(default_factory=lambda: [{}])  # states[v] = {row_id: image}
    ts: list[_dt.datetime] = field(default_factory=lambda: [BEFORE_EVERYTHING])  # ts[v] = commit timestamp of v
    seen_row_ids: set[int] = field(default_factory=set)
    ever_keys: set[int] = field(default_factory=set)
    next_key: int = 1
    ops: list[str] = field(default_factory=list)

    @property
    def version(self) -> int:
        return len(self.states) - 1

    @property
    def dead_keys(self) -> list[int]:
        return sorted(self.ever_keys - set(self.live))

    def fresh_key(self) -> int:
        k = self.next_key
        self.next_key += 1
        return k


# (SQL predicate, the same predicate in Python with SQL NULL semantics; it sees (values, created, updated))
PREDICATES: list[tuple[str, Callable[[Values, int, int], bool]]] = [
    ("TRUE", lambda v, c, u: True),
    ("id % 2 = 0", lambda v, c, u: v[0] % 2 == 0),
    ("id % 3 = 1", lambda v, c, u: v[0] % 3 == 1),
    ("qty >= 2", lambda v, c, u: v[1] is not None and v[1] >= 2),
    ("name = 'a'", lambda v, c, u: v[2] == "a"),
    ("name IS NULL OR amount IS NULL", lambda v, c, u: v[2] is None or v[3] is None),
    ("amount > 0.75", lambda v, c, u: v[3] is not None and v[3] > 0.75),
    ("id IN (1, 2, 3)", lambda v, c, u: v[0] in (1, 2, 3)),
    ("id < 0", lambda v, c, u: False),  # matches nothing
    ("name = 'no such name'", lambda v, c, u: False),  # matches nothing
    ("_row_last_updated_at_version > _row_created_at_version", lambda v, c, u: u > c),
]


def _with(v: Values, **kw: object) -> Values:
    d = dict(zip(DATA_COLS, v, strict=True))
    d.update(kw)
    return tuple(d[c] for c in DATA_COLS)


# (SET mapping, the new values in Python)
SETTERS: list[tuple[dict[str, str], Callable[[Values], Values]]] = [
    ({"amount": "amount"}, lambda v: v),  # changes nothing: still an update, _changed_columns == []
    ({"qty": "qty", "name": "name"}, lambda v: v),  # changes nothing either
    ({"qty": "coalesce(qty, 0) % 3 + 1"}, lambda v: _with(v, qty=(0 if v[1] is None else v[1]) % 3 + 1)),
    ({"qty": "CAST(2 AS BIGINT)"}, lambda v: _with(v, qty=2)),  # sometimes the value it had
    ({"name": "'a'"}, lambda v: _with(v, name="a")),
    ({"name": "CASE WHEN name = 'a' THEN 'b' ELSE 'a' END"}, lambda v: _with(v, name="b" if v[2] == "a" else "a")),
    ({"amount": "coalesce(amount, 0.5)"}, lambda v: _with(v, amount=0.5 if v[3] is None else v[3])),
    ({"amount": "CAST(NULL AS DOUBLE)"}, lambda v: _with(v, amount=None)),
    ({"name": "name", "amount": "CAST(1.5 AS DOUBLE)"}, lambda v: _with(v, amount=1.5)),
    ({"qty": "CAST(3 AS BIGINT)", "name": "'b'", "amount": "CAST(0.5 AS DOUBLE)"}, lambda v: _with(v, qty=3, name="b", amount=0.5)),
]

QTYS = st.sampled_from([1, 2, 3, None])
NAMES = st.sampled_from(["a", "b", None])
AMOUNTS = st.sampled_from([0.5, 1.0, 1.5, None])
MODES = st.sampled_from([None, None, lineage.COPY_ON_WRITE])


def _batch(rows: list[Values]) -> pa.Table:
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(DATA_COLS)}, schema=SCHEMA)


def _draw_values(data: st.DataObject, k: int) -> Values:
    return (k, data.draw(QTYS, label="qty"), data.draw(NAMES, label="name"), data.draw(AMOUNTS, label="amount"))


def _draw_new_rows(data: st.DataObject, model: Model, lo: int, hi: int) -> list[Values]:
    """Rows with keys that are not live: fresh keys or keys deleted earlier (re-inserts)."""
    n = data.draw(st.integers(lo, hi), label="new rows")
    out: list[Values] = []
    used: set[int] = set()
    for _ in range(n):
        dead = [k for k in model.dead_keys if k not in used]
        if dead and data.draw(st.sampled_from([True, True, False]), label="re-use a deleted key"):
            k = data.draw(st.sampled_from(dead), label="deleted key")
        else:
            k = model.fresh_key()
        used.add(k)
        out.append(_draw_values(data, k))
    return out


# ------------------------------------------------------------------ writes


def _after_commit(table: lineage.Table, model: Model, ci: lineage.CommitInfo, new_live: dict[int, list] | None) -> None:
    """Check the commit against the model's expectation and record the new state."""
    if new_live is None:
        assert not ci.committed, f"expected a no-op (nothing matched) but got {ci}"
        assert ci.version == model.version, "a write that matched nothing must not make a version"
        assert table.version == model.version
        return
    assert ci.committed, f"expected a commit, got {ci}"
    assert ci.version == model.version + 1, f"{ci} after version {model.version}"
    model.live = new_live
    # learn row ids of inserted rows from a scan, by key (keys are unique among live rows)
    got = table.scan().to_pylist()
    by_key = {r["id"]: r for r in got}
    assert len(by_key) == len(got), "duplicate keys in scan"
    assert set(by_key) == set(model.live), f"scan keys {sorted(by_key)} != model keys {sorted(model.live)}"
    for k, entry in model.live.items():
        r = by_key[k]
        assert tuple(r[c] for c in DATA_COLS) == entry[1], f"key {k}: scan {r} vs model {entry}"
        assert (r["_row_created_at_version"], r["_row_last_updated_at_version"]) == (entry[2], entry[3]), f"key {k}: {r} vs {entry}"
        if entry[0] is None:
            assert r["_row_id"] not in model.seen_row_ids, f"inserted row {r} re-uses a row id"
            entry[0] = r["_row_id"]
            model.seen_row_ids.add(entry[0])
        else:
            assert r["_row_id"] == entry[0], f"row id of key {k} changed: {r} vs {entry}"
    model.states.append({e[0]: (e[1], e[2], e[3]) for e in model.live.values()})
    model.ts.append(ci.timestamp)
    assert table.version == model.version == ci.version


def _copy_live(model: Model) -> dict[int, list]:
    return {k: list(e) for k, e in model.live.items()}


def _step(data: st.DataObject, table: lineage.Table, model: Model, first: bool = False) -> None:
    v = model.version + 1  # the version this write gets if it commits
    kinds = ["update", "delete", "upsert", "append", "update", "upsert", "delete"]
    kind = "append" if first or not model.live else data.draw(st.sampled_from(kinds), label="operation")
    new_live: dict[int, list] | None = None
    if kind == "append":
        rows = _draw_new_rows(data, model, 2 if first else 0, 4)
        desc = f"append {rows}"
        if rows:
            new_live = _copy_live(model)
            for r in rows:
                new_live[r[0]] = [None, r, v, v]
                model.ever_keys.add(r[0])
        ci = table.append(_batch(rows))
    elif kind == "delete":
        sql, pred = data.draw(st.sampled_from(PREDICATES), label="where")
        mode = data.draw(MODES, label="mode")
        desc = f"delete where {sql!r} mode={mode}"
        matched = [k for k, e in model.live.items() if pred(e[1], e[2], e[3])]
        if matched:
            new_live = {k: list(e) for k, e in model.live.items() if k not in matched}
        ci = table.delete(sql, mode=mode)
    elif kind == "update":
        sql, pred = data.draw(st.sampled_from(PREDICATES), label="where")
        sets, setter = data.draw(st.sampled_from(SETTERS), label="set")
        mode = data.draw(MODES, label="mode")
        desc = f"update where {sql!r} set {sets} mode={mode}"
        matched = [k for k, e in model.live.items() if pred(e[1], e[2], e[3])]
        if matched:
            new_live = _copy_live(model)
            for k in matched:
                e = new_live[k]
                new_live[k] = [e[0], setter(e[1]), e[2], v]
        ci = table.update(sql, sets, mode=mode)
    else:
        live = sorted(model.live)
        existing = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=min(3, len(live))), label="keys") if live else []
        rows = []
        for k in existing:
            if data.draw(st.booleans(), label="same values"):
                rows.append(model.live[k][1])
            else:
                rows.append(_draw_values(data, k))
        rows += _draw_new_rows(data, model, 0 if existing else 1, 2)
        skip = data.draw(st.booleans(), label="skip_unchanged")
        mode = data.draw(MODES, label="mode")
        desc = f"upsert {rows} skip_unchanged={skip} mode={mode}"
        cand = _copy_live(model)
        changed = False
        for r in rows:
            k = r[0]
            if k in cand:
                if skip and cand[k][1] == r:
                    continue
                cand[k] = [cand[k][0], r, cand[k][2], v]
            else:
                cand[k] = [None, r, v, v]
                model.ever_keys.add(k)
            changed = True
        if changed:
            new_live = cand
        ci = table.upsert(_batch(rows), skip_unchanged=skip, mode=mode)
    note(f"v{model.version}: {desc} -> committed={ci.committed} version={ci.version}")
    model.ops.append(desc)
    event(f"op: {kind}" + ("" if new_live is not None else " matching nothing"))
    if "copy-on-write" in desc:
        event("copy-on-write write")
    _after_commit(table, model, ci, new_live)


# ------------------------------------------------------------------ expected feeds


def _changed(pre: Values, post: Values, cols: list[str]) -> list[str]:
    return [c for c in cols if pre[DATA_COLS.index(c)] != post[DATA_COLS.index(c)]]


def _out(values: Values, cols: list[str], change_type: str, version: int, ts: _dt.datetime, rid: int, created: int,
         updated: int, changed: list[str] | None) -> tuple:
    data = tuple(values[DATA_COLS.index(c)] for c in cols)
    return data + (change_type, version, ts, rid, created, updated, None if changed is None else tuple(changed))


def expected_per_version(model: Model, a: int, b: int, cols: list[str] = DATA_COLS) -> list[tuple]:
    out = []
    for v in range(a + 1, b + 1):
        prev, cur, ts = model.states[v - 1], model.states[v], model.ts[v]
        for rid, (vals, cre, upd) in cur.items():
            if rid not in prev:
                assert cre == upd == v
                out.append(_out(vals, cols, "insert", v, ts, rid, cre, upd, None))
            elif upd == v:
                pvals, pcre, pupd = prev[rid]
                assert pupd < v and pcre == cre
                changed = _changed(pvals, vals, cols)
                out.append(_out(pvals, cols, "update_preimage", v, ts, rid, pcre, pupd, changed))
                out.append(_out(vals, cols, "update_postimage", v, ts, rid, cre, upd, changed))
            else:
                assert prev[rid] == cur[rid]
        for rid, (pvals, pcre, pupd) in prev.items():
            if rid not in cur:
                out.append(_out(pvals, cols, "delete", v, ts, rid, pcre, pupd, None))
    return out


def _last_change(model: Model, rid: int, a: int, b: int) -> int:
    last = None
    for v in range(a + 1, b + 1):
        p, c = model.states[v - 1].get(rid), model.states[v].get(rid)
        if p != c:
            last = v
    assert last is not None
    return last


def expected_net(model: Model, a: int, b: int, cols: list[str] = DATA_COLS) -> list[tuple]:
    out = []
    sa, sb = model.states[a], model.states[b]
    for rid in set(sa) | set(sb):
        if rid in sa and rid in sb:
            (pvals, pcre, pupd), (vals, cre, upd) = sa[rid], sb[rid]
            changed = _changed(pvals, vals, cols)
            if not changed:
                continue
            v = _last_change(model, rid, a, b)
            out.append(_out(pvals, cols, "update_preimage", v, model.ts[v], rid, pcre, pupd, changed))
            out.append(_out(vals, cols, "update_postimage", v, model.ts[v], rid, cre, upd, changed))
        elif rid in sb:
            vals, cre, upd = sb[rid]
            v = _last_change(model, rid, a, b)
            out.append(_out(vals, cols, "insert", v, model.ts[v], rid, cre, upd, None))
        else:
            pvals, pcre, pupd = sa[rid]
            v = _last_change(model, rid, a, b)
            out.append(_out(pvals, cols, "delete", v, model.ts[v], rid, pcre, pupd, None))
    return out


def expected_deleted(model: Model, a: int, b: int, cols: list[str] = DATA_COLS) -> list[tuple]:
    out = []
    for v in range(a + 1, b + 1):
        prev, cur = model.states[v - 1], model.states[v]
        for rid, (vals, cre, upd) in prev.items():
            if rid not in cur:
                data = tuple(vals[DATA_COLS.index(c)] for c in cols)
                out.append(data + (v, model.ts[v], rid, cre, upd))
    return out


# ------------------------------------------------------------------ comparison


def _canon(tbl: pa.Table, names: list[str]) -> list[tuple]:
    assert tbl.column_names == names, f"output columns {tbl.column_names}, expected {names}"
    out = []
    for r in tbl.to_pylist():
        out.append(tuple(tuple(r[c]) if isinstance(r[c], list) else r[c] for c in names))
    return out


def _assert_multiset(got: list[tuple], want: list[tuple], what: str) -> None:
    g, w = Counter(got), Counter(want)
    if g != w:
        missing = sorted((w - g).elements(), key=repr)
        extra = sorted((g - w).elements(), key=repr)
        raise AssertionError(f"{what}:\n  missing (expected, not returned): {missing}\n  unexpected (returned, not expected): {extra}")


def _features(model: Model) -> None:
    """Hypothesis events (see --hypothesis-show-statistics) for the situations the property must reach."""
    n = model.version
    updates: Counter[int] = Counter()
    for row in expected_per_version(model, 0, n):
        kind, rid, changed = row[len(DATA_COLS)], row[len(DATA_COLS) + 3], row[-1]
        if kind == "update_postimage":
            updates[rid] += 1
            if changed == ():
                event("update that changed nothing (_changed_columns == [])")
            elif len(changed) < len(DATA_COLS) - 1:
                event("update changing some columns only")
    if any(c >= 2 for c in updates.values()):
        event("row updated several times")
    seen_keys: dict[int, set[int]] = {}
    for state in model.states:
        for rid, (vals, _, _) in state.items():
            seen_keys.setdefault(vals[0], set()).add(rid)
    if any(len(r) > 1 for r in seen_keys.values()):
        event("key deleted then re-inserted (new row id)")
    for a in range(n + 1):
        for b in range(a, n + 1):
            sa, sb = model.states[a], model.states[b]
            if any(r in sb and sa[r][0] == sb[r][0] and sa[r] != sb[r] for r in sa):
                event("net: row updated in range but equal at both ends (dropped)")
                return


def check_range(table: lineage.Table, model: Model, a: int, b: int) -> None:
    names = DATA_COLS + CHANGE_COLS
    got = _canon(cdf.changes(table, a, b), names)
    _assert_multiset(got, expected_per_version(model, a, b), f"changes({a}, {b}) per-version")
    got_net = _canon(cdf.changes(table, a, b, net=True), names)
    _assert_multiset(got_net, expected_net(model, a, b), f"changes({a}, {b}, net=True)")
    for r in got_net:
        assert a < r[len(DATA_COLS) + 1] <= b, f"net _commit_version outside ({a}, {b}]: {r}"
    # the streamed feed is the same table, row for row (parts of a few rows: pairs at the part bounds)
    for net in (False, True):
        whole = cdf.changes(table, a, b, net=net)
        streamed = cdf.change_batches(table, a, b, net=net, batch_rows=1 + (a + b) % 3).read_all()
        assert streamed.equals(whole), f"change_batches({a}, {b}, net={net}) differs from changes()"
        by_bytes = cdf.change_batches(table, a, b, net=net, batch_bytes=150 * (1 + (a * b) % 7)).read_all()  # parts of ~1-7 rows
        assert by_bytes.equals(whole), f"change_batches({a}, {b}, net={net}) in parts cut by bytes differs from changes()"
    got_del = _canon(cdf.deleted_rows(table, since=a, until=b), DATA_COLS + DELETED_COLS)
    _assert_multiset(got_del, expected_deleted(model, a, b), f"deleted_rows(since={a}, until={b})")
    if a == b:
        assert not got and not got_net and not got_del, f"empty range ({a}, {b}] must give no rows"


def check_timestamp_form(table: lineage.Table, model: Model, a: int, b: int) -> None:
    """``changes(from_timestamp=ts[a], to_timestamp=ts[b])`` is ``changes(a, b)`` (checked against the model by check_range)."""
    names = DATA_COLS + CHANGE_COLS
    for net, expected in ((False, expected_per_version), (True, expected_net)):
        by_ts = _canon(cdf.changes(table, from_timestamp=model.ts[a], to_timestamp=model.ts[b], net=net), names)
        _assert_multiset(by_ts, expected(model, a, b), f"changes(from_timestamp=ts[{a}], to_timestamp=ts[{b}], net={net})")


# ------------------------------------------------------------------ the property

PROPERTY_SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _run_property(data: st.DataObject, partition_by: list[str] | None, server=None) -> None:  # noqa: ANN001
    # Half the tables capture pre-images in the deleted-rows index; the feed must be the same either way.
    capture = data.draw(st.booleans(), label="capture pre-images")
    event("pre-image capture" if capture else "pointers only")
    with temp_lake(server, "cdf-prop-") as lake:
        table = lineage.create_table("shop.orders", SCHEMA, key=["id"], partition_by=partition_by,
                                     properties={"lineage.cdf.capture-preimages": str(capture).lower()}, **lake.where())
        model = Model()
        for i in range(data.draw(st.integers(4, 10), label="steps")):
            _step(data, table, model, first=i == 0)
        n = model.version
        note(f"versions 0..{n}; commit timestamps {model.ts}")
        _features(model)
        pairs = {(0, n), (n, n)}
        if n >= 1:
            v = data.draw(st.integers(1, n), label="single version")
            pairs.add((v - 1, v))
            a = data.draw(st.integers(0, n), label="a == b")
            pairs.add((a, a))
        for _ in range(2):
            a = data.draw(st.integers(0, n), label="a")
            b = data.draw(st.integers(a, n), label="b")
            pairs.add((a, b))
        for a, b in sorted(pairs):
            check_range(table, model, a, b)
        ts_pairs = {(0, n), data.draw(st.sampled_from(sorted(pairs)), label="timestamp pair")}
        for a, b in sorted(ts_pairs):
            check_timestamp_form(table, model, a, b)


@settings(max_examples=25, **PROPERTY_SETTINGS)
@given(data=st.data())
def test_cdf_matches_model(data: st.DataObject) -> None:
    _run_property(data, None)


@settings(max_examples=6, **PROPERTY_SETTINGS)
@given(data=st.data())
def test_cdf_matches_model_partitioned(data: st.DataObject) -> None:
    _run_property(data, ["bucket(4, id)"])


@settings(max_examples=S3_PROPERTY_EXAMPLES, phases=S3_PHASES, **PROPERTY_SETTINGS)
@given(data=st.data())
def test_cdf_matches_model_on_s3(moto_server, data: st.DataObject) -> None:  # noqa: ANN001
    _run_property(data, None, moto_server)


# ------------------------------------------------------------------ focused examples


def _create(warehouse: str, **kw: object) -> lineage.Table:
    return lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse, **kw)


def _live_ids(table: lineage.Table) -> dict[int, int]:
    return {r["id"]: r["_row_id"] for r in table.scan().to_pylist()}


def test_row_updated_twice_gives_two_update_pairs(warehouse: str) -> None:
    t = _create(warehouse)
    c1 = t.append(_batch([(1, 1, "a", 0.5), (2, 1, "a", 0.5)]))
    c2 = t.append(_batch([(3, 2, "b", 1.0)]))
    c3 = t.update("id = 1", {"qty": "CAST(2 AS BIGINT)"})
    c4 = t.update("id = 2", {"amount": "amount"})  # changes nothing
    c5 = t.update("id = 1", {"name": "'b'", "amount": "CAST(1.5 AS DOUBLE)"})
    c6 = t.append(_batch([(4, 3, None, None)]))
    assert [c.version for c in (c1, c2, c3, c4, c5, c6)] == [1, 2, 3, 4, 5, 6]
    ids = _live_ids(t)
    r1, r2, r3, r4 = ids[1], ids[2], ids[3], ids[4]
    names = DATA_COLS + CHANGE_COLS
    got = _canon(cdf.changes(t, 1, 6), names)
    want = [
        (3, 2, "b", 1.0, "insert", 2, c2.timestamp, r3, 2, 2, None),
        (1, 1, "a", 0.5, "update_preimage", 3, c3.timestamp, r1, 1, 1, ("qty",)),
        (1, 2, "a", 0.5, "update_postimage", 3, c3.timestamp, r1, 1, 3, ("qty",)),
        (2, 1, "a", 0.5, "update_preimage", 4, c4.timestamp, r2, 1, 1, ()),
        (2, 1, "a", 0.5, "update_postimage", 4, c4.timestamp, r2, 1, 4, ()),
        (1, 2, "a", 0.5, "update_preimage", 5, c5.timestamp, r1, 1, 3, ("name", "amount")),
        (1, 2, "b", 1.5, "update_postimage", 5, c5.timestamp, r1, 1, 5, ("name", "amount")),
        (4, 3, None, None, "insert", 6, c6.timestamp, r4, 6, 6, None),
    ]
    _assert_multiset(got, want, "changes(1, 6)")
    # net: one pair for row 1 (state 1 -> state 6); row 2's no-op update vanishes
    got_net = _canon(cdf.changes(t, 1, 6, net=True), names)
    want_net = [
        (3, 2, "b", 1.0, "insert", 2, c2.timestamp, r3, 2, 2, None),
        (1, 1, "a", 0.5, "update_preimage", 5, c5.timestamp, r1, 1, 1, ("qty", "name", "amount")),
        (1, 2, "b", 1.5, "update_postimage", 5, c5.timestamp, r1, 1, 5, ("qty", "name", "amount")),
        (4, 3, None, None, "insert", 6, c6.timestamp, r4, 6, 6, None),
    ]
    _assert_multiset(got_net, want_net, "changes(1, 6, net=True)")
    # from 0: row 1 is an insert with its image at 6
    got0 = [r for r in _canon(cdf.changes(t, 0, 6, net=True), names) if r[len(DATA_COLS) + 3] == r1]
    assert got0 == [(1, 2, "b", 1.5, "insert", 5, c5.timestamp, r1, 1, 5, None)]
    # to_version defaults to the current version
    _assert_multiset(_canon(cdf.changes(t, 1), names), want, "changes(1)")
    # empty range
    for v in range(7):
        assert cdf.changes(t, v, v).num_rows == 0
        assert cdf.changes(t, v, v, net=True).num_rows == 0


def test_columns_restricts_data_columns(warehouse: str) -> None:
    t = _create(warehouse)
    t.append(_batch([(1, 1, "a", 0.5), (2, 2, "b", 1.0)]))
    c2 = t.update("id = 1", {"name": "'b'"})  # a column outside the selection
    c3 = t.update("id = 2", {"amount": "CAST(1.5 AS DOUBLE)", "name": "'a'"})
    t.delete("id = 1")
    full = cdf.changes(t, 1, 4)
    sel = ["id", "amount"]
    got = cdf.changes(t, 1, 4, columns=sel)
    assert got.column_names == sel + CHANGE_COLS
    assert got.schema.field("amount").type == pa.float64()
    # the same rows as the full feed, projected; _changed_columns only names selected columns
    projected = []
    for r in full.to_pylist():
        cc = r["_changed_columns"]
        r["_changed_columns"] = None if cc is None else [c for c in cc if c in sel]
        projected.append(tuple(tuple(r[c]) if isinstance(r[c], list) else r[c] for c in sel + CHANGE_COLS))
    _assert_multiset(_canon(got, sel + CHANGE_COLS), projected, "changes(columns=['id', 'amount'])")
    ids = _live_ids(t)
    pre_post = [r for r in got.to_pylist() if r["_commit_version"] == c3.version]
    assert {r["_change_type"] for r in pre_post} == {"update_preimage", "update_postimage"}
    assert all(r["_changed_columns"] == ["amount"] and r["_row_id"] == ids[2] for r in pre_post)
    v2 = [r for r in got.to_pylist() if r["_commit_version"] == c2.version]
    assert len(v2) == 2 and all(r["_changed_columns"] == [] for r in v2)
    # net over a selected column change keeps only the selected columns
    net = cdf.changes(t, 2, 3, net=True, columns=["amount"])
    assert net.column_names == ["amount"] + CHANGE_COLS
    assert sorted((r["_change_type"], r["amount"], tuple(r["_changed_columns"])) for r in net.to_pylist()) == [
        ("update_postimage", 1.5, ("amount",)),
        ("update_preimage", 1.0, ("amount",)),
    ]
    # deleted_rows honours columns too
    d = cdf.deleted_rows(t, since=0, columns=["name"])
    assert d.column_names == ["name"] + DELETED_COLS
    assert [(r["name"], r["_row_deleted_at_version"]) for r in d.to_pylist()] == [("b", 4)]


def test_reinserted_key_gets_new_row_id_in_feed(warehouse: str) -> None:
    t = _create(warehouse)
    t.append(_batch([(1, 1, "a", 0.5)]))
    old = _live_ids(t)[1]
    c2 = t.delete("id = 1")
    nothing = t.delete("id = 1")  # matches nothing: no version
    assert not nothing.committed and nothing.version == 2 and t.version == 2
    c3 = t.append(_batch([(1, 1, "a", 0.5)]))  # same key, same values
    new = _live_ids(t)[1]
    assert new != old
    names = DATA_COLS + CHANGE_COLS
    want = [
        (1, 1, "a", 0.5, "delete", 2, c2.timestamp, old, 1, 1, None),
        (1, 1, "a", 0.5, "insert", 3, c3.timestamp, new, 3, 3, None),
    ]
    _assert_multiset(_canon(cdf.changes(t, 1, 3), names), want, "changes(1, 3)")
    # net is keyed by row id: a delete and an insert, never an update pair
    _assert_multiset(_canon(cdf.changes(t, 1, 3, net=True), names), want, "changes(1, 3, net=True)")
    d = _canon(cdf.deleted_rows(t, since=0, until=3), DATA_COLS + DELETED_COLS)
    assert d == [(1, 1, "a", 0.5, 2, c2.timestamp, old, 1, 1)]
    assert cdf.deleted_rows(t, since=2, until=3).num_rows == 0
    assert _canon(cdf.deleted_rows(t), DATA_COLS + DELETED_COLS) == d  # since defaults to the retention window (all)


def test_key_update_keeps_row_id(warehouse: str) -> None:
    t = _create(warehouse)
    t.append(_batch([(1, 1, "a", 0.5), (2, 2, "b", 1.0)]))
    rid = _live_ids(t)[1]
    c2 = t.update("id = 1", {"id": "id + 100"}, mode="copy-on-write")
    assert _live_ids(t)[101] == rid
    names = DATA_COLS + CHANGE_COLS
    want = [
        (1, 1, "a", 0.5, "update_preimage", 2, c2.timestamp, rid, 1, 1, ("id",)),
        (101, 1, "a", 0.5, "update_postimage", 2, c2.timestamp, rid, 1, 2, ("id",)),
    ]
    _assert_multiset(_canon(cdf.changes(t, 1, 2), names), want, "changes(1, 2)")
    _assert_multiset(_canon(cdf.changes(t, 1, 2, net=True), names), want, "changes(1, 2, net=True)")
    assert cdf.deleted_rows(t, since=0).num_rows == 0
