"""Shapes shared by every engine: the commits relation and output schemas."""

from __future__ import annotations

import pyarrow as pa

from lineage.storage.metadata import CommitEntry
from lineage.iceberg.schema import cast_table

TIMESTAMP = pa.timestamp("ms", tz="UTC")

CHANGE_FIELDS = [
    pa.field("_change_type", pa.string(), nullable=False),
    pa.field("_commit_version", pa.int64(), nullable=False),
    pa.field("_commit_timestamp", TIMESTAMP),
    pa.field("_row_id", pa.int64(), nullable=False),
    pa.field("_row_created_at_version", pa.int64(), nullable=False),
    pa.field("_row_last_updated_at_version", pa.int64(), nullable=False),
    pa.field("_changed_columns", pa.list_(pa.string())),
]

DELETED_FIELDS = [
    pa.field("_row_deleted_at_version", pa.int64(), nullable=False),
    pa.field("_row_deleted_at_timestamp", TIMESTAMP),
    pa.field("_row_id", pa.int64(), nullable=False),
    pa.field("_row_created_at_version", pa.int64(), nullable=False),
    pa.field("_row_last_updated_at_version", pa.int64(), nullable=False),
]


def commits_table(commits: tuple[CommitEntry, ...]) -> pa.Table:
    """``__version`` → ``_commit_timestamp`` for every commit in the log."""
    return pa.table(
        {
            "__version": pa.array([c.version for c in commits], pa.int64()),
            "_commit_timestamp": pa.array([c.timestamp_ms for c in commits], pa.int64()).cast(TIMESTAMP),
        }
    )


PURGED_FIELD = pa.field("_purged", pa.bool_(), nullable=False)

# The embedded engine's Arrow types of the two string-valued change columns: dictionary-encoded, since their
# values come from a handful of names (the four change types, the selected columns' names). Building them is
# then a wrap of the small integer codes the feed computes, not a copy of a string per row
# (:func:`decode_change_columns` decodes them).
CHANGE_TYPE_ENCODED = pa.dictionary(pa.int8(), pa.string())
CHANGED_COLUMNS_ENCODED = pa.list_(pa.dictionary(pa.int32(), pa.string()))
_ENCODED = {"_change_type": CHANGE_TYPE_ENCODED, "_changed_columns": CHANGED_COLUMNS_ENCODED}
_PLAIN = {f.name: f.type for f in CHANGE_FIELDS if f.name in _ENCODED}


def change_schema(data: pa.Schema, purged: bool = False) -> pa.Schema:
    """Output schema of ``changes()``: the selected data columns then the change columns.

    Tables that were ever purged get a trailing ``_purged`` flag.
    """
    if purged:  # erased images have null data columns, keys included
        return pa.schema([f.with_nullable(True) for f in data] + CHANGE_FIELDS + [PURGED_FIELD])
    return pa.schema(list(data) + CHANGE_FIELDS)


def encoded_change_schema(data: pa.Schema, purged: bool = False) -> pa.Schema:
    """The Arrow schema of the embedded engine's feed: :func:`change_schema` with ``_change_type`` a
    ``dictionary<int8, string>`` and ``_changed_columns`` a ``list<dictionary<int32, string>>`` (same values)."""
    schema = change_schema(data, purged)
    for name, t in _ENCODED.items():
        i = schema.get_field_index(name)
        schema = schema.set(i, schema.field(i).with_type(t))
    return schema


def decode_change_columns(result: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
    """A feed of the embedded engine (or one batch of :func:`cdf.change_batches`) with ``_change_type`` as
    ``string`` and ``_changed_columns`` as ``list<string>``, the types of the Spark engine's feed."""
    schema = result.schema
    for name, t in _ENCODED.items():
        i = schema.get_field_index(name)
        if i >= 0 and schema.field(i).type == t:
            schema = schema.set(i, schema.field(i).with_type(_PLAIN[name]))
    return result if schema == result.schema else result.cast(schema)


def deleted_schema(data: pa.Schema, purged: bool = False) -> pa.Schema:
    """Output schema of ``deleted_rows()`` (``_purged`` as in :func:`change_schema`)."""
    if purged:
        return pa.schema([f.with_nullable(True) for f in data] + DELETED_FIELDS + [PURGED_FIELD])
    return pa.schema(list(data) + DELETED_FIELDS)


def conform(result: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast an engine's result to the documented schema (column order included)."""
    result = result.select(schema.names)
    return cast_table(result, schema)
