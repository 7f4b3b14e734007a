"""Spark reads files on an object store through its Python workers (pyarrow), not through Hadoop.

A cluster then needs no ``hadoop-aws`` jar nor S3 settings of its own: the
driver ships each task the bucket settings this process registered
(:func:`lineage.storage.files.registered`), and the task reads its files
with the same readers as the embedded engine (column chunks by byte range).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

import lineage.storage.files as files
from lineage.storage.settings import StoreSettings


def with_settings(fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``fn`` (a ``mapInArrow`` function) run on a worker that first learns this driver's bucket settings."""
    buckets: dict[str, StoreSettings] = files.registered()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files.register_settings(buckets)
        yield from fn(batches)

    return run
