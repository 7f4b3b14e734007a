"""Property-based tests of change-stream ingest against a plain Python model.

Hypothesis draws sequences of steps on a small keyed table: change-stream
batches (``apply_changelog`` in strict and upsert mode, merge-on-read or
copy-on-write, with Flink and Debezium codes, several events per key, and sometimes an event that breaks
strict mode), interleaved with ``upsert``, ``delete``, ``update``,
``compact``, ``expire_snapshots`` and ``vacuum``, with or without pre-image
capture (``lineage.cdf.capture-preimages``). The model applies each
batch's events one by one to a dict (the obvious, slow definition of the
semantics) and after every step we check:

* ``scan()`` equals the model, with row ids kept for every key live before
  and after a step and a fresh row id for every new row;
* the returned ``CommitInfo`` (committed, version, inserted/updated/deleted/
  ignored), and that a rejected batch changed nothing;
* the per-version change feed of every version so far, and the net feed
  from a random earlier version, equal the model's;
* the key index is kept by every commit (never dropped) and equals a fresh
  rebuild from a scan of the key columns;
* the key lookup used by writes (``live_images_for_keys``, through the key
  index and through the key scan, with and without column values) agrees
  with the table for every key ever used, live or not.

Set ``LINEAGE_PROPERTY_EXAMPLES`` to run more examples than the default.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pytest
from conftest import SCHEMA
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import cdf
import lineage
from index.key_index import KeyIndex
from lineage import duck
from lineage.maintenance.key_index import check_key_index
from lineage.writes.live_images import live_images_for_keys

KEYS = list(range(1, 9))
NAMES = st.sampled_from(["x", "y", None])
AMOUNTS = st.sampled_from([0.5, 1.0, 2.0, None])
POSITIVE = {"+I", "+U", "u", "c", "r", "INSERT", "UPDATE_AFTER"}


@dataclass(frozen=True)
class Row:
    """A live row of the model."""

    name: str | None
    amount: float | None
    row_id: int | None  # None until the scan after its insert reveals it
    created: int
    updated: int


@dataclass
class Model:
    """Live rows by key, each version's rows, and each version's expected change events."""

    live: dict[int, Row] = field(default_factory=dict)
    version: int = 0
    seen_row_ids: set[int] = field(default_factory=set)
    states: dict[int, dict[int, Row]] = field(default_factory=lambda: {0: {}})
    # per version: (change type, key, name, amount, key whose row id it is) — row ids resolved after the scan
    feeds: dict[int, list[tuple]] = field(default_factory=dict)

    def commit(self, new_live: dict[int, Row], feed: list[tuple]) -> None:
        self.version += 1
        self.live = new_live
        self.feeds[self.version] = feed


def _image(r: Row) -> tuple:
    return (r.name, r.amount)


def _net_of_batch(model: Model, events: list[tuple], upsert: bool) -> tuple[dict[int, tuple | None], int] | None:
    """Apply events one by one; the end state of each touched key and the ignored count, or None if strict mode refuses."""
    state: dict[int, tuple | None] = {}
    ignored = 0
    for op, k, name, amount in events:
        cur = state[k] if k in state else (_image(model.live[k]) if k in model.live else None)
        if op in POSITIVE:
            if not upsert and op in ("+I", "+U", "c", "r", "INSERT", "UPDATE_AFTER") and cur is not None:
                return None
            if not upsert and op == "u" and cur is None:
                return None
            state[k] = (name, amount)
        else:
            if cur is None:
                if not upsert:
                    return None
                ignored += 1
            elif not upsert and op in ("-U", "UPDATE_BEFORE") and cur != (name, amount):
                return None
            state[k] = None
    return state, ignored


def _apply_net(model: Model, net: dict[int, tuple | None]) -> tuple[dict[int, Row], list[tuple], int, int, int]:
    v = model.version + 1
    new_live = dict(model.live)
    feed: list[tuple] = []
    ins = upd = dele = 0
    for k, end in net.items():
        old = model.live.get(k)
        if old is not None and end is not None:
            new_live[k] = replace(old, name=end[0], amount=end[1], updated=v)
            feed += [("update_preimage", k, *_image(old)), ("update_postimage", k, *end)]
            upd += 1
        elif old is None and end is not None:
            new_live[k] = Row(end[0], end[1], None, v, v)
            feed.append(("insert", k, *end))
            ins += 1
        elif old is not None and end is None:
            del new_live[k]
            feed.append(("delete", k, *_image(old)))
            dele += 1
    return new_live, feed, ins, upd, dele


# ---------------------------------------------------------------- drawing batches


def _draw_events(data: st.DataObject, model: Model, upsert: bool) -> list[tuple]:
    """A batch; in strict mode mostly valid against the running state, sometimes with one bad event."""
    n = data.draw(st.integers(1, 10), label="events")
    state = {k: _image(r) for k, r in model.live.items()}
    events: list[tuple] = []
    break_at = data.draw(st.one_of(st.none(), st.integers(0, n - 1)), label="bad event at") if not upsert else None
    for i in range(n):
        k = data.draw(st.sampled_from(KEYS), label="key")
        cur = state.get(k)
        img = (data.draw(NAMES, label="name"), data.draw(AMOUNTS, label="amount"))
        if upsert:
            op = data.draw(st.sampled_from(["+I", "-U", "+U", "-D", "c", "u", "d", "r"]), label="op")
        elif i == break_at:
            bad = ["+I", "+U"] if cur is not None else ["-D", "-U", "u"]
            if cur is not None:
                bad.append("-U*")
            op = data.draw(st.sampled_from(bad), label="bad op")
            if op == "-U*":
                op, img = "-U", (cur[0], 7.0)  # an image that differs from the live row
        elif cur is not None:
            op = data.draw(st.sampled_from(["-U", "-D", "d", "u", "UPDATE_BEFORE"]), label="op")
            if op in ("-U", "UPDATE_BEFORE"):
                img = cur
                events.append((op, k, *img))
                state[k] = None
                if data.draw(st.booleans(), label="pair with +U"):
                    img = (data.draw(NAMES), data.draw(AMOUNTS))
                    events.append(("+U", k, *img))
                    state[k] = img
                continue
        else:
            op = data.draw(st.sampled_from(["+I", "c", "r", "+U", "INSERT"]), label="op")
        events.append((op, k, *img))
        state[k] = img if op in POSITIVE else None
    return events


def _batch(events: list[tuple]) -> pa.Table:
    return pa.table(
        {
            "_op": [e[0] for e in events],
            "id": pa.array([e[1] for e in events], pa.int64()),
            "name": pa.array([e[2] for e in events], pa.string()),
            "amount": pa.array([e[3] for e in events], pa.float64()),
        }
    )


# ---------------------------------------------------------------- checks


def _check_scan(t: lineage.Table, model: Model) -> None:
    got = t.scan().to_pylist()
    assert sorted(r["id"] for r in got) == sorted(model.live), "live keys differ from the model"
    for r in got:
        m = model.live[r["id"]]
        assert (r["name"], r["amount"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) == (
            m.name, m.amount, m.created, m.updated
        ), f"key {r['id']}: {r} vs model {m}"
        if m.row_id is None:
            assert r["_row_id"] not in model.seen_row_ids, f"new row {r} re-uses a row id"
            model.live[r["id"]] = replace(m, row_id=r["_row_id"])
            model.seen_row_ids.add(r["_row_id"])
        else:
            assert r["_row_id"] == m.row_id, f"row id of key {r['id']} changed: {r} vs {m}"
    model.states[model.version] = dict(model.live)


def _row_id_at(model: Model, key: int, version: int, change: str) -> int:
    """The row id a feed row refers to: the image live before (pre/delete) or after (insert/post) the version."""
    state = model.states[version - 1] if change in ("update_preimage", "delete") else model.states[version]
    return state[key].row_id  # type: ignore[return-value]


def _check_feeds(t: lineage.Table, model: Model, net_from: int) -> None:
    want = sorted(
        (v, c, k, n, a, _row_id_at(model, k, v, c)) for v, feed in model.feeds.items() for (c, k, n, a) in feed
    )
    got = cdf.changes(t, 0).to_pylist()
    got = sorted((r["_commit_version"], r["_change_type"], r["id"], r["name"], r["amount"], r["_row_id"]) for r in got)
    assert got == want, "per-version change feed differs from the model"

    a, b = model.states[net_from], model.states[model.version]
    a_ids = {r.row_id: (k, r) for k, r in a.items()}
    b_ids = {r.row_id: (k, r) for k, r in b.items()}
    want_net = []
    for rid in a_ids.keys() | b_ids.keys():
        if rid in a_ids and rid in b_ids:
            (k, ra), (_, rb) = a_ids[rid], b_ids[rid]
            if _image(ra) != _image(rb):
                want_net += [("update_preimage", k, *_image(ra), rid), ("update_postimage", k, *_image(rb), rid)]
        elif rid in a_ids:
            k, ra = a_ids[rid]
            want_net.append(("delete", k, *_image(ra), rid))
        else:
            k, rb = b_ids[rid]
            want_net.append(("insert", k, *_image(rb), rid))
    got_net = cdf.changes(t, net_from, net=True).to_pylist()
    got_net = sorted((r["_change_type"], r["id"], r["name"], r["amount"], r["_row_id"]) for r in got_net)
    assert got_net == sorted(want_net), f"net change feed from version {net_from} differs from the model"


def _check_key_index(t: lineage.Table, model: Model) -> None:
    """The key index survived every step (no write dropped it) and equals a fresh rebuild from a key scan."""
    state = t.state()
    if model.version:
        assert state.lineage.key_index is not None, "a commit dropped the key index"
    problems, _ = check_key_index(state)
    assert not problems, problems


def _check_key_lookup(t: lineage.Table, model: Model, data: st.DataObject) -> None:
    """Both ways of the key lookup used by writes (key index, key scan) agree with the model, with and without values."""
    state = t.state()
    values = data.draw(st.booleans(), label="lookup with values")
    want = {k: (r.row_id, r.created, r.updated, *((r.name, r.amount) if values else ())) for k, r in model.live.items()}
    where: dict[str, dict[int, tuple[str, int]]] = {}
    for index in (KeyIndex.open(state, build=False), None):
        con = duck.connect()
        try:
            con.register("probe", pa.table({"id": pa.array(KEYS, pa.int64())}))
            live = live_images_for_keys(state, con, "probe", ["id"], values=values, index=index)
        finally:
            con.close()
        found = live.images.to_pylist()
        got = {
            r["id"]: (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"], *((r["name"], r["amount"]) if values else ()))
            for r in found
        }
        how = "key index" if index is not None else "key scan"
        assert len(got) == len(found), f"the lookup by {how} found two live images of one key"
        assert got == want, f"the lookup by {how} disagrees with the table"
        where[how] = {r["id"]: (live.files[r["__file_id"]].path, r["__pos"]) for r in found}
    if len(where) == 2:
        assert where["key index"] == where["key scan"], "the two lookups point at different images"


# ---------------------------------------------------------------- steps


def _step_changelog(t: lineage.Table, model: Model, data: st.DataObject) -> None:
    upsert = data.draw(st.booleans(), label="upsert mode")
    mode = data.draw(st.sampled_from([None, lineage.COPY_ON_WRITE]), label="mode")
    events = _draw_events(data, model, upsert)
    note(f"apply_changelog(upsert={upsert}, mode={mode}): {events}")
    outcome = _net_of_batch(model, events, upsert)
    before = t.version
    if outcome is None:
        with pytest.raises(lineage.KeyViolationError):
            t.apply_changelog(_batch(events), upsert=upsert, mode=mode)
        assert t.version == before, "a rejected batch committed"
        return
    net, ignored = outcome
    new_live, feed, ins, upd, dele = _apply_net(model, net)
    info = t.apply_changelog(_batch(events), upsert=upsert, mode=mode)
    assert (info.inserted, info.updated, info.deleted, info.ignored) == (ins, upd, dele, ignored), info
    assert info.committed == bool(feed), info
    if feed:
        assert info.version == model.version + 1
        model.commit(new_live, feed)


def _step_upsert(t: lineage.Table, model: Model, data: st.DataObject) -> None:
    keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True), label="upsert keys")
    rows = [(k, data.draw(NAMES), data.draw(AMOUNTS)) for k in keys]
    note(f"upsert {rows}")
    t.upsert(pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows], "amount": [r[2] for r in rows]}, schema=SCHEMA))
    net = {k: (n, a) for k, n, a in rows}
    new_live, feed, *_ = _apply_net(model, net)
    model.commit(new_live, feed)


def _step_delete(t: lineage.Table, model: Model, data: st.DataObject) -> None:
    r = data.draw(st.integers(0, 2), label="delete id % 3 =")
    note(f"delete id % 3 = {r}")
    info = t.delete(f"id % 3 = {r}")
    net = {k: None for k in model.live if k % 3 == r}
    if net:
        new_live, feed, *_ = _apply_net(model, net)
        model.commit(new_live, feed)
    assert info.committed == bool(net)


def _step_update(t: lineage.Table, model: Model, data: st.DataObject) -> None:
    r = data.draw(st.integers(0, 1), label="update id % 2 =")
    note(f"update amount = 3.0 where id % 2 = {r}")
    info = t.update(f"id % 2 = {r}", {"amount": "3.0"})
    net = {k: (row.name, 3.0) for k, row in model.live.items() if k % 2 == r}
    if net:
        new_live, feed, *_ = _apply_net(model, net)
        model.commit(new_live, feed)
    assert info.committed == bool(net)


def _step_maintenance(t: lineage.Table, model: Model, data: st.DataObject) -> None:
    op = data.draw(st.sampled_from(["compact", "expire", "vacuum"]), label="maintenance")
    note(op)
    if op == "compact":
        t.compact()
    elif op == "expire":
        t.expire_snapshots(retain_last=1)
    else:
        t.vacuum(older_than=_dt.timedelta(0))
    while model.version < t.version:  # maintenance versions have no change events
        model.commit(dict(model.live), [])
        model.states[model.version] = dict(model.live)


STEPS = [_step_changelog, _step_changelog, _step_changelog, _step_upsert, _step_delete, _step_update, _step_maintenance]


@settings(
    max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_changelog_matches_model(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """Random change-stream batches interleaved with other writes and maintenance agree with the model at every step."""
    wh = str(tmp_path_factory.mktemp("wh"))
    capture = data.draw(st.booleans(), label="capture pre-images")
    properties = {"lineage.cdf.capture-preimages": str(capture).lower()}
    if data.draw(st.booleans(), label="row groups of 2 rows"):  # key lookups read only the row groups that hold an image
        properties["write.parquet.row-group-limit"] = "2"
    t = lineage.create_table("s.cl", SCHEMA, key=["id"], warehouse=wh, properties=properties)
    model = Model()
    for _ in range(data.draw(st.integers(2, 7), label="steps")):
        step = data.draw(st.sampled_from(STEPS), label="step")
        step(t, model, data)
        assert t.version == model.version
        _check_scan(t, model)
        _check_key_index(t, model)
        _check_key_lookup(t, model, data)
        net_from = data.draw(st.integers(0, model.version), label="net from")
        _check_feeds(t, model, net_from)
