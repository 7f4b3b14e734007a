"""The snapshot producer of a lineage commit: manifests for added and removed data and delete files.

pyiceberg 0.12 writes data manifests only; this producer (a pyiceberg
``_OverwriteFiles``) also writes delete manifests, merges manifests by
Iceberg's rule, takes the snapshot timestamp and id from the caller, and
writes v3 manifests and manifest lists (``first_row_id``) on v3 tables.
:func:`lineage.commits.commit.commit_files` drives it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, ManifestWriterV2
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.table.update.snapshot import _new_manifest_list_file_name, _OverwriteFiles
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType

from lineage.storage.avro_out import BufferedAvroOutput
from lineage.storage.fileio import ImmutableFileCache
from lineage.commits.merge_rule import MergeSettings, plan_merge, plan_rewrite
import lineage.storage.manifests_v3 as v3
import lineage.commits.v3_commit as v3_commit


class _ManifestWriter(ManifestWriterV2):
    """A v2 manifest writer whose ``equality_ids`` are ``list<int>`` as the Iceberg spec says.

    pyiceberg 0.12 declares them ``list<long>``; Iceberg Java then fails to read
    the manifest (ClassCastException Long -> Integer) as soon as it holds an
    equality delete file, e.g. a Flink sink's manifest our commit rewrote.
    """

    written_sink: dict[str, list[ManifestEntry]] | None = None  # manifest path -> its entries as written (see remember_entries)

    def _with_partition(self, format_version):  # type: ignore[no-untyped-def]
        return v3.entry_schema(self._spec, self._schema, format_version)

    def new_writer(self):  # type: ignore[no-untyped-def]
        """pyiceberg's writer with every entry in one Avro block (:mod:`lineage.storage.avro_out`), the same bytes per entry."""
        schema = self._with_partition(self.version)
        return BufferedAvroOutput(output_file=self._output_file, file_schema=schema, record_schema=schema,
                                  schema_name="manifest_entry", metadata=self._meta, memo_field="data_file")

    def to_manifest_file(self) -> ManifestFile:
        """The manifest's list entry; its entries as written go to ``written_sink`` when set."""
        manifest = super().to_manifest_file()
        if self.written_sink is not None:
            self.written_sink[manifest.manifest_path] = self._writer.written  # type: ignore[attr-defined]
        return manifest


class _DeleteManifestWriter(_ManifestWriter):
    """A v2 manifest writer for delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def _without_bounds(entry: ManifestEntry) -> ManifestEntry:
    """A copy of ``entry`` whose data file has no lower/upper bounds (they may hold erased values)."""
    df = copy.copy(entry.data_file)
    df._data = list(df._data)  # DataFile exposes no setters; positions 10/11 are lower/upper bounds
    df._data[10], df._data[11] = {}, {}
    return v3.with_data_file(entry, df)


@dataclass(frozen=True)
class _Rewrite:
    """A carried manifest to write anew: its live entries and, for each, whether it leaves the snapshot."""

    manifest: ManifestFile
    entries: list[ManifestEntry]
    hit: list[bool]


class BaseMetadata:
    """What pyiceberg's snapshot producer needs of a Transaction: the table and its base metadata.

    A real ``Transaction`` recomputes (and deep-copies) the whole table
    metadata on every ``table_metadata`` access, about fifteen times per
    commit, which costs time proportional to the number of snapshots. The
    producer only reads the base metadata, so one shared reference is enough.
    """

    def __init__(self, iceberg: IcebergTable) -> None:
        self._table = iceberg
        self.table_metadata = iceberg.metadata


class LineageSnapshotProducer(_OverwriteFiles):
    """Adds data and delete files and removes data or delete files, in one snapshot.

    Manifests are merged on commit by Iceberg's rule (:mod:`lineage.commits.merge_rule`),
    data and delete manifests separately; with ``rewrite_all`` every bin of
    two or more manifests is merged (``rewrite_manifests``).
    """

    strip_removed_stats = False
    rewrite_all = False

    def __init__(  # type: ignore[no-untyped-def]
        self, operation: Operation, transaction, io, properties: dict[str, str], timestamp_ms: int, snapshot_id: int, data_sequence_number: int | None
    ) -> None:
        super().__init__(operation, transaction, io, snapshot_properties=properties, branch=MAIN_BRANCH)
        self._timestamp_ms = timestamp_ms
        self._snapshot_id = snapshot_id
        self._data_sequence_number = data_sequence_number
        self.delete_sequence_numbers: dict[str, int] = {}  # delete file path -> an explicit data sequence number (CONVERT)
        self._merge_settings = MergeSettings.for_manifests(transaction.table_metadata.properties)
        self._v3 = transaction.table_metadata.format_version >= 3
        self.removed_vectors: set[tuple[str, str]] = set()  # v3: (Puffin file, data file) of vectors leaving (lineage.commits.v3_commit)
        self._removed_vector_files: list[DataFile] = []  # their entries as found: the summary counts them
        self._unassigned: dict[str, int] = {}  # v3: manifest path -> rows that inherit a first_row_id from it
        self._written_entries: dict[str, list[ManifestEntry]] = {}  # v3: manifest path -> its entries as written
        self.first_row_ids: dict[str, int] | None = None  # upgrade to v3: data file -> explicit first_row_id (every manifest rewritten)
        self._absorb: list[DataFile] = []  # new delete files (v3: vectors) to write into a rewritten delete manifest
        self._absorbed = False
        self._absorb_data: list[DataFile] = []  # v2: new data files to write into a rewritten data manifest
        self._data_absorbed = False
        self._absorb_spec: int | None = None  # the spec the new delete files are written under

    def _added_manifest(self, writer: Any, files: list[DataFile], sequence_number: Callable[[DataFile], int | None]) -> ManifestFile:
        """One manifest of ``files`` as ADDED entries of this snapshot (None: the entry inherits the snapshot's number)."""
        with writer as w:
            for f in files:
                w.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                          sequence_number=sequence_number(f), data_file=f))
        return w.to_manifest_file()

    def _manifests(self) -> list[ManifestFile]:
        spec = self._transaction.table_metadata.spec()
        data = [f for f in self._added_data_files if f.content == DataFileContent.DATA]
        deletes = [f for f in self._added_data_files if f.content != DataFileContent.DATA]
        manifests: list[ManifestFile] = []
        # New data files go into the data manifest a commit rewrites anyway (one folding small files drops them from
        # theirs, lineage.writes.small_files), as new delete files do below. On v3 they are its first entries and the
        # only ones without a first_row_id (carried entries are written with theirs), so they inherit the manifest's
        # first_row_id in the order added, as from a manifest of their own (list_order puts that manifest first).
        self._data_absorbed = False
        self._absorb_data = data if data and not self.rewrite_all and self.first_row_ids is None else []
        # A commit's new delete files (v3: vectors; v2: position delete files, lineage.storage.merged_deletes) go into
        # the delete manifest it rewrites anyway (the one losing the files they replace), one object fewer per small
        # commit; written apart when no delete manifest of their spec is rewritten.
        self._absorb = deletes if deletes and not self.rewrite_all and self.first_row_ids is None else []
        self._absorb_spec = spec.spec_id
        carried = self._carried_manifests()
        if data and not self._data_absorbed:
            manifests.append(self._added_manifest(self.new_manifest_writer(spec), data, lambda f: self._data_sequence_number))
        if deletes and not self._absorbed:
            manifests.append(self._added_manifest(self._delete_writer(spec), deletes, self._delete_sequence_number))
        out: list[ManifestFile] = []
        for content in (ManifestContent.DATA, ManifestContent.DELETES):
            # Newest first, as Iceberg orders them: this commit's manifest, then the parent's.
            group = [m for m in manifests if m.content == content] + [m for m in carried if m.content == content]
            out.extend(self._merged(group, content))
        return out

    def _delete_sequence_number(self, f: DataFile) -> int | None:
        """An added delete file's explicit data sequence number (None: it inherits the snapshot's)."""
        return self.delete_sequence_numbers.get(f.file_path)

    def _take_absorbed(self, group: list[_Rewrite]) -> list[DataFile]:
        """The new files to write into the rewritten manifest ``group``: the new data files into a data manifest, the new
        delete files into a delete manifest (all of them, once, if their spec is its)."""
        first = group[0].manifest
        if first.content == ManifestContent.DATA:
            if not self._absorb_data or self._data_absorbed or self._absorb_spec != first.partition_spec_id:
                return []
            self._data_absorbed = True
            return self._absorb_data
        if (not self._absorb or self._absorbed or first.content != ManifestContent.DELETES
                or self._absorb_spec != first.partition_spec_id):
            return []
        self._absorbed = True
        return self._absorb

    def _merged(self, manifests: list[ManifestFile], content: ManifestContent) -> list[ManifestFile]:
        """``manifests`` of one content after merge-on-commit, partition spec by spec (highest id first)."""
        if not manifests:
            return []
        first = manifests[0]
        by_spec: dict[int, list[ManifestFile]] = {}
        for m in manifests:
            by_spec.setdefault(m.partition_spec_id, []).append(m)
        out: list[ManifestFile] = []
        for spec_id in sorted(by_spec, reverse=True):
            group = by_spec[spec_id]
            if self.rewrite_all:
                bins = plan_rewrite(group, _manifest_weight, self._merge_settings.target_bytes)
            else:
                bins = plan_merge(group, _manifest_weight, self._merge_settings, first)
            for members, merge in bins:
                if not merge:
                    out.extend(members)
                    continue
                merged = self._merge_manifests(spec_id, content, members)
                if merged is not None:
                    out.append(merged)
        return out

    def _merge_manifests(self, spec_id: int, content: ManifestContent, members: list[ManifestFile]) -> ManifestFile | None:
        """One manifest with the entries of ``members`` (Iceberg's ManifestMergeManager rule).

        Files added by this snapshot stay ADDED and files it deletes stay
        DELETED; every other live entry becomes EXISTING with its snapshot id
        and data and file sequence numbers unchanged; DELETED entries of
        earlier snapshots are dropped. None when nothing is left.
        """
        spec = self.spec(spec_id)
        writer = self._delete_writer(spec) if content == ManifestContent.DELETES else self.new_manifest_writer(spec)
        count = 0
        with writer:
            for manifest in members:
                for entry in self._entries(manifest, discard_deleted=False):
                    if entry.status == ManifestEntryStatus.DELETED:
                        if entry.snapshot_id == self._snapshot_id:
                            writer.delete(entry)
                            count += 1
                    elif entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == self._snapshot_id:
                        writer.add(entry)
                        count += 1
                    else:
                        writer.existing(self._with_first_row_id(entry))
                        count += 1
        return writer.to_manifest_file() if count else None

    def new_manifest_writer(self, spec):  # type: ignore[no-untyped-def]
        """A data manifest writer (spec-conform ``equality_ids``, see :class:`_ManifestWriter`; v3: ``first_row_id``)."""
        if self._v3:
            return v3.ManifestWriterV3(spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression,
                                       self._unassigned, self._written_entries)
        if self._transaction.table_metadata.format_version != 2:
            return super().new_manifest_writer(spec)
        return self._v2_sink(_ManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression))

    def _v2_sink(self, writer: _ManifestWriter) -> _ManifestWriter:
        writer.written_sink = self._written_entries  # the next commit carries or rewrites the manifest without reading it
        return writer

    def _delete_writer(self, spec):  # type: ignore[no-untyped-def]
        if self._v3:
            return v3.DeleteManifestWriterV3(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                             self._compression, written=self._written_entries)
        return self._v2_sink(_DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression))

    def _entries(self, manifest: ManifestFile, discard_deleted: bool) -> list[ManifestEntry]:
        """A manifest's entries (cached by manifest); on v3 with every v3 field and inherited ``first_row_id`` (they are written back)."""
        written = self._written_entries.get(manifest.manifest_path)
        if written is not None:  # written by this producer (merged into another of its manifests): as written
            return [e for e in written if not discard_deleted or e.status != ManifestEntryStatus.DELETED]
        read = v3.read_entries if self._v3 else v3.read_v2_entries
        return read(manifest, self._io, discard_deleted=discard_deleted)

    def _with_first_row_id(self, e: ManifestEntry) -> ManifestEntry:
        """``e`` with the explicit ``first_row_id`` an upgrade to v3 gives its data file, if any."""
        first = self.first_row_ids.get(e.data_file.file_path) if self.first_row_ids else None
        return e if first is None else v3.with_data_file(e, v3.as_v3(e.data_file, first_row_id=first))

    def _carried_manifests(self) -> list[ManifestFile]:
        """The parent's manifests; those holding a removed file are rewritten with it marked DELETED."""
        metadata = self._transaction.table_metadata
        parent = v3_commit.snapshot_of(metadata, self._parent_snapshot_id) if self._parent_snapshot_id else None
        if parent is None:
            return []
        removed = self._deleted_data_files
        vectors = self.removed_vectors
        # Which manifests can hold a file leaving: data files sit in data manifests, delete files and vectors in
        # delete manifests (a merge-on-read commit on v3 removes vectors only: no data manifest is read).
        touched = {ManifestContent.DATA: any(f.content == DataFileContent.DATA for f in removed),
                   ManifestContent.DELETES: bool(vectors) or any(f.content != DataFileContent.DATA for f in removed)}

        def leaves(e: ManifestEntry) -> bool:  # v3: a vector leaves by (Puffin file, data file), not by path
            # DataFiles hash by path and compare field by field, and the vectors of a commit share a path: test the set only
            # when it holds something
            return (bool(removed) and e.data_file in removed) or (
                bool(vectors) and (e.data_file.file_path, v3.referenced_data_file(e.data_file)) in vectors)
        slots: list[ManifestFile | list[_Rewrite]] = []  # in order: carried as they are, or rewritten (a group each)
        open_groups: dict[tuple[ManifestContent, int], tuple[list[_Rewrite], list[int]]] = {}  # (content, spec id) -> group, its bytes
        for manifest in manifests_of(parent, self._io, self._v3):
            live_count = (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)
            if manifest.added_files_count is not None and manifest.existing_files_count is not None and live_count == 0:
                continue  # only DELETED entries of an earlier commit: nothing to carry
            stale = self.strip_removed_stats and bool(manifest.deleted_files_count)
            upgrade = self.first_row_ids is not None  # every manifest is written anew, in the v3 structs
            if not touched[manifest.content] and not stale and not upgrade:
                slots.append(manifest)
                continue
            entries = self._entries(manifest, discard_deleted=True)
            hit = [leaves(e) for e in entries]
            if not any(hit) and not stale and not upgrade:
                slots.append(manifest)
                continue
            rewrite = _Rewrite(manifest, entries, hit)
            if stale or upgrade:
                slots.append([rewrite])
                continue
            # The manifests a commit rewrites become one per content and spec (up to the target manifest size), not one
            # each: a commit replacing the delete files (v3: vectors) of the files it deletes from, spread over the delete
            # manifests, or folding small data files each added by a commit of its own (lineage.writes.small_files),
            # writes one object for them, not one per manifest touched.
            key = (manifest.content, manifest.partition_spec_id)
            group, size = open_groups.get(key, (None, [0]))
            if group is None or size[0] + _manifest_weight(manifest) > self._merge_settings.target_bytes:
                group, size = [], [0]
                open_groups[key] = (group, size)
                slots.append(group)
            group.append(rewrite)
            size[0] += _manifest_weight(manifest)
        out: list[ManifestFile] = []
        found: set[str] = set()
        for slot in slots:
            if isinstance(slot, ManifestFile):
                out.append(slot)
                continue
            added = self._take_absorbed(slot)
            if added or any(r.entries for r in slot):
                out.append(self._rewritten(slot, removed, found, added))
        missing = [f.file_path for f in removed if f.file_path not in found]
        if missing:
            raise CommitFailedException(f"files to remove are no longer in the snapshot: {missing[:3]}")
        return out

    def _rewritten(self, members: list[_Rewrite], removed: set[DataFile], found: set[str], added: list[DataFile]) -> ManifestFile:
        """One manifest of the entries of ``members`` (one content, one spec): the leaving ones DELETED, the others EXISTING,
        and ``added`` files of this snapshot ADDED first."""
        first = members[0].manifest
        spec = self.spec(first.partition_spec_id)
        writer = self._delete_writer(spec) if first.content == ManifestContent.DELETES else self.new_manifest_writer(spec)
        with writer:
            for f in added:
                number = self._data_sequence_number if f.content == DataFileContent.DATA else self._delete_sequence_number(f)
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                                   sequence_number=number, data_file=f))
            for r in members:
                for e, leaving in zip(r.entries, r.hit, strict=True):
                    if leaving:
                        writer.delete(_without_bounds(e) if self.strip_removed_stats else e)
                        found.add(e.data_file.file_path)
                        if not (removed and e.data_file in removed):
                            self._removed_vector_files.append(e.data_file)
                    else:
                        writer.existing(self._with_first_row_id(e))
        return writer.to_manifest_file()

    def updates_and_requirements(self) -> tuple[tuple, tuple]:
        """Build the snapshot (like pyiceberg's ``_commit``, with our timestamp)."""
        metadata = self._transaction.table_metadata
        new_manifests = self._manifests()
        sequence_number = metadata.next_sequence_number()
        if self._operation == Operation.REPLACE:
            # pyiceberg only totals append/overwrite/delete summaries; totals are the same for a replace.
            self._operation = Operation.OVERWRITE
            totals = self._summary(self.snapshot_properties)
            self._operation = Operation.REPLACE
            summary = Summary(operation=Operation.REPLACE, **totals.additional_properties)
        else:
            summary = self._summary(self.snapshot_properties)
        location = self._transaction._table.location_provider().new_metadata_location(
            _new_manifest_list_file_name(snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid)
        )
        self._written_manifest_lists.append(location)
        if self._v3:
            new_manifests = v3.list_order(new_manifests, self._snapshot_id)
        writer = v3_commit.list_writer(metadata, self._io.new_output(location), self._snapshot_id, self._parent_snapshot_id,
                                       sequence_number, self._compression, self._unassigned)
        with writer:
            listed = tuple(writer.prepare_manifest(m) for m in new_manifests)  # as a reader of the list will see them
            writer._writer.write_block(list(listed))
        lineage = v3_commit.snapshot_row_ids(writer)  # v3: first-row-id and added-rows
        for m in listed:  # v3: the next commit carries or rewrites them without reading them back
            if m.manifest_path in self._written_entries:
                v3.remember_entries(m, self._written_entries[m.manifest_path], v2=not self._v3)
        _WRITTEN_LISTS.get(location, lambda: listed)
        snapshot = Snapshot(
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=location,
            sequence_number=sequence_number,
            timestamp_ms=self._timestamp_ms,
            summary=summary,
            schema_id=metadata.current_schema_id,
            **lineage,
        )
        return (
            (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(
                    snapshot_id=self._snapshot_id,
                    parent_snapshot_id=self._parent_snapshot_id,
                    ref_name=MAIN_BRANCH,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (AssertRefSnapshotId(snapshot_id=self._parent_snapshot_id, ref=MAIN_BRANCH),),
        )

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """pyiceberg's summary, also counting vectors removed entry by entry (pyiceberg keys removed files by path)."""
        removed = list(self._deleted_data_files) + self._removed_vector_files
        return v3_commit.summary(self._transaction.table_metadata, self._operation, self._added_data_files, removed,
                                 self._parent_snapshot_id, snapshot_properties)

    def written_files(self) -> list[str]:
        """Manifests and manifest lists this producer wrote (to clean up after a lost race)."""
        return list(self._written_manifests) + list(self._written_manifest_lists)


# Manifest lists this process wrote, by location: the next commit of the same table carries them
# without reading the list back (pyiceberg re-reads a manifest list on every Snapshot.manifests call).
_WRITTEN_LISTS: ImmutableFileCache[tuple[ManifestFile, ...]] = ImmutableFileCache(64)


def manifests_of(snapshot: Snapshot, io, v3_fields: bool = False) -> tuple[ManifestFile, ...]:  # type: ignore[no-untyped-def]
    """The manifests of ``snapshot`` (from memory when this process wrote its manifest list), with ``first_row_id`` if ``v3_fields``."""
    read = (lambda: v3.read_manifest_list(io, snapshot.manifest_list)) if v3_fields else (lambda: tuple(snapshot.manifests(io)))
    return _WRITTEN_LISTS.get(snapshot.manifest_list, read)


def _manifest_weight(manifest: ManifestFile) -> int:
    return int(manifest.manifest_length or 0)
