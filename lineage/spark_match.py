"""The predicate pass of a Spark delete, update or purge: executors read, evaluate and emit only the matches.

Each Spark task takes a slice of one data file (:class:`FileSlice`) and, in
its Python worker, with no row crossing the JVM, builds the embedded
engine's own live view over that file (:func:`lineage.read.scan.register_live_view`:
columns matched by Iceberg field id, so a renamed column keeps its values
and one added by schema evolution reads as null; the file's position delete
files and Iceberg v3 deletion vectors applied, so removed rows never match;
the lineage columns from the file's runs). The checked predicate and SELECT
list run on that view in a sealed DuckDB database that may read only the
file and its delete files (:func:`lineage.duck.seal`), so they mean on Spark
exactly what they mean embedded. DuckDB reads only the columns they name,
the predicate's first, and decodes the others for the matched rows.

The driver sends each task its slice (the live file: metadata) and receives
nothing: the result is a Spark DataFrame that the next step (the delete
files and index segment of :mod:`lineage.writes.spark_removed`, the new
images of an update) consumes on the executors.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

import lineage.duck as duck
import lineage.storage.spark_read as spark_read
from lineage.read.scan import register_live_view
from lineage.errors import LineageMetadataError
from lineage.sql.predicate import Predicate
from lineage.state import LiveFile
from lineage.storage.fileio import local_path

SLICE_ROWS = 4_000_000  # a data file longer than this is split into slices of this many positions, one task each
BATCH_ROWS = 65_536  # rows per Arrow batch a task hands back to Spark
PATH, POS = "__path", "__pos"


@dataclass(frozen=True)
class FileSlice:
    """A task's share of one live data file: its positions ``[start, end)``."""

    file: LiveFile
    start: int
    end: int


@dataclass(frozen=True)
class MatchPass:
    """What every task of one pass evaluates: the checked predicate and SELECT list over the live view.

    ``where`` and ``select`` come from the checked expression layer
    (:mod:`lineage.sql.expressions`); ``select`` may name the data columns,
    the lineage columns, ``__path`` (the file's local path) and ``__pos``.
    """

    schema: pa.Schema
    field_ids: dict[str, int] | None
    where: str
    exact_floats: bool
    select: str
    out: pa.Schema
    lineage: LineageSource | None = None  # where a task reads the lineage of files sent without it


@dataclass(frozen=True)
class LineageSource:
    """Where the tasks of a pass read the lineage of the files the driver sends without it: each file's lineage
    segment, by path (:meth:`lineage.state.TableState.files`), read once per Python worker (segments are cached)."""

    io_properties: dict[str, str]
    location: str
    segment_of: dict[str, str]  # data file location -> the lineage segment holding its lineage

    def attach(self, f: LiveFile) -> LiveFile:
        """``f`` with its lineage (read here when the driver left it out)."""
        if f.lineage is not None:
            return f
        from pyiceberg.io import load_file_io

        import lineage.storage.files as store

        store.register(self.location, self.io_properties)
        seg = self.segment_of[f.path]
        found = _segment_index(load_file_io(self.io_properties, self.location), seg).get(f.path)
        if found is None:
            raise LineageMetadataError(f"lineage segment {seg} does not describe the data file {f.path}")
        return replace(f, lineage=found)


_INDEXED: dict[str, dict[str, Any]] = {}  # a worker's lineage segments by file path, the last few it read


def _segment_index(io: Any, segment: str) -> dict[str, Any]:
    """The lineage of ``segment``'s files by path (read through the segment cache; indexed once per worker)."""
    from lineage.storage.metadata import read_segment

    got = _INDEXED.get(segment)
    if got is None:
        if len(_INDEXED) >= 16:
            _INDEXED.pop(next(iter(_INDEXED)))
        got = _INDEXED[segment] = {fl.file_path: fl for fl in read_segment(io, segment)}
    return got


def slices(files: Sequence[LiveFile], slice_rows: int | None = None) -> list[FileSlice]:
    """The tasks of a pass over ``files``: one per file, or one per ``slice_rows`` (default :data:`SLICE_ROWS`) positions of a longer file."""
    slice_rows = SLICE_ROWS if slice_rows is None else slice_rows
    out = []
    for f in files:
        rows = int(f.data_file.record_count)
        out.extend(FileSlice(f, start, min(rows, start + slice_rows)) for start in range(0, max(rows, 1), slice_rows))
    return out


def match_pass(schema: pa.Schema, field_ids: dict[str, int] | None, pred: Predicate, select: str, out: pa.Schema) -> MatchPass:
    """The :class:`MatchPass` of ``pred`` and ``select`` over a table of ``schema`` (``field_ids``: :func:`lineage.iceberg.schema.projection_field_ids`)."""
    return MatchPass(schema, field_ids, pred.sql, pred.reads_floats, select, out)


def matches(spark: Any, files: Sequence[LiveFile], spec: MatchPass) -> Any:
    """Executors run ``SELECT spec.select FROM live WHERE spec.where`` over the live rows of ``files``: a Spark DataFrame of ``spec.out``.

    The :func:`slices` are dealt to as many tasks as Spark runs at once
    (:func:`deal`): each Python task costs Spark a fixed tenth of a second or
    so of CPU in the JVM and in the worker, more than evaluating a
    million-row file. The slices travel with the pickled function (Spark
    broadcasts a large one); the DataFrame handed to the workers holds only
    task numbers.
    """
    spark_schema = spark.createDataFrame(spec.out.empty_table()).schema
    pieces = slices(files)
    if not pieces:
        return spark.createDataFrame(spec.out.empty_table())
    tasks = deal(pieces, spark.sparkContext.defaultParallelism)
    blob = pickle.dumps(tasks)
    ids = spark.range(0, len(tasks), 1, numPartitions=len(tasks))
    return ids.mapInArrow(spark_read.with_settings(_task(blob, spec)), spark_schema)


def deal(pieces: Sequence[FileSlice], tasks: int) -> list[list[FileSlice]]:
    """``pieces`` dealt to at most ``tasks`` tasks, the longest first, each to the task with the fewest rows so far."""
    out: list[list[FileSlice]] = [[] for _ in range(max(1, min(tasks, len(pieces))))]
    load = [0] * len(out)
    for piece in sorted(pieces, key=lambda p: p.end - p.start, reverse=True):
        i = load.index(min(load))
        out[i].append(piece)
        load[i] += piece.end - piece.start
    return out


def _task(blob: bytes, spec: MatchPass) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: the slices dealt to the incoming task numbers, evaluated one after the other."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tasks: list[list[FileSlice]] = pickle.loads(blob)
        for i in [int(i) for b in batches for i in b.column(0).to_pylist()]:
            for piece in tasks[i]:
                yield from evaluate_slice(piece, spec)

    return run


def open_slice(task: FileSlice, spec: MatchPass) -> Any:
    """A sealed DuckDB connection whose view ``live`` holds the live rows of ``task``'s file, and the SQL of the pass over the slice."""
    return open_files([task.file], spec)


def open_files(files: Sequence[LiveFile], spec: MatchPass) -> Any:
    """A sealed DuckDB connection whose view ``__live`` holds the live rows of ``files`` (``__file_id``: the index in ``files``)."""
    if spec.lineage is not None:
        files = [spec.lineage.attach(f) for f in files]
    con = duck.connect(isolated=True)
    try:
        con.execute("SET threads = 1")  # one core per Spark task: the task slots are the parallelism
        paths = register_live_view(con, "__live", files, spec.schema, spec.field_ids)
        duck.seal(con, paths, exact_floats=spec.exact_floats)  # the files and their delete files, nothing else
    except BaseException:
        con.close()
        raise
    return con


def evaluate_files(files: Sequence[LiveFile], spec: MatchPass) -> Iterator[pa.RecordBatch]:
    """The rows of ``files`` (whole) that ``spec.where`` matches, as ``spec.select`` makes them: one query on one connection.

    A task that evaluates several files pays for one DuckDB database, not one per file.
    """
    if not files:
        return
    con = open_files(files, spec)
    try:
        names = " ".join(f"WHEN {i} THEN '" + local_path(f.path).replace("'", "''") + "'" for i, f in enumerate(files))
        sql = f"SELECT {spec.select} FROM (SELECT *, CASE __file_id {names} END AS {PATH} FROM __live) live WHERE ({spec.where})"
        for batch in con.execute(sql).fetch_record_batch(BATCH_ROWS):
            if batch.num_rows:
                yield from pa.Table.from_batches([batch]).cast(spec.out).to_batches()
    finally:
        con.close()


def slice_sql(task: FileSlice, spec: MatchPass) -> str:
    """The query of the pass over ``task``'s slice, on a connection from :func:`open_slice`."""
    whole = task.start == 0 and task.end >= task.file.data_file.record_count
    within = "" if whole else f"{POS} >= {int(task.start)} AND {POS} < {int(task.end)} AND "
    path = "'" + local_path(task.file.path).replace("'", "''") + "'"
    return f"SELECT {spec.select} FROM (SELECT *, {path} AS {PATH} FROM __live) live WHERE {within}({spec.where})"


def evaluate_slice(task: FileSlice, spec: MatchPass) -> Iterator[pa.RecordBatch]:
    """The rows of ``task``'s slice that ``spec.where`` matches, as ``spec.select`` makes them (batches of ``spec.out``)."""
    con = open_slice(task, spec)
    try:
        reader = con.execute(slice_sql(task, spec)).fetch_record_batch(BATCH_ROWS)
        for batch in reader:
            if batch.num_rows:
                yield from pa.Table.from_batches([batch]).cast(spec.out).to_batches()
    finally:
        con.close()
