"""Removed images written by Spark executors: position delete files and the deleted-rows index segment.

A Spark upsert finds the live images it removes on
executors (a DataFrame of pointers: ``__path``, ``__pos``, the lineage
columns, and optionally key values and old values). :func:`write_removed`
keeps them there. The pointers are repartitioned by delete-file group (a
data file, or a partition when the table's delete granularity groups by
partition) and each task, for its groups:

* writes the position delete files (:func:`lineage.storage.writer.write_position_deletes`,
  the embedded engine's writer and grouping), or on an Iceberg v3 table one
  deletion vector per data file, merged with the file's current deletes
  (:func:`lineage.storage.deletion_vectors.write_vectors`, as embedded);
* builds the index segment's row of each data file (positions as a roaring
  bitmap, row ids, created and valid-from versions as runs, captured values):
  :func:`index.deleted_rows.index_rows`;
* with the key index on, writes the removed images' keys to a scratch file.

One more task concatenates the index rows and writes the commit's index
segment. The driver collects one small summary row per data file (its path,
the number of images removed, the pickled descriptors of the delete files)
and the segment's path, never a row per removed image. The key index is the
exception: its delta segment is built on the driver, which reads the removed
keys back from the scratch files (key columns only).

A delete or update by predicate writes the same files with the pieces
below (:func:`removed_of`, :func:`index_blob`, :func:`write_deletes`,
:func:`write_keys`, :func:`write_segment`) in the tasks that match the rows
(:mod:`lineage.writes.spark_onepass`).
"""

from __future__ import annotations

import io as _io
import pickle
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile

from index.deleted_rows import RemovedImages, WrittenIndex, captured_values, index_rows, write_index_table
import lineage.iceberg.v3_metadata as v3_metadata
import lineage.spark as spark_io
import lineage.storage.files as store
import lineage.writes.spark_scratch as spark_scratch
from lineage.context import TableContext
from lineage.properties import delete_granularity
from lineage.state import LiveFile, TableState
from lineage.storage.fileio import write_bytes
from lineage.storage.metadata import index_dir
from lineage.storage.deletion_vectors import VectorTarget
from lineage.storage.merged_deletes import write_file_deletes
from lineage.storage.writer import spec_id_of

POINTER_COLUMNS = ["__path", "__pos", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
KEY_PREFIX = "__old_key_"  # the removed images' key values, one column per key column
OLD_PREFIX = "__old_"  # their data columns' values (pre-image capture), one column per data column

_INDEX_SUFFIX = "-deleted-rows.parquet"  # the index segment's name is the job's prefix (its scratch files') and this
_SUMMARY = "__path string, __images long, __deletes binary, __index binary, __keys string, __ledgers string"


@dataclass
class RemovedOnSpark:
    """What executors wrote for the removed images, as the driver sees it (O(files touched)).

    ``images``: how many images were removed; ``delete_files``: the position
    delete files; ``index``: the index segment (None when nothing was removed);
    ``removed_keys``: the removed images' keys for the key index (None without
    it); ``files_touched``: data files with a removed image; ``replaced``:
    on Iceberg v3, the deletion vectors the new ones replace (the commit
    removes them).
    """

    images: int = 0
    delete_files: list[DataFile] = field(default_factory=list)
    index: WrittenIndex | None = None
    removed_keys: pa.Table | None = None
    files_touched: int = 0
    replaced: list[DataFile] = field(default_factory=list)


def write_removed(table: TableContext, state: TableState, files: list[LiveFile], pointers: Any, key: list[str], capture: bool) -> RemovedOnSpark:
    """Executors write the delete files and the index segment of the images ``pointers`` names.

    ``pointers`` is a Spark DataFrame with :data:`POINTER_COLUMNS`, the key
    values ``__old_key_<i>`` of ``key`` and, with ``capture``, the old values
    ``__old_<i>`` of every data column. ``files`` are the live files the
    pointers point into. The commit that uses the result must be made on
    ``state`` (its version is in the index segment).
    """
    from pyspark.sql import functions as F

    if not files:
        return RemovedOnSpark()
    session = pointers.sparkSession
    context = removal_context(table, state, files, key, capture)
    groups = _delete_groups(files, context.granularity, table.iceberg.metadata.default_spec_id)
    group_df = session.createDataFrame(pa.table({"__gpath": [store.local_path(f.path) for f in files], "__group": groups}))
    cols = POINTER_COLUMNS + [f"{KEY_PREFIX}{i}" for i in range(len(key))] + ([f"{OLD_PREFIX}{i}" for i in range(len(context.schema))] if capture else [])
    keyed = pointers.select(*[spark_io.column(c) for c in cols]).join(F.broadcast(group_df), F.col("__path") == F.col("__gpath")).drop("__gpath")
    tasks = max(1, min(len(set(groups)), session.sparkContext.defaultParallelism))
    ordered = keyed.repartition(tasks, "__group").sortWithinPartitions("__group", "__path", "__pos")
    summaries = ordered.mapInArrow(_file_writer(context), _SUMMARY).persist()
    try:
        rows = summaries.select("__path", "__images", "__deletes", "__keys", "__ledgers").collect()  # one row per data file touched
        if not rows:
            return RemovedOnSpark()
        written = summaries.select("__index").coalesce(1).mapInArrow(_segment_writer(context), "size long, images long").collect()
    except BaseException:
        spark_scratch.discard(table.iceberg.io, context.prefix)  # nothing is committed
        raise
    finally:
        summaries.unpersist()
    store.delete_many(sorted({p for r in rows if r["__ledgers"] for p in r["__ledgers"].split("\n")}))
    return assemble(context, table.iceberg.io, key, rows, written[0]["size"], written[0]["images"])


def removal_context(table: TableContext, state: TableState, files: list[LiveFile], key: list[str], capture: bool) -> RemovalContext:
    """What the executor tasks removing images from ``files`` need, for a commit on ``state``."""
    ice = table.iceberg
    version = ice.metadata.next_sequence_number()
    granularity, limit = delete_granularity(ice.metadata.properties)
    field_ids = {f.name: f.field_id for f in ice.schema().fields}
    scratch = f"{index_dir(ice.metadata.location)}/{version:09d}-{uuid.uuid4()}"
    return RemovalContext(
        v3_metadata.metadata_json(ice.metadata).decode(), dict(ice.io.properties), ice.metadata.location, version, granularity, limit,
        {store.local_path(f.path): f.data_file for f in files}, table.arrow_schema, field_ids, len(key), capture, scratch if key else None,
        current={store.local_path(f.path): tuple(f.deletes) for f in files}, vectors=ice.metadata.format_version >= 3,
        index_path=f"{scratch}{_INDEX_SUFFIX}",
    )


def assemble(ctx: RemovalContext, io: Any, key: list[str], rows: list[Any], index_size: int, index_images: int) -> RemovedOnSpark:
    """The driver's view of what executors wrote: ``rows`` (``__path``, ``__images``, ``__deletes``, ``__keys``; one per data file touched) and the index segment."""
    images = sum(r["__images"] for r in rows)
    if index_images != images:
        raise RuntimeError(f"internal: the index segment holds {index_images} images, the delete files {images}")
    written_deletes = [pickle.loads(r["__deletes"]) for r in rows if r["__deletes"] is not None]
    deletes = [d for new, _ in written_deletes for d in new]
    replaced = [d for _, old in written_deletes for d in old]
    keys = _read_keys(io, sorted({r["__keys"] for r in rows if r["__keys"]}), key, ctx.schema) if key else None
    return RemovedOnSpark(images, deletes, WrittenIndex(ctx.index_path, index_size, images, ctx.version), keys, len(rows), replaced)


def _delete_groups(files: list[LiveFile], granularity: str, default_spec: int) -> list[int]:
    """Which files' deletes one task writes together: each file alone, or a partition's files (``partition``, ``auto``)."""
    if granularity == "file":
        return list(range(len(files)))
    ids: dict[tuple, int] = {}
    return [ids.setdefault((spec_id_of(f.data_file, default_spec), repr(f.data_file.partition)), len(ids)) for f in files]


@dataclass(frozen=True)
class RemovalContext:
    """What an executor task needs (pickled with the task): table metadata, a FileIO's settings, the commit's facts."""

    metadata_json: str
    io_properties: dict[str, str]
    location: str
    version: int
    granularity: str
    file_scoped_limit: int
    data_files: dict[str, DataFile]  # by local path, as Spark rows name them
    schema: pa.Schema
    field_ids: dict[str, int]
    keys: int
    capture: bool
    scratch: str | None  # prefix of the removed-keys files (key index on)
    current: dict[str, tuple[DataFile, ...]] = field(default_factory=dict)  # each data file's current deletes, by local path
    vectors: bool = False  # Iceberg v3: deletion vectors, one per data file
    index_path: str = ""  # where the commit's index segment goes

    @property
    def prefix(self) -> str:
        """The job's prefix: its scratch files, ledgers (:mod:`lineage.writes.spark_scratch`) and index segment are named from it."""
        return self.index_path.removesuffix(_INDEX_SUFFIX)

    def target(self) -> Any:
        from pyiceberg.table.metadata import TableMetadataUtil

        return spark_io.WriteTarget(TableMetadataUtil.parse_raw(self.metadata_json), spark_io.executor_io(self.io_properties, self.location))


def _file_writer(ctx: RemovalContext) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: a task's pointers (sorted by group, file, position) to delete files and index rows."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        got = list(batches)
        data = pa.Table.from_batches(got) if got else None
        if data is None or not data.num_rows:
            return
        target = ctx.target()
        codes = data.column("__path").combine_chunks().dictionary_encode()
        ids = codes.indices.to_numpy()
        paths = codes.dictionary.to_pylist()
        starts = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1))
        bounds = [*starts.tolist(), len(ids)]
        group_of = data.column("__group").to_numpy()
        positions = data.column("__pos").to_numpy().astype(np.int64)
        keys_path = write_keys(ctx, target, data, TaskContext.get().partitionId())
        ledger = spark_scratch.Ledger(target.io, ctx.prefix)
        by_group: dict[int, list[tuple[int, int]]] = {}
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            by_group.setdefault(int(group_of[s]), []).append((s, e))
        out_schema = pa.schema([("__path", pa.string()), ("__images", pa.int64()), ("__deletes", pa.binary()), ("__index", pa.binary()),
                                ("__keys", pa.string()), ("__ledgers", pa.string())])
        for spans in by_group.values():
            written = write_deletes(ctx, target, [(paths[ids[s]], positions[s:e]) for s, e in spans], ctx.granularity)
            ledger.wrote([d.file_path for d in written[0]])
            for n, (s, e) in enumerate(spans):
                yield pa.RecordBatch.from_pydict(
                    {"__path": [paths[ids[s]]], "__images": [e - s], "__deletes": [pickle.dumps(written) if n == 0 else None],
                     "__index": [index_blob(removed_of(ctx, paths[ids[s]], data.slice(s, e - s)))], "__keys": [keys_path],
                     "__ledgers": ["\n".join(ledger.paths) or None]},
                    schema=out_schema,
                )
                ledger.paths = []

    return run


def write_keys(ctx: RemovalContext, target: Any, data: pa.Table, task: int) -> str | None:
    """With the key index on, the removed images' keys (``__old_key_<i>`` of ``data``) written to a scratch file of task ``task``; its path."""
    if ctx.scratch is None:
        return None
    path = f"{ctx.scratch}-{task}-{uuid.uuid4()}-removed-keys.parquet"  # named per attempt: a task Spark runs again writes anew
    sink = _io.BytesIO()
    pq.write_table(data.select([f"{KEY_PREFIX}{i}" for i in range(ctx.keys)]), sink)
    write_bytes(target.io, path, sink.getvalue())
    return path


def write_deletes(ctx: RemovalContext, target: Any, members: list[tuple[str, np.ndarray]], granularity: str) -> tuple[list[DataFile], list[DataFile]]:
    """The delete files of ``members`` (local path of a data file, positions), grouped by ``granularity``, and the deletes they
    replace: as the embedded engine writes them (:func:`lineage.storage.merged_deletes.write_file_deletes`)."""
    return write_file_deletes(target, [VectorTarget(ctx.data_files[p], pos, ctx.current[p]) for p, pos in members], granularity)


def removed_of(ctx: RemovalContext, path: str, rows: pa.Table) -> RemovedImages:
    """The images ``rows`` (:data:`POINTER_COLUMNS` of one data file, by local ``path``, sorted by position) removed by the commit."""
    ints = {c: rows.column(c).to_numpy().astype(np.int64) for c in POINTER_COLUMNS[1:]}
    return RemovedImages(ctx.data_files[path].file_path, ints["__pos"], ints["_row_id"], ints["_row_created_at_version"],
                         ints["_row_last_updated_at_version"], ctx.version, _values(rows, ctx) if ctx.capture else None)


def index_blob(removed: RemovedImages) -> bytes:
    """The index segment row of ``removed`` as Arrow IPC bytes (what travels to the task writing the segment)."""
    sink = _io.BytesIO()
    with pa.ipc.new_stream(sink, (rows := index_rows([removed])).schema) as w:
        w.write_table(rows)
    return sink.getvalue()


def write_segment(ctx: RemovalContext, io: Any, blobs: list[bytes]) -> tuple[int, int]:
    """The index rows ``blobs`` (:func:`index_blob`) written as the commit's index segment (``ctx.index_path``); its size and image count."""
    parts = [pa.ipc.open_stream(blob).read_all() for blob in blobs]
    rows = pa.concat_tables(parts, promote_options="permissive")
    size = write_index_table(io, ctx.index_path, rows)
    return size, sum(len(p.column("row_ids")[0]) for p in parts)


def _values(rows: pa.Table, ctx: RemovalContext) -> pa.Table:
    """The removed images' old values (``__old_<i>``), in the table's types, columns named by field id."""
    values = pa.Table.from_arrays([rows.column(f"{OLD_PREFIX}{i}").cast(f.type) for i, f in enumerate(ctx.schema)], names=ctx.schema.names)
    return captured_values(values, ctx.field_ids)


def _segment_writer(ctx: RemovalContext) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function (one task): the index rows of every data file written as one index segment."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        blobs = [blob for b in batches for blob in b.column("__index").to_pylist()]
        if not blobs:
            return
        size, images = write_segment(ctx, ctx.target().io, blobs)
        yield pa.RecordBatch.from_pydict({"size": [size], "images": [images]}, schema=pa.schema([("size", pa.int64()), ("images", pa.int64())]))

    return run


def _read_keys(io: Any, paths: list[str], key: list[str], schema: pa.Schema) -> pa.Table:
    """The removed images' keys from the executors' scratch files (which are deleted)."""
    names = [f"{KEY_PREFIX}{i}" for i in range(len(key))]
    out = pa.schema([schema.field(k).with_nullable(True) for k in key])
    parts = []
    try:
        for p in paths:
            with io.new_input(p).open() as f:
                got = pq.read_table(f, columns=names)
            parts.append(pa.Table.from_arrays([got.column(n).cast(out.field(i).type) for i, n in enumerate(names)], schema=out))
    finally:
        store.delete_many(paths)
    return pa.concat_tables(parts) if parts else out.empty_table()
