"""Routine upkeep of a long-lived table in one call, driven by table properties.

A table that takes a small commit every few seconds grows in four places:
snapshots in the Iceberg metadata file (rewritten whole at each commit),
small data and delete files, manifests (bounded by merge-on-commit, see
:mod:`lineage.commits.merge_rule`) and the commit log (chunked, see
:mod:`lineage.storage.commit_log`). :func:`maintain` runs, in this order, what keeps
each of them bounded, each step only when the table's properties say it is
due:

1. ``expire-snapshots``: snapshots older than ``history.expire.max-snapshot-age-ms``
   (Iceberg's property, default 5 days) beyond the newest
   ``history.expire.min-snapshots-to-keep`` (default 1);
2. ``rewrite-data-files``: compaction with Iceberg's ``rewrite_data_files``
   thresholds (``lineage.maintain.rewrite-data-files.*``: ``min-input-files``
   5, ``delete-ratio-threshold`` 0.3, ``delete-file-threshold`` unset);
3. ``rewrite-position-deletes``: a data file's delete files merged once it
   has ``lineage.maintain.rewrite-position-deletes.min-input-files`` (5) of
   them, or delete files point at removed data files;
4. ``rewrite-manifests``: when a snapshot holds more manifests of one kind
   than ``commit.manifest.min-count-to-merge`` (tables written before merge
   on commit, or with it disabled);
5. ``merge-key-index``: the key index's background merge under its merge
   policy (:func:`lineage.maintenance.key_index.merge_key_index`; tables
   without a key index have nothing to do);
6. ``expire-log``: commit log entries older than the change-feed retention
   window (``lineage.cdf.retention.*``), once a whole chunk's worth is due;
7. ``vacuum``: files nothing references, older than
   ``lineage.maintain.vacuum.min-age-ms`` (1 hour, so files of commits in
   flight are safe).

Each step can be switched off with ``lineage.maintain.<step>.enabled=false``.
Every commit is planned against the current snapshot and retried after a lost
race, so ``maintain`` may run from cron or every N commits of a streaming job
while writers commit; a step that keeps losing is reported as skipped and the
others still run. ``dry_run=True`` says what each step would do and changes
nothing.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyiceberg.manifest import ManifestContent
from pyiceberg.table.snapshots import Operation

from lineage.commits.commit import CommitRequest
from lineage.storage.commit_log import CHUNK_ENTRIES
from lineage.context import HasContext, TableContext, context_of
from lineage.errors import CommitConflictError
from lineage.maintenance._common import MaintenanceResult, commit_with_retries
from lineage.maintenance.compaction import compact, compaction_groups, compaction_rule, rewrite_deletes
from lineage.maintenance.key_index import has_key_index, merge_key_index
from lineage.maintenance.vacuum import expire_snapshots, vacuum
from lineage.commits.merge_rule import MergeSettings, plan_rewrite
from lineage.properties import (
    COMPACT_DELETE_FILES,
    COMPACT_DELETE_RATIO,
    COMPACT_MIN_INPUT_FILES,
    DELETES_MIN_INPUT_FILES,
    MAINTAIN_STEPS,
    MAX_SNAPSHOT_AGE_MS,
    MIN_SNAPSHOTS_TO_KEEP,
    VACUUM_MIN_AGE_MS,
    maintain_step_enabled,
    read,
)
from lineage.retention import window
import lineage.storage.removals as removals
from lineage.state import TableState, state_at

STEPS = MAINTAIN_STEPS


@dataclass(frozen=True)
class MaintenanceStep:
    """One step of :func:`maintain`: whether it ran (or would run) and what it did."""

    name: str
    status: str  # "done", "nothing to do", "would run", "disabled", "skipped"
    detail: str = ""
    result: MaintenanceResult | None = None


@dataclass(frozen=True)
class MaintenanceReport:
    """What :func:`maintain` did, step by step."""

    table: str
    dry_run: bool
    steps: tuple[MaintenanceStep, ...]

    @property
    def committed(self) -> list[int]:
        """Versions committed by the steps (maintenance commits produce no change events)."""
        return [s.result.version for s in self.steps if s.result is not None and s.result.version is not None]

    def __str__(self) -> str:
        width = max(len(s.name) for s in self.steps)
        head = f"maintenance of {self.table}" + (" (dry run: nothing changed)" if self.dry_run else "")
        return "\n".join([head] + [f"  {s.name:<{width}}  {s.status}" + (f": {s.detail}" if s.detail else "") for s in self.steps])


def _enabled(props: Mapping[str, str], step: str) -> bool:
    return bool(read(props, maintain_step_enabled(step)))


def check_properties(props: dict[str, str]) -> None:
    """Validate every property :func:`maintain` reads (so a typo fails before anything runs)."""
    for step in STEPS:
        _enabled(props, step)
    for name in (MAX_SNAPSHOT_AGE_MS, MIN_SNAPSHOTS_TO_KEEP, COMPACT_MIN_INPUT_FILES, COMPACT_DELETE_FILES, DELETES_MIN_INPUT_FILES,
                 VACUUM_MIN_AGE_MS, COMPACT_DELETE_RATIO):
        read(props, name)
    MergeSettings.for_manifests(props)
    MergeSettings.for_segments(props)


# ---------------------------------------------------------------------- manifests
def manifest_counts(state: TableState) -> dict[str, int]:
    """Number of data and delete manifests of the state's snapshot."""
    counts = {"data": 0, "deletes": 0}
    if state.snapshot is not None:
        for m in state.snapshot.manifests(state.iceberg.io):
            counts["deletes" if m.content == ManifestContent.DELETES else "data"] += 1
    return counts


def rewrite_manifests(table: TableContext | HasContext, dry_run: bool = False) -> MaintenanceResult:
    """Merge the current snapshot's manifests into as few as ``commit.manifest.target-size-bytes`` allows.

    For tables that already have many manifests (written before merge on
    commit, or with ``commit.manifest-merge.enabled=false``). Entries keep
    their snapshot ids and sequence numbers, as with Iceberg's
    ``rewrite_manifests``; one commit, no change events.
    """
    table = context_of(table)
    settings = MergeSettings.for_manifests(table.iceberg.metadata.properties)

    def outcome(state: TableState) -> tuple[int, int]:
        if state.snapshot is None:
            return 0, 0
        groups: dict[tuple[int, int], list] = {}
        for m in state.snapshot.manifests(state.iceberg.io):
            groups.setdefault((int(m.content), m.partition_spec_id), []).append(m)
        before = sum(len(g) for g in groups.values())
        after = sum(len(plan_rewrite(g, lambda m: int(m.manifest_length or 0), settings.target_bytes)) for g in groups.values())
        return before, after

    table.refresh()
    before, after = outcome(state_at(table.iceberg))
    if after >= before:
        return MaintenanceResult("rewrite-manifests", None, detail=f"nothing to rewrite ({before} manifest(s))")
    if dry_run:
        return MaintenanceResult("rewrite-manifests", None, detail=f"would rewrite {before} manifest(s) into {after}")

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        b, a = outcome(state)
        return CommitRequest("rewrite-manifests", Operation.REPLACE, rewrite_manifests=True) if a < b else None

    _, result = commit_with_retries(table, plan, "rewrite-manifests")
    if result is None:
        return MaintenanceResult("rewrite-manifests", None, detail="nothing to rewrite")
    return MaintenanceResult("rewrite-manifests", result.version, detail=f"{before} manifest(s) -> {after}")


# ---------------------------------------------------------------------- the commit log
def expire_log(table: TableContext | HasContext, dry_run: bool = False, min_entries: int = CHUNK_ENTRIES) -> MaintenanceResult:
    """Drop commit log entries older than the change-feed retention window.

    Nothing happens while fewer than ``min_entries`` entries are due (a
    commit per entry would cost more than it saves) or when the table keeps
    every version (no ``lineage.cdf.retention.*`` property). Dropped entries
    leave ``history()``; ranges starting before the window were refused
    already. For each commit property key the newest dropped entry carrying
    it is kept (checkpoints of materialized views).
    """
    table = context_of(table)

    def due(state: TableState) -> tuple[int, int]:
        oldest = window(state).oldest
        log = state.lineage.log
        floor = log.floor.version if log.floor else 0
        count = sum(1 for c in log.since(floor) if c.version < oldest)
        return oldest, count

    table.refresh()
    oldest, count = due(state_at(table.iceberg))
    if count < max(1, min_entries):
        return MaintenanceResult("expire-log", None, detail=f"{count} entr{'y' if count == 1 else 'ies'} older than the retention window")
    if dry_run:
        return MaintenanceResult("expire-log", None, detail=f"would drop {count} entries older than version {oldest}")

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        keep_from, n = due(state)
        if n < max(1, min_entries):
            return None
        return CommitRequest("expire-log", Operation.REPLACE, transform_list=lambda lst: replace(lst, log=lst.log.expired(keep_from)))

    _, result = commit_with_retries(table, plan, "expire-log")
    if result is None:
        return MaintenanceResult("expire-log", None, detail="nothing to expire")
    return MaintenanceResult("expire-log", result.version, detail=f"dropped {count} entries older than version {oldest}")


# ---------------------------------------------------------------------- the key index
def merge_key_index_step(table: TableContext, dry_run: bool = False) -> MaintenanceResult | None:
    """The key index's background merge under its policy (None: the table keeps no key index)."""
    if not has_key_index(table):
        return None
    return merge_key_index(table, dry_run=dry_run)


# ---------------------------------------------------------------------- all of it
def maintain(table: TableContext | HasContext, dry_run: bool = False) -> MaintenanceReport:
    """Run every upkeep step the table's properties call for (see the module docstring)."""
    table = context_of(table)
    table.refresh()
    props = dict(table.iceberg.metadata.properties)
    check_properties(props)
    steps: list[MaintenanceStep] = []

    def run(name: str, action: Any) -> None:
        if not _enabled(props, name):
            steps.append(MaintenanceStep(name, "disabled"))
            return
        try:
            result = action()
        except CommitConflictError as exc:
            steps.append(MaintenanceStep(name, "skipped", str(exc)))
            return
        if result is None:
            steps.append(MaintenanceStep(name, "nothing to do", "the table has no key index" if name == "merge-key-index" else ""))
            return
        detail = result.detail.splitlines()[0] if result.detail else ""
        if not detail and result.version is not None:
            detail = f"version {result.version}: {result.files_removed} file(s) rewritten into {result.files_added}"
        if dry_run:
            status = "would run" if detail.startswith("would") else "nothing to do"
        else:
            status = "done" if result.version is not None or result.files_removed or detail.startswith("expired") else "nothing to do"
        steps.append(MaintenanceStep(name, status, detail, result))

    max_age = read(props, MAX_SNAPSHOT_AGE_MS)
    keep = read(props, MIN_SNAPSHOTS_TO_KEEP)
    run("expire-snapshots", lambda: expire_snapshots(table, _dt.timedelta(milliseconds=max_age), keep, dry_run=dry_run))

    rule = compaction_rule(
        table,
        min_input_files=read(props, COMPACT_MIN_INPUT_FILES),
        delete_ratio_threshold=read(props, COMPACT_DELETE_RATIO),
        delete_file_threshold=read(props, COMPACT_DELETE_FILES),
    )

    def compaction() -> MaintenanceResult:
        if not dry_run:
            return compact(table, rule=rule)
        table.refresh()
        groups = compaction_groups(state_at(table.iceberg), rule)
        if not groups:
            return MaintenanceResult("compact", None, detail="nothing to compact")
        n = sum(len(g) for g in groups)
        return MaintenanceResult("compact", None, files_removed=n, detail=f"would rewrite {n} data file(s) into {len(groups)}")

    run("rewrite-data-files", compaction)
    run("rewrite-position-deletes",
        lambda: rewrite_deletes(table, min_input_files=read(props, DELETES_MIN_INPUT_FILES), dry_run=dry_run))

    manifest_settings = MergeSettings.for_manifests(props)

    def manifests() -> MaintenanceResult:
        table.refresh()
        counts = manifest_counts(state_at(table.iceberg))
        if max(counts.values()) <= manifest_settings.min_count:
            return MaintenanceResult("rewrite-manifests", None, detail=f"{counts['data']} data and {counts['deletes']} delete manifest(s)")
        return rewrite_manifests(table, dry_run=dry_run)

    run("rewrite-manifests", manifests)
    run("merge-key-index", lambda: merge_key_index_step(table, dry_run=dry_run))
    run("expire-log", lambda: expire_log(table, dry_run=dry_run))
    vacuum_age = _dt.timedelta(milliseconds=read(props, VACUUM_MIN_AGE_MS))

    def cleanup() -> MaintenanceResult:
        result = vacuum(table, vacuum_age, dry_run=dry_run)
        if dry_run and result.files_removed:
            return replace(result, detail=f"would remove {result.files_removed} file(s), {result.bytes_removed:,} bytes")
        return result

    run("vacuum", cleanup)
    if not dry_run:
        removals.wait()  # old metadata files still queued (small commits leave them for one with room) go now
    return MaintenanceReport(table.name, dry_run, tuple(steps))
