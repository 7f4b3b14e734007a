"""Iceberg format version 3 table metadata, written as the spec says.

pyiceberg 0.12 models v3 metadata (``TableMetadataV3`` with ``next-row-id``,
snapshots with ``first-row-id`` and ``added-rows``) and applies updates to it
(adding a snapshot advances ``next-row-id`` by the snapshot's ``added-rows``),
but refuses to serialise it. This module writes the JSON itself: the same
fields pyiceberg writes for v2 plus the v3 ones, with ``next-row-id`` always
present (the spec requires it; a table created or upgraded by pyiceberg has
none yet, which the spec defines as 0).

The catalog commit (:func:`lineage.catalog.commit_metadata`) writes every
metadata file through :func:`write_table_metadata` and applies updates
through :func:`apply_updates`, so a v3 table's commit stays one
compare-and-swap on the catalog's pointer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor, ToOutputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.typedef import IcebergBaseModel

V3 = 3
SUPPORTED_FORMAT_VERSIONS = (2, 3)


def is_v3(metadata: TableMetadata) -> bool:
    """Whether ``metadata`` is of format version 3 or later (row lineage, deletion vectors)."""
    return int(metadata.format_version) >= V3


def with_next_row_id(metadata: TableMetadata) -> TableMetadata:
    """``metadata`` with ``next-row-id`` set (0 when a v3 table has none yet, as the spec initialises it)."""
    if is_v3(metadata) and getattr(metadata, "next_row_id", None) is None:
        return metadata.model_copy(update={"next_row_id": 0})
    return metadata


def apply_updates(base: TableMetadata, updates: Iterable[Any], context: Any) -> TableMetadata:
    """Apply pyiceberg table updates one by one, keeping ``next-row-id`` defined on v3 metadata.

    pyiceberg advances ``next-row-id`` only when the base has one; an upgrade
    to v3 leaves it unset, so it is set to 0 after every update.
    """
    from pyiceberg.table.update import UpgradeFormatVersionUpdate, _apply_table_update

    metadata = with_next_row_id(base)
    for change in updates:
        if isinstance(change, UpgradeFormatVersionUpdate) and change.format_version == V3 and metadata.format_version == 2:
            metadata = _upgraded(metadata)  # pyiceberg 0.12 refuses to upgrade past 2
            context.add_update(change)
        else:
            metadata = with_next_row_id(_apply_table_update(change, metadata, context))
    return metadata


def upgraded(metadata: TableMetadata, next_row_id: int) -> TableMetadata:
    """v2 ``metadata`` as v3 with ``next-row-id`` = ``next_row_id`` (the base of a commit that upgrades a lineage table).

    The spec's upgrade sets ``next-row-id`` to 0; a lineage table's rows already
    have ids below its own high-water mark, so the commit that upgrades it
    starts assigning ids there (a snapshot's ``first-row-id`` may exceed the
    table's ``next-row-id``; ids are unique, not dense).
    """
    return _upgraded(metadata).model_copy(update={"next_row_id": int(next_row_id)})


def _upgraded(metadata: TableMetadata) -> TableMetadata:
    """v2 ``metadata`` as v3 (the spec's upgrade: ``next-row-id`` 0, snapshots unchanged, so without row ids)."""
    obj = IcebergBaseModel.model_dump(metadata, mode="json")
    obj.update({"format-version": V3, "next-row-id": 0})
    return TableMetadataV3.model_validate(obj)


def metadata_json(metadata: TableMetadata) -> bytes:
    """The metadata file's bytes (UTF-8 JSON); v3 too, which pyiceberg's ``model_dump_json`` refuses."""
    metadata = with_next_row_id(metadata)
    text = IcebergBaseModel.model_dump_json(metadata)
    return text.encode("utf-8")


def write_table_metadata(metadata: TableMetadata, io: FileIO, location: str) -> None:
    """Write a table metadata file at ``location``: v3 here, earlier versions through pyiceberg."""
    if not is_v3(metadata):
        ToOutputFile.table_metadata(metadata, io.new_output(location))
        return
    data = Compressor.get_compressor(location).bytes_compressor()(metadata_json(metadata))
    with io.new_output(location).create(overwrite=False) as out:
        out.write(data)
