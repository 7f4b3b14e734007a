"""Compaction: merge position delete files, and rewrite data files dropping deleted rows.

Neither operation changes the table's rows, so neither produces change
events: surviving rows keep ``_row_id`` and both versions (the new files'
lineage is copied from the old positions), and the deleted-rows index keeps
pointing at the old files, which stay pinned while the retention window
needs them.

Data sequence numbers: compacted data files are committed with the data
sequence number of the snapshot compaction started from (what Iceberg's
``rewrite_data_files`` does with ``use-starting-sequence-number``), so
equality deletes committed concurrently would still apply to them. Rewritten
position delete files get the new snapshot's sequence number, which is at
least the sequence number of every data file they reference.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table.snapshots import Operation

import lineage.duck as duck
from index.key_index import KeyIndexChange
from index.key_merge_policy import MAINTENANCE
from lineage.commits.commit import CommitRequest
from lineage.context import HasContext, TableContext, context_of
from lineage.storage.deletes import is_puffin, positions_for, read_position_deletes
import lineage.maintenance.spark_rewrite as spark_rewrite
from lineage.maintenance._common import MaintenanceResult, commit_with_retries, position_delete_files, referenced_data_path, snapshot_files
from lineage.sql.predicate import quote_ident
from lineage.properties import DELETE_GRANULARITY, TARGET_FILE_SIZE, read
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import cast_table, projection_field_ids
from lineage.state import LiveFile, TableState, state_at
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, HIDDEN_UPDATED
from lineage.storage.deletion_vectors import VectorTarget, vectors_of, write_vectors
from lineage.storage.writer import WrittenFile, write_data_files, write_position_deletes


def _partition_key(f: DataFile) -> tuple:
    return (f.spec_id, tuple(f.partition._data) if hasattr(f.partition, "_data") else repr(f.partition))


def _delete_rewrite_plan(
    state: TableState, granularity: str, min_input_files: int | None
) -> tuple[list[DataFile], list[tuple[DataFile, np.ndarray]]]:
    """(delete files to remove, (data file, positions) to write) of a delete-file rewrite; nothing to do: empty lists.

    A partition's delete files are rewritten when some data file has more
    than one of them (at least ``min_input_files`` when given, Iceberg's
    ``rewrite_position_delete_files`` option) or when some point at data
    files no longer in the snapshot.
    """
    live_data, all_deletes = snapshot_files(state)
    delete_files = position_delete_files(all_deletes)
    if state.iceberg.metadata.format_version >= 3:  # deletion vectors are one per data file already
        delete_files = [d for d in delete_files if not is_puffin(d.file_path)]
    if not delete_files:
        return [], []
    live = {f.file_path: f for f in live_data}
    groups: dict[tuple, list[DataFile]] = defaultdict(list)
    for d in delete_files:
        groups[_partition_key(d)].append(d)
    removed: list[DataFile] = []
    targets: list[tuple[DataFile, np.ndarray]] = []
    for members in groups.values():
        positions: dict[str, list[np.ndarray]] = defaultdict(list)
        dangling = False
        for d in members:
            for p, pos in read_position_deletes(d.file_path).items():
                if p in live:
                    positions[p].append(pos)
                else:
                    dangling = True
        wanted = len(positions) if granularity == "file" else min(1, len(positions))
        if not dangling:
            if len(members) <= wanted:
                continue
            if min_input_files is not None and max((len(parts) for parts in positions.values()), default=0) < min_input_files:
                continue
        removed.extend(members)
        targets.extend((live[p], np.unique(np.concatenate(parts))) for p, parts in positions.items())
    return removed, targets


def rewrite_deletes(table: TableContext | HasContext, granularity: str | None = None, *, min_input_files: int | None = None, dry_run: bool = False) -> MaintenanceResult:
    """Merge the position delete files of each partition into one per data file (or per partition).

    Delete entries that point at data files no longer in the snapshot (left by
    copy-on-write or compaction) are dropped. No data file is rewritten. With
    ``min_input_files`` a partition is left alone until some data file has
    that many delete files. ``dry_run`` only says what would be rewritten.
    """
    table = context_of(table)
    granularity = granularity or read(table.iceberg.metadata.properties, DELETE_GRANULARITY) or "file"  # maintenance: file-scoped unless asked
    if table.iceberg.metadata.format_version >= 3:
        granularity = "file"  # v3: deletion vectors, one per data file
    stats: dict[str, int] = {}
    if dry_run:
        table.refresh()
        removed, targets = _delete_rewrite_plan(state_at(table.iceberg), granularity, min_input_files)
        detail = f"would merge {len(removed)} delete file(s) into {len(targets) if granularity == 'file' else 'one per partition'}" if removed else "nothing to rewrite"
        return MaintenanceResult("rewrite-deletes", None, files_removed=len(removed), detail=detail)

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        removed, targets = _delete_rewrite_plan(state, granularity, min_input_files)
        if not removed:
            return None
        if table.iceberg.metadata.format_version >= 3:  # one deletion vector per data file
            new, _ = write_vectors(table.iceberg, [VectorTarget(df, pos) for df, pos in targets])
        else:
            new = write_position_deletes(table.iceberg, targets, granularity) if targets else []
        created.extend(f.file_path for f in new)
        stats.update(added=len(new), removed=len(removed), bytes_added=sum(f.file_size_in_bytes for f in new),
                     bytes_removed=sum(f.file_size_in_bytes for f in removed))
        return CommitRequest("rewrite-deletes", Operation.REPLACE, delete_files=new, removed_files=removed)

    _, result = commit_with_retries(table, plan, "rewrite-deletes")
    if result is None:
        return MaintenanceResult("rewrite-deletes", None, detail="nothing to rewrite")
    return MaintenanceResult("rewrite-deletes", result.version, stats["added"], stats["removed"], stats["bytes_added"], stats["bytes_removed"])


def _bins(files: list[LiveFile], target: int) -> list[list[LiveFile]]:
    """Group files (in order) into bins whose total size stays near ``target``."""
    out: list[list[LiveFile]] = []
    current: list[LiveFile] = []
    size = 0
    for f in sorted(files, key=lambda f: f.data_file.file_size_in_bytes):
        if current and size + f.data_file.file_size_in_bytes > target:
            out.append(current)
            current, size = [], 0
        current.append(f)
        size += f.data_file.file_size_in_bytes
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class CompactionRule:
    """Which data files compaction rewrites (Iceberg's ``rewrite_data_files`` options, same meaning).

    A file is a candidate when it is smaller than ``small`` bytes or has too
    many deletes: position deletes covering at least ``delete_ratio_threshold``
    of its rows, or at least ``delete_file_threshold`` delete files. A
    partition's candidates are rewritten when one has too many deletes or
    when there are at least ``min_input_files`` of them. The defaults are this
    library's historical rule (any delete, or two small files); ``maintain()``
    uses Iceberg's (30 %, no file count, five files).
    """

    target: int
    small: int
    min_input_files: int = 2
    delete_ratio_threshold: float = 0.0
    delete_file_threshold: int | None = None

    def too_many_deletes(self, f: LiveFile) -> bool:
        """Whether ``f``'s deletes alone make it worth rewriting."""
        if not f.deletes and not f.resolved:
            return False
        if self.delete_file_threshold is not None and len(f.delete_paths) >= self.delete_file_threshold:
            return True
        if self.delete_ratio_threshold <= 0:
            return True
        deleted = len(positions_for(f.path, f.delete_paths))
        return deleted >= self.delete_ratio_threshold * max(1, f.data_file.record_count)


def compaction_groups(state: TableState, rule: CompactionRule) -> list[list[LiveFile]]:
    """The groups of live files compaction would rewrite into one file each (empty: nothing to do)."""
    by_partition: dict[tuple, list[LiveFile]] = defaultdict(list)
    for f in state.live_files():
        by_partition[_partition_key(f.data_file)].append(f)
    chosen: list[list[LiveFile]] = []
    for members in by_partition.values():
        heavy = {f.path for f in members if rule.too_many_deletes(f)}
        candidates = [f for f in members if f.data_file.file_size_in_bytes < rule.small or f.path in heavy]
        if heavy or len(candidates) >= rule.min_input_files:
            chosen.extend(_bins(candidates, rule.target))
    return chosen


def compaction_rule(table: TableContext, target_file_size_bytes: int | None = None, min_file_size_bytes: int | None = None, **thresholds) -> CompactionRule:
    """The rule for ``table`` from arguments, falling back to ``write.target-file-size-bytes`` (small: 3/4 of the target)."""
    props = table.iceberg.metadata.properties
    target = int(target_file_size_bytes or read(props, TARGET_FILE_SIZE))
    small = int(min_file_size_bytes if min_file_size_bytes is not None else target * 3 // 4)
    return CompactionRule(target, small, **{k: v for k, v in thresholds.items() if v is not None})


def rewrite_group(iceberg: Any, group: list[LiveFile], schema: pa.Schema, field_ids: dict[str, int]) -> list[WrittenFile]:
    """The live rows of ``group`` written to new data files, in file and position order, keeping their lineage.

    ``iceberg`` gives the metadata the files are written for: on format
    version 3 they carry ``_row_id`` and ``_last_updated_sequence_number``.
    """
    names = ", ".join(quote_ident(c) for c in schema.names)
    con = duck.connect()
    try:
        register_live_view(con, "g", group, schema, field_ids)
        rows = duck.fetch_arrow(
            con,
            f"SELECT {names}, _row_id AS {HIDDEN_ROW_ID}, _row_created_at_version AS {HIDDEN_CREATED}, "
            f"_row_last_updated_at_version AS {HIDDEN_UPDATED} FROM g ORDER BY __file_id, __pos",
        )
    finally:
        con.close()
    hidden = pa.schema(list(schema) + [pa.field(h, pa.int64(), False) for h in (HIDDEN_ROW_ID, HIDDEN_CREATED, HIDDEN_UPDATED)])
    return write_data_files(iceberg, cast_table(rows, hidden))


def compact(
    table: TableContext | HasContext, target_file_size_bytes: int | None = None, min_file_size_bytes: int | None = None, *,
    rule: CompactionRule | None = None, engine: str = "duckdb", spark: Any = None,
) -> MaintenanceResult:
    """Rewrite data files that have deletes or are small, per partition, up to the target size.

    By default a partition is compacted when it has a data file with position
    deletes, or at least two files smaller than ``min_file_size_bytes``
    (default: 3/4 of the target, ``write.target-file-size-bytes`` on disk);
    ``rule`` sets Iceberg-style thresholds instead (:class:`CompactionRule`).
    Rows keep their lineage; no change events; the CDF over any range is the
    same after. ``engine="spark"``: Spark executors read and write the rows
    (``spark``, or the active session); the driver plans and commits.
    """
    table = context_of(table)
    spark = spark_rewrite.session_for(engine, spark)
    rule = rule or compaction_rule(table, target_file_size_bytes, min_file_size_bytes)
    schema = table.arrow_schema
    field_ids = projection_field_ids(table.iceberg.metadata)
    stats: dict[str, int] = {}

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        chosen = compaction_groups(state, rule)
        if not chosen:
            return None
        _, all_deletes = snapshot_files(state)
        written, removed = [], []
        if spark is not None:
            written = spark_rewrite.compact_groups(table, state, chosen, spark)
            created.extend(w.data_file.file_path for w in written)
            removed = [f.data_file for group in chosen for f in group]
        for group in chosen if spark is None else []:
            new = rewrite_group(table.iceberg, group, schema, field_ids)
            created.extend(w.data_file.file_path for w in new)
            written.extend(new)
            removed.extend(f.data_file for f in group)
        gone = {f.file_path for f in removed}
        if table.iceberg.metadata.format_version >= 3:  # a vector leaves by entry: its Puffin file may hold others
            removed_deletes = vectors_of(gone, all_deletes)
        else:
            removed_deletes = [d for d in all_deletes if referenced_data_path(d) in gone]
        stats.update(
            added=len(written),
            removed=len(removed) + len(removed_deletes),
            bytes_added=sum(w.data_file.file_size_in_bytes for w in written),
            bytes_removed=sum(f.file_size_in_bytes for f in removed + removed_deletes),
        )
        return CommitRequest(
            "compact",
            Operation.REPLACE,
            written=written,
            removed_files=removed + removed_deletes,
            data_sequence_number=state.version,
            key_index=KeyIndexChange(merge=MAINTENANCE),  # rows move to new files; new entries replace the old
        )

    _, result = commit_with_retries(table, plan, "compact")
    if result is None:
        return MaintenanceResult("compact", None, detail="nothing to compact")
    return MaintenanceResult("compact", result.version, stats["added"], stats["removed"], stats["bytes_added"], stats["bytes_removed"])
