"""Indexes kept beside an Iceberg table: the deleted-rows index, the purged-rows file and the key index (index.key_index)."""

import lineage  # noqa: F401  (initialise the lineage package first: its write path imports this package's modules)
from index.deleted_rows import RemovedImages, read_index_segment, write_index_segment

__all__ = ["RemovedImages", "read_index_segment", "write_index_segment"]
