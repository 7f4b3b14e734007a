"""A bulk append into an empty keyed table leaves the key index to its first keyed use (``lineage.key-index.defer-rows``).

The append then commits no index (as a write path that does not know it
would); the next write that needs it builds it from one scan and commits it.
These tests pin that the deferral never changes what a write sees: key
checks, races, ``verify``, and the index the first keyed write commits.
"""

from __future__ import annotations

import importlib

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

import lineage
from conftest import SCHEMA
from index import key_segment
from index.key_index import PROP_DEFER_ROWS
from lineage.errors import InvalidArgumentError, KeyViolationError
from lineage.fileio import ImmutableFileCache
from lineage.maintenance import verify
from lineage.maintenance.key_index import check_key_index

commit_module = importlib.import_module("lineage.commit")


def _batch(ids: list[int], name: str = "x") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [name] * len(ids), "amount": [1.0] * len(ids)}, schema=SCHEMA)


def _table(warehouse: str, defer_rows: int | str, name: str = "s.t") -> lineage.Table:
    return lineage.create_table(name, SCHEMA, key=["id"], warehouse=warehouse, properties={PROP_DEFER_ROWS: str(defer_rows)})


def _consistent(t: lineage.Table) -> None:
    state = t.state()
    assert state.lineage.key_index is not None, "the table has no key index"
    problems, checked = check_key_index(state)
    assert not problems, problems
    assert checked["key_index_entries"] == t.count()


@pytest.fixture(autouse=True)
def _fresh_segment_cache(monkeypatch):
    monkeypatch.setattr(key_segment, "_CACHE", ImmutableFileCache(256))


def test_a_bulk_append_into_an_empty_table_defers_the_index_to_its_first_keyed_use(warehouse):
    t = _table(warehouse, 5)
    t.append(_batch(list(range(10))))
    assert t.state().lineage.key_index is None  # deferred: the commit names no index
    assert verify(t).ok
    with pytest.raises(KeyViolationError, match="already in the table"):
        t.append(_batch([3]))  # the check builds the index from a scan and finds the live key
    assert t.state().lineage.key_index is None and t.count() == 10  # a refused write commits nothing
    info = t.upsert(_batch([4, 20], "new"))
    assert (info.updated, info.inserted) == (1, 1)
    _consistent(t)  # the first keyed write committed the whole index
    rows = {r["id"]: r["name"] for r in t.scan().to_pylist()}
    assert rows[4] == "new" and rows[20] == "new" and rows[5] == "x"
    t.append(_batch(list(range(100, 110))))  # no longer empty: an ordinary keyed append, index kept
    _consistent(t)


def test_small_appends_and_defer_rows_zero_keep_the_index_eager(warehouse):
    small = _table(warehouse, 5, "s.small")
    small.append(_batch([1, 2, 3, 4]))  # under the threshold
    _consistent(small)
    never = _table(warehouse, 0, "s.never")
    never.append(_batch(list(range(50))))
    _consistent(never)
    default = lineage.create_table("s.default", SCHEMA, key=["id"], warehouse=warehouse)
    default.append(_batch(list(range(50))))  # the default threshold (100,000 rows) is far above
    _consistent(default)


def test_a_deferred_append_still_refuses_duplicate_and_null_keys(warehouse):
    t = _table(warehouse, 2)
    with pytest.raises(KeyViolationError, match="more than once"):
        t.append(_batch([1, 2, 2, 3]))
    with pytest.raises(KeyViolationError, match="null"):
        t.append(pa.table({"id": pa.array([1, None, 3], pa.int64()), "name": ["a"] * 3, "amount": [1.0] * 3}))
    assert t.version == 0 and t.count() == 0


def test_a_bad_defer_rows_property_is_refused_and_nothing_is_written(warehouse):
    for bad in ("many", "-1"):
        t = _table(warehouse, bad, f"s.bad{bad.strip('-')}")
        with pytest.raises(InvalidArgumentError, match=PROP_DEFER_ROWS):
            t.append(_batch([1, 2, 3]))
        assert t.count() == 0


def test_a_writer_racing_a_deferred_bulk_append_sees_its_keys(warehouse, monkeypatch):
    loser = _table(warehouse, 5)
    winner = lineage.open_table("s.t", warehouse=warehouse)
    real = commit_module.commit_files
    race = {"pending": True, "lost": 0}

    def racing(*args, **kwargs):
        if race["pending"]:
            race["pending"] = False
            winner.append(_batch(list(range(10)), "winner"))  # deferred, lands between the loser's plan and its commit
        try:
            return real(*args, **kwargs)
        except CommitFailedException:
            race["lost"] += 1
            raise

    monkeypatch.setattr(commit_module, "commit_files", racing)
    with pytest.raises(KeyViolationError, match="7"):
        loser.append(_batch([7], "loser"))  # planned on the empty table; the re-plan builds the winner's index
    assert race["lost"] == 1
    assert winner.state().lineage.key_index is None and winner.count() == 10
    loser.append(_batch([70], "loser"))
    _consistent(loser)
