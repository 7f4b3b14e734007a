"""Shared plumbing of maintenance operations: the retry loop and snapshot inventories."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table.snapshots import Snapshot

from lineage.commit import CommitRequest, CommitResult, commit_change
from lineage.deletes import referenced_data_path  # noqa: F401  (maintenance modules import it from here)
from lineage.errors import CommitConflictError
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
    table,  # lineage.Table  # type: ignore[no-untyped-def]
    plan: Callable[[TableState, list[str]], CommitRequest | None],
    operation: str,
) -> tuple[CommitRequest | None, CommitResult | None]:
    """Plan against the current snapshot and commit; re-plan after each lost race.

    ``plan`` writes the files it needs (recording their paths in the list it
    gets) and returns a request, or None when there is nothing to do.
    """
    retries = int(table.iceberg.metadata.properties.get("commit.retry.num-retries", 20))
    for attempt in range(1, retries + 2):
        table.refresh()
        state = state_at(table.iceberg)
        created: list[str] = []
        try:
            request = plan(state, created)
            if request is None:
                return None, None
            result = commit_change(table.iceberg, state, request, created)
            table.refresh()
            return request, result
        except CommitFailedException as exc:
            log.info("%s lost a commit race (attempt %d): %s", operation, attempt, exc)
            _remove(table, created)
        except BaseException:
            _remove(table, created)
            raise
        time.sleep(min(2.0, 0.01 * 2 ** min(attempt, 8)) * random.uniform(0.5, 1.5))
    raise CommitConflictError(f"{operation} gave up after {retries + 1} attempts: writers kept committing to {table.name}")


def _remove(table, paths: list[str]) -> None:  # type: ignore[no-untyped-def]
    for path in paths:
        try:
            table.iceberg.io.delete(path)
        except Exception:
            pass


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
