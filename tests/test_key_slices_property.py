"""Property test: the key index's sliced base merge (writers past ``max-segments``) against the change-feed model.

A writer whose key index has more than ``lineage.key-index.max-segments``
segments, and may not merge them whole (``writer-merge-limit``), merges them
into a new base one hash range per commit (:func:`index.key_merge_policy.writer_slice`):
base *pieces* with a ``key-index.range`` header, which a lookup probes only
with the keys of their range. At the defaults this never happens below
millions of keys; here the table properties force it (a writer limit of a few
records, at most one to three segments), on v2 and v3 tables, and in half the
examples with a 2-bit key hash (every lookup resolves collisions).

Hypothesis draws writes (append, delete, update, upsert; merge-on-read or
copy-on-write) with :mod:`test_cdf_property`'s model and its write step, and
between them maintenance (compaction, rewrite of delete files, reindex, key
index merges, snapshot expiry with vacuum). After every step:

* a lookup of every key ever written (and of keys never written) gives
  exactly the model's live keys, each with its row id and versions;
* the same lookup by a reader that ignores the ``key-index.range`` header
  (an older reader: a piece is a segment like any other) gives the same;
* ``verify``'s key index check finds the index equal to a scan of the key
  columns (data file and position too);
* after expiry and vacuum, the key index files on disk are exactly the ones
  the current index names (slices no snapshot reaches are removed, the
  reachable ones kept).

At the end the change feed (per version and net) and ``deleted_rows`` match
the model over a few ranges. A Spark variant runs Spark's delete, update and
upsert on a small budget. ``LINEAGE_SLICE_EXAMPLES`` sets the examples of
the embedded property (default 6), ``LINEAGE_SLICE_SPARK_EXAMPLES`` those of
the Spark one (default 1).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import test_cdf_property as cdf_model
from conftest import key_hash_mask
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import lineage
import lineage.commits.commit as commit_module
import lineage.outcome as outcome
import lineage.storage.files as files
from index import key_hash
from index.key_index import KeyIndex
from lineage.maintenance.key_index import check_key_index
from lineage.storage.metadata import index_dir

EXAMPLES = int(os.environ.get("LINEAGE_SLICE_EXAMPLES", "6"))
SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                     HealthCheck.function_scoped_fixture])
MAINTENANCE = ["none", "none", "none", "compact", "rewrite_deletes", "reindex", "merge_key_index", "merge_key_index_full",
               "expire_vacuum"]


def slicing_properties(writer_limit: int, max_segments: int) -> dict[str, str]:
    """Table properties under which writers slice the key index's base merge after a few commits."""
    return {
        "lineage.key-index.merge-fanout": "2",
        "lineage.key-index.writer-merge-limit": str(writer_limit),
        "lineage.key-index.max-segments": str(max_segments),
        "lineage.key-index.base-fraction": "0.5",
    }


def _lookup(index: KeyIndex, keys: list[int]) -> dict[int, tuple]:
    found = index.lookup(pa.table({"id": pa.array(keys, pa.int64())})).to_pylist()
    out = {r["id"]: (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) for r in found}
    assert len(out) == len(found), f"a key found twice: {found}"
    return out


def check_index(table: lineage.Table, model: cdf_model.Model) -> int:
    """Lookups (also by a reader ignoring piece ranges) equal the model's live keys; verify's check passes. Returns
    how many base pieces the index has."""
    state = table.state()
    problems, _ = check_key_index(state)
    assert not problems, problems
    index = KeyIndex.open(state, build=False)
    if state.snapshot is None:
        return 0
    assert index is not None, "a path dropped the key index"
    probe = sorted(model.ever_keys | {0, model.next_key, model.next_key + 7})
    want = {k: (e[0], e[2], e[3]) for k, e in model.live.items()}
    assert _lookup(index, probe) == want, f"lookup differs from the live keys (segments {[s.hash_range for s in index.segments]})"
    older = KeyIndex(index.key, [replace(s, hash_range=None) for s in index.segments], index.version, index.source)
    assert _lookup(older, probe) == want, "a reader ignoring key-index.range sees other keys"
    return sum(s.hash_range is not None for s in index.segments)


def _stored_segments(table: lineage.Table) -> set[str]:
    root = index_dir(table.iceberg.metadata.location)
    return {f.location for f in files.list_files(root) if f.location.endswith("-keys.kix")}


def _current_segments(table: lineage.Table) -> set[str]:
    ref = table.state().lineage.key_index
    return set(ref or ())


def _snapshot_ts(table: lineage.Table, version: int) -> dt.datetime:
    snap = next(s for s in table.iceberg.metadata.snapshots if s.sequence_number == version)
    return dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, dt.timezone.utc)


def maintain(table: lineage.Table, model: cdf_model.Model, kind: str) -> None:
    """Run maintenance ``kind``; its commits (if any) are versions that change no row."""
    if kind == "none":
        return
    if kind == "compact":
        table.compact(min_file_size_bytes=10**9)
    elif kind == "rewrite_deletes":
        table.rewrite_deletes()
    elif kind == "reindex":
        table.reindex()
    elif kind in ("merge_key_index", "merge_key_index_full"):
        table.merge_key_index(full=kind.endswith("full"))
    else:
        table.expire_snapshots(retain_last=1)
        table.vacuum(older_than=dt.timedelta(0))
        stored, current = _stored_segments(table), {local(p) for p in _current_segments(table)}
        assert {local(p) for p in stored} == current, f"vacuum kept {stored - current} / lost {current - stored}"
    table.refresh()
    while model.version < table.version:
        model.states.append(dict(model.states[-1]))
        model.ts.append(_snapshot_ts(table, model.version))
    note(f"maintenance {kind} -> version {table.version}")


def local(path: str) -> str:
    """A path without its ``file:`` scheme."""
    return path.removeprefix("file://").removeprefix("file:")


def check_feed(table: lineage.Table, model: cdf_model.Model, data: st.DataObject) -> None:
    """The change feed and deleted rows of a few ranges equal the model's."""
    n = model.version
    pairs = {(0, n)}
    if n >= 1:
        v = data.draw(st.integers(1, n), label="single version")
        pairs.add((v - 1, v))
        a = data.draw(st.integers(0, n), label="a")
        pairs.add((a, data.draw(st.integers(a, n), label="b")))
    for a, b in sorted(pairs):
        cdf_model.check_range(table, model, a, b)


def seed(table: lineage.Table, model: cdf_model.Model, n: int) -> None:
    """Append keys 1 .. n (so that the index has records to slice) and record them in the model."""
    rows = [(k, 1 + k % 3, "a", 0.5) for k in range(1, n + 1)]
    ci = table.append(cdf_model._batch(rows))
    model.ever_keys |= {r[0] for r in rows}
    model.next_key = n + 1
    v = model.version + 1
    cdf_model._after_commit(table, model, ci, {r[0]: [None, r, v, v] for r in rows})


def run_property(data: st.DataObject, warehouse: str, spark=None) -> None:  # noqa: ANN001
    """One drawn sequence of writes and maintenance on a table with the slicing forced on (writes on ``spark`` if given)."""
    fmt = data.draw(st.sampled_from([2, 3]), label="format version")
    # Spark's one example slices from its first write (every Spark write then adds a piece or a delta after them)
    limit = data.draw(st.sampled_from([2, 5, 16]) if spark is None else st.just(2), label="writer limit")
    max_segments = data.draw(st.sampled_from([1, 2, 3]) if spark is None else st.just(1), label="max segments")
    props = slicing_properties(limit, max_segments) | {"write.target-file-size-bytes": "2000"}
    table = lineage.create_table("s.t", cdf_model.SCHEMA, key=["id"], warehouse=warehouse, properties=props, format_version=fmt)
    writer = table if spark is None else SparkWrites(table, spark, data.draw(st.sampled_from(["lookup", "join"]), label="upsert strategy"))
    model = cdf_model.Model()
    seed(table, model, data.draw(st.integers(1, 30) if spark is None else st.just(12), label="first keys"))
    most = 0
    for _ in range(data.draw(st.integers(5, 12) if spark is None else st.just(5), label="steps")):
        cdf_model._step(data, writer, model)
        most = max(most, check_index(table, model))
        maintain(table, model, data.draw(st.sampled_from(MAINTENANCE), label="maintenance"))
        most = max(most, check_index(table, model))
    event(f"base pieces at once: {min(most, 4)}{'+' if most >= 4 else ''}")
    check_feed(table, model, data)


class SparkWrites:
    """``table`` whose merge-on-read deletes, updates and upserts run on Spark (copy-on-write and ``skip_unchanged``,
    which Spark does not do, stay embedded)."""

    def __init__(self, table: lineage.Table, spark, strategy: str) -> None:  # noqa: ANN001
        self.table, self.spark, self.strategy = table, spark, strategy

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.table, name)

    def delete(self, where: str, *, mode: str | None = None) -> lineage.CommitInfo:
        if mode == lineage.COPY_ON_WRITE:
            return self.table.delete(where, mode=mode)
        return self.table.delete(where, engine="spark", spark=self.spark)

    def update(self, where: str, set: dict[str, str], *, mode: str | None = None) -> lineage.CommitInfo:  # noqa: A002
        if mode == lineage.COPY_ON_WRITE:
            return self.table.update(where, set, mode=mode)
        return self.table.update(where, set, engine="spark", spark=self.spark)

    def upsert(self, batch: pa.Table, *, skip_unchanged: bool = False, mode: str | None = None) -> lineage.CommitInfo:
        from lineage.writes import spark as spark_writes

        if mode == lineage.COPY_ON_WRITE or skip_unchanged:
            return self.table.upsert(batch, skip_unchanged=skip_unchanged, mode=mode)
        df = self.spark.createDataFrame(batch)
        return spark_writes.upsert(self.table._context, df, lineage.MERGE_ON_READ, self.strategy)


_counter = iter(range(10**9))


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data(), tiny_hash=st.booleans())
def test_sliced_key_index_matches_the_model(tmp_path, data, tiny_hash) -> None:  # noqa: ANN001
    # a 2-bit key hash: every key collides, every key falls into the first piece and the others are empty
    with key_hash_mask(np.uint64(3) if tiny_hash else key_hash._FULL):
        run_property(data, str(tmp_path / f"wh{next(_counter)}"))


@pytest.mark.spark
@settings(max_examples=int(os.environ.get("LINEAGE_SLICE_SPARK_EXAMPLES", "1")), **SETTINGS)
@given(data=st.data())
def test_sliced_key_index_matches_the_model_with_spark_writes(spark, tmp_path, data) -> None:  # noqa: ANN001
    run_property(data, str(tmp_path / f"wh{next(_counter)}"), spark)


def test_the_forced_settings_slice_and_lookups_stay_right(tmp_path) -> None:
    """The settings of the property do make pieces (a slicing runs, and finishes into a base of pieces)."""
    table = lineage.create_table("s.t", cdf_model.SCHEMA, key=["id"], warehouse=str(tmp_path),
                                 properties=slicing_properties(4, 2))
    model = cdf_model.Model()
    seed(table, model, 20)
    pieces = []
    for v in range(2, 14):
        k = v
        ci = table.update(f"id = {k}", {"qty": "qty + 1"})
        live = cdf_model._copy_live(model)
        e = live[k]
        live[k] = [e[0], (k, e[1][1] + 1, *e[1][2:]), e[2], v]
        cdf_model._after_commit(table, model, ci, live)
        pieces.append(check_index(table, model))
    assert max(pieces) >= 2, f"no slicing ran: pieces per commit {pieces}"
    segs = KeyIndex.open(table.state(), build=False).segments
    assert segs[0].hash_range is not None and segs[0].hash_range[0] == 0, "the slicing did not finish into a base of pieces"
    cdf_model.check_range(table, model, 0, model.version)


class _Crash(BaseException):
    """The process dies: nothing after it runs (no clean-up by ``except Exception``)."""


def test_a_crash_between_a_slices_files_and_its_commit(tmp_path, monkeypatch) -> None:
    """Writers crash after writing a piece's files, before the catalog commit: the table stays as it was, a
    lookup stays right, the next writers go on slicing, and vacuum removes the crashed attempts' files."""
    table = lineage.create_table("s.t", cdf_model.SCHEMA, key=["id"], warehouse=str(tmp_path),
                                 properties=slicing_properties(4, 2))
    model = cdf_model.Model()
    seed(table, model, 20)
    real, real_delete = commit_module.commit_files, outcome.delete_files
    crashed = 0
    for k in range(2, 16):
        before = _current_segments(table)
        stored = _stored_segments(table)
        if k % 2:  # every other write crashes
            monkeypatch.setattr(commit_module, "commit_files", lambda *a, **kw: (_ for _ in ()).throw(_Crash()))
            monkeypatch.setattr(outcome, "delete_files", lambda *a, **kw: None)  # a dead process cleans nothing up
            with pytest.raises(_Crash):
                table.delete(f"id = {k}")
            monkeypatch.setattr(commit_module, "commit_files", real)
            monkeypatch.setattr(outcome, "delete_files", real_delete)
            crashed += len(_stored_segments(table) - stored)
            table = lineage.open_table("s.t", warehouse=str(tmp_path))
            assert table.version == model.version and _current_segments(table) == before
            check_index(table, model)
        ci = table.delete(f"id = {k}")
        live = {key: e for key, e in model.live.items() if key != k}
        cdf_model._after_commit(table, model, ci, live)
        check_index(table, model)
    assert crashed, "no crashed attempt left a key index file (the crash came before the slice was written)"
    table.expire_snapshots(retain_last=1)
    table.vacuum(older_than=dt.timedelta(0))
    assert {local(p) for p in _stored_segments(table)} == {local(p) for p in _current_segments(table)}
    check_index(table, model)
    cdf_model.check_range(table, model, 0, model.version)
