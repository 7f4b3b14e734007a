"""Upgrade a v2 lineage table to Iceberg format version 3, keeping every row id.

After the upgrade every v3 reader (Spark, DuckDB's iceberg extension,
pyiceberg) returns this library's ``_row_id`` for every live row, and the
change feed, the deleted-rows index and the key index are unchanged. The
upgrade is one commit (one compare-and-swap on the catalog's pointer): the
metadata it writes is v3 and holds a new snapshot, a maintenance commit like
compaction (a version of its own with no change events). In it:

* a data file whose row ids are one run from position 0 (``start`` ...
  ``start + n - 1``: every file of an append) and whose rows all carry the
  file's data sequence number as their updated version stays where it is: its
  manifest entry is written again as EXISTING with an explicit
  ``first_row_id`` = ``start``, so v3 readers read ``start + position`` and
  the file's data sequence number, which are our values;
* any other data file (the new images of an update, an upsert's, the files a
  copy-on-write rewrite or compaction wrote) is rewritten like compaction
  does on v3: its live rows go to a new file carrying ``_row_id`` and
  ``_last_updated_sequence_number`` explicitly, and its position delete
  files scoped to it leave. Such a file, as any added file, consumes its row
  count of the id space;
* the table's ``next-row-id`` becomes the lineage's next row id (the
  snapshot's ``first-row-id``), plus the rows of the rewritten files.

``_last_updated_sequence_number`` is ``_row_last_updated_at_version``: a
version *is* the sequence number of its commit, on v2 tables too (a foreign
snapshot reconciled keeps its own sequence number as its version).

Position delete files of the v2 past that apply to files kept stay: v3
readers apply them, and the first v3 delete of such a file merges them into
its deletion vector (:mod:`lineage.storage.deletion_vectors`).

Equality delete files (a foreign writer's such as Flink's, or the equality
change-stream strategy's) are converted first, by default: CONVERT
(:func:`lineage.maintenance.convert.convert_table`) is a commit of its own,
on the v2 table, turning them into position delete files that change no
reader's answer; the upgrade then keeps those as it keeps every v2 position
delete file. So the upgrade of such a table is two commits, and a failed
upgrade leaves the table converted but otherwise as it was (converting
changes no answer, row id, feed or index). With ``convert_deletes=False`` a
table holding equality deletes is refused, and the message names the command
that converts them.
"""

from __future__ import annotations

import logging
from typing import Any

from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation

import lineage.iceberg.v3_metadata as v3_metadata
import lineage.iceberg.v3_tables as v3_tables
import lineage.storage.manifests_v3 as manifests_v3
from index.key_index import KeyIndexChange
from index.key_merge_policy import MAINTENANCE
from lineage.catalog import is_sql_catalog
from lineage.commits.commit import CommitRequest, CommitResult, commit_change
from lineage.commits.producer import manifests_of
from lineage.context import HasContext, TableContext, context_of
from lineage.errors import CommitConflictError, InvalidArgumentError, UnsupportedFormatError
from lineage.iceberg.schema import projection_field_ids
from lineage.maintenance._common import MaintenanceResult, referenced_data_path
from lineage.maintenance.convert import convert_table
from lineage.maintenance.compaction import rewrite_group
from lineage.outcome import Attempt, CommitLoop
from lineage.state import LiveFile, TableState, state_at

log = logging.getLogger("lineage.maintenance")

TARGET = 3


def check_target(format_version: object) -> int:
    """The format version a lineage table may be upgraded to (3), or InvalidArgumentError."""
    if str(format_version).strip() != str(TARGET):
        raise InvalidArgumentError(
            f"a lineage table can be upgraded to Iceberg format version 3 only (got {format_version!r})"
        )
    return TARGET


def upgrade(table: TableContext | HasContext, format_version: object = TARGET, convert_deletes: bool = True) -> MaintenanceResult:
    """Make a v2 lineage table an Iceberg v3 table whose native row ids are this library's (one commit).

    Equality delete files are converted to position deletes first, in a
    commit of their own (``detail`` says how many); with
    ``convert_deletes=False`` such a table is refused instead. A table
    already on v3 is left as it is (``version`` None, ``detail`` says so).
    Raises InvalidArgumentError for another format version,
    UnsupportedFormatError when the catalog cannot commit v3 metadata from
    Python or (without ``convert_deletes``) the table has equality delete
    files, CommitConflictError when other writers kept committing. A failed
    upgrade leaves the table as it was (converted, when it converted).
    """
    check_target(format_version)
    table = context_of(table)
    table.refresh()
    if v3_metadata.is_v3(table.iceberg.metadata):
        return _already(table)
    catalog = table.iceberg.catalog
    if not is_sql_catalog(catalog) or not catalog.engine.dialect.supports_sane_rowcount:
        raise UnsupportedFormatError(
            f"this catalog ({type(catalog).__name__}) cannot commit Iceberg format version 3 metadata from Python; "
            "use a SQL catalog (SQLite or PostgreSQL)"
        )
    schema = table.arrow_schema
    field_ids = projection_field_ids(table.iceberg.metadata)
    stats: dict[str, int] = {"converted": 0}

    def attempt(a: Attempt) -> CommitResult | None:
        state = state_at(table.iceberg, persist=True)
        if v3_metadata.is_v3(state.iceberg.metadata):
            return None  # another process upgraded it meanwhile
        if convert_deletes and has_equality_deletes(state):  # also ones another writer added since the last attempt
            stats["converted"] += convert_table(table).equality_files
            table.refresh()
            state = state_at(table.iceberg, persist=True)
        if state.snapshot is None and state.lineage.next_row_id == 0:
            v3_tables.upgrade(state.iceberg, TARGET)  # no rows yet: the spec's metadata-only upgrade
            return None
        target = virtual_v3(state.iceberg, state.lineage.next_row_id)
        request = _plan(state, target, schema, field_ids, a.files, stats)
        a.describe = lambda result: (request, result)
        return commit_change(target, state, request, a)

    loop: CommitLoop[CommitResult | None] = CommitLoop("upgrade", lambda: table.iceberg, table.refresh, table.commit_retries, logger=log)
    result = loop.run(attempt, lambda n: CommitConflictError(f"upgrade gave up after {n} attempts: writers kept committing to {table.name}"))
    table.refresh()
    if result is None:
        return _already(table)
    return MaintenanceResult(
        "upgrade", result.version, stats["added"], stats["removed"], stats["bytes_added"], stats["bytes_removed"],
        detail=f"{stats['kept']} data files kept with their row ids, {stats['rewritten']} rewritten with _row_id"
        + (f"; {stats['converted']} equality delete file(s) converted to position deletes first" if stats["converted"] else ""),
    )


def _already(table: TableContext) -> MaintenanceResult:
    return MaintenanceResult("upgrade", None, detail=f"table {table.name} has Iceberg format version 3; nothing to upgrade")


def virtual_v3(iceberg: IcebergTable, next_row_id: int) -> IcebergTable:
    """``iceberg`` as if upgraded to v3 in memory (same metadata location): the base of the upgrade commit."""
    metadata = v3_metadata.upgraded(iceberg.metadata, next_row_id)
    return IcebergTable(iceberg.name(), metadata, iceberg.metadata_location, iceberg.io, iceberg.catalog)


def data_sequence_numbers(state: TableState) -> dict[str, int]:
    """The data sequence number of every live data file of ``state``'s snapshot, from its manifests."""
    out: dict[str, int] = {}
    if state.snapshot is None:
        return out
    io = state.iceberg.io
    for manifest in manifests_of(state.snapshot, io, True):
        if manifest.content != ManifestContent.DATA:
            continue
        for e in manifests_v3.read_entries(manifest, io):
            out[e.data_file.file_path] = int(e.sequence_number)
    return out


def kept_first_row_id(f: LiveFile, sequence_number: int | None) -> int | None:
    """The ``first_row_id`` that makes v3 readers return ``f``'s lineage as it is, or None when the file must be rewritten."""
    ids, updated = f.lineage.row_ids, f.lineage.updated
    if len(ids.values) != 1 or len(updated.values) != 1 or sequence_number is None:
        return None
    return int(ids.values[0]) if int(updated.values[0]) == sequence_number else None


def has_equality_deletes(state: TableState) -> bool:
    """Whether a live data file of ``state`` has equality deletes (or positions resolved from them) applying to it."""
    return any(f.equality_deletes or f.resolved for f in state.live_files())


def _plan(state: TableState, target: IcebergTable, schema: Any, field_ids: dict[str, int], created: list[str],
          stats: dict[str, int]) -> CommitRequest:
    files = state.live_files()
    if has_equality_deletes(state):
        name = ".".join(state.iceberg.name()[-2:])
        raise UnsupportedFormatError(
            f"table {name} has equality delete files; convert them first: Table.convert_equality_deletes(), "
            f"on the command line lineage convert-deletes {name} (or upgrade with convert_deletes=True)"
        )
    sequence_numbers = data_sequence_numbers(state)
    kept: dict[str, int] = {}
    rewrite: list[LiveFile] = []
    for f in files:
        first = kept_first_row_id(f, sequence_numbers.get(f.path))
        if first is None:
            rewrite.append(f)
        else:
            kept[f.path] = first
    written = rewrite_group(target, rewrite, schema, field_ids) if rewrite else []
    created.extend(w.data_file.file_path for w in written)
    gone = {f.path for f in rewrite}
    scoped = [d for f in rewrite for d in f.deletes if d.content == DataFileContent.POSITION_DELETES and referenced_data_path(d) in gone]
    removed = [f.data_file for f in rewrite] + list({d.file_path: d for d in scoped}.values())
    stats.update(
        added=len(written), removed=len(removed), kept=len(kept), rewritten=len(rewrite),
        bytes_added=sum(w.data_file.file_size_in_bytes for w in written),
        bytes_removed=sum(f.file_size_in_bytes for f in removed),
    )
    return CommitRequest(
        "upgrade",
        Operation.REPLACE,
        written=written,
        removed_files=removed,
        data_sequence_number=state.version if written else None,
        key_index=KeyIndexChange(merge=MAINTENANCE),
        first_row_ids=kept,  # every manifest is written anew in the v3 structs
    )
