"""Shared plumbing of maintenance operations: the commit loop and snapshot inventories."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table.snapshots import Snapshot

from lineage.commits.commit import CommitRequest, CommitResult, commit_change
from lineage.context import TableContext
from lineage.storage.deletes import referenced_data_path  # noqa: F401  (maintenance modules import it from here)
from lineage.errors import CommitConflictError
from lineage.outcome import Attempt, CommitLoop
from lineage.state import TableState, state_at

log = logging.getLogger("lineage.maintenance")


@dataclass(frozen=True)
class MaintenanceResult:
    """What one maintenance operation did (``version`` is None when it committed nothing)."""

    operation: str
    version: int | None
    files_added: int = 0
    files_removed: int = 0
    bytes_added: int = 0
    bytes_removed: int = 0
    detail: str = ""


def commit_with_retries(
    table: TableContext,
    plan: Callable[[TableState, list[str]], CommitRequest | None],
    operation: str,
) -> tuple[CommitRequest | None, CommitResult | None]:
    """Plan against the current snapshot and commit; re-plan after each lost race.

    ``plan`` writes the files it needs (recording their paths in the list it
    gets) and returns a request, or None when there is nothing to do. The
    outcome of a failing catalog call is settled by
    :class:`lineage.outcome.CommitLoop`: a commit that landed is reported as
    committed, files are deleted only for attempts known to be lost.
    """
    retries = table.commit_retries

    def attempt(a: Attempt) -> tuple[CommitRequest | None, CommitResult | None]:
        state = state_at(table.iceberg, persist=True)  # a foreign base's lineage persisted first
        request = plan(state, a.files)
        if request is None:
            return None, None
        a.describe = lambda result: (request, result)
        return request, commit_change(table.iceberg, state, request, a)

    loop: CommitLoop[tuple[CommitRequest | None, CommitResult | None]] = CommitLoop(
        operation, lambda: table.iceberg, table.refresh, retries, logger=log
    )
    return loop.run(
        attempt,
        lambda n: CommitConflictError(f"{operation} gave up after {n} attempts: writers kept committing to {table.name}"),
    )


def snapshot_files(state: TableState, snapshot: Snapshot | None = None) -> tuple[list[DataFile], list[DataFile]]:
    """Live data files and live delete files of a snapshot (the state's by default)."""
    snapshot = snapshot or state.snapshot
    if snapshot is None:
        return [], []
    data, deletes = [], []
    for manifest in snapshot.manifests(state.iceberg.io):
        for entry in manifest.fetch_manifest_entry(state.iceberg.io, discard_deleted=True):
            (deletes if manifest.content == ManifestContent.DELETES else data).append(entry.data_file)
    return data, deletes


def position_delete_files(deletes: list[DataFile]) -> list[DataFile]:
    """The position delete files among ``deletes`` (equality delete files are matched by value, not position)."""
    return [d for d in deletes if d.content == DataFileContent.POSITION_DELETES]
