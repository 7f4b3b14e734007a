"""Reading manifest lists and manifests of Iceberg v3 tables with their v3 fields.

pyiceberg 0.12 reads every manifest list and manifest with the v2 read
schema, which drops what v3 added: a manifest's ``first_row_id`` (field 520)
and a content file's ``first_row_id`` (142), ``referenced_data_file`` (143),
``content_offset`` (144) and ``content_size_in_bytes`` (145), the fields of
row lineage and deletion vectors. For a table of format version 3 or later
this module reads them with pyiceberg's v3 read schemas: the records keep the
v2 fields at the same positions (every pyiceberg accessor works) and carry
the v3 ones after them, read through the accessors here. A v2 table's files
are read by pyiceberg as before.
"""

from __future__ import annotations

from pyiceberg.avro.file import AvroFile
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE, MANIFEST_ENTRY_SCHEMAS, MANIFEST_LIST_FILE_SCHEMAS, DataFile, DataFileContent, FileFormat,
    ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, PartitionFieldSummary, _inherit_from_manifest,
)
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from lineage.storage.fileio import ImmutableFileCache

V3 = 3


def _position(fields: object, name: str) -> int:
    names = [f.name for f in fields]  # type: ignore[attr-defined]
    return names.index(name)


_FILE_FIRST_ROW_ID = _position(DATA_FILE_TYPE[V3].fields, "first_row_id")
_REFERENCED_DATA_FILE = _position(DATA_FILE_TYPE[V3].fields, "referenced_data_file")
_CONTENT_OFFSET = _position(DATA_FILE_TYPE[V3].fields, "content_offset")
_CONTENT_SIZE = _position(DATA_FILE_TYPE[V3].fields, "content_size_in_bytes")
_MANIFEST_FIRST_ROW_ID = _position(MANIFEST_LIST_FILE_SCHEMAS[V3].fields, "first_row_id")

# Manifest lists read here, by path (immutable, uniquely named): a list is read once per process.
_LISTS: ImmutableFileCache[list[ManifestFile]] = ImmutableFileCache(256)


def is_v3(table: IcebergTable) -> bool:
    """Whether the table's format version is 3 or later (row lineage and deletion vectors)."""
    return int(table.metadata.format_version) >= V3


def _field(record: object, at: int) -> object:
    data = record._data  # type: ignore[attr-defined]
    return data[at] if len(data) > at else None


def manifest_first_row_id(manifest: ManifestFile) -> int | None:
    """A data manifest's ``first_row_id`` from the manifest list (None before v3 or for a delete manifest)."""
    value = _field(manifest, _MANIFEST_FIRST_ROW_ID)
    return None if value is None else int(value)  # type: ignore[call-overload]


def file_first_row_id(data_file: DataFile) -> int | None:
    """A data file's ``first_row_id`` as its manifest entry records it (None: inherited, see lineage.iceberg.row_lineage)."""
    value = _field(data_file, _FILE_FIRST_ROW_ID)
    return None if value is None else int(value)  # type: ignore[call-overload]


def referenced_data_file(delete_file: DataFile) -> str | None:
    """The data file a deletion vector (or a file-scoped position delete file) names in ``referenced_data_file``."""
    value = _field(delete_file, _REFERENCED_DATA_FILE)
    return None if value is None else str(value)


def content_range(delete_file: DataFile) -> tuple[int, int] | None:
    """``(content_offset, content_size_in_bytes)`` of a deletion vector's blob in its Puffin file."""
    offset, size = _field(delete_file, _CONTENT_OFFSET), _field(delete_file, _CONTENT_SIZE)
    if offset is None or size is None:
        return None
    return int(offset), int(size)  # type: ignore[call-overload]


def is_deletion_vector(delete_file: DataFile) -> bool:
    """Whether a delete-file entry is a deletion vector (position deletes in a Puffin blob)."""
    return delete_file.content == DataFileContent.POSITION_DELETES and delete_file.file_format == FileFormat.PUFFIN


def read_manifest_list(io: FileIO, path: str) -> list[ManifestFile]:
    """The manifests of the manifest list at ``path``, with their v3 fields (cached by path)."""
    def load() -> list[ManifestFile]:
        with AvroFile[ManifestFile](
            io.new_input(path), MANIFEST_LIST_FILE_SCHEMAS[V3],
            read_types={-1: ManifestFile, 508: PartitionFieldSummary}, read_enums={517: ManifestContent},
        ) as reader:
            return list(reader)

    return _LISTS.get(path, load)


def snapshot_manifests(table: IcebergTable, snapshot: Snapshot) -> list[ManifestFile]:
    """The manifests of ``snapshot``: with their v3 fields on a v3 table, else as pyiceberg reads them."""
    if not is_v3(table) or not snapshot.manifest_list:
        return snapshot.manifests(table.io)
    return read_manifest_list(table.io, snapshot.manifest_list)


def fetch_entries(table: IcebergTable, manifest: ManifestFile, discard_deleted: bool = True) -> list[ManifestEntry]:
    """The entries of ``manifest`` with inherited sequence numbers: with their v3 fields on a v3 table.

    ``first_row_id`` is not inherited here (pyiceberg's rules cover sequence
    numbers and the spec id only): :mod:`lineage.iceberg.row_lineage` does it.
    """
    if not is_v3(table):
        return manifest.fetch_manifest_entry(table.io, discard_deleted=discard_deleted)
    with AvroFile[ManifestEntry](
        table.io.new_input(manifest.manifest_path), MANIFEST_ENTRY_SCHEMAS[V3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        return [_inherit_from_manifest(e, manifest) for e in reader
                if not discard_deleted or e.status != ManifestEntryStatus.DELETED]
