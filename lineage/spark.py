"""Spark integration: scans with lineage, and writes of Spark DataFrames.

Executors do all row work: they read the Parquet files (``_metadata.file_path``
and ``_metadata.row_index`` give positions), and they write new data files
with this library's own writer inside ``mapInArrow``. The driver handles only
metadata: file lists, lineage runs, summaries of what executors removed
(:mod:`lineage.writes.spark_removed`), and the descriptors of written files,
then stamps lineage and commits one Iceberg snapshot, exactly like the Python
path.

Spark's Python workers must import this package: run them with the same
interpreter (``spark.pyspark.python``) or install the package on the workers.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa

from lineage.context import TableContext
from lineage.errors import InvalidArgumentError, KeyViolationError, LineageMetadataError
from lineage.storage.fileio import local_path
from lineage.storage.rle import combined_breakpoints, encode_sequence, encode_values
from lineage.iceberg.schema import arrow_schema, conform, projection_field_ids
import lineage.storage.files as store
import lineage.storage.spark_read as spark_read
import lineage.spark_match as spark_match
from lineage.state import LiveFile, TableState
from lineage.read.values import file_columns, layout
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, HIDDEN_UPDATED
import lineage.iceberg.v3_metadata as v3_metadata
from lineage.sql.predicate import Predicate
from lineage.storage.deletes import is_puffin, vector_table
from lineage.storage.writer import WrittenFile, write_data_files


# Data file locations as position delete files store them: plain paths or file: URIs (not percent-encoded).
_NORMALIZE = r"^file:(//)?"


def is_spark_dataframe(data: object) -> bool:
    """Whether ``data`` is a PySpark DataFrame (without importing pyspark eagerly)."""
    return type(data).__module__.startswith("pyspark.sql") and type(data).__name__ == "DataFrame"


def spark_session(spark: Any) -> Any:
    """``spark``, else the active Spark session (InvalidArgumentError if there is none)."""
    if spark is not None:
        return spark
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - pyspark is a dependency
        raise InvalidArgumentError("engine='spark' needs pyspark") from None
    active = SparkSession.getActiveSession()
    if active is None:
        raise InvalidArgumentError("engine='spark' needs spark=<SparkSession> (no active session found)")
    return active


def column(name: str) -> Any:
    """The Spark column ``name``, quoted (names may hold spaces, dots or backticks)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def file_index(spark: Any, df: Any, paths: list[str], numbers: list[int] | None = None) -> Any:
    """A small DataFrame naming each file ``df`` reads: ``__uri``, ``__path`` and ``__file``.

    ``df`` is a Spark read of ``paths``. Spark names a file by its URI, which
    it percent-encodes (``_metadata.file_path`` is ``file:/my%20lake/a.parquet``
    for ``/my lake/a.parquet``), so rows are matched to the table's paths
    through Spark's own listing (``inputFiles()``, no job) decoded once per
    file here, not by rewriting the URI on every row. ``__path`` is the
    file's local path as :func:`~lineage.storage.fileio.local_path` gives it and
    ``__file`` its index in ``paths`` (or ``numbers[index]``).
    """
    wanted: dict[str, int] = {}
    for i, p in enumerate(paths):
        wanted.setdefault(os.path.normpath(local_path(p)), i)
    uris, locals_, ids = [], [], []
    found = set()
    for uri in df.inputFiles():
        parsed = urlparse(uri)
        i = wanted.get(os.path.normpath(unquote(parsed.path)))
        if i is None:
            raise LineageMetadataError(f"Spark lists the file {uri!r}, which is none of the {len(paths)} files it was asked to read")
        found.add(i)
        # the listing says file:///x where _metadata.file_path says file:/x: both spellings map to the file
        spellings = {uri} if parsed.netloc else {uri, f"{parsed.scheme}:{parsed.path}", f"{parsed.scheme}://{parsed.path}"}
        for spelling in sorted(spellings):
            uris.append(spelling)
            locals_.append(local_path(paths[i]))
            ids.append(i if numbers is None else numbers[i])
    if len(found) != len(wanted):
        raise LineageMetadataError(f"Spark lists {len(found)} of the {len(wanted)} files it was asked to read")
    return spark.createDataFrame(pa.table({"__uri": pa.array(uris, pa.string()), "__path": pa.array(locals_, pa.string()),
                                           "__file": pa.array(ids, pa.int32())}))


def read_files(spark: Any, paths: list[str], schema: pa.Schema, field_ids: dict[str, int] | None = None) -> Any:
    """Rows of ``paths`` (``schema``'s columns) with ``__path`` (local path), ``__file`` (index in ``paths``) and ``__pos`` (row index).

    With ``field_ids`` (the table's schema evolved: :func:`lineage.iceberg.schema.projection_field_ids`)
    columns are matched by Iceberg field id, as the embedded engine does: files
    are grouped by the names their footers give the columns (one group per
    schema the table had), a column a file lacks reads as null, and older
    types are cast to the current ones.
    """
    from pyspark.sql import functions as F

    if any(store.is_remote(p) for p in paths):  # executors read through pyarrow: no hadoop-aws on the cluster
        return remote_files(spark, paths, schema, field_ids)
    groups: dict[tuple[str | None, ...], list[int]] = {}
    for i, p in enumerate(paths):
        sources = tuple(schema.names) if field_ids is None else tuple(file_columns(layout(local_path(p)).arrow, schema, field_ids))
        groups.setdefault(sources, []).append(i)
    types = spark.createDataFrame(schema.empty_table()).schema if field_ids is not None else None
    out = None
    for sources, members in groups.items():
        group = [paths[i] for i in members]
        # recursiveFileLookup disables partition inference from directory names like id_bucket=3.
        df = spark.read.option("recursiveFileLookup", "true").parquet(*[local_path(p) for p in group])
        if types is None:
            cols = [column(c) for c in schema.names]
        else:
            cols = [(column(src) if src is not None else F.lit(None)).cast(types[c].dataType).alias(c)
                    for c, src in zip(schema.names, sources, strict=True)]
        rows = df.select(*cols, F.col("_metadata.file_path").alias("__uri"), F.col("_metadata.row_index").alias("__pos"))
        rows = rows.join(F.broadcast(file_index(spark, df, group, members)), "__uri").drop("__uri")
        out = rows if out is None else out.unionByName(rows)
    return out


def remote_files(spark: Any, paths: list[str], schema: pa.Schema, field_ids: dict[str, int] | None = None) -> Any:
    """:func:`read_files` of files on an object store: Spark's Python workers read them (:mod:`lineage.storage.spark_read`)."""
    from pyspark.sql import functions as F

    sources = [file_columns(layout(local_path(p)).arrow, schema, field_ids) if field_ids is not None else list(schema.names)
               for p in paths]
    rows = spark_read.read_files(spark, paths, schema, sources)
    names = spark.createDataFrame(pa.table({"__file": pa.array(range(len(paths)), pa.int32()),
                                            "__path": pa.array([local_path(p) for p in paths], pa.string())}))
    return rows.join(F.broadcast(names), "__file")


def live_rows(spark: Any, state: TableState, columns: list[str], files: list[LiveFile] | None = None) -> Any:
    """Live images with lineage (and ``__path``/``__pos``) as a Spark DataFrame."""
    from pyspark.sql import functions as F

    files = state.live_files() if files is None else files
    if not files:
        schema = pa.schema(
            [state_field for state_field in arrow_schema_of(state) if state_field.name in columns]
            + [pa.field(n, pa.int64()) for n in ("_row_id", "_row_created_at_version", "_row_last_updated_at_version", "__pos")]
            + [pa.field("__path", pa.string())]
        )
        return spark.createDataFrame(pa.Table.from_batches([], schema=schema))
    table_schema = arrow_schema_of(state)
    rows = read_files(spark, [f.path for f in files], pa.schema([table_schema.field(c) for c in columns]),
                      projection_field_ids(state.iceberg.metadata))

    deletes = sorted({local_path(d) for f in files for d in f.delete_paths if not is_puffin(d)})
    vectors = sorted({d for f in files for d in f.delete_paths if is_puffin(d)})  # Iceberg v3 deletion vectors (small: read here)
    if deletes or vectors:
        found = None
        if deletes:
            found = (spark_read.read_files(spark, deletes, pa.schema([("file_path", pa.string()), ("pos", pa.int64())]))
                     if any(store.is_remote(d) for d in deletes) else spark.read.parquet(*deletes))
        if vectors:
            dv = spark.createDataFrame(vector_table(vectors))
            found = dv if found is None else found.select("file_path", "pos").unionByName(dv)
        dels = found.select(
            F.regexp_replace(F.col("file_path"), _NORMALIZE, "").alias("__dpath"), F.col("pos").alias("__dpos")
        )
        rows = rows.join(dels, (rows["__path"] == dels["__dpath"]) & (rows["__pos"] == dels["__dpos"]), "left_anti")

    single, multi = [], []
    for f in files:
        pos, rid, created, updated = combined_breakpoints(f.lineage.row_ids, f.lineage.created, f.lineage.updated)
        ends = np.append(pos[1:], f.lineage.record_count)
        entry = (local_path(f.path), pos, ends - pos, rid, created, updated)
        (single if len(pos) == 1 else multi).append(entry)

    def runs_table(entries: list[tuple]) -> pa.Table:
        return pa.table({"__rpath": pa.array([p for e in entries for p in [e[0]] * len(e[1])], pa.string()), **runs_columns(entries)})

    def runs_columns(entries: list[tuple]) -> dict[str, np.ndarray]:
        return {
            "pos_start": np.concatenate([e[1] for e in entries]),
            "length": np.concatenate([e[2] for e in entries]),
            "row_id_start": np.concatenate([e[3] for e in entries]),
            "created": np.concatenate([e[4] for e in entries]),
            "updated": np.concatenate([e[5] for e in entries]),
        }

    lineage_cols = [
        (F.col("row_id_start") + F.col("__pos") - F.col("pos_start")).alias("_row_id"),
        F.col("created").alias("_row_created_at_version"),
        F.col("updated").alias("_row_last_updated_at_version"),
    ]
    out = []
    if single:
        runs = F.broadcast(spark.createDataFrame(runs_table(single)))
        out.append(rows.join(runs, rows["__path"] == runs["__rpath"]).select(*[column(c) for c in columns], *lineage_cols, "__path", "__pos"))
    if multi:
        # Files an update or upsert wrote have up to one run per row: the runs name their file by number, not by path
        # (a path per run made the driver's table, and its copy on the way to the JVM, several times larger).
        numbers = F.broadcast(spark.createDataFrame(pa.table({"__mpath": [e[0] for e in multi], "__fno": np.arange(len(multi), dtype=np.int32)})))
        ids = np.repeat(np.arange(len(multi), dtype=np.int32), [len(e[1]) for e in multi])
        runs = (
            spark.createDataFrame(pa.table({"__rfno": ids, **runs_columns(multi)}))
            .withColumn("__i", F.explode(F.sequence(F.lit(0).cast("long"), F.col("length") - 1)))
            .withColumn("__ppos", F.col("pos_start") + F.col("__i"))
        )
        numbered = rows.join(numbers, rows["__path"] == numbers["__mpath"])
        joined = numbered.join(runs, (numbered["__fno"] == runs["__rfno"]) & (numbered["__pos"] == runs["__ppos"]))
        out.append(joined.select(*[column(c) for c in columns], *lineage_cols, "__path", "__pos"))
    result = out[0]
    for other in out[1:]:
        result = result.unionByName(other)
    return result


def arrow_schema_of(state: TableState) -> pa.Schema:
    """The table's data columns at ``state`` as an Arrow schema."""
    return arrow_schema(state.iceberg.schema())


def to_spark(spark: Any, state: TableState, with_lineage: bool = True) -> Any:
    """The table at ``state`` as a Spark DataFrame with the lineage columns."""
    columns = arrow_schema_of(state).names
    df = live_rows(spark, state, columns)
    keep = columns + (["_row_id", "_row_created_at_version", "_row_last_updated_at_version"] if with_lineage else [])
    return df.select(*[column(c) for c in keep])


# ---------------------------------------------------------------- writes


@dataclass(frozen=True)
class WriteTarget:
    """What an executor needs to write data files: the table metadata and a FileIO."""

    metadata: Any
    io: Any


def executor_io(io_properties: dict[str, str], location: str) -> Any:
    """A FileIO for an executor task, from the driver's FileIO properties.

    The object-store bucket of ``location`` is registered with those
    properties first: the library's own object writes and ranged reads
    (scratch files, Puffin files, deletion vectors) find its endpoint and
    credentials through :mod:`lineage.storage.files`, which a fresh Python
    worker knows nothing of.
    """
    from pyiceberg.io import load_file_io

    store.register(location, io_properties)
    return load_file_io(io_properties, location)


def removed_images(files: list[LiveFile], pointers: pa.Table, key: list[str]) -> pa.Table:
    """Pointers collected from executors (``__path``, ``__pos``, lineage, ``key`` values) as the write loop's removed images (``__file_id``)."""
    index_of = {local_path(f.path): i for i, f in enumerate(files)}
    missing = [p for p in set(pointers.column("__path").to_pylist()) if p not in index_of]
    if missing:
        raise InvalidArgumentError(f"internal: matched rows point at files not in the snapshot: {missing[:3]}")
    return pa.table(
        {
            "__file_id": pa.array([index_of[p] for p in pointers.column("__path").to_pylist()], pa.int32()),
            "__pos": pointers.column("__pos").cast(pa.int64()),
            "_row_id": pointers.column("_row_id"),
            "_row_created_at_version": pointers.column("_row_created_at_version"),
            "_row_last_updated_at_version": pointers.column("_row_last_updated_at_version"),
            **{k: pointers.column(k) for k in key},
        }
    )


def _executor_writer(metadata_json: str, io_properties: dict[str, str], location: str, schema: pa.Schema, key: list[str], group: str | None = None):  # type: ignore[no-untyped-def]
    """A ``mapInArrow`` function that writes its partition as data files and yields their descriptors.

    With ``group`` the partition arrives sorted by that column and each
    group's rows are written to files of their own (compaction's bins).
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyiceberg.table.metadata import TableMetadataUtil

        metadata = TableMetadataUtil.parse_raw(metadata_json)
        target = WriteTarget(metadata, executor_io(io_properties, location))
        batches = list(batches)
        if not batches:
            return
        data = pa.Table.from_batches(batches)
        if group is None:
            yield from _write_payloads(target, data, metadata, key)
            return
        ids = data.column(group).to_numpy()
        starts = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1, [len(ids)]))
        body = data.drop_columns([group])
        for s, e in zip(starts[:-1], starts[1:], strict=True):
            yield from _write_payloads(target, body.slice(int(s), int(e - s)), metadata, key)

    return write


def _write_payloads(target: WriteTarget, data: pa.Table, metadata: Any, key: list[str]) -> Iterator[pa.RecordBatch]:
    """Write ``data`` (table columns, optionally hidden lineage columns) as data files; one pickled WrittenFile per batch."""
    for w in written_files(target, data, metadata, key):
        yield pa.RecordBatch.from_pydict({"payload": [pickle.dumps(w)]}, schema=pa.schema([("payload", pa.binary())]))


def written_files(target: WriteTarget, data: pa.Table, metadata: Any, key: list[str]) -> Iterator[WrittenFile]:
    """Write ``data`` (table columns, optionally hidden lineage columns) as data files; their descriptors, lineage as runs."""
    hidden = [c for c in (HIDDEN_ROW_ID, HIDDEN_CREATED, HIDDEN_UPDATED) if c in data.column_names]
    body = conform(data.drop_columns(hidden), metadata.schema(), key)
    for h in hidden:
        body = body.append_column(pa.field(h, pa.int64(), False), data.column(h).cast(pa.int64()))
    for w in write_data_files(target, body):
        row_ids = encode_sequence(w.row_ids) if w.row_ids is not None else None
        created = encode_values(w.created) if w.created is not None else None
        updated = encode_values(w.updated) if w.updated is not None else None
        yield WrittenFile(w.data_file, row_ids, created, updated)


def write_with_executors(table: TableContext, df: Any, group: str | None = None) -> list[WrittenFile]:
    """Executors write ``df`` (table columns, optionally HIDDEN_ROW_ID/HIDDEN_CREATED/HIDDEN_UPDATED) as data files; returns their descriptors.

    With ``group`` (an integer column; each Spark partition sorted by it) every group's rows go to files of their own.
    """
    ice = table.iceberg
    fn = _executor_writer(v3_metadata.metadata_json(ice.metadata).decode(), dict(ice.io.properties), ice.metadata.location, table.arrow_schema, table.key, group)
    payloads = df.mapInArrow(fn, "payload binary").collect()
    return [pickle.loads(r["payload"]) for r in payloads]


def check_spark_schema(table: TableContext, df: Any) -> None:
    """Validate a Spark DataFrame's columns against the table on the driver (no rows read)."""
    empty = df.limit(0).toArrow()
    conform(empty, table.iceberg.schema(), table.key)


def check_spark_keys(df: Any, key: list[str]) -> str | None:
    """Describe null or duplicate keys in a Spark DataFrame (aggregates only reach the driver)."""
    from pyspark.sql import functions as F

    null_cond = None
    for k in key:
        cond = column(k).isNull()
        null_cond = cond if null_cond is None else (null_cond | cond)
    nulls = df.filter(null_cond).count()
    if nulls:
        return f"key column(s) {key} are null in {nulls} row(s)"
    dups = df.groupBy(*[column(k) for k in key]).count().filter(F.col("count") > 1)
    n = dups.count()
    if n:
        sample = [r.asDict() for r in dups.drop("count").limit(3).collect()]
        return f"{n} key value(s) occur more than once in the batch, e.g. {sample}"
    return None


def reject_bad_batch(table: TableContext, df: Any, keyed: bool) -> None:
    """Driver-side validation of a Spark batch (schema; null and duplicate keys when ``keyed``)."""
    check_spark_schema(table, df)
    if keyed:
        if not table.key:
            raise KeyViolationError(f"table {table.name} has no key; create it with key=[...] to upsert")
        problem = check_spark_keys(df, table.key)
        if problem:
            raise KeyViolationError(f"upsert batch rejected: {problem}")


def existing_keys(spark: Any, state: TableState, batch: Any, key: list[str]) -> list[dict[str, Any]]:
    """Up to three key values of ``batch`` that live rows already have (computed by executors)."""
    live = live_rows(spark, state, key).select(*[column(k) for k in key])
    return [r.asDict() for r in batch.select(*[column(k) for k in key]).join(live, key, "left_semi").limit(3).collect()]


def evaluate(spark: Any, state: TableState, files: list, pred: Predicate, select: str, out: pa.Schema) -> Any:
    """Executors run ``SELECT select FROM live WHERE pred`` over the live rows of ``files``; a Spark DataFrame of ``out``.

    ``pred`` is the checked predicate (:func:`lineage.sql.predicate.parse_predicate`) and ``select`` a checked
    select list over the data columns, the lineage columns, ``__path`` and ``__pos``. Each task builds the
    embedded engine's live view over its file and evaluates them in a sealed DuckDB database of its own
    (:mod:`lineage.spark_match`): they mean on Spark what they mean embedded, DuckDB reads only the columns
    they name, and no row goes through the JVM to be tested.
    """
    session = spark_session(spark)
    spec = spark_match.match_pass(arrow_schema_of(state), projection_field_ids(state.iceberg.metadata), pred, select, out)
    return spark_match.matches(session, files, spec)
