"""What a commit does differently on an Iceberg v3 table, beside the snapshot producer of :mod:`lineage.commits.commit`.

A Puffin file holds the deletion vectors of several data files, so a vector
leaves the snapshot entry by entry, named by its Puffin file and its
referenced data file (:func:`lineage.storage.deletion_vectors.vector_removal`),
where pyiceberg keys removed files by path. This module recognises such
removals, keeps the snapshot summary's counts right for them, and derives the
committed snapshot's live files without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.io import OutputFile
from pyiceberg.manifest import DataFile, ManifestListWriter, write_manifest_list
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary, update_snapshot_summaries

import lineage.storage.manifests_v3 as v3
from lineage.identity_cache import IdentityCache
from lineage.state import SnapshotFiles


def snapshot_of(metadata: TableMetadata, snapshot_id: int) -> Snapshot | None:
    """``metadata.snapshot_by_id(snapshot_id)`` from an index built once per metadata object: pyiceberg scans the
    snapshot list, which grows by one per commit, and a commit asks several times (for its own new id too)."""
    return _SNAPSHOTS.get(metadata, lambda: {s.snapshot_id: s for s in metadata.snapshots}).get(snapshot_id)


_SNAPSHOTS: IdentityCache[dict[int, Snapshot]] = IdentityCache(size=16)


def first_row_id(metadata: TableMetadata, snapshot_id: int) -> int:
    """The first row id of snapshot ``snapshot_id``: its own (a reconciled snapshot), else the table's next-row-id (ours)."""
    snap = snapshot_of(metadata, snapshot_id)
    if snap is not None and snap.first_row_id is not None:
        return int(snap.first_row_id)
    return int(getattr(metadata, "next_row_id", None) or 0)


def list_writer(metadata: TableMetadata, output: OutputFile, snapshot_id: int, parent_id: int | None, sequence_number: int,
                compression: AvroCompressionCodec, unassigned: dict[str, int]) -> ManifestListWriter:
    """The manifest list writer of the table's format version (v3: :class:`~lineage.storage.manifests_v3.ManifestListWriterV3`)."""
    if metadata.format_version >= 3:
        return v3.ManifestListWriterV3(output, snapshot_id, parent_id, sequence_number, first_row_id(metadata, snapshot_id),
                                       compression, unassigned)
    return write_manifest_list(format_version=metadata.format_version, output_file=output, snapshot_id=snapshot_id,
                               parent_snapshot_id=parent_id, sequence_number=sequence_number, avro_compression=compression)


def snapshot_row_ids(writer: ManifestListWriter) -> dict[str, int]:
    """The snapshot fields ``first-row-id`` and ``added-rows`` a v3 manifest list assigned (none before v3)."""
    if isinstance(writer, v3.ManifestListWriterV3):
        return {"first_row_id": writer.first_row_id, "added_rows": writer.added_rows}
    return {}


def names_one_vector(f: DataFile) -> bool:
    """Whether a removed file names one deletion vector of a Puffin file (not the whole file)."""
    return v3.is_deletion_vector(f) and v3.referenced_data_file(f) is not None


def without_vectors(known: SnapshotFiles, removed: list[DataFile]) -> tuple[SnapshotFiles, list[DataFile]]:
    """``known`` with each removed vector taken from its one data file, and the removed files left to remove by path."""
    vectors = [(f.file_path, v3.referenced_data_file(f)) for f in removed if names_one_vector(f)]
    if not vectors:
        return known, removed
    files = dict(known.files)
    for puffin_path, data_path in vectors:
        live = files.get(data_path)  # type: ignore[arg-type]
        if live is not None:
            files[data_path] = dataclasses.replace(live, deletes=tuple(d for d in live.deletes if d.file_path != puffin_path))  # type: ignore[index]
    return dataclasses.replace(known, files=files), [f for f in removed if not names_one_vector(f)]


def summary(
    metadata: TableMetadata,
    operation: Operation,
    added: Iterable[DataFile],
    removed: Iterable[DataFile],
    parent_snapshot_id: int | None,
    properties: Mapping[str, str],
) -> Summary:
    """A snapshot summary as pyiceberg builds it (counts, totals from the parent), from explicit lists of files."""
    schema, specs = metadata.schema(), metadata.specs()
    limit = metadata.properties.get(TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT)
    ssc = SnapshotSummaryCollector(partition_summary_limit=int(limit))
    for f in added:
        ssc.add_file(data_file=f, partition_spec=metadata.spec(), schema=schema)
    for f in removed:
        ssc.remove_file(data_file=f, partition_spec=specs[f.spec_id], schema=schema)
    parent = snapshot_of(metadata, parent_snapshot_id) if parent_snapshot_id is not None else None
    return update_snapshot_summaries(
        summary=Summary(operation=operation, **ssc.build(), **properties),
        previous_summary=parent.summary if parent is not None else None,
    )
