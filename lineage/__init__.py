"""Row lineage for Apache Iceberg tables: stable row ids and created/updated versions.

Quick start::

    import lineage
    t = lineage.create_table("shop.orders", schema, key=["order_id"], warehouse="wh")
    t.append(batch)
    t.update("status = 'new'", {"status": "'paid'"})
    t.scan()   # data columns + _row_id, _row_created_at_version, _row_last_updated_at_version
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lineage.errors import (
    BadPredicateError,
    CatalogFailedError,
    CatalogUnavailableError,
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
    PuffinFormatError,
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
from lineage.properties import COPY_ON_WRITE, MERGE_ON_READ

if TYPE_CHECKING:  # pragma: no cover
    from lineage.adoption import Adoption, adopt
    from lineage.table import CommitInfo, Table, create_table, open_table

# The facade is loaded on first use, so that importing any module of the library (lineage.errors, index.*, ...)
# does not first import lineage.table and everything below it: the import order of the packages does not matter.
_LAZY = {
    "Adoption": "lineage.adoption",
    "adopt": "lineage.adoption",
    "CommitInfo": "lineage.table",
    "Table": "lineage.table",
    "create_table": "lineage.table",
    "open_table": "lineage.table",
}


def __getattr__(name: str) -> Any:
    """The public classes and functions of :mod:`lineage.table` and :mod:`lineage.adoption`, loaded on first use."""
    module = _LAZY.get(name)
    if module is None:
        try:  # a submodule, as after `import lineage.x` (``lineage.table`` works after a bare ``import lineage``)
            return importlib.import_module(f"lineage.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"lineage.{name}":
                raise
            raise AttributeError(f"module 'lineage' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Adoption",
    "BadPredicateError",
    "COPY_ON_WRITE",
    "CatalogFailedError",
    "CatalogUnavailableError",
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
    "PuffinFormatError",
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
