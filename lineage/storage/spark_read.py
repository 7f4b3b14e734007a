"""Spark reads files on an object store through its Python workers (pyarrow), not through Hadoop.

A cluster then needs no ``hadoop-aws`` jar nor S3 settings of its own: the
driver ships each task the bucket settings this process registered
(:func:`lineage.storage.files.registered`), and the task reads its files
with the same readers as the embedded engine (column chunks by byte range).
Rows carry ``__file`` (the file's number) and ``__pos`` (the row's position
in its file), what Spark's ``_metadata.row_index`` gives for local files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

import lineage.storage.files as files
from lineage.storage.settings import StoreSettings

FILE = "__file"
POS = "__pos"
ROWS_PER_BATCH = 65536


def with_settings(fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``fn`` (a ``mapInArrow`` function) run on a worker that first learns this driver's bucket settings."""
    buckets: dict[str, StoreSettings] = files.registered()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files.register_settings(buckets)
        yield from fn(batches)

    return run


def read_files(spark: Any, paths: Sequence[str], schema: pa.Schema, sources: Sequence[Sequence[str | None]] | None = None,
               numbers: Sequence[int] | None = None) -> Any:
    """Rows of ``paths`` as a Spark DataFrame: ``schema``'s columns, then ``__file`` (int32) and ``__pos`` (int64).

    ``sources[i]`` names, for each column of ``schema``, the column of file
    ``i`` that holds it (None: the file lacks it, it reads as null); by
    default the columns of the same names. ``__file`` is ``numbers[i]``
    (default ``i``). Each task reads one file.
    """
    if sources is None:
        sources = [list(schema.names)] * len(paths)
    numbers = list(range(len(paths))) if numbers is None else list(numbers)
    tasks = pa.table({"path": pa.array(list(paths), pa.string()), "number": pa.array(numbers, pa.int32()),
                      "sources": pa.array([list(s) for s in sources], pa.list_(pa.string()))})
    out = pa.schema([*schema, pa.field(FILE, pa.int32()), pa.field(POS, pa.int64())])
    spark_schema = spark.createDataFrame(out.empty_table()).schema
    df = spark.createDataFrame(tasks).repartition(max(1, min(len(paths), spark.sparkContext.defaultParallelism * 4)))
    return df.mapInArrow(with_settings(_reader(schema)), spark_schema)


def _reader(schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path, number, sources in zip(*(batch.column(c).to_pylist() for c in ("path", "number", "sources")), strict=True):
                yield from _read_file(path, number, sources, schema)

    return read


def _read_file(path: str, number: int, sources: list[str | None], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(files.source(path))
    present = [s for s in dict.fromkeys(sources) if s is not None]
    start = 0
    for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=present, use_threads=False):
        n = batch.num_rows
        cols = []
        for src, field in zip(sources, schema, strict=True):
            col = pa.nulls(n, field.type) if src is None else batch.column(src)
            cols.append(col if col.type == field.type else col.cast(field.type))
        cols += [pa.array(np.full(n, number, np.int32)), pa.array(np.arange(start, start + n, dtype=np.int64))]
        start += n
        yield pa.RecordBatch.from_arrays(cols, names=[*schema.names, FILE, POS])
