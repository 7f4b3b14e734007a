"""The ``equality`` change-stream strategy: commit a batch like Flink's Iceberg sink, with no key lookup.

Selected with the table property ``write.changelog.strategy = equality``
(see :mod:`lineage.writes.changelog`). One batch is one Iceberg commit
(operation ``overwrite``) holding:

* a data file (one per partition) with every image a ``+I``, ``+U``, ``u``
  (Debezium ``c``/``r``) event writes, in batch order;
* position deletes against that new file for the images the batch itself
  supersedes or deletes again (every written image but each key's last event,
  when that event is positive): Flink's within-checkpoint deletes;
* an equality delete file on the key columns (field ids = the table's
  identifier fields) holding every key of the batch: whatever image the key
  had before the batch goes. An equality delete applies only to data files of
  a strictly lower data sequence number, so it never removes the batch's own
  images.

It reads nothing of the table's data, lineage or key index: the cost of a
commit is the cost of writing the batch. Its snapshot summary carries
``lineage.operation = changelog``, ``lineage.write-strategy = equality`` and
the caller's idempotency properties (``stream=`` positions, ``lineage.user.*``)
but **no** ``lineage.list``: the commit's lineage (which rows were inserted,
updated or deleted, their row ids) is derived later by reconciling the
snapshot, exactly as for a Flink commit (docs/design.md, "Foreign commits").

Semantics are **upsert mode only**: without a lookup nothing can be checked
against the table, so ``+I``/``+U``/``u`` replace the key's row whatever it
was, and ``-U``/``-D`` remove it if there was one. ``upsert=False`` (strict
mode) is refused with InvalidArgumentError rather than silently unchecked.
For the same reason ``CommitInfo.inserted``/``updated``/``deleted`` are not
known at write time and are 0; ``CommitInfo`` reports the files written, and
the reconciled commit log carries the exact counts.

Partitioned tables: the equality delete of a key must land in the partition
of the key's earlier image, which is only known without a lookup when every
partition source column is a key column (Flink's upsert mode has the same
rule) and the table has a single partition spec; otherwise the write is
refused with InvalidArgumentError.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table.snapshots import Operation

import lineage.duck as duck
from lineage.commits.commit import commit_files
from lineage.context import TableContext
from lineage.errors import CommitConflictError, InvalidArgumentError, UnsupportedFormatError, VersionMovedError
from lineage.storage.metadata import STRATEGY_EQUALITY as STRATEGY
from lineage.storage.metadata import SUMMARY_OPERATION, SUMMARY_STRATEGY
from lineage.outcome import Attempt, CommitLoop
from lineage.sql.predicate import quote_ident
from lineage.columns import HIDDEN_ROW_ID
from lineage.storage.writer import write_data_files, write_equality_deletes, write_position_deletes
from lineage.writes.changelog_batch import ChangelogBatch, check_problems
from lineage.writes.changelog_sql import POSITIVE, Relations
from lineage.writes.loop import log
from lineage.writes.plan import CommitInfo, ms_to_datetime
from lineage.properties import COMMIT_RETRIES
from lineage.writes.stream_position import StreamPosition, stream_digest

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

OPERATION = "changelog"
_EVENT = "__event"  # an event's batch position, carried through the data writer to learn each image's file position


def check_equality_table(table: TableContext) -> None:
    """Refuse tables whose equality deletes could not be placed without a lookup (see the module docs)."""
    meta = table.iceberg.metadata
    if meta.format_version >= 3:
        raise UnsupportedFormatError(
            f"table {table.name} has Iceberg format version 3: the equality changelog strategy would give every updated row a new "
            "native _row_id (row lineage does not survive equality deletes) and its in-batch deletes would be position delete "
            "files, which v3 forbids; use write.changelog.strategy=position"
        )
    spec = meta.spec()
    if spec.is_unpartitioned():
        return
    if len(meta.partition_specs) > 1:
        raise InvalidArgumentError(
            f"table {table.name} has {len(meta.partition_specs)} partition specs; the equality changelog strategy needs a single one "
            "(an equality delete only reaches files of its own spec): use write.changelog.strategy=position"
        )
    key_ids = set(meta.schema().identifier_field_ids)
    outside = [meta.schema().find_column_name(f.source_id) for f in spec.fields if f.source_id not in key_ids]
    if outside:
        raise InvalidArgumentError(
            f"table {table.name} is partitioned by column(s) {outside} that are not key columns; the equality changelog strategy "
            "can only place a key's equality delete when the partition follows from the key: use write.changelog.strategy=position"
        )


def plan_batch(batch: ChangelogBatch, arrow_schema: pa.Schema, con: duckdb.DuckDBPyConnection) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """The batch as Flink's sink writes it: (images in batch order, keys to equality-delete, superseded image rows).

    ``images`` has the data columns plus :data:`_EVENT` (row number in
    ``images``); ``superseded`` are the row numbers of images a later event of
    the same key replaces or deletes.
    """
    key = list(batch.key)
    if not batch.explicit_order and not any(batch.events.column(k).null_count for k in key):
        return _plan_in_arrow(batch, arrow_schema)
    con.register("events", batch.events)
    keys = ", ".join(quote_ident(k) for k in key)
    if batch.explicit_order:
        # Only ambiguous order (ties) is checked: there is no live state to check events against.
        con.execute(f"CREATE OR REPLACE TEMP TABLE __start AS SELECT {keys}, NULL::BIGINT AS _row_id FROM events LIMIT 0")
        rel = Relations(key, batch.columns, batch.order, (), quote_ident, start="__start")
        check_problems(con, rel, batch, True, False)
    order = ", ".join(quote_ident(c) for c in batch.order)
    cols = ", ".join(quote_ident(c) for c in batch.columns)
    positive = "(" + ", ".join(str(c) for c in POSITIVE) + ")"
    images = duck.fetch_arrow(
        con,
        # QUALIFY filters after the window: lead() sees the negative events too.
        f"SELECT {cols}, lead(__op) OVER (PARTITION BY {keys} ORDER BY {order}) IS NOT NULL AS __superseded "
        f"FROM events QUALIFY __op IN {positive} ORDER BY {order}",
    )
    superseded = np.flatnonzero(images.column("__superseded").to_numpy(zero_copy_only=False))
    images = images.drop_columns(["__superseded"]).cast(arrow_schema).append_column(_EVENT, pa.array(np.arange(images.num_rows, dtype=np.int64)))
    deleted_keys = duck.fetch_arrow(con, f"SELECT DISTINCT {keys} FROM events")
    return images, deleted_keys, superseded


def _plan_in_arrow(batch: ChangelogBatch, arrow_schema: pa.Schema) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """:func:`plan_batch` without SQL, for batches in batch order with non-null keys (a stream's usual batch).

    The same answer as the window query: a stable sort by key code then batch
    position finds, for each event, whether a later event of its key follows.
    Two small DuckDB queries cost more than the arithmetic on a few thousand
    events, and this is most of an equality commit's own work.
    """
    events = batch.events
    n = events.num_rows
    perm = pc.sort_indices(events, sort_keys=[(c, "ascending") for c in batch.order]).to_numpy()
    rank = np.empty(n, np.int64)
    rank[perm] = np.arange(n, dtype=np.int64)
    codes = _key_codes(events, list(batch.key))
    by_key = np.lexsort((rank, codes))
    later = np.zeros(n, bool)
    later[by_key[:-1]] = codes[by_key[1:]] == codes[by_key[:-1]]
    ops = events.column("__op").to_numpy(zero_copy_only=False)
    chosen = perm[np.isin(ops[perm], POSITIVE)]  # positive events in batch order
    images = events.select(list(batch.columns)).take(pa.array(chosen, pa.int64())).cast(arrow_schema)
    images = images.append_column(_EVENT, pa.array(np.arange(len(chosen), dtype=np.int64)))
    _, first = np.unique(codes, return_index=True)
    deleted_keys = events.select(list(batch.key)).take(pa.array(np.sort(first), pa.int64()))
    return images, deleted_keys, np.flatnonzero(later[chosen])


def _key_codes(events: pa.Table, key: list[str]) -> np.ndarray:
    """One integer per event, equal for events of equal (non-null) keys."""
    parts = [pc.dictionary_encode(events.column(k)).combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64) for k in key]
    if len(parts) == 1:
        return parts[0]
    return np.unique(np.stack(parts, axis=1), axis=0, return_inverse=True)[1].ravel().astype(np.int64)


def apply_equality_changelog(
    table: TableContext,
    batch: ChangelogBatch,
    *,
    upsert: bool,
    properties: dict[str, str],
    expected_version: int | None,
    position: StreamPosition | None,
) -> CommitInfo:
    """Commit ``batch`` with the equality strategy (see the module docs); returns what was written."""
    if not upsert:
        raise InvalidArgumentError(
            f"table {table.name} writes change streams with the equality strategy, which does no key lookup and so cannot check "
            "events against the table: pass upsert=True (+I/+U replace the key's row, -U/-D remove it if it exists), "
            "or set write.changelog.strategy=position for strict checks"
        )
    check_equality_table(table)
    con = duck.connect()
    try:
        images, keys, superseded = plan_batch(batch, table.arrow_schema, con)
    finally:
        con.close()
    retries = table.commit_retries
    summary = {SUMMARY_OPERATION: OPERATION, SUMMARY_STRATEGY: STRATEGY, **properties}

    def attempt(a: Attempt) -> CommitInfo:
        ice = table.iceberg
        current = ice.metadata.current_snapshot()
        version = current.sequence_number if current else 0
        if expected_version is not None and version != expected_version:
            raise VersionMovedError(table.name, expected_version, version)
        digest = stream_digest(ice)
        if position is not None:
            last = digest.last_batch(ice, position.stream_id)
            if last is not None and position.batch_id <= last:
                return _no_op(table)
        # Carried forward by every commit, so that the head snapshot keeps answering for every stream.
        positions = digest.after(position, ice.metadata.next_sequence_number())
        if images.num_rows == 0 and keys.num_rows == 0:
            return _no_op(table)
        # Files are written per attempt: a lost race deletes them (the loop's rule), a retry writes them again.
        written = write_data_files(ice, images.rename_columns([*images.column_names[:-1], HIDDEN_ROW_ID]))
        a.files.extend(w.data_file.file_path for w in written)
        targets = []
        for w in written:
            pos = np.flatnonzero(np.isin(np.asarray(w.row_ids), superseded))  # row_ids carry the images' row numbers
            if len(pos):
                targets.append((w.data_file, pos.astype(np.int64)))
        pos_deletes = write_position_deletes(ice, targets) if targets else []
        a.files.extend(f.file_path for f in pos_deletes)
        eq_deletes = write_equality_deletes(ice, keys, list(ice.schema().identifier_field_ids))
        a.files.extend(f.file_path for f in eq_deletes)
        added = [w.data_file for w in written] + pos_deletes + eq_deletes
        snapshot_id = ice.metadata.new_snapshot_id()
        timestamp_ms = max(int(time.time() * 1000), (current.timestamp_ms + 1) if current else 0)
        result = CommitInfo(
            version=ice.metadata.next_sequence_number(),
            snapshot_id=snapshot_id,
            timestamp=ms_to_datetime(timestamp_ms),
            operation=OPERATION,
            data_files_added=len(written),
            delete_files_added=len(pos_deletes) + len(eq_deletes),
            bytes_written=sum(f.file_size_in_bytes for f in added),
            attempts=a.number,
            properties=dict(properties),
        )
        a.result = result
        commit_files(
            ice, operation=Operation.OVERWRITE, added=added, removed=[], properties={**summary, **positions}, timestamp_ms=timestamp_ms,
            snapshot_id=snapshot_id, attempt=a,
        )
        return result

    loop: CommitLoop[CommitInfo] = CommitLoop(f"{table.name}: commit", lambda: table.iceberg, table.refresh, retries, logger=log)
    return loop.run(
        attempt,
        lambda n: CommitConflictError(
            f"gave up after {n} attempts: other writers kept committing to {table.name}; nothing was committed. "
            f"Retry later or raise the table property {COMMIT_RETRIES}"
        ),
    )


def _no_op(table: TableContext) -> CommitInfo:
    snap = table.iceberg.metadata.current_snapshot()
    ts = snap.timestamp_ms if snap else table.iceberg.metadata.last_updated_ms
    return CommitInfo(
        version=snap.sequence_number if snap else 0, snapshot_id=snap.snapshot_id if snap else None, timestamp=ms_to_datetime(ts),
        operation=OPERATION, committed=False,
    )
