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
