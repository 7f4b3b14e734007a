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
