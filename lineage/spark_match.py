"""The predicate pass of a Spark delete, update or purge: executors read, evaluate and emit only the matches.

Each Spark task takes a slice of one data file (:class:`FileSlice`) and, in
its Python worker, with no row crossing the JVM:

1. reads the positions the file's delete files remove
   (:func:`lineage.storage.deletes.read_position_deletes`, position delete
   files and Iceberg v3 deletion vectors alike), so removed rows never match;
2. reads only the columns the predicate names, at the live positions, row
   group by row group (:func:`lineage.read.values.read_at`: columns matched
   by Iceberg field id, so a renamed column keeps its values and one added
   by schema evolution reads as null, exactly as embedded);
3. attaches the lineage columns from the file's runs (the arithmetic of the
   embedded view's ASOF join: :func:`lineage.read.scan.register_live_view`);
4. evaluates the checked predicate in a sealed DuckDB database of its own
   (:func:`lineage.duck.seal`), so it means on Spark what it means embedded;
5. for the matched positions only, reads the further columns the SELECT
   list needs (the key, the old values, the whole image of an update) and
   runs that list over them.

The driver sends each task its slice (path, delete files, lineage runs:
metadata) and receives nothing: the result is a Spark DataFrame that the
next step (the delete files and index segment of
:mod:`lineage.writes.spark_removed`, the new images of an update) consumes
on the executors.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import lineage.duck as duck
import lineage.storage.spark_read as spark_read
from lineage.columns import LINEAGE_SCHEMA
from lineage.read.values import layout, read_at
from lineage.sql.predicate import Predicate
from lineage.state import LiveFile
from lineage.storage.deletes import read_position_deletes
from lineage.storage.fileio import local_path
from lineage.storage.rle import combined_breakpoints

SLICE_ROWS = 1_000_000  # a data file longer than this is split into slices of this many positions, one task each
CHUNK_ROWS = 1_000_000  # a task evaluates its row groups in chunks of about this many rows (memory stays bounded)
PATH, POS = "__path", "__pos"


@dataclass(frozen=True)
class FileSlice:
    """A task's share of one data file: the row groups that start in ``[start, end)``, and what reading them needs.

    ``path`` is the location Iceberg records, ``local`` the name Spark rows
    give the file (``__path``), ``deletes`` the delete files that apply to it,
    and ``runs`` its lineage as (pos_start, row_id_start, created, updated).
    """

    path: str
    local: str
    rows: int
    start: int
    end: int
    deletes: tuple[str, ...]
    runs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class MatchPass:
    """What every task of one pass evaluates: the checked predicate and SELECT list, and the columns each reads.

    ``where`` and ``select`` come from the checked expression layer
    (:mod:`lineage.sql.expressions`); ``where_columns`` are the data columns
    the predicate reads, ``image_columns`` those the SELECT list reads (all
    data columns when the caller cannot say).
    """

    schema: pa.Schema
    field_ids: dict[str, int] | None
    where: str
    exact_floats: bool
    where_columns: tuple[str, ...]
    image_columns: tuple[str, ...]
    select: str
    out: pa.Schema
    where_lineage: bool = True  # the predicate reads a lineage column: the first pass attaches them


def slices(files: Sequence[LiveFile], slice_rows: int | None = None) -> list[FileSlice]:
    """The tasks of a pass over ``files``: one per file, or one per ``slice_rows`` (default :data:`SLICE_ROWS`) positions of a longer file."""
    slice_rows = SLICE_ROWS if slice_rows is None else slice_rows
    out = []
    for f in files:
        pos, rid, created, updated = combined_breakpoints(f.lineage.row_ids, f.lineage.created, f.lineage.updated)
        runs = (np.asarray(pos, np.int64), np.asarray(rid, np.int64), np.asarray(created, np.int64), np.asarray(updated, np.int64))
        rows = int(f.lineage.record_count)
        for start in range(0, max(rows, 1), slice_rows):
            out.append(FileSlice(f.path, local_path(f.path), rows, start, min(rows, start + slice_rows), tuple(f.delete_paths), runs))
    return out


def match_pass(schema: pa.Schema, field_ids: dict[str, int] | None, pred: Predicate, select: str, out: pa.Schema,
               reads: Sequence[str] | None = None) -> MatchPass:
    """The :class:`MatchPass` of ``pred`` and ``select`` over a table of ``schema``; ``reads``: the data columns ``select`` needs (None: all)."""
    names = set(schema.names)
    where_columns = schema.names if pred.columns is None else [c for c in pred.columns if c in names]
    image_columns = schema.names if reads is None else [c for c in reads if c in names]
    lineage = pred.columns is None or any(f.name in pred.columns for f in LINEAGE_SCHEMA)
    return MatchPass(schema, field_ids, pred.sql, pred.reads_floats, tuple(dict.fromkeys(where_columns)),
                     tuple(dict.fromkeys(image_columns)), select, out, lineage)


def matches(spark: Any, files: Sequence[LiveFile], spec: MatchPass) -> Any:
    """Executors run ``SELECT spec.select FROM live WHERE spec.where`` over the live rows of ``files``: a Spark DataFrame of ``spec.out``.

    ``live`` has the data columns, the lineage columns, ``__path`` (the
    file's local path) and ``__pos``. One task per :func:`slices` entry; the
    tasks' specs travel with the pickled function (Spark broadcasts a large one).
    """
    spark_schema = spark.createDataFrame(spec.out.empty_table()).schema
    tasks = slices(files)
    if not tasks:
        return spark.createDataFrame(spec.out.empty_table())
    blob = pickle.dumps(tasks)
    ids = spark.range(0, len(tasks), 1, numPartitions=len(tasks))
    return ids.mapInArrow(spark_read.with_settings(_task(blob, spec)), spark_schema)


def _task(blob: bytes, spec: MatchPass) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: the slices named by the incoming ids, evaluated one after the other."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tasks: list[FileSlice] = pickle.loads(blob)
        wanted = [int(i) for b in batches for i in b.column(0).to_pylist()]
        if not wanted:
            return
        con = duck.connect(isolated=True)
        try:
            con.execute("SET threads = 1")  # one core per Spark task: the task slots are the parallelism
            duck.seal(con, exact_floats=spec.exact_floats)  # reads no file: the rows are registered tables
            for i in wanted:
                yield from evaluate_slice(con, tasks[i], spec)
        finally:
            con.close()

    return run


def dead_positions(path: str, delete_paths: Sequence[str]) -> np.ndarray:
    """Sorted positions of the data file ``path`` that ``delete_paths`` remove (its name compared as a local path)."""
    want = os.path.normpath(local_path(path))
    parts = []
    for d in delete_paths:
        found = read_position_deletes(d)
        hit = found.get(path)
        if hit is None:  # a writer that spells the location otherwise (file:/x, file:///x, /x)
            hit = next((v for k, v in found.items() if os.path.normpath(local_path(k)) == want), None)
        if hit is not None and len(hit):
            parts.append(hit)
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))


def lineage_at(runs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], positions: np.ndarray) -> list[pa.Array]:
    """``_row_id``, ``_row_created_at_version`` and ``_row_last_updated_at_version`` of the rows at ``positions``."""
    pos_start, row_id_start, created, updated = runs
    if len(pos_start) == 1:
        return [pa.array(positions + (row_id_start[0] - pos_start[0])), pa.array(np.full(len(positions), created[0], np.int64)),
                pa.array(np.full(len(positions), updated[0], np.int64))]
    idx = np.searchsorted(pos_start, positions, side="right") - 1
    return [pa.array(row_id_start[idx] + (positions - pos_start[idx])), pa.array(created[idx]), pa.array(updated[idx])]


def _chunks(task: FileSlice) -> list[tuple[int, int]]:
    """The position ranges of the row groups starting in the task's slice, merged up to :data:`CHUNK_ROWS` rows."""
    starts = layout(task.local).starts if task.rows else np.zeros(1, np.int64)
    bounds = [(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True) if task.start <= a < task.end]
    out: list[tuple[int, int]] = []
    for a, b in bounds:
        if out and b - out[-1][0] <= CHUNK_ROWS:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _rows(task: FileSlice, spec: MatchPass, columns: Sequence[str], positions: np.ndarray) -> pa.Table:
    """Data columns ``columns`` of ``task``'s file at ``positions`` (sorted), read by field id in the table's types."""
    schema = pa.schema([spec.schema.field(c) for c in columns])
    if not columns:
        return pa.table({"__n": pa.nulls(len(positions), pa.null())}).drop_columns(["__n"])
    return read_at([task.path], np.zeros(len(positions), np.int64), positions, schema, spec.field_ids, cache=False)


def _view(data: pa.Table, task: FileSlice, positions: np.ndarray, lineage: bool = True) -> pa.Table:
    """``data`` (rows at ``positions``) with the lineage columns (unless not ``lineage``) and ``__pos``: the embedded live view's columns."""
    cols, names = list(data.columns), list(data.column_names)
    if lineage:
        cols += lineage_at(task.runs, positions)
        names += [f.name for f in LINEAGE_SCHEMA]
    return pa.Table.from_arrays([*cols, pa.array(positions, pa.int64())], names=[*names, POS])


def _query(con: Any, rows: pa.Table, sql: str) -> pa.Table:
    con.register("live", rows)
    try:
        return con.execute(sql).to_arrow_table()
    finally:
        con.unregister("live")


def evaluate_slice(con: Any, task: FileSlice, spec: MatchPass) -> Iterator[pa.RecordBatch]:
    """The rows of ``task``'s slice that ``spec.where`` matches, as ``spec.select`` makes them (batches of ``spec.out``).

    ``con`` is a sealed DuckDB connection (it reads no file: the rows are
    read here and registered).
    """
    dead = dead_positions(task.path, task.deletes)
    # the matched rows' image: every column the predicate or the SELECT list reads, in the table's order
    wanted = [c for c in spec.schema.names if c in spec.where_columns or c in spec.image_columns]
    extra = [c for c in wanted if c not in spec.where_columns]
    for a, b in _chunks(task):
        keep = np.ones(b - a, bool)
        keep[dead[(dead >= a) & (dead < b)] - a] = False
        live = np.flatnonzero(keep).astype(np.int64) + a
        if not len(live):
            continue
        data = _rows(task, spec, spec.where_columns, live)
        hit = _query(con, _view(data, task, live, spec.where_lineage), f"SELECT {POS} FROM live WHERE ({spec.where})").column(POS).to_numpy()
        if not len(hit):
            continue
        hit = np.sort(hit.astype(np.int64))
        taken = data.take(pa.array(np.searchsorted(live, hit), pa.int64()))
        del data
        more = _rows(task, spec, extra, hit)
        image = pa.Table.from_arrays([taken.column(c) if c in spec.where_columns else more.column(c) for c in wanted], names=wanted)
        image = _view(image, task, hit).append_column(pa.field(PATH, pa.string()), pa.array([task.local] * len(hit), pa.string()))
        yield from _query(con, image, f"SELECT {spec.select} FROM live").cast(spec.out).to_batches()
