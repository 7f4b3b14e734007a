"""Data files of Iceberg v3 tables whose rows keep their ids: ``_row_id`` written with Parquet's delta encoding.

A v3 writer that moves or updates a row writes its ``_row_id`` into the new
file (spec, Row Lineage). This library writes such files ordered by row id
(new images of updated rows) or as runs of ascending ids (the files a fold or
a compaction rewrites), so consecutive ids differ by little: Parquet's
``DELTA_BINARY_PACKED`` encoding stores those differences in a few bits each,
where the default (a dictionary of 8-byte values, then plain once the
dictionary is full) stores about 3 to 4 bytes per row after compression. For
5,000 updated rows of a 1M-row table the column takes 7 KB instead of 18; for
a fold of 50,000 rows 42 KB instead of 153. Every other column is written as
before (dictionary encoding, the table's compression). The encoding is part of
the Parquet format that every Iceberg reader reads (Spark, DuckDB, pyiceberg).

:func:`write_files` is pyiceberg's ``write_file`` with that change and one more, and writes every Parquet data file
of the library (of v2 tables too, whose files have no ``_row_id``): pyiceberg's projection of a batch to the file's
schema turned a null list of structs, or a null map with struct values, into an empty one (apache/iceberg-python
#3833); :func:`lineage.iceberg.schema.with_null_collections` gives them their nulls back. And a column whose
distinct values would fill the dictionary page anyway (``write.parquet.dict-size-bytes``) is written plain from the
start instead of after Parquet's fallback (:func:`overflowing_dictionaries`, an estimate from a sample of rows).
"""

from __future__ import annotations

import io
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lineage.iceberg.schema import with_null_collections
from lineage.identity_cache import IdentityCache
from lineage.storage.lineage_columns import ROW_ID_NAME

if TYPE_CHECKING:  # pyiceberg's writer modules load pyarrow.dataset: imported when a file is written
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import WriteTask
    from pyiceberg.table.metadata import TableMetadata

ROW_ID_ENCODING = "DELTA_BINARY_PACKED"


def leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet column paths (leaves, dotted) of ``schema``, as pyarrow's writer names them (built once per equal
    schema: each file written brings a schema object of its own)."""
    with _LOCK:
        paths = _PATHS.get(schema)
        if paths is not None:
            _PATHS.move_to_end(schema)
            return paths
    sink = io.BytesIO()
    pq.write_table(schema.empty_table(), sink)
    sink.seek(0)
    md = pq.ParquetFile(sink).metadata.schema
    paths = tuple(md.column(i).path for i in range(len(md)))
    with _LOCK:
        _PATHS[schema] = paths
        while len(_PATHS) > 32:
            _PATHS.popitem(last=False)
    return paths


_PATHS: OrderedDict[pa.Schema, tuple[str, ...]] = OrderedDict()
_LOCK = threading.Lock()


def writer_options(schema: pa.Schema, rows: pa.Table | None = None, dictionary_limit: int = 0) -> dict[str, Any]:
    """pyarrow ParquetWriter options giving ``_row_id`` the delta encoding and every other column the dictionary, except,
    given a row group's ``rows`` and the writer's dictionary page limit, the columns :func:`overflowing_dictionaries`
    names (none of this when the schema has no ``_row_id`` and no column overflows: pyiceberg's options as they are)."""
    paths = leaf_paths(schema)
    plain = overflowing_dictionaries(rows, dictionary_limit) if rows is not None and dictionary_limit > 0 else set()
    if ROW_ID_NAME not in paths and not plain:
        return {}
    options: dict[str, Any] = {"use_dictionary": [p for p in paths if p != ROW_ID_NAME and p not in plain]}
    if ROW_ID_NAME in paths:
        options["column_encoding"] = {ROW_ID_NAME: ROW_ID_ENCODING}
    return options


SAMPLE_ROWS = 4096  # rows (drawn at random, with a fixed seed) from which a column's distinct values are estimated


def overflowing_dictionaries(rows: pa.Table, limit: int) -> set[str]:
    """The columns of ``rows`` (numbers, dates and times, strings and binaries) whose distinct values would fill a
    dictionary page of ``limit`` bytes: Parquet's writer would build their dictionary, then fall back to plain encoding.

    Building and dropping such a dictionary (Arrow's hash table of the values and the row group's dictionary-encoded
    pages) took 24-36 MB of Arrow's pool at once: the flush of 280,000 new images of an update peaked 51 MB above its
    rows, 15 MB with its two all-distinct columns written plain from the start, in a third of the CPU time and a
    smaller file. The number of distinct values is estimated from :data:`SAMPLE_ROWS` rows drawn at random
    (:func:`estimated_distinct`), so the test costs the same whatever the size of the row group; a wrong guess
    changes the file's encoding (its size), never its rows. The dictionary's size is taken as Arrow's value width
    per value, or 4 bytes plus the mean length of the sampled strings.
    """
    plain: set[str] = set()
    positions: pa.Array | None = None
    for field, column in zip(rows.schema, rows.columns, strict=True):
        kind = field.type
        strings = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
        fixed = pa.types.is_integer(kind) or (pa.types.is_floating(kind) and not pa.types.is_float16(kind)) or pa.types.is_timestamp(kind) \
            or pa.types.is_date(kind) or pa.types.is_time(kind) or pa.types.is_duration(kind)
        if not (strings or fixed):
            continue
        present = len(column) - column.null_count
        if (column.nbytes if strings else present * (kind.bit_width // 8)) <= limit:  # cannot fill the page
            continue
        if positions is None:
            positions = _sample_positions(len(column))
        sample = column.take(positions).drop_null()
        if len(sample) == 0:
            continue
        width = 4 + pc.sum(pc.binary_length(sample)).as_py() / len(sample) if strings else kind.bit_width // 8
        if estimated_distinct(sample, present) * width > limit:
            plain.add(field.name)
    return plain


def _sample_positions(n: int) -> pa.Array:
    """Up to :data:`SAMPLE_ROWS` distinct row positions below ``n``, drawn with a fixed seed (every row when fewer), sorted."""
    if n <= SAMPLE_ROWS:
        return pa.array(np.arange(n, dtype=np.int64))
    return pa.array(np.unique(np.random.default_rng(0).integers(0, n, SAMPLE_ROWS, dtype=np.int64)))


def estimated_distinct(sample: pa.Array | pa.ChunkedArray, present: int) -> int:
    """The number of distinct values of a column of ``present`` non-null values, from ``sample`` (non-null values at
    distinct random positions): exact when the sample is the whole column; otherwise the ``d`` for which ``k`` rows
    drawn from a column of ``d`` values, each ``present / d`` times, would show as many distinct values as the sample
    does (:func:`_shown`), at most ``present``. Skewed columns show fewer, so they are estimated lower (they keep
    their dictionary)."""
    k = len(sample)
    seen = int(pc.count_distinct(sample).as_py())
    if k >= present or seen == 0:
        return seen
    if seen >= k or _shown(present, k, present) <= seen:
        return present
    lo, hi = float(seen), float(present)  # _shown increases with d: bisect for the d showing ``seen``
    for _ in range(64):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _shown(mid, k, present) < seen else (lo, mid)
    return int(round(hi))


def _shown(d: float, k: int, n: int) -> float:
    """The expected number of distinct values among ``k`` rows drawn from ``n`` holding ``d`` values equally often (a
    value is missed with probability ``(1 - k / n) ** (n / d)``)."""
    return -d * math.expm1(n / d * math.log1p(-k / n))


def _row_id_delta_writer() -> type:
    """pyiceberg's Parquet writer (the table's compression, page and row group settings) with :func:`writer_options`."""
    global _WRITER
    if _WRITER is None:
        from pyiceberg.io.pyarrow import ParquetFormatWriter

        class RowIdDeltaWriter(ParquetFormatWriter):
            def write(self, table: pa.Table) -> None:
                """Write ``table`` (the first call opens the file with the options of its schema and first row group)."""
                if getattr(self, "_writer", None) is None:
                    first = table.slice(0, self._row_group_size)
                    limit = int(self._parquet_writer_kwargs.get("dictionary_pagesize_limit") or 0)
                    self._parquet_writer_kwargs = {**self._parquet_writer_kwargs, **writer_options(table.schema, first, limit)}
                super().write(table)

        _WRITER = RowIdDeltaWriter
    return _WRITER


_WRITER: type | None = None
# The schema a file is written with (the table's with column names Avro and Parquet accept), once per schema object: it
# is a new validated Schema each time (a third of a millisecond per file written).
_FILE_SCHEMAS: IdentityCache[Schema] = IdentityCache()


def write_files(file_io: FileIO, metadata: TableMetadata, tasks: Iterable[WriteTask]) -> list[DataFile]:
    """Write each task as one Parquet data file of ``metadata``'s table (its current schema: the table's columns, and
    the row lineage fields when rows keep their ids) and return their entries: pyiceberg's ``write_file``, with
    ``_row_id`` delta-encoded and null lists and maps kept null."""
    from pyiceberg.io.pyarrow import ParquetFormatModel, _to_requested_schema, sanitize_column_names
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE
    from pyiceberg.table.locations import load_location_provider
    from pyiceberg.typedef import Record
    from pyiceberg.utils.concurrent import ExecutorFactory
    from pyiceberg.utils.config import Config

    model = ParquetFormatModel()
    provider = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
    downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
    table_schema = metadata.schema()
    file_schema = _FILE_SCHEMAS.get(table_schema, lambda: sanitize_column_names(table_schema))

    def write_one(task: WriteTask) -> DataFile:
        batches = [
            with_null_collections(
                _to_requested_schema(requested_schema=file_schema, file_schema=task.schema, batch=batch,
                                     downcast_ns_timestamp_to_us=downcast, include_field_ids=True, format_model=model),
                batch, file_schema, task.schema)
            for batch in task.record_batches
        ]
        path = provider.new_data_location(data_file_name=task.generate_data_file_filename(model.file_extension()),
                                          partition_key=task.partition_key)
        out = file_io.new_output(path)
        writer = _row_id_delta_writer()(out, file_schema, metadata.properties)
        with writer:
            writer.write(pa.Table.from_batches(batches))
        statistics = writer.result()
        return DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=task.partition_key.partition if task.partition_key else Record(), file_size_in_bytes=len(out),
            sort_order_id=None, spec_id=metadata.default_spec_id, equality_ids=None, key_metadata=None,
            **statistics.to_serialized_dict(),
        )

    return list(ExecutorFactory.get_or_create().map(write_one, tasks))
