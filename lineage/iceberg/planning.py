"""Planning a snapshot's live files from its manifests, equality deletes included.

pyiceberg's ``plan_files`` refuses snapshots that hold equality delete files,
which every Flink CDC sink (and this library's own ``equality`` change-stream
strategy) writes. This planner reads the manifests itself and matches delete
files to data files with the rules of the Iceberg spec ("Scan Planning"):

* a position delete file with data sequence number ``d`` applies to data
  files with data sequence number ``<= d`` in the same partition (or to the
  one file its ``file_path`` bounds name);
* an equality delete file with data sequence number ``d`` applies to data
  files with data sequence number **strictly** ``< d`` in the same partition,
  or in every partition when its spec is unpartitioned (a global delete).

Every entry keeps its data sequence number, which the reconciliation of
foreign snapshots and CONVERT need.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from pyiceberg.manifest import INITIAL_SEQUENCE_NUMBER, DataFile, DataFileContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record
from pyiceberg.utils.concurrent import ExecutorFactory

import lineage.storage.manifests_v3 as manifests_v3
from lineage.storage.deletes import path_in_bounds, referenced_data_path
from lineage.storage.fileio import ImmutableFileCache


@dataclass(frozen=True)
class PlannedFile:
    """A live data file with its data sequence number and the delete files that apply to it."""

    data_file: DataFile
    sequence_number: int
    position_deletes: tuple[DataFile, ...]
    equality_deletes: tuple[DataFile, ...] = ()


@dataclass
class _ByPartition:
    """Equality delete files of one partition, sorted by data sequence number."""

    seqs: list[int] = field(default_factory=list)
    files: list[DataFile] = field(default_factory=list)

    def add(self, seq: int, delete_file: DataFile) -> None:
        at = bisect_right(self.seqs, seq)
        self.seqs.insert(at, seq)
        self.files.insert(at, delete_file)

    def newer_than(self, seq: int) -> list[DataFile]:
        return self.files[bisect_right(self.seqs, seq) :]

    def at_least(self, seq: int) -> list[DataFile]:
        return self.files[bisect_left(self.seqs, seq) :]


class EqualityDeleteIndex:
    """Equality delete files by partition, answering which apply to a data file."""

    def __init__(self, unpartitioned_specs: set[int]) -> None:
        self._unpartitioned = unpartitioned_specs
        self._global = _ByPartition()
        self._by_partition: dict[tuple[int, Record], _ByPartition] = {}

    def add(self, entry: ManifestEntry) -> None:
        """Index one live equality delete entry."""
        f = entry.data_file
        seq = sequence_of(entry)
        if (f.spec_id or 0) in self._unpartitioned:
            self._global.add(seq, f)
        else:
            self._by_partition.setdefault((f.spec_id or 0, f.partition), _ByPartition()).add(seq, f)

    def __bool__(self) -> bool:
        return bool(self._global.files) or bool(self._by_partition)

    def for_data_file(self, seq: int, data_file: DataFile) -> tuple[DataFile, ...]:
        """Equality delete files that apply to ``data_file`` of data sequence number ``seq``."""
        out = self._global.newer_than(seq)
        local = self._by_partition.get((data_file.spec_id or 0, data_file.partition))
        if local is not None:
            out = out + local.newer_than(seq)
        return tuple(out)


class PositionDeleteIndex:
    """Position delete files by the one data file they name (file-scoped) or by partition.

    pyiceberg's ``DeleteFileIndex`` binds and evaluates a ``file_path``
    predicate for every pair of data file and partition-scoped delete file,
    which costs seconds per snapshot once a stream has written a few hundred
    partition-scoped files; here a file-scoped delete is found by path and a
    partition-scoped one is checked against its ``file_path`` bounds.
    """

    def __init__(self) -> None:
        self._by_file: dict[str, list[tuple[int, DataFile]]] = {}
        self._by_partition: dict[tuple[int, Record], _ByPartition] = {}

    def add(self, entry: ManifestEntry) -> None:
        """Index one live position delete entry."""
        f = entry.data_file
        target = referenced_data_path(f)
        if target is not None:
            self._by_file.setdefault(target, []).append((sequence_of(entry), f))
        else:
            self._by_partition.setdefault((f.spec_id or 0, f.partition), _ByPartition()).add(sequence_of(entry), f)

    def __bool__(self) -> bool:
        return bool(self._by_file) or bool(self._by_partition)

    def for_data_file(self, seq: int, data_file: DataFile) -> tuple[DataFile, ...]:
        """Position delete files that apply to ``data_file`` of data sequence number ``seq``, sorted by path."""
        path = data_file.file_path
        out = [f for s, f in self._by_file.get(path, ()) if s >= seq]
        local = self._by_partition.get((data_file.spec_id or 0, data_file.partition))
        if local is not None:
            out.extend(f for f in local.at_least(seq) if path_in_bounds(f, path))
        return tuple(sorted(out, key=lambda d: d.file_path))


def sequence_of(entry: ManifestEntry) -> int:
    """An entry's data sequence number (inherited from its manifest when it was added)."""
    return entry.sequence_number if entry.sequence_number is not None else INITIAL_SEQUENCE_NUMBER


# Live entries of recently read manifests, by manifest path, bounded by the number of entries held (one
# manifest at most a quarter of them). Manifest files are immutable and uniquely named, so their entries stay
# valid; a reader that polls the change feed or a stream that commits every few seconds re-reads only the
# manifests its last call did not see.
_ENTRIES: ImmutableFileCache[list[ManifestEntry]] = ImmutableFileCache(200_000, weigh=len, max_share=0.25)


_LISTS: ImmutableFileCache[list[ManifestFile]] = ImmutableFileCache(256)  # v3 manifest lists read, by path


def is_v3(table: IcebergTable) -> bool:
    """Whether the table's format version is 3 or later (native row lineage, deletion vectors)."""
    return int(table.metadata.format_version) >= 3


def snapshot_manifests(table: IcebergTable, snapshot: Snapshot) -> list[ManifestFile]:
    """The manifests of ``snapshot``; on a v3 table with their ``first_row_id`` (pyiceberg's reader drops it)."""
    if not is_v3(table) or not snapshot.manifest_list:
        return snapshot.manifests(table.io)
    return _LISTS.get(snapshot.manifest_list, lambda: list(manifests_v3.read_manifest_list(table.io, snapshot.manifest_list)))


def manifest_entries(table: IcebergTable, manifest: ManifestFile, discard_deleted: bool = True) -> list[ManifestEntry]:
    """The entries of ``manifest`` (live ones only by default); on a v3 table with the v3 fields and inherited ``first_row_id``."""
    if is_v3(table):
        return manifests_v3.read_entries(manifest, table.io, discard_deleted=discard_deleted)
    return manifest.fetch_manifest_entry(table.io, discard_deleted=discard_deleted)


def live_entries(table: IcebergTable, manifests: Iterable[ManifestFile]) -> Iterator[ManifestEntry]:
    """Every live (added or existing) entry of ``manifests``, in manifest order (the entries are shared: do not modify them).

    Manifests not cached (:data:`_ENTRIES`) are read in parallel.
    """
    manifests = list(manifests)
    v3 = is_v3(table)  # read with the v3 fields (row lineage, deletion vectors)

    def key(m: ManifestFile) -> tuple[str, bool, int | None]:
        # On v3 the entries inherit first_row_id from the manifest list's value, which a manifest written before
        # an upgrade to v3 gets only in a later snapshot's list: the same manifest reads differently.
        return m.manifest_path, v3, manifests_v3.manifest_first_row_id(m) if v3 else None

    found = {m.manifest_path: _ENTRIES.peek(key(m)) for m in manifests}
    missing = [m for m in manifests if found[m.manifest_path] is None]
    if missing:
        read = ExecutorFactory.get_or_create().map(lambda m: manifest_entries(table, m), missing)
        for m, entries in zip(missing, read, strict=True):
            found[m.manifest_path] = entries
            _ENTRIES.put(key(m), entries)
    return chain.from_iterable(found[m.manifest_path] or () for m in manifests)


def plan_snapshot(table: IcebergTable, snapshot: Snapshot) -> list[PlannedFile]:
    """Every live data file of ``snapshot`` with the position and equality delete files that apply to it.

    Data files come in manifest order, then entry order within a manifest (the
    order pyiceberg's planner uses), so planning is deterministic.
    """
    data: list[ManifestEntry] = []
    positions = PositionDeleteIndex()
    unpartitioned = {spec.spec_id for spec in table.metadata.partition_specs if spec.is_unpartitioned()}
    equality = EqualityDeleteIndex(unpartitioned)
    for entry in live_entries(table, snapshot_manifests(table, snapshot)):
        content = entry.data_file.content
        if content == DataFileContent.DATA:
            data.append(entry)
        elif content == DataFileContent.POSITION_DELETES:
            positions.add(entry)
        elif content == DataFileContent.EQUALITY_DELETES:
            equality.add(entry)
        else:
            raise ValueError(f"unknown content {content!r} of {entry.data_file.file_path}")
    out = []
    for entry in data:
        seq = sequence_of(entry)
        f = entry.data_file
        out.append(
            PlannedFile(
                f,
                seq,
                positions.for_data_file(seq, f) if positions else (),
                equality.for_data_file(seq, f) if equality else (),
            )
        )
    return out
