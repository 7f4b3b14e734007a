"""Iceberg v3 row lineage columns in data files: ``_row_id`` and ``_last_updated_sequence_number``.

The spec (Row Lineage) has a writer that moves an existing row to a new data
file copy the row's ``_row_id`` into it, and either copy its
``_last_updated_sequence_number`` (the row is unchanged, e.g. compaction) or
write null (the row was modified: it inherits the new file's data sequence
number). A file of new rows may omit both columns: its rows read
``first_row_id + _pos`` and the file's sequence number.

This module extends a table's write schema with the two reserved fields
(optional ``long``, field ids 2147483540 and 2147483539) and builds their
values from the lineage a writer carries with the rows (row ids, and updated
versions when known, which on v3 are the commits' sequence numbers).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import LongType, NestedField

import lineage.storage.files as files
from lineage.errors import LineageMetadataError
from lineage.identity_cache import IdentityCache

ROW_ID_FIELD_ID = 2147483540
LAST_UPDATED_FIELD_ID = 2147483539
ROW_ID_NAME = "_row_id"
LAST_UPDATED_NAME = "_last_updated_sequence_number"
FIELD_IDS = (ROW_ID_FIELD_ID, LAST_UPDATED_FIELD_ID)


def writes_lineage_columns(metadata: TableMetadata) -> bool:
    """Whether data files of this table carry the v3 row lineage columns (format version 3 and later)."""
    return int(metadata.format_version) >= 3


def write_schema(schema: Schema) -> Schema:
    """``schema`` plus the two row lineage fields, as data files are written with them (built once per schema)."""
    return _WRITE_SCHEMAS.get(schema, lambda: Schema(
        *schema.fields,
        NestedField(ROW_ID_FIELD_ID, ROW_ID_NAME, LongType(), required=False),
        NestedField(LAST_UPDATED_FIELD_ID, LAST_UPDATED_NAME, LongType(), required=False),
        schema_id=schema.schema_id,
        identifier_field_ids=schema.identifier_field_ids,
    ))


def write_metadata(metadata: TableMetadata) -> TableMetadata:
    """``metadata`` whose current schema is :func:`write_schema` of the table's (for pyiceberg's file writer; built once
    per metadata object: every data file a commit writes asks for it)."""
    def build() -> TableMetadata:
        current = metadata.schema()
        schemas = [write_schema(s) if s.schema_id == current.schema_id else s for s in metadata.schemas]
        return metadata.model_copy(update={"schemas": schemas})

    return _WRITE_METADATA.get(metadata, build)


# Schemas and metadata are immutable: the derived ones are kept per object (a validated Schema costs about a millisecond).
_WRITE_SCHEMAS: IdentityCache[Schema] = IdentityCache()
_WRITE_METADATA: IdentityCache[TableMetadata] = IdentityCache(size=16)


def with_lineage_columns(body: pa.Table, row_ids: np.ndarray, updated: np.ndarray | None) -> pa.Table:
    """``body`` with ``_row_id`` (every row keeps its id) and ``_last_updated_sequence_number``.

    ``updated`` None means every row was modified by the commit: the column
    is all null, so each row inherits the new file's data sequence number.
    A negative value (:data:`lineage.storage.writer.FRESH`: a fresh insert
    written in one file with updated images) is written as null: the row
    reads the file's ``first_row_id`` plus its position, and the file's
    sequence number.
    """
    n = body.num_rows
    if len(row_ids) != n or (updated is not None and len(updated) != n):
        raise ValueError(f"lineage of {n} rows has {len(row_ids)} row ids")
    seq = pa.nulls(n, pa.int64()) if updated is None else _ids(updated)
    return body.append_column(pa.field(ROW_ID_NAME, pa.int64()), _ids(row_ids)).append_column(pa.field(LAST_UPDATED_NAME, pa.int64()), seq)


def _ids(values: np.ndarray) -> pa.Array:
    """``values`` as a long column; a negative value (a fresh insert's, assigned at commit) is written as null."""
    values = np.asarray(values, np.int64)
    fresh = values < 0
    return pa.array(values, pa.int64(), mask=fresh if fresh.any() else None)


def without_lineage_stats(data_file: DataFile) -> DataFile:
    """``data_file`` with no column statistics for the row lineage fields (only the table's columns are described)."""
    for pos in _STATS_POSITIONS:
        stats = data_file._data[pos]
        if stats and any(k in stats for k in FIELD_IDS):
            data_file._data[pos] = {k: v for k, v in stats.items() if k not in FIELD_IDS}
    return data_file


# Positions of column_sizes, value_counts, null_value_counts, nan_value_counts, lower_bounds, upper_bounds in the data_file struct
_STATS_POSITIONS = (6, 7, 8, 9, 10, 11)


def present_columns(schema: pa.Schema) -> dict[int, str]:
    """Field id -> column name of the lineage columns a data file's Parquet schema holds (matched by field id)."""
    out = {}
    for name in schema.names:
        meta = schema.field(name).metadata or {}
        fid = meta.get(b"PARQUET:field_id")
        if fid is not None and int(fid) in FIELD_IDS:
            out[int(fid)] = name
    return out


def native_row_ids(path: str, first_row_id: int, record_count: int) -> np.ndarray:
    """The ``_row_id`` of every row of the v3 data file at ``path`` whose ``first_row_id`` is ``first_row_id``: the
    value written in the file where not null, else ``first_row_id`` plus the row's position (spec, Row Lineage).
    Reads only the file's footer and its ``_row_id`` column."""
    inherited = np.arange(first_row_id, first_row_id + record_count, dtype=np.int64)
    parquet = files.parquet_file(path)
    name = present_columns(parquet.schema_arrow).get(ROW_ID_FIELD_ID)
    if name is None:
        return inherited
    written = parquet.read(columns=[name], use_threads=False).column(0)
    if len(written) != record_count:
        raise LineageMetadataError(f"{path} has {len(written)} rows, its lineage says {record_count}")
    values = written.combine_chunks().cast(pa.int64())
    if values.null_count == 0:
        return values.to_numpy()
    return np.where(values.is_valid().to_numpy(zero_copy_only=False), values.fill_null(0).to_numpy(), inherited)
