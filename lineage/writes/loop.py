"""The plan/write/commit loop every write goes through, and what a write returns.

Each attempt:

1. **plan** against the current snapshot in DuckDB (the caller's ``plan_fn``):
   which live images are removed, which new images replace them (same row id),
   which rows are new;
2. **write** Parquet files: new data files, and either position delete files
   (merge-on-read) or rewritten data files (copy-on-write);
3. **commit** (:func:`lineage.commits.commit.commit_change`): the lineage segment, the
   deleted-rows index segment and the lineage list, then one Iceberg snapshot
   whose summary points at the list.

A lost commit race removes the attempt's files and plans again; a failing
catalog call is settled by :mod:`lineage.outcome` (files are deleted only for
attempts known not to have landed). This module never imports
:mod:`lineage.table`; the table is passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table.snapshots import Operation

from index.deleted_rows import RemovedImages, captured_values
import lineage.duck as duck
from lineage.commits.commit import CommitRequest, CommitResult, commit_change
from lineage.context import TableContext
from lineage.errors import CommitConflictError, InvalidArgumentError, VersionMovedError
from lineage.memory import release_if_grown, release_within
from lineage.outcome import Attempt, CommitLoop
from lineage.state import TableState
from lineage.read.values import read_at
from lineage.storage.deletion_vectors import VectorTarget
from lineage.storage.merged_deletes import write_file_deletes
from lineage.storage.writer import WrittenFile, with_fresh_rows, write_data_files
import lineage.storage.puts as puts
import lineage.storage.removals as removals
from lineage.properties import COMMIT_RETRIES, MERGE_ON_READ, capture_preimages
from lineage.writes.plan import CommitInfo, Plan, ms_to_datetime
from lineage.writes.rows import by_row_id, group_removed
from lineage.writes.small_files import FoldPolicy, UntouchedFold, files_to_fold, rewrite_kept, untouched_fold

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


# The name the write loop always logged under (operators and tests filter on it).
log = logging.getLogger("lineage.table")

_ICEBERG_OPERATION = {
    "append": Operation.APPEND,
    "delete": Operation.DELETE,
    "update": Operation.OVERWRITE,
    "upsert": Operation.OVERWRITE,
    "merge": Operation.OVERWRITE,
    "changelog": Operation.OVERWRITE,
}


def run_write(
    table: TableContext,
    plan_fn: Callable[[TableState, duckdb.DuckDBPyConnection], Plan],
    *,
    mode: str,
    reuse_inserts: list[WrittenFile] | None = None,
    expected_version: int | None = None,
    isolated: bool = False,
) -> CommitInfo:
    """Plan, write and commit, re-planning after each lost commit race.

    The attempts run in a :class:`lineage.outcome.CommitLoop`: a failing
    catalog call is settled by reading the table back, and an attempt that
    may still land keeps its files and is looked for before each retry.
    With ``expected_version`` every attempt first checks the table is
    still at that version, so a lost race ends in VersionMovedError.
    ``isolated``: each attempt gets a DuckDB database of its own, which the
    plan may seal (:func:`lineage.duck.seal`, for user expressions).
    """
    if expected_version is not None and (not isinstance(expected_version, int) or isinstance(expected_version, bool)):
        raise InvalidArgumentError(f"expected_version must be an integer version, got {expected_version!r}")
    retries = table.commit_retries
    shared = [w.data_file.file_path for w in reuse_inserts or []]  # written once, used by every attempt

    def attempt(a: Attempt) -> CommitInfo:
        # carries the live files of the table's own last commit; a foreign base's lineage is persisted first
        state = table.state_in_hand(persist=True)
        if expected_version is not None and state.version != expected_version:
            raise VersionMovedError(table.name, expected_version, state.version)
        con = duck.connect(isolated=True) if isolated else _LazyConnection()  # an isolated one is sealed by the plan
        try:
            try:
                plan = plan_fn(state, con)
            except Exception as exc:
                if not duck.is_error(exc):
                    raise
                # The user's predicate or expressions failed on the data (e.g. a cast); nothing was written.
                failed = InvalidArgumentError(f"evaluating the write's predicate or expressions failed: {exc}")
                raise duck.out_of_memory(exc) or failed from None
            if plan.is_empty:
                return _no_op(table, state, plan.operation, a.number, plan.ignored)
            try:
                # data and delete files fly with the commit's other files (landed before the catalog); the commit's
                # requests, pre-image reads included, leave the room for queued removals (lineage.storage.removals)
                with removals.commit_budget(), puts.parallel_puts():
                    return _materialize_and_commit(table, state, plan, mode, con, a, reuse_inserts)
            except Exception as exc:
                oom = duck.out_of_memory(exc)  # e.g. the kept rows of a copy-on-write rewrite; None for any other error
                if oom is None:
                    raise
                raise oom from None
        finally:
            shared[:] = [w.data_file.file_path for w in reuse_inserts or []]
            con.close()

    loop: CommitLoop[CommitInfo] = CommitLoop(f"{table.name}: commit", lambda: table.iceberg, table.refresh, retries, shared, logger=log)
    try:
        return loop.run(
            attempt,
            lambda n: CommitConflictError(
                f"gave up after {n} attempts: other writers kept committing to {table.name}; nothing was committed. "
                f"Retry later or raise the table property {COMMIT_RETRIES}"
            ),
        )
    finally:
        release_if_grown()


def _no_op(table: TableContext, state: TableState, operation: str, attempt: int, ignored: int = 0) -> CommitInfo:
    snap = state.snapshot
    ts = ms_to_datetime(snap.timestamp_ms) if snap else ms_to_datetime(table.iceberg.metadata.last_updated_ms)
    return CommitInfo(
        version=state.version, snapshot_id=snap.snapshot_id if snap else None, timestamp=ts, operation=operation, attempts=attempt,
        committed=False, ignored=ignored,
    )


def _materialize_and_commit(
    table: TableContext,
    state: TableState,
    plan: Plan,
    mode: str,
    con: duckdb.DuckDBPyConnection,
    attempt: Attempt,
    reuse_inserts: list[WrittenFile] | None,
) -> CommitInfo:
    ice = table.iceberg
    created = attempt.files
    version = ice.metadata.next_sequence_number()
    written: list[WrittenFile] = []
    delete_files: list[DataFile] = []
    removed_files: list[DataFile] = []
    removed_images: list[RemovedImages] = []

    groups: dict[int, dict[str, np.ndarray]] = {}
    rewrite: list[int] = []
    # 1. removed images: position deletes, or rewritten files
    if plan.removed is not None and plan.removed.num_rows:
        groups = group_removed(plan.removed)
        values = _captured(table, plan, groups) if capture_preimages(ice.metadata.properties) else None
        for fid, cols in groups.items():
            removed_images.append(
                RemovedImages(plan.files[fid].path, cols["__pos"], cols["_row_id"], cols["_row_created_at_version"], cols["_row_last_updated_at_version"],
                              version, None if values is None else values.take(pa.array(cols["__row"])))
            )
        # copy-on-write rewrites every file it deletes from; merge-on-read the small files it folds (lineage.writes.small_files)
        rewrite = list(groups) if mode != MERGE_ON_READ else files_to_fold(
            plan.files, {fid: cols["__pos"] for fid, cols in groups.items()}, _written_rows(plan),
            FoldPolicy.of(ice.metadata.properties))
        deleted = {fid: cols for fid, cols in groups.items() if fid not in rewrite}
        if deleted:
            # v3: one deletion vector per data file; v2: a file's earlier delete file of ours is merged in and replaced
            # (lineage.storage.merged_deletes). Either way the files they replace leave in the same commit.
            delete_files, replaced = write_file_deletes(ice, [VectorTarget(plan.files[fid].data_file, cols["__pos"], plan.files[fid].deletes)
                                                 for fid, cols in deleted.items()])
            created.extend(f.file_path for f in delete_files)
            removed_files.extend(replaced)
        if rewrite:
            kept, leaving = rewrite_kept(table, plan.files, groups, rewrite, created, folded=mode == MERGE_ON_READ)
            written.extend(kept)
            removed_files.extend(leaving)

    # 3 (decided first). the small files it does not touch, once enough of them gather (lineage.writes.small_files); not
    # beside deletes an engine wrote (their files are not in ``groups``). Their rows go into the file of step 2.
    fold = None if plan.prewritten_deletes else untouched_fold(table, state, plan.files, groups, rewrite, _written_rows(plan))

    # 2. new images of updated rows, then fresh inserts (in the same files when both are written now: fewer objects)
    inserts = plan.inserts if plan.inserts is not None and plan.inserts.num_rows else None
    if plan.new_images is not None and plan.new_images.num_rows:
        images = by_row_id([plan.new_images])
        if inserts is not None and reuse_inserts is None:
            images, inserts = with_fresh_rows(images, inserts), None
        _write_fresh(table, images, fold, created, written, removed_files)
        fold = None
    if inserts is not None:
        if reuse_inserts:
            written.extend(reuse_inserts)  # appends do not depend on the base snapshot
        elif reuse_inserts is None:
            _write_fresh(table, plan.inserts, fold, created, written, removed_files)
            fold = None
        else:
            new = write_data_files(ice, plan.inserts)
            reuse_inserts.extend(new)
            written.extend(new)
    if fold is not None:
        _write_fresh(table, None, fold, created, written, removed_files)

    if plan.prewritten_deletes:  # written by executors with the index segment of their images
        created.extend(f.file_path for f in plan.prewritten_deletes)
        created.append(plan.prewritten_index.path)
        delete_files.extend(plan.prewritten_deletes)
        removed_files.extend(plan.prewritten_replaced)
    if plan.prewritten:
        if not plan.reusable:
            created.extend(w.data_file.file_path for w in plan.prewritten)
        written.extend(plan.prewritten)

    request = CommitRequest(
        operation=plan.operation,
        iceberg_operation=_ICEBERG_OPERATION[plan.operation],
        written=written,
        delete_files=delete_files,
        removed_files=removed_files,
        removed_images=removed_images,
        inserted=plan.inserted,
        updated=plan.updated,
        deleted=plan.deleted,
        properties=plan.properties,
        key_index=plan.key_index,
        written_index=plan.prewritten_index,
    )

    release_within()  # what writing the files freed goes back before the commit builds its lineage and key index
    number = attempt.number  # not the attempt itself: it holds ``info``, and a cycle would keep the plan's arrays until a full GC

    def info(result: CommitResult) -> CommitInfo:
        return CommitInfo(
            version=result.version,
            snapshot_id=result.snapshot_id,
            timestamp=ms_to_datetime(result.timestamp_ms),
            operation=plan.operation,
            inserted=plan.inserted,
            updated=plan.updated,
            deleted=plan.deleted,
            data_files_added=len(written),
            delete_files_added=len(delete_files),
            data_files_removed=sum(1 for f in removed_files if f.content == DataFileContent.DATA),  # v3: not the vectors replaced
            bytes_written=result.bytes_written,
            attempts=number,
            ignored=plan.ignored,
        )

    attempt.describe = info
    result = commit_change(ice, state, request, attempt)
    table.carry_files(result.snapshot_id, result.files)
    return info(result)


def _write_fresh(table: TableContext, rows: pa.Table | None, fold: UntouchedFold | None, created: list[str],
                 written: list[WrittenFile], removed_files: list[DataFile]) -> None:
    """Write ``rows`` (new images and inserts; None: none), with the kept rows of the files ``fold`` folds in the same
    data file (one object, not two)."""
    if fold is None:
        new = write_data_files(table.iceberg, rows)
        created.extend(w.data_file.file_path for w in new)
    else:
        new, leaving = fold.rewrite(table, created, extra=rows)
        removed_files.extend(leaving)
    written.extend(new)


def _written_rows(plan: Plan) -> int:
    """Rows of new images and inserts the plan writes (or an engine wrote for it)."""
    return sum(t.num_rows for t in (plan.new_images, plan.inserts) if t is not None) + sum(int(w.data_file.record_count) for w in plan.prewritten)


def _captured(table: TableContext, plan: Plan, groups: dict[int, dict]) -> pa.Table:
    """The removed images' values (rows of ``plan.removed``), columns named by field id, for the index segment.

    Planners that read the removed rows pass their values; otherwise they are
    read back by position from the files (the plan's files are still live).
    """
    field_ids = {f.name: f.field_id for f in table.iceberg.schema().fields}
    values = plan.removed_values
    if values is None:
        fid = np.concatenate([np.full(len(c["__pos"]), f, np.int64) for f, c in groups.items()])
        rows = np.concatenate([c["__row"] for c in groups.values()])
        read = read_at([f.path for f in plan.files], fid, np.concatenate([c["__pos"] for c in groups.values()]), table.arrow_schema, field_ids)
        order = np.empty(len(rows), np.int64)
        order[rows] = np.arange(len(rows))
        values = read.take(pa.array(order))
    return captured_values(values, field_ids)


class _LazyConnection:
    """A DuckDB connection opened on first use: appends to a table without key clashes to check never need one."""

    def __init__(self) -> None:
        self._con: duckdb.DuckDBPyConnection | None = None

    def __getattr__(self, name: str) -> object:
        if self._con is None:
            self._con = duck.connect()
        return getattr(self._con, name)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
