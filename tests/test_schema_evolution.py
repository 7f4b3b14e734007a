"""Schema evolution: files written under an older schema are read by field id wherever data files are read."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.types import DoubleType, LongType, StringType

import cdf
import lineage
from conftest import assert_interop, evolve_schema

BASE = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                  pa.field("qty", pa.int32()), pa.field("amount", pa.float32())])
FIRST = pa.table({"id": [1, 2, 3, 4], "name": ["a", "b", "c", "d"], "qty": pa.array([1, 2, 3, 4], pa.int32()),
                  "amount": pa.array([1.5, 2.5, 3.5, 4.5], pa.float32())}, schema=BASE)

EVOLUTIONS = {
    "add": lambda u: u.add_column("note", StringType()),
    "rename": lambda u: u.rename_column("name", "label"),
    "widen": lambda u: (u.update_column("qty", LongType()), u.update_column("amount", DoubleType())),
    "drop": lambda u: u.delete_column("name"),
}


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("change", sorted(EVOLUTIONS))
def test_purge_of_a_file_written_before_a_schema_change(tmp_path, version, change):
    """A purge copies a file written under the older schema with the current columns (read by field id): before,
    it read the file by the current column names and failed with ArrowInvalid after an added or renamed column."""
    t = lineage.create_table("s.t", BASE, key=["id"], warehouse=str(tmp_path / "wh"), format_version=version)
    t.append(FIRST)
    with evolve_schema(t) as u:
        EVOLUTIONS[change](u)
    before = {r["id"]: r for r in t.scan(with_lineage=False).to_pylist()}
    assert t.purge("id = 2").version is not None
    del before[2]
    assert {r["id"]: r for r in t.scan(with_lineage=False).to_pylist()} == before
    assert_interop(t)
    feed = cdf.changes(t, 0, t.version)
    purged = [r for r in feed.to_pylist() if r["_row_id"] == 1]
    assert purged and all(r["_purged"] for r in purged)
    assert all(r[c] is None for r in purged for c in t.arrow_schema.names if c != "id" and t.arrow_schema.field(c).nullable)


POINT = pa.struct([pa.field("a", pa.int64(), nullable=False)])
REQUIRED = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("r", pa.int64(), nullable=False),
                      pa.field("s", POINT, nullable=False), pa.field("o", POINT)])
NULL_SETS = [("r", "NULL"), ("r", "CASE WHEN id = 1 THEN NULL ELSE r END"), ("s", "NULL"),
             ("s", "{'a': NULL::BIGINT}"), ("o", "struct_pack(a := CAST(NULL AS BIGINT))")]


@pytest.mark.parametrize(("engine", "version"), [("duckdb", 2), ("duckdb", 3), ("spark", 3)])  # Spark's path is one for v2 and v3
def test_update_setting_a_required_value_to_null_is_refused(tmp_path, request, engine, version):
    """An update whose new image holds a null where the schema requires a value (a required column, a required
    struct, a required field of a struct) is a SchemaMismatchError naming the column, and the table is untouched.
    On Spark the executors found it and the driver raised Spark's own exception (and, for a struct field, the
    executors' Arrow cast failed first with ArrowInvalid)."""
    spark = request.getfixturevalue("spark") if engine == "spark" else None
    t = lineage.create_table("s.req", REQUIRED, key=["id"], warehouse=str(tmp_path / "wh"), format_version=version)
    t.append(pa.table({"id": [1, 2], "r": [1, 2], "s": [{"a": 1}, {"a": 2}], "o": [{"a": 1}, None]}, schema=REQUIRED))
    before, version_before = t.scan().sort_by("id"), t.version
    for column, expr in NULL_SETS:
        with pytest.raises(lineage.errors.SchemaMismatchError, match=f"column '{column}'"):
            t.update("id = 1", {column: expr}, engine=engine, spark=spark)
        t.refresh()
        assert t.version == version_before
        assert t.scan().sort_by("id").equals(before)
    t.update("id = 1", {"o": "NULL"}, engine=engine, spark=spark)  # the optional struct may be null
    assert t.scan(where="id = 1", with_lineage=False).to_pylist() == [{"id": 1, "r": 1, "s": {"a": 1}, "o": None}]


# ---------------------------------------------------------------------------------------------------------------
# Model-based: schema evolution interleaved with every write and maintenance operation, on v2 and v3.
#
# The model keeps each live row's values by Iceberg field id. The table, pyiceberg's and DuckDB's readers and the
# change feed show every image in the current schema: a column added after an image was written reads as null, a
# renamed column keeps its values, a promoted one reads as the wider type, a dropped one is gone.

import os  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

EVOLUTION_SETTINGS = settings(
    max_examples=int(os.environ.get("LINEAGE_EVOLUTION_EXAMPLES", "3")),
    stateful_step_count=int(os.environ.get("LINEAGE_EVOLUTION_STEPS", "8")),
    deadline=None,
    derandomize=os.environ.get("LINEAGE_EVOLUTION_RANDOM") is None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

Row = dict[int, object]  # field id -> value
SMALL = st.one_of(st.none(), st.integers(-3, 3))


class EvolvingTable(RuleBasedStateMachine):
    """Appends, deletes, updates, upserts, compaction, purge and schema changes against a model."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.TemporaryDirectory(prefix="lineage-evolve-")
        self.t: lineage.Table
        self.live: dict[int, tuple[int, Row]] = {}  # row id -> (updated version, values)
        self.states: dict[int, dict[int, tuple[int, Row]]] = {0: {}}  # version -> live rows after it
        self.keys: dict[int, int] = {}  # key -> row id of the live row
        self.next_key = 0
        self.purged: set[int] = set()

    @initialize(version=st.sampled_from([2, 3]))
    def create(self, version: int) -> None:
        schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("a", pa.int32()),
                            pa.field("f", pa.float32()), pa.field("s", pa.string())])
        self.t = lineage.create_table("s.evolving", schema, key=["id"], warehouse=self.dir.name, format_version=version)

    def teardown(self) -> None:
        self.dir.cleanup()

    # -- the current schema
    def _fields(self) -> list[tuple[str, int, pa.DataType]]:
        ice = self.t.iceberg.schema()
        arrow = self.t.arrow_schema
        return [(f.name, f.field_id, arrow.field(f.name).type) for f in ice.fields]

    def _value(self, dtype: pa.DataType, raw: int | None) -> object:
        if raw is None:
            return None
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            return f"v{raw}"
        if pa.types.is_floating(dtype):
            return raw + 0.5
        return raw

    def _rows(self, draw: st.DataObject, keys: list[int]) -> tuple[pa.Table, list[Row]]:
        fields = self._fields()
        rows: list[Row] = []
        for k in keys:
            row: Row = {}
            for name, fid, dtype in fields:
                row[fid] = k if name == "id" else self._value(dtype, draw.draw(SMALL))
            rows.append(row)
        table = pa.table({name: pa.array([r[fid] for r in rows], dtype) for name, fid, dtype in fields}, schema=self.t.arrow_schema)
        return table, rows

    def _committed(self, ci: lineage.CommitInfo | None) -> int | None:
        self.t.refresh()
        v = ci.version if ci is not None else None
        if v is not None:
            self.states[v] = dict(self.live)
        return v

    def _live_keys(self, draw: st.DataObject, most: int = 3) -> list[int]:
        if not self.keys:
            return []
        return draw.draw(st.lists(st.sampled_from(sorted(self.keys)), min_size=1, max_size=most, unique=True))

    # -- writes
    @rule(data=st.data(), n=st.integers(1, 4))
    def append(self, data: st.DataObject, n: int) -> None:
        keys = list(range(self.next_key, self.next_key + n))
        self.next_key += n
        batch, rows = self._rows(data, keys)
        before = set(r["_row_id"] for r in self.t.scan(columns=["_row_id"]).to_pylist())
        ci = self.t.append(batch)
        v = ci.version
        got = {r["id"]: r["_row_id"] for r in self.t.scan(columns=["id", "_row_id"]).to_pylist() if r["_row_id"] not in before}
        for k, row in zip(keys, rows, strict=True):
            self.keys[k] = got[k]
            self.live[got[k]] = (v, row)
        self._committed(ci)

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), cow=st.booleans())
    def delete(self, data: st.DataObject, cow: bool) -> None:
        keys = self._live_keys(data)
        ci = self.t.delete(f"id IN ({', '.join(map(str, keys))})", mode="copy-on-write" if cow else None)
        for k in keys:
            del self.live[self.keys.pop(k)]
        self._committed(ci)

    @precondition(lambda self: bool(self.keys) and len(self._fields()) > 1)
    @rule(data=st.data(), cow=st.booleans())
    def update(self, data: st.DataObject, cow: bool) -> None:
        keys = self._live_keys(data)
        name, fid, dtype = data.draw(st.sampled_from([f for f in self._fields() if f[0] != "id"]))
        raw = data.draw(SMALL)
        value = self._value(dtype, raw)
        literal = "NULL" if value is None else (f"'{value}'" if isinstance(value, str) else str(value))
        ci = self.t.update(f"id IN ({', '.join(map(str, keys))})", {name: literal}, mode="copy-on-write" if cow else None)
        v = ci.version
        for k in keys:
            rid = self.keys[k]
            self.live[rid] = (v, {**self.live[rid][1], fid: value})
        self._committed(ci)

    @rule(data=st.data())
    def upsert(self, data: st.DataObject) -> None:
        old = self._live_keys(data, 2)
        new = list(range(self.next_key, self.next_key + data.draw(st.integers(0, 2))))
        if not old and not new:
            return
        self.next_key += len(new)
        batch, rows = self._rows(data, old + new)
        before = set(r["_row_id"] for r in self.t.scan(columns=["_row_id"]).to_pylist())
        ci = self.t.upsert(batch)
        v = ci.version
        got = {r["id"]: r["_row_id"] for r in self.t.scan(columns=["id", "_row_id"]).to_pylist() if r["_row_id"] not in before}
        for k, row in zip(old + new, rows, strict=True):
            if k not in self.keys:
                self.keys[k] = got[k]
            self.live[self.keys[k]] = (v, row)
        self._committed(ci)

    @rule()
    def compact(self) -> None:
        res = self.t.compact(target_file_size_bytes=1 << 20, min_file_size_bytes=1 << 20)
        self._committed(res if res.version is not None else None)

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        keys = self._live_keys(data, 1)
        res = self.t.purge(f"id IN ({', '.join(map(str, keys))})")
        for k in keys:
            rid = self.keys.pop(k)
            del self.live[rid]
            self.purged.add(rid)
        self._committed(res)

    # -- schema changes
    @rule(kind=st.sampled_from(["string", "long"]))
    def add_column(self, kind: str) -> None:
        from pyiceberg.types import LongType

        name = f"c{len(self.t.iceberg.schema().fields)}_{self.t.iceberg.schema().highest_field_id}"
        with evolve_schema(self.t) as u:
            u.add_column(name, StringType() if kind == "string" else LongType())

    @precondition(lambda self: len(self._fields()) > 1)
    @rule(data=st.data())
    def rename_column(self, data: st.DataObject) -> None:
        name, fid, _ = data.draw(st.sampled_from([f for f in self._fields() if f[0] != "id"]))
        with evolve_schema(self.t) as u:
            u.rename_column(name, f"r{fid}_{len(self.t.iceberg.metadata.schemas)}")

    @precondition(lambda self: any(pa.types.is_int32(f[2]) or pa.types.is_float32(f[2]) for f in self._fields()))
    @rule(data=st.data())
    def widen(self, data: st.DataObject) -> None:
        name, _, dtype = data.draw(st.sampled_from([f for f in self._fields() if pa.types.is_int32(f[2]) or pa.types.is_float32(f[2])]))
        with evolve_schema(self.t) as u:
            u.update_column(name, LongType() if pa.types.is_int32(dtype) else DoubleType())

    @precondition(lambda self: len(self._fields()) > 2)
    @rule(data=st.data())
    def drop_column(self, data: st.DataObject) -> None:
        name, _, _ = data.draw(st.sampled_from([f for f in self._fields() if f[0] != "id"]))
        with evolve_schema(self.t) as u:
            u.delete_column(name)

    # -- checks
    def _render(self, rid: int, row: Row) -> tuple:
        if rid in self.purged:
            return tuple(None for _ in self._fields())
        return tuple(row.get(fid) for _, fid, _ in self._fields())

    @invariant()
    def scans_match_the_model(self) -> None:
        if not hasattr(self, "t"):
            return
        names = [n for n, _, _ in self._fields()]
        ours = self.t.scan()
        got = sorted((r["_row_id"], r["_row_last_updated_at_version"], tuple(r[n] for n in names)) for r in ours.to_pylist())
        want = sorted((rid, v, self._render(rid, row)) for rid, (v, row) in self.live.items())
        assert got == want, "our scan differs from the model"
        assert_interop(self.t)

    def _expected_feed(self, a: int, b: int) -> list[tuple]:
        versions = sorted(v for v in self.states if a < v <= b)
        out: list[tuple] = []
        prev = self.states[max(v for v in self.states if v <= a)]
        for v in versions:
            cur = self.states[v]
            for rid in prev.keys() - cur.keys():
                out.append(("delete", v, rid, self._render(rid, prev[rid][1])))
            for rid, (upd, row) in cur.items():
                if rid not in prev:
                    out.append(("insert", v, rid, self._render(rid, row)))
                elif prev[rid][0] != upd:
                    out.append(("update_preimage", v, rid, self._render(rid, prev[rid][1])))
                    out.append(("update_postimage", v, rid, self._render(rid, row)))
            prev = cur
        return sorted(out, key=repr)

    def _expected_net(self, a: int, b: int) -> list[tuple]:
        first = self.states[max(v for v in self.states if v <= a)]
        last = self.states[max(v for v in self.states if v <= b)]
        out: list[tuple] = []
        for rid in first.keys() - last.keys():
            out.append(("delete", rid, self._render(rid, first[rid][1])))
        for rid, (upd, row) in last.items():
            if rid not in first:
                out.append(("insert", rid, self._render(rid, row)))
            elif first[rid][0] != upd and self._render(rid, first[rid][1]) != self._render(rid, row):
                out.append(("update_preimage", rid, self._render(rid, first[rid][1])))
                out.append(("update_postimage", rid, self._render(rid, row)))
        return sorted(out, key=repr)

    def check_feed(self) -> None:
        names = [n for n, _, _ in self._fields()]
        b = self.t.version
        if not b:
            return
        feed = cdf.changes(self.t, 0, b).to_pylist()
        got = sorted(((r["_change_type"], r["_commit_version"], r["_row_id"], tuple(r[n] for n in names)) for r in feed), key=repr)
        assert got == self._expected_feed(0, b), "per-version feed differs from the model"
        for a in sorted({0, b // 2, b - 1}):
            net = cdf.changes(self.t, a, b, net=True).to_pylist()
            got = sorted(((r["_change_type"], r["_row_id"], tuple(r[n] for n in names)) for r in net), key=repr)
            assert got == self._expected_net(a, b), f"net feed ({a}, {b}] differs from the model"


def test_schema_evolution_matches_model() -> None:
    """Reads and the change feed after any interleaving of schema changes with writes and maintenance (v2, v3).

    ``LINEAGE_EVOLUTION_EXAMPLES`` and ``LINEAGE_EVOLUTION_STEPS`` raise the budget for a deeper hunt."""

    class Checked(EvolvingTable):
        def teardown(self) -> None:
            try:
                if hasattr(self, "t"):
                    self.check_feed()
            finally:
                super().teardown()

    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(Checked, settings=EVOLUTION_SETTINGS)


@pytest.mark.parametrize("key", [["id"], None])
def test_foreign_rewrite_of_a_file_written_before_a_rename_is_a_move(tmp_path, key):
    """pyiceberg's copy-on-write delete after a rename rewrites the kept rows under the new name: reconciling it
    reads the removed images by field id, so the kept rows pair as moves (same row ids, no event). Before, the
    renamed column read as null in the old file: keyed rows became updates, keyless ones delete + insert with
    new row ids."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    t = lineage.create_table("s.foreign", schema, key=key, warehouse=str(tmp_path / "wh"))
    t.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}, schema=schema))
    with evolve_schema(t) as u:
        u.rename_column("name", "label")
    t.iceberg.delete("id == 2")
    t.refresh()
    feed = cdf.changes(t, 1, t.version).to_pylist()
    assert [(r["_change_type"], r["id"], r["label"], r["_row_id"]) for r in feed] == [("delete", 2, "b", 1)]
    assert sorted((r["id"], r["label"], r["_row_id"]) for r in t.scan().to_pylist()) == [(1, "a", 0), (3, "c", 2)]


def test_equality_deletes_written_before_the_key_column_was_renamed(tmp_path):
    """Equality delete files and data files written before a rename of the key column are read by field id:
    before, every scan failed with ArrowInvalid (the delete file read by the key's current name)."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.float64())])
    t = lineage.create_table("s.eq", schema, key=["id"], warehouse=str(tmp_path / "wh"),
                             properties={"write.changelog.strategy": "equality"})

    def events(rows: list[tuple]) -> pa.Table:
        return pa.table({"_op": [r[0] for r in rows], "id": [r[1] for r in rows], "v": [r[2] for r in rows]})

    t.apply_changelog(events([("+I", 1, 1.0), ("+I", 2, 2.0), ("+I", 3, 3.0)]), upsert=True)
    t.apply_changelog(events([("+U", 1, 10.0), ("-D", 2, None)]), upsert=True)
    with evolve_schema(t) as u:
        u.rename_column("id", "key")
    want = [(1, 10.0), (3, 3.0)]
    assert sorted((r["key"], r["v"]) for r in t.scan().to_pylist()) == want
    feed = [(r["_change_type"], r["key"], r["v"]) for r in cdf.changes(t, 0, t.version).to_pylist()]
    assert sorted(feed, key=repr) == sorted([("insert", 1, 1.0), ("insert", 2, 2.0), ("insert", 3, 3.0), ("update_preimage", 1, 1.0),
                                             ("update_postimage", 1, 10.0), ("delete", 2, 2.0)], key=repr)
    t.convert_equality_deletes()
    assert sorted((r["key"], r["v"]) for r in t.scan().to_pylist()) == want
    assert_interop(t)


def test_purge_on_v3_after_a_delete_from_two_files(tmp_path):
    """Found by the model-based test: one delete from two data files writes one Puffin file with two vectors; a
    purge rewriting one of the files carried the other's vector over once per entry of that Puffin file and
    failed ("two deletion vectors for one data file"). Each data file's deletes are now carried once."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])
    t = lineage.create_table("s.p3", schema, key=["id"], warehouse=str(tmp_path / "wh"), format_version=3)
    t.append(pa.table({"id": [1, 2, 3], "v": [1, 2, 3]}, schema=schema))
    t.append(pa.table({"id": [4, 5, 6], "v": [4, 5, 6]}, schema=schema))
    t.delete("id IN (1, 4)")
    t.purge("id = 2")
    assert sorted(r["id"] for r in t.scan().to_pylist()) == [3, 5, 6]
    assert_interop(t)
