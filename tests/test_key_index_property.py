"""Property test: every write and maintenance path keeps the key index equal to a key scan.

Hypothesis draws sequences of appends, deletes, updates (of values and of
keys), upserts (with and without ``skip_unchanged``), merges, compaction,
rewrite_deletes, purge, reindex, key-index merges, snapshot expiry and
vacuum, each write merge-on-read or copy-on-write. Every step runs on two
tables: one with the key index, one with ``lineage.key-index.enabled=false``
(the key-scan path the library had before the index). After every step:

* ``verify``'s key index check finds no difference between the index and a
  scan of the key columns (every live key, right row id, file, position and
  versions; nothing extra), and the index exists (every path maintains it);
* both tables hold the same rows with the same versions (as the steps that
  made them: index maintenance commits exist on one table only), the writes
  report the same counts and fail the same way (the index changes cost, not
  results);
* row ids are unique and a key that was not deleted keeps its row id (an
  update of the key carries it to the new key);
* both match a plain dict model of the live keys.

The indexed table merges segments early (fanout 2, small writer limit, at
most 3 segments) so the policy's every branch runs, and some examples
narrow the key hash to 2 bits, so that every lookup and merge resolves hash
collisions. Set ``LINEAGE_PROPERTY_EXAMPLES`` for more examples than 10.
"""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow as pa
from conftest import SCHEMA, key_hash_mask
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import lineage
from index import key_hash
from lineage.errors import LineageError
from lineage.maintenance.key_index import check_key_index

KEYS = st.integers(0, 24)
MODES = st.sampled_from(["merge-on-read", "copy-on-write"])

OPS = st.one_of(
    st.tuples(st.just("append"), st.lists(KEYS, min_size=1, max_size=6, unique=True)),
    st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=5, unique=True), MODES),
    st.tuples(st.just("update"), st.lists(KEYS, min_size=1, max_size=5, unique=True), MODES),
    st.tuples(st.just("update_key"), st.lists(KEYS, min_size=1, max_size=3, unique=True), st.integers(1, 8), MODES),
    st.tuples(st.just("upsert"), st.lists(KEYS, min_size=1, max_size=8, unique=True), st.booleans(), MODES),
    st.tuples(st.just("merge"), st.lists(KEYS, max_size=5, unique=True), st.lists(KEYS, max_size=4, unique=True), MODES),
    st.tuples(st.just("compact")),
    st.tuples(st.just("rewrite_deletes")),
    st.tuples(st.just("purge"), KEYS),
    st.tuples(st.just("reindex")),
    st.tuples(st.just("merge_key_index"), st.booleans()),
    st.tuples(st.just("expire_vacuum")),
)


def _batch(keys: list[int], tag: str) -> pa.Table:
    return pa.table({"id": pa.array(keys, pa.int64()), "name": [f"{tag}{k}" for k in keys], "amount": [float(k) for k in keys]}, schema=SCHEMA)


def _in(keys: list[int]) -> str:
    return f"id IN ({', '.join(map(str, keys))})"


def _run(table: lineage.Table, op: tuple) -> object:
    """Apply one operation; return what it reported (or the error type)."""
    kind = op[0]
    try:
        if kind == "append":
            r = table.append(_batch(op[1], "a"))
        elif kind == "delete":
            r = table.delete(_in(op[1]), mode=op[2])
        elif kind == "update":
            r = table.update(_in(op[1]), {"amount": "amount + 1"}, mode=op[2])
        elif kind == "update_key":
            r = table.update(_in(op[1]), {"id": f"id + {op[2]}", "name": "'moved'"}, mode=op[3])
        elif kind == "upsert":
            # Unchanged values for even keys (so skip_unchanged has something to skip).
            batch = _batch(op[1], "u").to_pylist()
            for row in batch:
                if row["id"] % 2 == 0:
                    row["name"] = f"a{row['id']}"
            r = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA), skip_unchanged=op[2], mode=op[3])
        elif kind == "merge":
            ups = [k for k in op[1] if k not in op[2]]
            r = table.merge(_batch(ups, "m"), deletes=pa.table({"id": pa.array(op[2], pa.int64())}), mode=op[3])
        elif kind == "compact":
            r = table.compact(min_file_size_bytes=10**9)
        elif kind == "rewrite_deletes":
            r = table.rewrite_deletes()
        elif kind == "purge":
            r = table.purge(f"id = {op[1]}")
        elif kind == "reindex":
            r = table.reindex() if _indexed(table) else None
        elif kind == "merge_key_index":
            r = table.merge_key_index(full=op[1]) if _indexed(table) else None
        else:
            table.expire_snapshots(retain_last=1)
            r = table.vacuum(older_than=dt.timedelta(0))
    except LineageError as exc:
        return ("error", type(exc).__name__)
    if isinstance(r, lineage.CommitInfo):
        return (r.committed, r.inserted, r.updated, r.deleted)
    return None if r is None else r.operation


def _failed(result: object) -> bool:
    return isinstance(result, tuple) and result[0] == "error"


def _indexed(table: lineage.Table) -> bool:
    return table.properties.get("lineage.key-index.enabled") != "false"


def _live(table: lineage.Table) -> dict[int, tuple]:
    cols = ["id", "name", "amount", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
    return {r["id"]: tuple(r[c] for c in cols[1:]) for r in table.scan(columns=cols).to_pylist()}


def _model_step(model: set[int], op: tuple) -> None:
    """The live keys after ``op`` (failed writes change nothing; callers check both tables agree on failure)."""
    kind = op[0]
    if kind == "append" and not model & set(op[1]):
        model |= set(op[1])
    elif kind in ("delete",):
        model -= set(op[1])
    elif kind == "purge":
        model.discard(op[1])
    elif kind in ("upsert",):
        model |= set(op[1])
    elif kind == "merge":
        model |= {k for k in op[1] if k not in op[2]}
        model -= set(op[2])
    elif kind == "update_key":
        moved = model & set(op[1])
        new = {k + op[2] for k in moved}
        rest = model - moved
        if len(new) == len(moved) and not new & rest:
            model -= moved
            model |= new


_counter = iter(range(10**9))


@settings(
    max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "10")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(OPS, min_size=1, max_size=8), tiny_hash=st.booleans(), writer_limit=st.sampled_from([0, 6, 1000]))
def test_key_index_agrees_with_the_table_after_every_step(tmp_path, ops, tiny_hash, writer_limit):
    wh = str(tmp_path / f"wh{next(_counter)}")
    policy = {
        "lineage.key-index.merge-fanout": "2",
        "lineage.key-index.writer-merge-limit": str(writer_limit),
        "lineage.key-index.max-segments": "3",
        "lineage.key-index.base-fraction": "0.5",
        "write.target-file-size-bytes": "2000",
    }
    with key_hash_mask(np.uint64(3) if tiny_hash else key_hash._FULL):
        indexed = lineage.create_table("s.indexed", SCHEMA, key=["id"], warehouse=wh, properties=policy)
        plain = lineage.create_table("s.plain", SCHEMA, key=["id"], warehouse=wh, properties={"lineage.key-index.enabled": "false"})
        model: set[int] = set()
        steps: dict[str, dict[int, int]] = {"indexed": {}, "plain": {}}  # version -> step that made it
        before = _live(indexed)
        # Most drawn keys are live from the start, so deletes, updates and upserts hit rows.
        for step, op in enumerate([("append", list(range(0, 20, 1)))] + ops):
            note(f"step {step}: {op}")
            got, want = _run(indexed, op), _run(plain, op)
            if op[0] not in ("reindex", "merge_key_index"):
                assert got == want, f"indexed table reported {got}, the key-scan path {want}"
            if not _failed(got):
                _model_step(model, op)
            for name, t in (("indexed", indexed), ("plain", plain)):
                steps[name].setdefault(t.version, step)
            after = _live(indexed)
            assert set(after) == model

            def as_steps(rows: dict[int, tuple], name: str) -> dict[int, tuple]:
                return {k: (v[0], v[1], steps[name][v[3]], steps[name][v[4]]) for k, v in rows.items()}

            assert as_steps(after, "indexed") == as_steps(_live(plain), "plain")
            _check_row_ids(before, after, op, failed=_failed(got))
            before = after

            state = indexed.state()
            assert state.lineage.key_index is not None or state.snapshot is None, "a path dropped the key index"
            problems, _ = check_key_index(state)
            assert not problems, problems
            assert plain.state().lineage.key_index is None


def _check_row_ids(before: dict[int, tuple], after: dict[int, tuple], op: tuple, failed: bool) -> None:
    ids = [v[2] for v in after.values()]
    assert len(ids) == len(set(ids)), "two live rows share a row id"
    removed = set()
    moved: dict[int, int] = {}
    if not failed:
        if op[0] in ("delete",):
            removed = set(op[1])
        elif op[0] == "purge":
            removed = {op[1]}
        elif op[0] == "merge":
            removed = set(op[2])
        elif op[0] == "update_key":
            moved = {k: k + op[2] for k in op[1] if k in before}
    for k, v in before.items():
        if k in removed:
            continue
        target = moved.get(k, k)
        if k in moved or target in after:
            assert after[target][2] == v[2], f"key {k} lost its row id ({v[2]} -> {after[target][2]})"
