"""Row lineage for Apache Iceberg tables: stable row ids and created/updated versions.

Quick start::

    import lineage
    t = lineage.create_table("shop.orders", schema, key=["order_id"], warehouse="wh")
    t.append(batch)
    t.update("status = 'new'", {"status": "'paid'"})
    t.scan()   # data columns + _row_id, _row_created_at_version, _row_last_updated_at_version
"""

from lineage.errors import (
    BadPredicateError,
    CatalogFailedError,
    CommitConflictError,
    CommitStateUnknownError,
    FeedSchemaChangedError,
    HistoryGapError,
    LostFileError,
    VersionMovedError,
    InvalidArgumentError,
    KeyViolationError,
    LineageError,
    LineageMetadataError,
    RetentionError,
    SchemaMismatchError,
    StreamPositionLostError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnknownColumnError,
    UnknownVersionError,
    UnsupportedFormatError,
    VersionRangeError,
)
from lineage.table import COPY_ON_WRITE, MERGE_ON_READ, CommitInfo, Table, create_table, open_table
from lineage.adoption import Adoption, adopt

__all__ = [
    "Adoption",
    "BadPredicateError",
    "COPY_ON_WRITE",
    "CatalogFailedError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "FeedSchemaChangedError",
    "VersionMovedError",
    "CommitInfo",
    "HistoryGapError",
    "LostFileError",
    "StreamPositionLostError",
    "InvalidArgumentError",
    "KeyViolationError",
    "LineageError",
    "LineageMetadataError",
    "MERGE_ON_READ",
    "RetentionError",
    "SchemaMismatchError",
    "Table",
    "TableAlreadyExistsError",
    "TableNotFoundError",
    "UnknownColumnError",
    "UnknownVersionError",
    "UnsupportedFormatError",
    "VersionRangeError",
    "adopt",
    "create_table",
    "open_table",
]
