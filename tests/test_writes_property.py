"""Property-based tests of the write path against a plain in-memory model.

Hypothesis draws short sequences of writes (append, delete, update, upsert,
each merge-on-read by default or copy-on-write per call) and after every
step we check, against a Python model of the table:

* ``scan()`` returns exactly the model's rows;
* ``_row_id`` is unique, a surviving row keeps its id forever, and a newly
  inserted row (also one re-using a deleted key) gets an id never seen before;
* ``_row_created_at_version`` / ``_row_last_updated_at_version`` follow
  DESIGN.md section 3;
* the returned ``CommitInfo`` (committed flag, version, counts, files) is
  right, and a write that matches nothing makes no version;
* pyiceberg's and DuckDB's own readers see the same rows (``assert_interop``);
* the snapshot summary is truthful: its totals equal what the manifests hold;
* ``scan(as_of=v)`` for an earlier version returns the model's state at ``v``.

The same property runs over an unpartitioned table, a ``bucket(4, id)`` one
(both with ``write.delete.granularity`` drawn from unset / file / partition, and
unset with a file-scoped limit of 1) and one
identity-partitioned on ``name`` (so updates move rows between partitions)
with ``write.delete.granularity=partition``; a tiny
``write.target-file-size-bytes`` is drawn too, so writes span several files. The ``grouped-*``
configurations run deletes and updates a group of data files of at most two rows at a time
(``LINEAGE_WRITE_GROUP_ROWS``, :mod:`lineage.writes.grouped`), locally and on S3.
Set ``LINEAGE_PROPERTY_EXAMPLES`` to run more examples than the default 15.
"""

from __future__ import annotations

import io as _io
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SCHEMA, assert_interop
from lakes import S3_PHASES, S3_PROPERTY_EXAMPLES, temp_lake
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pyiceberg.manifest import DataFileContent, ManifestContent

import lineage
from lineage.storage.deletes import read_position_deletes, referenced_data_path
from lineage.writes.grouped import ENV_GROUP_ROWS

# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class Row:
    """One live row of the model (the key is the dict key)."""

    name: str | None
    amount: float | None
    row_id: int | None  # None until the first scan after its insert reveals it
    created: int
    updated: int


@dataclass(frozen=True)
class Expected:
    """What a write must report."""

    committed: bool
    inserted: int = 0
    updated: int = 0
    deleted: int = 0


@dataclass
class Model:
    """The table as plain Python: live rows by key, plus every committed version's rows."""

    live: dict[int, Row] = field(default_factory=dict)
    version: int = 0
    next_key: int = 1
    ever_keys: set[int] = field(default_factory=set)
    seen_row_ids: set[int] = field(default_factory=set)
    states: dict[int, dict[int, Row]] = field(default_factory=lambda: {0: {}})
    commits: list[tuple[int, str, int, int, int]] = field(default_factory=list)

    @property
    def dead_keys(self) -> list[int]:
        return sorted(self.ever_keys - set(self.live))

    def fresh_key(self) -> int:
        k = self.next_key
        self.next_key += 1
        return k

    def _commit(self, operation: str, exp: Expected) -> None:
        self.version += 1
        self.commits.append((self.version, operation, exp.inserted, exp.updated, exp.deleted))

    # Each apply_* mutates the model only when the write must commit.
    def apply_insert_rows(self, rows: list[tuple[int, str | None, float | None]], v: int) -> None:
        for k, name, amount in rows:
            assert k not in self.live
            self.live[k] = Row(name, amount, None, v, v)
            self.ever_keys.add(k)

    def apply_append(self, rows: list[tuple[int, str | None, float | None]]) -> Expected:
        if not rows:
            return Expected(False)
        exp = Expected(True, inserted=len(rows))
        self.apply_insert_rows(rows, self.version + 1)
        self._commit("append", exp)
        return exp

    def apply_delete(self, pred: Callable[[int, Row], bool]) -> Expected:
        matched = [k for k, r in self.live.items() if pred(k, r)]
        if not matched:
            return Expected(False)
        for k in matched:
            del self.live[k]
        exp = Expected(True, deleted=len(matched))
        self._commit("delete", exp)
        return exp

    def apply_update(self, pred: Callable[[int, Row], bool], setter: Callable[[int, Row], tuple]) -> Expected:
        matched = [k for k, r in self.live.items() if pred(k, r)]
        if not matched:
            return Expected(False)
        v = self.version + 1
        for k in matched:
            name, amount = setter(k, self.live[k])
            self.live[k] = replace(self.live[k], name=name, amount=amount, updated=v)
        exp = Expected(True, updated=len(matched))
        self._commit("update", exp)
        return exp

    def apply_upsert(self, rows: list[tuple[int, str | None, float | None]], skip_unchanged: bool) -> Expected:
        v = self.version + 1
        updates, inserts = [], []
        for k, name, amount in rows:
            if k in self.live:
                old = self.live[k]
                if skip_unchanged and (old.name, old.amount) == (name, amount):
                    continue
                updates.append((k, name, amount))
            else:
                inserts.append((k, name, amount))
        if not updates and not inserts:
            return Expected(False)
        for k, name, amount in updates:
            self.live[k] = replace(self.live[k], name=name, amount=amount, updated=v)
        self.apply_insert_rows(inserts, v)
        exp = Expected(True, inserted=len(inserts), updated=len(updates))
        self._commit("upsert", exp)
        return exp


# ------------------------------------------------- predicates and expressions


def _gt(x: float | None, y: float) -> bool:
    return x is not None and x > y


# (SQL predicate, the same predicate in Python with SQL's NULL semantics)
PREDICATES: list[tuple[str, Callable[[int, Row], bool]]] = [
    ("id % 3 = 1", lambda k, r: k % 3 == 1),
    ("amount > 0.5", lambda k, r: _gt(r.amount, 0.5)),
    ("name = 'x'", lambda k, r: r.name == "x"),
    ("name IS NULL", lambda k, r: r.name is None),
    ("id < 0", lambda k, r: False),  # matches nothing
    ("name = 'no such name'", lambda k, r: False),  # matches nothing, prunable by statistics
    ("amount IS NULL OR amount <= 0.25", lambda k, r: r.amount is None or r.amount <= 0.25),
    ("id IN (1, 2, 3, 5, 8, 13)", lambda k, r: k in (1, 2, 3, 5, 8, 13)),
    ("name <> 'x' AND amount < 1", lambda k, r: r.name is not None and r.name != "x" and r.amount is not None and r.amount < 1),
    ("name LIKE 'x%'", lambda k, r: r.name is not None and r.name.startswith("x")),
    ("amount = 0.75", lambda k, r: r.amount == 0.75),
    ("_row_last_updated_at_version > _row_created_at_version", lambda k, r: r.updated > r.created),
    ("_row_created_at_version <= 2", lambda k, r: r.created <= 2),
    ("TRUE", lambda k, r: True),
]


def _opt(f: Callable, x: object) -> object:
    return None if x is None else f(x)


# (SET mapping of SQL expressions, the new (name, amount) in Python)
SETTERS: list[tuple[dict[str, str], Callable[[int, Row], tuple]]] = [
    ({"amount": "amount"}, lambda k, r: (r.name, r.amount)),  # changes nothing, still an update
    ({"id": "id", "name": "name"}, lambda k, r: (r.name, r.amount)),  # changes nothing either
    ({"amount": "amount + 1"}, lambda k, r: (r.name, _opt(lambda a: a + 1, r.amount))),
    ({"amount": "amount * 2"}, lambda k, r: (r.name, _opt(lambda a: a * 2, r.amount))),
    ({"amount": "-amount"}, lambda k, r: (r.name, _opt(lambda a: -a, r.amount))),
    ({"name": "'x'"}, lambda k, r: ("x", r.amount)),
    ({"name": "name || 'z'"}, lambda k, r: (_opt(lambda n: n + "z", r.name), r.amount)),
    ({"name": "upper(name)", "amount": "coalesce(amount, 0.5)"}, lambda k, r: (_opt(str.upper, r.name), 0.5 if r.amount is None else r.amount)),
    ({"name": "CAST(NULL AS VARCHAR)"}, lambda k, r: (None, r.amount)),
    ({"amount": "1.5"}, lambda k, r: (r.name, 1.5)),  # a DECIMAL literal into a DOUBLE column
    ({"amount": "NULL"}, lambda k, r: (r.name, None)),
    ({"name": "NULL", "amount": "0"}, lambda k, r: (None, 0.0)),
    ({"name": "CASE WHEN amount > 0.5 THEN 'big' ELSE name END"}, lambda k, r: ("big" if _gt(r.amount, 0.5) else r.name, r.amount)),
]

NAMES = st.sampled_from(["x", "y", "z", None])
AMOUNTS = st.sampled_from([0.25, 0.5, 0.75, 1.0, None])
MODES = st.sampled_from([None, lineage.MERGE_ON_READ, lineage.COPY_ON_WRITE])


def _batch(rows: list[tuple[int, str | None, float | None]]) -> pa.Table:
    return pa.table(
        {"id": [r[0] for r in rows], "name": [r[1] for r in rows], "amount": [r[2] for r in rows]},
        schema=SCHEMA,
    )


def _draw_new_rows(data: st.DataObject, model: Model, min_size: int, max_size: int) -> list[tuple]:
    """Rows with keys that are not live: fresh ones, or keys deleted earlier."""
    n = data.draw(st.integers(min_size, max_size), label="new rows")
    rows: list[tuple] = []
    used: set[int] = set()
    for _ in range(n):
        dead = [k for k in model.dead_keys if k not in used]
        if dead and data.draw(st.booleans(), label="re-use a deleted key"):
            k = data.draw(st.sampled_from(dead), label="deleted key")
        else:
            k = model.fresh_key()
        used.add(k)
        rows.append((k, data.draw(NAMES, label="name"), data.draw(AMOUNTS, label="amount")))
    return rows


# ------------------------------------------------------------------ checks


def _check_scan(table: lineage.Table, model: Model) -> None:
    """Current scan equals the model; learns the row ids of new rows."""
    got = table.scan().to_pylist()
    # The streamed scan reads the same files a few at a time (groups of ~4 KiB of Parquet, batches of 3 rows).
    streamed = [row for batch in table.scan_batches(batch_rows=3, group_bytes=4096) for row in batch.to_pylist()]
    by_row_id = lambda r: r["_row_id"]  # noqa: E731
    assert sorted(streamed, key=by_row_id) == sorted(got, key=by_row_id), "scan_batches() differs from scan()"
    keys = [r["id"] for r in got]
    assert len(set(keys)) == len(keys), f"duplicate keys in scan: {sorted(keys)}"
    rids = [r["_row_id"] for r in got]
    assert len(set(rids)) == len(rids), f"duplicate _row_id in scan: {sorted(rids)}"
    assert set(keys) == set(model.live), f"keys differ: scan {sorted(keys)}, model {sorted(model.live)}"
    learned = {}
    for r in got:
        m = model.live[r["id"]]
        assert (r["name"], r["amount"]) == (m.name, m.amount), f"values of key {r['id']}: {r} vs model {m}"
        assert r["_row_created_at_version"] == m.created, f"created version of key {r['id']}: {r} vs model {m}"
        assert r["_row_last_updated_at_version"] == m.updated, f"updated version of key {r['id']}: {r} vs model {m}"
        if m.row_id is None:
            assert r["_row_id"] not in model.seen_row_ids, f"new row {r} re-uses a row id seen before"
            learned[r["id"]] = r["_row_id"]
        else:
            assert r["_row_id"] == m.row_id, f"row id of key {r['id']} changed from {m.row_id}: {r}"
    for k, rid in learned.items():
        model.live[k] = replace(model.live[k], row_id=rid)
        model.seen_row_ids.add(rid)


def _check_as_of(table: lineage.Table, model: Model, version: int) -> None:
    want = {k: (r.name, r.amount, r.row_id, r.created, r.updated) for k, r in model.states[version].items()}
    got_rows = table.scan(as_of=version).to_pylist()
    got = {
        r["id"]: (r["name"], r["amount"], r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"])
        for r in got_rows
    }
    assert len(got) == len(got_rows), f"as_of={version}: duplicate keys"
    assert got == want, f"scan(as_of={version}) differs from the model's state at that version"


def _read_delete_pairs(table: lineage.Table, path: str, referenced: str | None = None) -> list[tuple[str, int]]:
    if path.endswith(".puffin"):  # deletion vectors (Iceberg v3): one Puffin file holds a commit's vectors, an entry names one
        return [(p, int(pos)) for p, positions in read_position_deletes(path).items() if p == referenced for pos in positions]
    with table.iceberg.io.new_input(path).open() as f:
        t = pq.read_table(_io.BytesIO(f.read()))
    return list(zip(t.column("file_path").to_pylist(), t.column("pos").to_pylist(), strict=True))


def _check_summary(table: lineage.Table, model: Model, ci: lineage.CommitInfo, exp: Expected, mode: str | None) -> None:
    """The current snapshot's summary matches its manifests; the last commit's counters match the CommitInfo."""
    ice = table.iceberg
    snap = ice.metadata.current_snapshot()
    if model.version == 0:
        assert snap is None
        return
    assert snap is not None and snap.sequence_number == model.version
    props = snap.summary.additional_properties
    assert props.get("lineage.version") == str(model.version)

    data_files = delete_files = position_deletes = records = 0
    live_data: dict[str, int] = {}
    delete_paths = []
    for manifest in snap.manifests(ice.io):
        for entry in manifest.fetch_manifest_entry(ice.io, discard_deleted=True):
            df = entry.data_file
            if manifest.content == ManifestContent.DELETES:
                assert df.content == DataFileContent.POSITION_DELETES, f"unexpected delete file content {df.content}"
                delete_files += 1
                position_deletes += df.record_count
                delete_paths.append((df.file_path, referenced_data_path(df)))
            else:
                assert df.content == DataFileContent.DATA
                data_files += 1
                records += df.record_count
                live_data[df.file_path] = df.record_count

    def total(name: str) -> int:
        return int(props.get(name, "0"))

    assert total("total-data-files") == data_files, f"summary {props} but manifests hold {data_files} data files"
    assert total("total-delete-files") == delete_files, f"summary {props} but manifests hold {delete_files} delete files"
    assert total("total-position-deletes") == position_deletes, f"summary {props} but manifests hold {position_deletes} position deletes"
    assert total("total-records") == records, f"summary {props} but live data files hold {records} records"
    assert total("total-equality-deletes") == 0

    # Delete files: record counts are exact, no position is deleted twice, and
    # live rows = records of live data files - positions deleted in them.
    pairs: list[tuple[str, int]] = []
    for path, referenced in delete_paths:
        got = _read_delete_pairs(table, path, referenced)
        pairs.extend(got)
    assert len(pairs) == position_deletes, "delete file record_count does not match the rows in the file"
    effective = [p for p in pairs if p[0] in live_data]
    assert len(set(effective)) == len(effective), "a position is deleted twice"
    assert all(0 <= pos < live_data[path] for path, pos in effective), "a position delete points past the end of its file"
    assert records - len(effective) == len(model.live)

    if not ci.committed:
        return
    assert ci.snapshot_id == snap.snapshot_id
    assert total("added-data-files") == ci.data_files_added
    assert total("added-delete-files") == ci.delete_files_added
    assert total("deleted-data-files") == ci.data_files_removed
    removed_images = exp.deleted + exp.updated
    effective_mode = mode or lineage.MERGE_ON_READ
    if effective_mode == lineage.MERGE_ON_READ:
        # data files leave only when small ones are folded: their kept rows move into a new file
        assert not ci.data_files_removed or ci.data_files_added > 0
        # a new vector (v3) or merged position delete file (v2) also holds the positions of the file it replaces
        assert total("added-position-deletes") >= removed_images
        if table.iceberg.metadata.properties.get("lineage.write.delete.merge") == "false" and not ci.data_files_removed:
            assert total("added-position-deletes") == removed_images
        assert ci.delete_files_added == 0 or removed_images > 0
        assert ci.delete_files_added > 0 or removed_images == 0 or ci.data_files_removed > 0
    else:
        assert ci.delete_files_added == 0
        assert total("added-position-deletes") == 0
        assert (ci.data_files_removed > 0) == (removed_images > 0)
    if exp.inserted + exp.updated:
        assert ci.data_files_added > 0
    elif effective_mode == lineage.MERGE_ON_READ:
        assert ci.data_files_added == 0


def _check_commit(table: lineage.Table, model: Model, before: int, ci: lineage.CommitInfo, exp: Expected, operation: str) -> None:
    assert isinstance(ci, lineage.CommitInfo)
    assert ci.operation == operation
    assert ci.committed == exp.committed, f"committed={ci.committed}, model expects {exp}"
    if exp.committed:
        assert ci.version == before + 1 == model.version
        assert (ci.inserted, ci.updated, ci.deleted) == (exp.inserted, exp.updated, exp.deleted), f"{ci} vs model {exp}"
    else:
        assert ci.version == before == model.version, "a write that matched nothing must not make a version"
        assert (ci.inserted, ci.updated, ci.deleted) == (0, 0, 0)
        assert (ci.data_files_added, ci.delete_files_added, ci.data_files_removed) == (0, 0, 0)
    assert table.version == model.version


# ------------------------------------------------------------------ the property

# partition_by, and the write.delete.granularity values to draw from (None: unset, file-scoped files up to
# lineage.write.delete.file-scoped-limit data files per partition and commit, one partition-scoped file beyond).
CONFIGS: dict[str, tuple[list[str] | None, list[str | None]]] = {
    "unpartitioned": (None, [None, "file", "partition"]),
    "bucket": (["bucket(4, id)"], [None, "file", "partition"]),
    "identity-granularity-partition": (["name"], ["partition"]),
    # Iceberg format version 3: deletes are deletion vectors, and assert_interop checks the native row lineage too
    "v3-unpartitioned": (None, [None]),
    "v3-identity": (["name"], [None]),
    # Deletes and updates a group of data files at a time (lineage.writes.grouped): groups of at most two rows
    "grouped-bucket": (["bucket(4, id)"], [None, "file", "partition"]),
    "grouped-v3-unpartitioned": (None, [None]),
}
GROUPED = "grouped-"
# A tiny target file size makes every write split its rows over several data files.
TARGET_FILE_SIZES = [None, "64"]

# Each step costs about half a second (assert_interop alone loads DuckDB's
# iceberg extension); LINEAGE_PROPERTY_EXAMPLES raises the budget for a deeper hunt.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "15")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _step(data: st.DataObject, table: lineage.Table, model: Model) -> None:
    before = model.version
    kind = data.draw(st.sampled_from(["append", "delete", "update", "upsert"]), label="operation")
    mode = None
    if kind == "append":
        rows = _draw_new_rows(data, model, 0, 4)
        note(f"v{before}: append {rows}")
        ci = table.append(_batch(rows))
        exp = model.apply_append(rows)
    elif kind == "delete":
        sql, pred = data.draw(st.sampled_from(PREDICATES), label="where")
        mode = data.draw(MODES, label="mode")
        note(f"v{before}: delete where {sql!r} mode={mode}")
        ci = table.delete(sql, mode=mode)
        exp = model.apply_delete(pred)
    elif kind == "update":
        sql, pred = data.draw(st.sampled_from(PREDICATES), label="where")
        sets, setter = data.draw(st.sampled_from(SETTERS), label="set")
        mode = data.draw(MODES, label="mode")
        note(f"v{before}: update where {sql!r} set {sets} mode={mode}")
        ci = table.update(sql, sets, mode=mode)
        exp = model.apply_update(pred, setter)
    else:
        live = sorted(model.live)
        existing = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=min(4, len(live))), label="keys") if live else []
        rows = []
        for k in existing:
            if data.draw(st.booleans(), label="same values"):
                rows.append((k, model.live[k].name, model.live[k].amount))
            else:
                rows.append((k, data.draw(NAMES, label="name"), data.draw(AMOUNTS, label="amount")))
        rows += _draw_new_rows(data, model, 0, 3)
        rows = data.draw(st.permutations(rows), label="batch order")
        skip = data.draw(st.booleans(), label="skip_unchanged")
        mode = data.draw(MODES, label="mode")
        note(f"v{before}: upsert {rows} skip_unchanged={skip} mode={mode}")
        ci = table.upsert(_batch(rows), skip_unchanged=skip, mode=mode)
        exp = model.apply_upsert(rows, skip)
    note(f"  -> {ci}")

    _check_commit(table, model, before, ci, exp, kind)
    _check_scan(table, model)
    model.states[model.version] = dict(model.live)
    assert_interop(table)
    _check_summary(table, model, ci, exp, mode)
    earlier = data.draw(st.sampled_from(sorted(model.states)), label="as_of")
    _check_as_of(table, model, earlier)


@pytest.mark.parametrize("config", list(CONFIGS))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_writes_match_model(config: str, data: st.DataObject) -> None:
    _writes_match_model(config, data, None)


@pytest.mark.parametrize("config", ["unpartitioned", "bucket", "v3-unpartitioned", "grouped-bucket", "grouped-v3-unpartitioned"])
@settings(PROPERTY_SETTINGS, max_examples=S3_PROPERTY_EXAMPLES, phases=S3_PHASES)
@given(data=st.data())
def test_writes_match_model_on_s3(moto_server, config: str, data: st.DataObject) -> None:  # noqa: ANN001
    _writes_match_model(config, data, moto_server)


def _writes_match_model(config: str, data: st.DataObject, server) -> None:  # noqa: ANN001
    partition_by, granularities = CONFIGS[config]
    properties = {}
    granularity = data.draw(st.sampled_from(granularities), label="write.delete.granularity")
    if granularity is not None:
        properties["write.delete.granularity"] = granularity
    else:
        limit = data.draw(st.sampled_from([None, "1"]), label="lineage.write.delete.file-scoped-limit")
        if limit is not None:
            properties["lineage.write.delete.file-scoped-limit"] = limit
    target = data.draw(st.sampled_from(TARGET_FILE_SIZES), label="write.target-file-size-bytes")
    if target is not None:
        properties["write.target-file-size-bytes"] = target
    note(f"table: partition_by={partition_by} properties={properties}")
    group_rows = {ENV_GROUP_ROWS: "2"} if config.startswith(GROUPED) else {}
    with temp_lake(server, "lineage-prop-") as lake, mock.patch.dict(os.environ, group_rows):
        table = lineage.create_table("shop.orders", SCHEMA, key=["id"], partition_by=partition_by, properties=properties,
                                     format_version=3 if config.removeprefix(GROUPED).startswith("v3") else None, **lake.where())
        model = Model()
        for _ in range(data.draw(st.integers(3, 7), label="steps")):
            _step(data, table, model)
        history = [(c.version, c.operation, c.inserted, c.updated, c.deleted) for c in table.history()]
        assert history == model.commits
        # A freshly opened handle sees the same table.
        again = lineage.open_table("shop.orders", **lake.where())
        assert again.version == model.version
        _check_scan(again, model)


# ------------------------------------------------------- literal SET values
# Plain literals are what users write first; SQL's UPDATE casts the value to
# the column's type on assignment, and so must update().


@pytest.mark.parametrize(
    "column, expression, expected",
    [("amount", "NULL", None), ("name", "NULL", None), ("amount", "0", 0.0), ("amount", "1.5", 1.5)],
)
def test_update_set_literal_takes_the_column_type(table: lineage.Table, column: str, expression: str, expected: object) -> None:
    table.append(_batch([(1, "x", 0.25), (2, "y", 0.5)]))
    ci = table.update("id = 1", {column: expression})
    assert ci.committed and ci.version == 2 and ci.updated == 1
    got = {r["id"]: r for r in table.scan().to_pylist()}
    assert got[1][column] == expected
    assert (got[1]["_row_id"], got[1]["_row_created_at_version"], got[1]["_row_last_updated_at_version"]) == (0, 1, 2)
    assert got[2] == {"id": 2, "name": "y", "amount": 0.5, "_row_id": 1, "_row_created_at_version": 1, "_row_last_updated_at_version": 1}
    assert_interop(table)


def test_partition_values_come_from_the_files_not_from_hive_like_paths(warehouse):
    # Iceberg partition folders look like Hive's (name=a+b/, name=null/, URL-encoded values); a reader that
    # took values from paths would turn None into 'null' or decode 'ü%20' wrongly.
    schema = pa.schema([pa.field("id", pa.int64(), False), ("name", pa.string()), ("n", pa.int64())])
    names = ["a b", "x=y", "p/q", None, "ü%20", "null"]
    t = lineage.create_table("p.hive", schema, key=["id"], partition_by=["name"], warehouse=warehouse)
    t.append(pa.table({"id": list(range(6)), "name": names, "n": list(range(6))}, schema=schema))
    t.update("name IS NULL OR name = 'null' OR id = 0", {"n": "n + 10"})
    t.merge(pa.table({"id": [1], "name": ["x=y"], "n": [21]}, schema=schema), deletes=pa.table({"id": [2]}))
    got = sorted(t.scan(columns=["id", "name", "n"]).to_pylist(), key=lambda r: r["id"])
    assert got == [
        {"id": 0, "name": "a b", "n": 10}, {"id": 1, "name": "x=y", "n": 21}, {"id": 3, "name": None, "n": 13},
        {"id": 4, "name": "ü%20", "n": 4}, {"id": 5, "name": "null", "n": 15},
    ]
    assert_interop(t)
