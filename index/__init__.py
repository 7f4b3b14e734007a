"""Indexes kept beside an Iceberg table: the deleted-rows index, the purged-rows file and the key index (index.key_index)."""

from index.deleted_rows import RemovedImages, read_index_segment, write_index_segment

__all__ = ["RemovedImages", "read_index_segment", "write_index_segment"]
