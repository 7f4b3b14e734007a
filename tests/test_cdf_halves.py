"""A large per-version feed computed as two feeds, one per half of its versions, in two threads.

The rows of a version never depend on another version's, so the feed over
``(a, b]`` is the feed over ``(a, m]`` followed by the one over ``(m, b]``.
Here the split is forced on small tables (``SPLIT_ROWS`` = 1) and every
range is compared, row for row and in order, with the feed computed whole;
a lost file is reported for the range asked, as without the split.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import cdf
import cdf.engine_duckdb as engine
import lineage
from cdf.plan import middle_version
from conftest import SCHEMA
from lineage.storage.commit_log import CommitEntry
from lineage.storage.fileio import local_path

CAPTURE = {"lineage.cdf.capture-preimages": "true"}


def _history(t: lineage.Table) -> None:
    t.append(pa.table({"id": list(range(12)), "name": list("abcdefabcdef"), "amount": [float(i) for i in range(12)]}, schema=SCHEMA))
    t.update("id % 3 = 0", {"amount": "amount + 100"})
    t.delete("id IN (1, 4)")
    t.update("id = 2", {"name": "'z'"}, mode="copy-on-write")
    t.merge(upserts=pa.table({"id": [3, 20], "name": ["u", "n"], "amount": [0.5, 2.0]}, schema=SCHEMA),
            deletes=pa.table({"id": [5]}))
    t.upsert(pa.table({"id": [3, 6, 21], "name": ["v", "w", "x"], "amount": [0.5, 7.0, 1.0]}, schema=SCHEMA))
    t.update("id = 7", {"amount": "amount"})  # an update that changes nothing


def _feed(t: lineage.Table, a: int, b: int, split: bool, columns: list[str] | None = None) -> pa.Table:
    saved = engine.SPLIT_ROWS
    engine.SPLIT_ROWS = 1 if split else 1 << 62
    try:
        return cdf.changes(t, a, b, columns=columns)
    finally:
        engine.SPLIT_ROWS = saved


@pytest.mark.parametrize("properties", [{}, CAPTURE], ids=["pointers", "captured"])
def test_halves_equal_the_whole_feed_for_every_range(warehouse, properties):
    t = lineage.create_table("s.halves", SCHEMA, key=["id"], warehouse=warehouse, properties=properties)
    _history(t)
    n = t.version
    split_somewhere = False
    for a in range(n):
        for b in range(a + 1, n + 1):
            for columns in (None, ["amount"]):
                whole = _feed(t, a, b, split=False, columns=columns)
                halves = _feed(t, a, b, split=True, columns=columns)
                assert halves.schema == whole.schema
                assert halves.combine_chunks().equals(whole.combine_chunks()), (a, b, columns)
                split_somewhere |= halves.column(0).num_chunks == 2
    assert split_somewhere  # the split did run


def test_a_lost_file_is_reported_for_the_range_asked(warehouse):
    t = lineage.create_table("s.lost", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1.0, 2.0]}, schema=SCHEMA))
    path = next(iter(t.state().files().files))
    t.iceberg.delete("id = 2")  # foreign copy-on-write: the file leaves the snapshot, the index points into it
    t.refresh()
    t.append(pa.table({"id": [3], "name": ["c"], "amount": [3.0]}, schema=SCHEMA))
    t.append(pa.table({"id": [4], "name": ["d"], "amount": [4.0]}, schema=SCHEMA))
    os.remove(local_path(path))
    assert middle_version(t.state().lineage.log.since(1), 1, 4, 1) is not None  # the split runs, and one half fails
    for split in (False, True):
        with pytest.raises(lineage.LostFileError, match=r"from version 1 to 4 needs row images removed at version\(s\) 2 "):
            _feed(t, 1, 4, split=split)


def _entry(version: int, inserted: int = 0, updated: int = 0, deleted: int = 0) -> CommitEntry:
    return CommitEntry(version=version, snapshot_id=version, timestamp_ms=0, operation="overwrite",
                       inserted=inserted, updated=updated, deleted=deleted)


def test_middle_version_halves_the_estimated_rows():
    log = [_entry(1, inserted=1000), _entry(2, updated=10), _entry(3, deleted=20), _entry(4, inserted=40), _entry(5, updated=20)]
    # rows in (1, 5]: 20 + 20 + 40 + 40 = 120; half reached at version 4 (80), the last version is never the middle
    assert middle_version(log, 1, 5, 100) == 4
    assert middle_version(log, 1, 5, 121) is None  # fewer rows than asked
    assert middle_version(log, 4, 5, 1) is None  # one version: nothing to split
    assert middle_version(log, 0, 2, 1) is None  # version 1 holds nearly every row: no gain
    assert middle_version(log, 2, 4, 1) == 3
