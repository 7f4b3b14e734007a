"""Iceberg format version 3 manifests and manifest lists (row lineage, deletion vector references).

pyiceberg 0.12 reads v3 manifests with its v2 read schema (dropping
``first_row_id`` and the deletion-vector fields) and writes v1/v2 only. A v3
commit needs all of them, so this module reads and writes them itself, on
pyiceberg's Avro machinery:

* **data files** (manifest entry field 2) carry ``first_row_id`` (142),
  ``referenced_data_file`` (143), ``content_offset`` (144) and
  ``content_size_in_bytes`` (145). A new data file is written with a null
  ``first_row_id`` and inherits one on read: the manifest's ``first_row_id``
  plus the record counts of the files before it in the manifest whose
  ``first_row_id`` was null (spec, "First Row ID Inheritance").
  :func:`read_entries` applies that inheritance, so an entry carried into a
  rewritten manifest (EXISTING or DELETED) is written with its inherited
  value, as the spec requires;
* **manifest lists** (:class:`ManifestListWriterV3`) carry ``first_row_id``
  (520): a carried manifest keeps its value; a data manifest without one is
  assigned the running row id, which then advances by the rows that will
  inherit an id from it: counted exactly for the manifests this commit wrote
  (only their files with a null ``first_row_id``), estimated as added plus
  existing rows for any other (spec, "First Row ID Assignment"). The writer's
  ``next_row_id`` minus the snapshot's ``first-row-id`` is the snapshot's
  ``added-rows``, which advances the table's ``next-row-id``.
"""

from __future__ import annotations

from copy import copy
from typing import Any

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, AvroCompressionCodec
from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestWriter,
    PartitionFieldSummary,
    _inherit_from_manifest,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

from lineage.storage.avro_out import BufferedAvroOutput
from lineage.storage.fileio import ImmutableFileCache
from lineage.identity_cache import struct_of

FORMAT_VERSION = 3
_V3_DATA_FIELDS = len(DATA_FILE_TYPE[3].fields)  # 20: v2's 16 plus first_row_id, referenced_data_file, content_offset, size
_FIRST_ROW_ID, _REFERENCED, _OFFSET, _SIZE = 16, 17, 18, 19  # positions in the v3 data_file struct
_LIST_FIRST_ROW_ID = 15  # position of first_row_id (520) in the v3 manifest_file struct
_EQUALITY_IDS = 135


def entry_schema(spec: PartitionSpec, schema: Schema, format_version: TableVersion) -> Schema:
    """The manifest entry schema of ``spec``, with ``equality_ids`` as ``list<int>`` as the spec says.

    pyiceberg declares ``equality_ids`` ``list<long>``; Iceberg Java then fails
    to read a manifest holding an equality delete file (ClassCastException).
    """
    key = (spec.spec_id, tuple(spec.fields), struct_of(schema), format_version)
    return _ENTRY_SCHEMAS.get(key, lambda: _entry_schema(spec, schema, format_version))


def _entry_schema(spec: PartitionSpec, schema: Schema, format_version: TableVersion) -> Schema:
    data_file = data_file_with_partition(format_version=format_version, partition_type=spec.partition_type(schema))
    fields = [
        NestedField(f.field_id, f.name, ListType(136, IntegerType(), element_required=True), required=False, doc=f.doc)
        if f.field_id == _EQUALITY_IDS
        else f
        for f in data_file.fields
    ]
    return manifest_entry_schema_with_data_file(format_version=format_version, data_file=StructType(*fields))


_ENTRY_SCHEMAS: ImmutableFileCache[Schema] = ImmutableFileCache(64)  # built once per spec, table schema and version


# ---------------------------------------------------------------- data files and manifest files of the v3 struct


def first_row_id(data_file: DataFile) -> int | None:
    """A data file's ``first_row_id`` (None when unassigned or when read without the v3 fields)."""
    return data_file._data[_FIRST_ROW_ID] if len(data_file._data) > _FIRST_ROW_ID else None


def referenced_data_file(data_file: DataFile) -> str | None:
    """The data file a deletion vector (or file-scoped position delete file) references, if recorded."""
    return data_file._data[_REFERENCED] if len(data_file._data) > _REFERENCED else None


def content_range(data_file: DataFile) -> tuple[int, int] | None:
    """``(content_offset, content_size_in_bytes)`` of a deletion vector blob, or None."""
    if len(data_file._data) <= _SIZE or data_file._data[_OFFSET] is None:
        return None
    return int(data_file._data[_OFFSET]), int(data_file._data[_SIZE])


def is_deletion_vector(data_file: DataFile) -> bool:
    """Whether a delete file entry is a deletion vector (a Puffin blob)."""
    return data_file.content == DataFileContent.POSITION_DELETES and data_file.file_format == FileFormat.PUFFIN


def as_v3(data_file: DataFile, **fields: Any) -> DataFile:
    """``data_file`` in the v3 struct (20 fields); ``fields`` set v3 fields by name (``first_row_id=...``)."""
    values = list(data_file._data) + [None] * (_V3_DATA_FIELDS - len(data_file._data))
    for name, value in fields.items():
        values[{"first_row_id": _FIRST_ROW_ID, "referenced_data_file": _REFERENCED, "content_offset": _OFFSET,
                "content_size_in_bytes": _SIZE}[name]] = value
    out = DataFile(*values)
    try:
        out.spec_id = data_file.spec_id
    except AttributeError:
        pass  # fresh from the writer: the commit sets it
    return out


def with_data_file(entry: ManifestEntry, data_file: DataFile) -> ManifestEntry:
    """A copy of ``entry`` (status, snapshot id, sequence numbers) describing ``data_file``."""
    return ManifestEntry.from_args(
        status=entry.status,
        snapshot_id=entry.snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=data_file,
    )


def manifest_first_row_id(manifest: ManifestFile) -> int | None:
    """A manifest's ``first_row_id`` (None when unassigned or read by pyiceberg's v2 reader)."""
    return manifest._data[_LIST_FIRST_ROW_ID] if len(manifest._data) > _LIST_FIRST_ROW_ID else None


def _as_v3_manifest(manifest: ManifestFile) -> ManifestFile:
    values = list(manifest._data) + [None] * (len(MANIFEST_LIST_FILE_SCHEMAS[3].fields) - len(manifest._data))
    return ManifestFile(*values)


# ---------------------------------------------------------------- reading


def read_manifest_list(io: FileIO, location: str) -> tuple[ManifestFile, ...]:
    """The manifests of a manifest list, with their ``first_row_id``."""
    with AvroFile[ManifestFile](
        io.new_input(location),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return tuple(reader)


def read_entries(manifest: ManifestFile, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
    """A manifest's entries with every v3 field, sequence numbers and ``first_row_id`` inherited.

    For a data manifest with a ``first_row_id``, a data file whose own value
    is null gets the manifest's value plus the record counts of the files
    before it that had a null value; without one (a snapshot older than the
    table's upgrade to v3) the files keep null. Parsed entries are cached by
    manifest (manifests are immutable); callers must not modify them.
    """
    key = (manifest.manifest_path, manifest_first_row_id(manifest), manifest.sequence_number)
    entries = _ENTRIES.get(key, lambda: _read_entries(manifest, io))
    return [e for e in entries if not discard_deleted or e.status != ManifestEntryStatus.DELETED]


def read_v2_entries(manifest: ManifestFile, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
    """A manifest's entries as pyiceberg's reader gives them (sequence numbers inherited; a v2 table's), cached like
    :func:`read_entries` (pyiceberg converts the file's Avro schema anew for every manifest it reads)."""
    key = (manifest.manifest_path, _V2, manifest.sequence_number)
    entries = _ENTRIES.get(key, lambda: tuple(ManifestFile.fetch_manifest_entry(manifest, io, discard_deleted=False)))
    return [e for e in entries if not discard_deleted or e.status != ManifestEntryStatus.DELETED]


_V2 = "v2"  # in the cache key in place of a first_row_id: entries in pyiceberg's v2 structs


# Parsed manifests, bounded by the entries held: a commit that replaces deletion vectors rewrites the manifests
# holding them, and reading an Avro manifest costs more in schema conversion than in its few entries.
_ENTRIES: ImmutableFileCache[tuple[ManifestEntry, ...]] = ImmutableFileCache(200_000, weigh=lambda e: 1 + len(e), max_share=0.25)


def _read_entries(manifest: ManifestFile, io: FileIO) -> tuple[ManifestEntry, ...]:
    with AvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        entries = [_inherit_from_manifest(e, manifest) for e in reader]
    return _inherit_first_row_ids(entries, manifest)


def _inherit_first_row_ids(entries: list[ManifestEntry], manifest: ManifestFile) -> tuple[ManifestEntry, ...]:
    next_id = manifest_first_row_id(manifest)
    if manifest.content == ManifestContent.DATA and next_id is not None:
        for e in entries:
            df = e.data_file
            if df._data[_FIRST_ROW_ID] is None:
                df._data[_FIRST_ROW_ID] = next_id
                next_id += int(df.record_count)
    return tuple(entries)


def _as_read(entry: ManifestEntry, manifest: ManifestFile) -> DataFile:
    """The data file of a written entry, ready to inherit from ``manifest``: a copy, unless inheriting would not change it.

    Inheriting sets the spec id (not written in the file) and, in a data
    manifest, a null ``first_row_id``. A data file that has both already (an
    entry carried from a cached manifest; a new deletion vector) is kept, so
    that it stays the same object commit after commit and is encoded once
    (:class:`lineage.storage.avro_out.MemoWriter`). Such objects are never
    modified afterwards.
    """
    df = entry.data_file
    row_ids_set = (manifest.content != ManifestContent.DATA or manifest_first_row_id(manifest) is None
                   or df._data[_FIRST_ROW_ID] is not None)
    unchanged = row_ids_set and getattr(df, "_spec_id", None) == manifest.partition_spec_id
    return df if unchanged else DataFile(*df._data)


def remember_entries(manifest: ManifestFile, written: list[ManifestEntry], v2: bool = False) -> None:
    """Keep the entries of a manifest this process wrote as :func:`read_entries` would read them back
    (:func:`read_v2_entries` with ``v2``: a v2 table's manifest, entries in the v2 structs).

    ``manifest`` is the manifest as its manifest list lists it (sequence
    number and ``first_row_id`` assigned); ``written`` are its entries as
    written (in the v3 struct). Each is copied, then inherits from the
    manifest exactly as a read entry does, so the next commit carries the
    manifest (or rewrites it) without reading and decoding it.
    """
    seq = manifest.sequence_number
    entries = []
    for e in written:  # pyiceberg's _inherit_from_manifest, without setting an unchanged spec id (a costly DataFile attribute)
        df = _as_read(e, manifest)
        if df is not e.data_file:
            df.spec_id = manifest.partition_spec_id
        inherits = seq == 0 or e.status == ManifestEntryStatus.ADDED
        entries.append(ManifestEntry(
            e.status, manifest.added_snapshot_id if e.snapshot_id is None else e.snapshot_id,
            seq if e.sequence_number is None and inherits else e.sequence_number,
            seq if e.file_sequence_number is None and inherits else e.file_sequence_number, df))
    key = (manifest.manifest_path, _V2 if v2 else manifest_first_row_id(manifest), manifest.sequence_number)
    _ENTRIES.put(key, tuple(entries) if v2 else _inherit_first_row_ids(entries, manifest))


# ---------------------------------------------------------------- writing


class ManifestWriterV3(ManifestWriter):
    """A v3 data manifest writer; counts the rows whose data files will inherit a ``first_row_id``.

    When given ``unassigned`` (a dict shared with :class:`ManifestListWriterV3`),
    :meth:`to_manifest_file` records the count there under the manifest's path;
    when given ``written``, the entries as written (see :func:`remember_entries`).
    Entries are written as one Avro block (:mod:`lineage.storage.avro_out`).
    """

    def __init__(
        self,
        spec: PartitionSpec,
        schema: Schema,
        output_file: OutputFile,
        snapshot_id: int,
        avro_compression: AvroCompressionCodec,
        unassigned: dict[str, int] | None = None,
        written: dict[str, list[ManifestEntry]] | None = None,
    ) -> None:
        super().__init__(spec, schema, output_file, snapshot_id, avro_compression)
        self.unassigned_rows = 0
        self._counts = unassigned
        self._written = written

    def content(self) -> ManifestContent:
        """Data files."""
        return ManifestContent.DATA

    @property
    def version(self) -> TableVersion:
        """Format version 3."""
        return 3

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "data" if self.content() == ManifestContent.DATA else "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        return entry_schema(self._spec, self._schema, 3)

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        """An Avro writer whose records are v3 entries (file and record schema alike)."""
        schema = self._with_partition(3)
        return BufferedAvroOutput(
            output_file=self._output_file, file_schema=schema, record_schema=schema, schema_name="manifest_entry",
            metadata=self._meta, memo_field="data_file",
        )

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        """The entry with its data file in the v3 struct (v2's rule on null sequence numbers kept)."""
        if entry.sequence_number is None:
            if entry.snapshot_id is not None and entry.snapshot_id != self._snapshot_id:
                raise ValueError(f"Found unassigned sequence number for an entry from snapshot: {entry.snapshot_id}")
            if entry.status != ManifestEntryStatus.ADDED:
                raise ValueError("Only entries with status ADDED can have null sequence number")
        df = entry.data_file
        if len(df._data) < _V3_DATA_FIELDS:
            df = as_v3(df)
        if self.content() == ManifestContent.DATA and df._data[_FIRST_ROW_ID] is None and entry.status != ManifestEntryStatus.DELETED:
            # (a DELETED entry without one is a file of a snapshot older than the table's upgrade: it is read by no one)
            self.unassigned_rows += int(df.record_count)
        return with_data_file(entry, df)

    def existing(self, entry: ManifestEntry) -> ManifestWriterV3:
        """Add ``entry`` as EXISTING (pyiceberg's rule; the entry built directly, not field by field by name)."""
        self.add_entry(ManifestEntry(ManifestEntryStatus.EXISTING, entry.snapshot_id, entry.sequence_number,
                                     entry.file_sequence_number, entry.data_file))
        return self

    def delete(self, entry: ManifestEntry) -> ManifestWriterV3:
        """Add ``entry`` as DELETED by this snapshot (pyiceberg's rule, built directly)."""
        self.add_entry(ManifestEntry(ManifestEntryStatus.DELETED, self._snapshot_id, entry.sequence_number,
                                     entry.file_sequence_number, entry.data_file))
        return self

    def to_manifest_file(self) -> ManifestFile:
        """The manifest's list entry, in the v3 struct (``first_row_id`` assigned by the list writer)."""
        manifest = _as_v3_manifest(super().to_manifest_file())
        if self._counts is not None:
            self._counts[manifest.manifest_path] = self.unassigned_rows
        if self._written is not None:
            self._written[manifest.manifest_path] = self._writer.written  # type: ignore[attr-defined]
        return manifest


class DeleteManifestWriterV3(ManifestWriterV3):
    """A v3 delete manifest writer (deletion vectors, equality deletes, older position delete files)."""

    def content(self) -> ManifestContent:
        """Delete files."""
        return ManifestContent.DELETES


class ManifestListWriterV3(ManifestListWriter):
    """A v3 manifest list: sequence numbers as in v2, and ``first_row_id`` for data manifests.

    ``unassigned`` maps a manifest path to the exact number of rows of its
    data files with a null ``first_row_id`` (the writers of this commit know
    it); other manifests without a ``first_row_id`` are estimated as added plus
    existing rows. ``next_row_id`` is the running row id after the manifests
    added so far.
    """

    def __init__(
        self,
        output_file: OutputFile,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        first_row_id: int,
        compression: AvroCompressionCodec,
        unassigned: dict[str, int] | None = None,
    ) -> None:
        super().__init__(
            format_version=3,
            output_file=output_file,
            meta={
                "snapshot-id": str(snapshot_id),
                "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
                "sequence-number": str(sequence_number),
                "first-row-id": str(first_row_id),
                "format-version": "3",
                AVRO_CODEC_KEY: compression,
            },
        )
        self._commit_snapshot_id = snapshot_id
        self._sequence_number = sequence_number
        self.first_row_id = first_row_id
        self.next_row_id = first_row_id
        self._unassigned = unassigned if unassigned is not None else {}

    def __enter__(self) -> ManifestListWriterV3:
        """Open the writer (records in the v3 struct)."""
        self._writer = BufferedAvroOutput(
            output_file=self._output_file,
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.__enter__()
        return self

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        """The manifest as listed: sequence numbers of new manifests assigned, ``first_row_id`` assigned if missing."""
        m = _as_v3_manifest(copy(manifest_file))
        if m.sequence_number == UNASSIGNED_SEQ:
            if self._commit_snapshot_id != m.added_snapshot_id:
                raise ValueError(f"Found unassigned sequence number for a manifest from snapshot: {m.added_snapshot_id}")
            m.sequence_number = self._sequence_number
        if m.min_sequence_number == UNASSIGNED_SEQ:
            if self._commit_snapshot_id != m.added_snapshot_id:
                raise ValueError(f"Found unassigned sequence number for a manifest from snapshot: {m.added_snapshot_id}")
            m.min_sequence_number = self._sequence_number
        if m.content == ManifestContent.DATA and m._data[_LIST_FIRST_ROW_ID] is None:
            m._data[_LIST_FIRST_ROW_ID] = self.next_row_id
            if m.manifest_path in self._unassigned:
                self.next_row_id += self._unassigned[m.manifest_path]
            else:
                self.next_row_id += int(m.added_rows_count or 0) + int(m.existing_rows_count or 0)
        return m

    @property
    def added_rows(self) -> int:
        """Row ids this list assigned: the snapshot's ``added-rows``."""
        return self.next_row_id - self.first_row_id


def list_order(manifests: list[ManifestFile], snapshot_id: int) -> list[ManifestFile]:
    """``manifests`` with the data manifest holding this snapshot's added files first.

    Row ids are assigned in manifest-list order (spec, "First Row ID
    Assignment"); the lineage of a commit numbers its added files from the
    table's ``next-row-id`` in the order they were added, so their manifest
    must be the first one assigned ids.
    """
    def holds_added(m: ManifestFile) -> bool:
        return m.content == ManifestContent.DATA and m.added_snapshot_id == snapshot_id and bool(m.added_files_count)

    return [m for m in manifests if holds_added(m)] + [m for m in manifests if not holds_added(m)]
