"""Kept rows rewritten (copy-on-write), and the small data files a merge-on-read write folds that way.

A merge-on-read write gives every data file it deletes from a delete (a
deletion vector on Iceberg v3, position deletes on v2). In a stream of small
commits with keys spread over the table, each commit adds a small data file
(its new images and inserts), and the next commits delete from nearly every
one of them: the files touched per commit, and with them the vectors, manifest
entries, values read and key-index entries of a commit, grow with the number
of commits since the last compaction.

So a merge-on-read write that deletes from more than
``lineage.write.fold.min-files`` data files *folds* the smallest of them: it
rewrites their kept rows (with their row ids, created and updated versions:
moves, not changes) into a new data file and removes them, instead of writing
their deletes. Files are taken smallest first while each keeps no more rows
than the commit writes so far (its new images and inserts, plus the rows
folded before it), up to ``lineage.write.fold.max-rows`` rows in all: a
tiered merge, so each row is rewritten a logarithmic number of times before
it sits in a file of that size, and the files a commit touches stay few.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile

import lineage.duck as duck
import lineage.properties as props
import lineage.storage.files as storage_files
import lineage.storage.prefetch as prefetch
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, HIDDEN_UPDATED
from lineage.commits.merge_rule import pack_from_end
from lineage.context import TableContext
from lineage.iceberg.schema import projection_field_ids
from lineage.properties import FOLD_MAX_ROWS, FOLD_MIN_FILES, TARGET_FILE_SIZE
from lineage.state import LiveFile, TableState, sized
from lineage.storage.deletes import referenced_data_path
from lineage.storage.deletion_vectors import replaced_by_vector
from lineage.storage.writer import FRESH, WrittenFile, write_data_files
from lineage.writes.rows import kept_rows, with_hidden

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


@dataclass(frozen=True)
class FoldPolicy:
    """When a merge-on-read write folds small data files (table properties ``lineage.write.fold.*``)."""

    max_rows: int = props.registry[FOLD_MAX_ROWS].default
    min_files: int = props.registry[FOLD_MIN_FILES].default

    @staticmethod
    def of(properties: Mapping[str, str]) -> FoldPolicy:
        """The policy a table's properties ask for (defaults where unset)."""
        return FoldPolicy(max_rows=int(props.read(properties, FOLD_MAX_ROWS)), min_files=int(props.read(properties, FOLD_MIN_FILES)))


def live_row_count(file: LiveFile) -> int:
    """Rows of ``file`` live before the write: its record count less the positions of its deletion vectors and
    file-scoped position delete files (partition-scoped ones not counted)."""
    deleted = sum(int(d.record_count) for d in file.deletes if referenced_data_path(d) == file.path)
    return max(int(file.data_file.record_count) - deleted, 0)


def files_to_fold(files: Sequence[LiveFile], removed: Mapping[int, np.ndarray], written_rows: int, policy: FoldPolicy) -> list[int]:
    """The ids (indexes in ``files``) of the files whose kept rows the write rewrites; ``removed`` holds the positions
    each file the write deletes from loses.

    ``written_rows`` are the rows the commit writes anyway (new images and
    inserts). Files with equality or resolved deletes are never folded, nor
    files left with no row (their deletes are cheaper than a rewrite of
    nothing and leave the file's history as it was).
    """
    if policy.max_rows <= 0 or len(removed) <= policy.min_files:
        return []
    return _tiered([(fid, len(positions)) for fid, positions in removed.items()], files, written_rows, 0, policy)


def _tiered(touched: Sequence[tuple[int, int]], files: Sequence[LiveFile], written_rows: int, total: int, policy: FoldPolicy) -> list[int]:
    """The ids of ``touched`` (file id, rows the write removes from it) folded by the tiered rule, ``total`` rows folded before."""
    candidates = []
    for fid, removing in touched:
        f = files[fid]
        if f.equality_deletes or f.resolved:
            continue
        kept = live_row_count(f) - removing
        if 0 < kept <= policy.max_rows:
            candidates.append((kept, fid))
    folded: list[int] = []
    for kept, fid in sorted(candidates):
        if kept > written_rows + total or total + kept > policy.max_rows:
            break  # sorted by size: every later file is larger still
        folded.append(fid)
        total += kept
    return folded


def untouched_to_fold(files: Sequence[LiveFile], written_rows: int, folded_rows: int, folded: int, policy: FoldPolicy) -> list[int]:
    """The ids (indexes in ``files``) of the small files a write that adds ``written_rows`` rows folds without deleting
    from them; ``files`` are the live files the write neither deletes from nor folds already (``folded`` files of
    ``folded_rows`` kept rows).

    Only a write that adds a small file (at most ``max-rows`` rows) folds this
    way: files are taken by the tiered rule of :func:`files_to_fold` (smallest
    first, each no larger than the rows written and folded so far), and only
    when that gathers at least ``min-files`` files with those folded already,
    so a stream of small commits rewrites a file every few commits, and the
    small files stay few (a logarithmic number of tiers of at most
    ``min-files`` each).
    """
    if policy.max_rows <= 0 or not 0 < written_rows <= policy.max_rows:
        return []
    out = _tiered([(fid, 0) for fid in range(len(files))], files, written_rows, folded_rows, policy)
    return out if len(out) + folded >= max(policy.min_files, 1) else []


@dataclass(frozen=True)
class UntouchedFold:
    """Small live files a write neither deletes from nor folds already, which it folds (see :func:`untouched_fold`)."""

    files: list[LiveFile]
    fids: list[int]  # indexes in ``files`` of those folded

    def rewrite(self, table: TableContext, created: list[str], extra: pa.Table | None = None) -> tuple[list[WrittenFile], list[DataFile]]:
        """Rewrite their kept rows (with ``extra`` in the same file, see :func:`rewrite_kept`); the new data files and the
        files leaving."""
        nothing = np.zeros(0, np.int64)
        return rewrite_kept(table, self.files, {fid: {"__pos": nothing} for fid in self.fids}, self.fids, created, extra=extra)


def untouched_fold(
    table: TableContext,
    state: TableState,
    files: Sequence[LiveFile],
    groups: Mapping[int, dict[str, np.ndarray]],
    rewrite: Sequence[int],
    written_rows: int,
) -> UntouchedFold | None:
    """The small live files of ``state`` a write neither deletes from nor folds already that it folds (see
    :func:`untouched_to_fold`), or None.

    ``files``, ``groups`` and ``rewrite`` are the write's plan files, the
    positions it removes by file id and the file ids it folds; ``written_rows``
    the rows it adds. Their rows move: row ids, created and updated versions
    are kept, so the change feed shows nothing for them.
    """
    policy = FoldPolicy.of(table.iceberg.metadata.properties)
    if state.snapshot is None or policy.max_rows <= 0 or not 0 < written_rows <= policy.max_rows:
        return None
    if storage_files.is_remote(table.iceberg.metadata.location):
        open_duckdb_early()
    touched = {files[fid].path for fid in groups}
    others = [f for f in state.files().files.values() if f.path not in touched]
    folded_rows = sum(live_row_count(files[fid]) - len(groups[fid]["__pos"]) for fid in rewrite)
    fids = untouched_to_fold(others, written_rows, folded_rows, len(rewrite), policy)
    return UntouchedFold(others, fids) if fids else None


def with_fresh_lineage(rows: pa.Table, target: pa.Schema) -> pa.Table:
    """``rows`` (data columns, some or none of the hidden lineage columns) as ``target``: a hidden column it lacks is
    :data:`~lineage.storage.writer.FRESH` (the commit assigns it: a fresh row id, created or updated version)."""
    for f in target:
        if f.name not in rows.column_names:
            rows = rows.append_column(f, pa.array(np.full(rows.num_rows, FRESH, np.int64)))
    return rows.select(target.names).cast(target)


_EARLY_LOCK = threading.Lock()
_early: list[threading.Thread] = []


def open_duckdb_early() -> None:
    """Open the process's shared DuckDB database on a background thread, once, so a later fold does not wait for it.

    A fold reads the files it rewrites through DuckDB (:func:`rewrite_kept`);
    a writer that makes small commits on an object store may use no DuckDB
    until its first fold, which would then wait for the database to open and
    load ``httpfs`` (tens of milliseconds, far more on a busy machine). A
    small write starts that here instead, off the commit's path. A failure is
    left for the fold to meet (and report) itself.
    """
    with _EARLY_LOCK:
        if _early:
            return
        thread = threading.Thread(target=_open_shared_database, name="lineage-duckdb-open", daemon=True)
        _early.append(thread)
    thread.start()
    atexit.register(thread.join, 30)  # a process ending right after its write waits for it rather than stop it mid-load


def _open_shared_database() -> None:
    try:
        duck.connect().close()
    except Exception:  # noqa: BLE001 - the fold opens it again and reports the error
        pass


def rewrite_kept(
    table: TableContext,
    files: Sequence[LiveFile],
    groups: Mapping[int, dict[str, np.ndarray]],
    fids: list[int],
    created: list[str],
    folded: bool = True,
    extra: pa.Table | None = None,
) -> tuple[list[WrittenFile], list[DataFile]]:
    """Rewrite the kept rows of ``files[fid]`` for ``fid`` in ``fids`` (``groups``: positions removed); return the new
    data files and the files leaving (the data files, and their deletion vectors on v3; on v2 their file-scoped
    position delete files when ``folded``, a copy-on-write leaving those to ``rewrite_deletes`` as it always did).

    The kept rows are read and rewritten a group of files at a time, so memory follows the group, not the number of
    files the write touches. A group holds at most one target file of Parquet and at most a sixteenth of DuckDB's
    memory limit (decoded rows take several times their Parquet bytes). Paths written are appended to ``created``.
    The rows are read in a DuckDB connection of their own, not the write's: one sealed for a user's expression reads
    the plan's files only, not their local copies or the files folded without being touched.
    ``extra`` (rows the commit writes anyway: its new images and inserts, see :func:`with_fresh_lineage`) goes into
    the first file written, so that a small commit that folds writes one data file, not two (a request each on an
    object store).
    """
    written: list[WrittenFile] = []
    con = duck.connect()
    try:
        _rewrite_chunks(table, files, groups, fids, con, created, written, extra)
    finally:
        con.close()
    removed = [files[fid].data_file for fid in fids]
    if folded or table.iceberg.metadata.format_version >= 3:  # their vectors (v3), file-scoped position deletes (v2)
        removed += [d for fid in fids for d in replaced_by_vector(files[fid].path, files[fid].deletes)]
    return written, removed


def _rewrite_chunks(table: TableContext, files: Sequence[LiveFile], groups: Mapping[int, dict[str, np.ndarray]], fids: list[int],
                    con: duckdb.DuckDBPyConnection, created: list[str], written: list[WrittenFile], extra: pa.Table | None = None) -> None:
    ice = table.iceberg
    field_ids = projection_field_ids(ice.metadata)
    target = with_hidden(table.arrow_schema, (HIDDEN_ROW_ID, HIDDEN_CREATED, HIDDEN_UPDATED))
    file_size = int(props.read(ice.metadata.properties, TARGET_FILE_SIZE))
    budget = min(file_size, duck.memory_limit_bytes() // 16)
    for chunk in pack_from_end(fids, lambda fid: int(files[fid].data_file.file_size_in_bytes), budget):
        group = [files[fid] for fid in chunk]
        # small remote files (often this writer's own, still in memory) fetched at once, not a few requests each in turn
        with prefetch.local_copies(sized(group)) as copies:
            kept = kept_rows(con, group, {fid: groups[fid] for fid in chunk}, table.arrow_schema, field_ids, copies)
        kept = kept.cast(target)
        if extra is not None:
            kept, extra = pa.concat_tables([with_fresh_lineage(extra, target), kept]), None
        rewritten = write_data_files(ice, kept)
        del kept
        created.extend(w.data_file.file_path for w in rewritten)
        written.extend(rewritten)
