"""One Iceberg commit carrying data files, position delete files and lineage.

pyiceberg 0.12 writes data manifests only. This producer also writes a delete
manifest (content ``deletes``) for added position delete files, takes the
snapshot timestamp from the caller (so the lineage commit log written before
the commit knows it), and never retries on its own: a lost race is reported
to the writer, which re-plans against the new snapshot and reassigns row ids.
"""

from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, ManifestWriterV2
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.table.update.snapshot import _new_manifest_list_file_name, _OverwriteFiles
from pyiceberg.manifest import write_manifest_list
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest writer for delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _LineageSnapshotProducer(_OverwriteFiles):
    """Adds data and delete files, removes data files, in one snapshot."""

    def __init__(self, operation: Operation, transaction, io, properties: dict[str, str], timestamp_ms: int, snapshot_id: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(operation, transaction, io, snapshot_properties=properties, branch=MAIN_BRANCH)
        self._timestamp_ms = timestamp_ms
        self._snapshot_id = snapshot_id

    def _manifests(self) -> list[ManifestFile]:
        spec = self._transaction.table_metadata.spec()
        self._build_delete_files_partition_predicate()
        data = [f for f in self._added_data_files if f.content == DataFileContent.DATA]
        deletes = [f for f in self._added_data_files if f.content != DataFileContent.DATA]
        deleted_entries = self._deleted_entries()
        manifests: list[ManifestFile] = []
        if data:
            with self.new_manifest_writer(spec) as writer:
                for f in data:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=f))
            manifests.append(writer.to_manifest_file())
        if deletes:
            writer = _DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression)
            with writer:
                for f in deletes:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=f))
            manifests.append(writer.to_manifest_file())
        if deleted_entries:
            by_spec: dict[int, list[ManifestEntry]] = {}
            for entry in deleted_entries:
                by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
            for spec_id, entries in by_spec.items():
                with self.new_manifest_writer(self.spec(spec_id)) as writer:
                    for entry in entries:
                        writer.add_entry(entry)
                manifests.append(writer.to_manifest_file())
        return manifests + self._existing_manifests()

    def updates_and_requirements(self) -> tuple[tuple, tuple]:
        """Build the snapshot (like pyiceberg's ``_commit``, with our timestamp)."""
        metadata = self._transaction.table_metadata
        new_manifests = self._manifests()
        sequence_number = metadata.next_sequence_number()
        summary = self._summary(self.snapshot_properties)
        location = self._transaction._table.location_provider().new_metadata_location(
            _new_manifest_list_file_name(snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid)
        )
        self._written_manifest_lists.append(location)
        with write_manifest_list(
            format_version=metadata.format_version,
            output_file=self._io.new_output(location),
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            sequence_number=sequence_number,
            avro_compression=self._compression,
        ) as writer:
            writer.add_manifests(new_manifests)
        snapshot = Snapshot(
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=location,
            sequence_number=sequence_number,
            timestamp_ms=self._timestamp_ms,
            summary=summary,
            schema_id=metadata.current_schema_id,
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

    def written_files(self) -> list[str]:
        """Manifests and manifest lists this producer wrote (to clean up after a lost race)."""
        return list(self._written_manifests) + list(self._written_manifest_lists)


def commit_files(
    iceberg: IcebergTable,
    *,
    operation: Operation,
    added: list[DataFile],
    removed: list[DataFile],
    properties: dict[str, str],
    timestamp_ms: int,
    snapshot_id: int,
    written: list[str],
) -> None:
    """Commit snapshot ``snapshot_id`` on ``main``, based on ``iceberg``'s current metadata.

    Paths of the manifests and manifest lists written are appended to
    ``written`` (even on failure) so a caller that lost the race can clean
    them up. Raises ``CommitFailedException`` when the branch moved; the
    caller then re-plans against the new snapshot.
    """
    tx = iceberg.transaction()
    producer = _LineageSnapshotProducer(operation, tx, iceberg.io, properties, timestamp_ms, snapshot_id)
    for f in added:
        producer.append_data_file(f)
    for f in removed:
        producer.delete_data_file(f)
    try:
        tx._apply(*producer.updates_and_requirements())
        tx.commit_transaction()
    except CommitFailedException:
        written.extend(producer.written_files())
        raise
    except Exception as exc:
        # Unknown outcome (e.g. the catalog's database was locked or the
        # connection broke): the commit may have landed. Look for our snapshot
        # before reporting anything.
        try:
            iceberg.refresh()
        except Exception:
            pass
        if iceberg.metadata.snapshot_by_id(producer.snapshot_id) is None:
            written.extend(producer.written_files())
            if _is_transient(exc):
                raise CommitFailedException(f"commit did not land: {exc}") from exc
            raise


def _is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a catalog hiccup worth retrying (SQLite lock, lost connection)."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (OperationalError, ConnectionError, TimeoutError))
