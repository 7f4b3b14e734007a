"""Spark integration: scans with lineage, and writes of Spark DataFrames.

Executors do all row work: they read the data files with the embedded
engine's live view (:func:`live_rows`, :mod:`lineage.spark_match`: positions,
deletes and lineage as embedded), and they write new data files with this
library's own writer inside ``mapInArrow``. The driver handles only
metadata: file lists, lineage segment paths, summaries of what executors removed
(:mod:`lineage.writes.spark_removed`), and the descriptors of written files,
then stamps lineage and commits one Iceberg snapshot, exactly like the Python
path.

Spark's Python workers must import this package: run them with the same
interpreter (``spark.pyspark.python``) or install the package on the workers.
"""

from __future__ import annotations

import contextlib
import pickle
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from lineage.context import TableContext
import lineage.errors as errors
from lineage.errors import InvalidArgumentError, KeyViolationError
from lineage.storage.fileio import local_path
from lineage.storage.rle import encode_sequence, encode_values
from lineage.iceberg.schema import arrow_schema, conform, projection_field_ids
import lineage.storage.files as store
import lineage.spark_match as spark_match
from lineage.state import LiveFile, TableState
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, HIDDEN_UPDATED
import lineage.iceberg.v3_metadata as v3_metadata
from lineage.sql.predicate import Predicate, quote_ident
from lineage.storage.writer import WrittenFile, write_data_files


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


def live_rows(spark: Any, state: TableState, columns: list[str], files: list[LiveFile] | None = None) -> Any:
    """Live images with lineage (and ``__path``/``__pos``) as a Spark DataFrame, read by executors.

    The tasks of :func:`lineage.spark_match.matches` read the files: each
    builds the embedded engine's live view over its slice of a file (columns
    matched by field id, the file's deletes and deletion vectors applied, the
    lineage columns from the file's runs) with nothing to filter. The driver
    sends each file's descriptor and the path of the lineage segment that
    holds its runs, not the runs: a task reads the segment itself (once per
    Python worker), so the files an update or upsert wrote, with up to one
    run per row, cost the driver nothing.
    """
    files = state.live_files() if files is None else files
    table_schema = arrow_schema_of(state)
    schema = pa.schema([table_schema.field(c) for c in columns])
    lineage = [pa.field(n, pa.int64()) for n in ("_row_id", "_row_created_at_version", "_row_last_updated_at_version")]
    out = pa.schema(list(schema) + lineage + [pa.field("__path", pa.string()), pa.field("__pos", pa.int64())])
    segment_of = state.files().segment_of if files else {}
    slim = [replace(f, lineage=None) if f.path in segment_of else f for f in files]  # type: ignore[arg-type]
    source = spark_match.LineageSource(dict(state.iceberg.io.properties), state.iceberg.metadata.location,
                                       {f.path: segment_of[f.path] for f in files if f.path in segment_of})
    select = ", ".join([*(quote_ident(c) for c in columns), "_row_id", "_row_created_at_version", "_row_last_updated_at_version",
                        "__path", "__pos"])
    spec = spark_match.MatchPass(schema, projection_field_ids(state.iceberg.metadata), "TRUE", False, select, out, source)
    return spark_match.matches(spark, slim, spec)


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


_EXECUTOR_ERROR = re.compile(r"^lineage\.errors\.(\w+): (.*)$", re.MULTILINE)


@contextlib.contextmanager
def executor_errors() -> Iterator[None]:
    """Re-raise on the driver, as itself, an error of this project that an executor task raised.

    Spark reports a Python task's failure as its own exception carrying the
    worker's traceback; bad input an executor finds (a null for a required
    column in an update's new images) must reach the caller as the project's
    specific error, as it does from the embedded engine.
    """
    try:
        yield
    except errors.LineageError:
        raise
    except Exception as exc:
        found = _EXECUTOR_ERROR.search(str(exc))
        cls = getattr(errors, found.group(1), None) if found else None
        if not (isinstance(cls, type) and issubclass(cls, errors.LineageError)):
            raise
        raise cls(found.group(2)) from exc  # type: ignore[union-attr]


def write_with_executors(table: TableContext, df: Any, group: str | None = None) -> list[WrittenFile]:
    """Executors write ``df`` (table columns, optionally HIDDEN_ROW_ID/HIDDEN_CREATED/HIDDEN_UPDATED) as data files; returns their descriptors.

    With ``group`` (an integer column; each Spark partition sorted by it) every group's rows go to files of their own.
    """
    ice = table.iceberg
    fn = _executor_writer(v3_metadata.metadata_json(ice.metadata).decode(), dict(ice.io.properties), ice.metadata.location, table.arrow_schema, table.key, group)
    with executor_errors():
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
    live = live_rows(spark, state, key).select(*[column(k) for k in key]).hint("merge")  # never broadcast: see spark_upsert
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
