"""Key index maintenance: rebuild, merge, and check against a scan of the key columns.

* :func:`reindex` rebuilds the index from one scan of the live key columns;
* :func:`merge_key_index` runs the merge policy without the writers' bound
  (or, with ``full``, merges everything into one base), so lookups touch few
  segments. It is what a periodic maintenance job calls;
* :func:`check_key_index` compares the index with a key scan (``verify``).

Both commits are maintenance commits (Iceberg operation ``replace``, no data
or delete file changed, no change events), published atomically with the
lineage list like every other commit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table.snapshots import Operation

from index.key_index import KeyIndex, KeyIndexChange, index_enabled, segment_info
from index.key_merge_policy import FULL, MAINTENANCE, MergePolicy, next_merge
from index.key_segment import ENTRY_COLUMNS
from lineage.commits.commit import CommitRequest
import lineage.duck as duck
from lineage.context import HasContext, TableContext, context_of
from lineage.errors import InvalidArgumentError, KeyViolationError, LineageError
from lineage.maintenance._common import MaintenanceResult, commit_with_retries
from lineage.state import TableState


def _require_index(table: TableContext) -> None:
    if not table.key:
        raise KeyViolationError(f"table {table.name} has no key, so it has no key index")
    if not index_enabled(table.iceberg):
        raise InvalidArgumentError(
            f"the key index of {table.name} is switched off (table properties lineage.key-index.enabled / lineage.key.enforce)"
        )


def _summary(index_paths: tuple[str, ...] | None, table: TableContext) -> str:
    index = KeyIndex.open(table.state(), build=False)
    entries = sum(s.entries for s in index.segments) if index else 0
    return f"key index: {len(index_paths or ())} segment(s), {entries} record(s)"


def reindex(table: TableContext | HasContext) -> MaintenanceResult:
    """Rebuild the key index from a scan of the key columns and commit it (no change events)."""
    table = context_of(table)
    _require_index(table)

    def plan(state: TableState, created: list[str]) -> CommitRequest:
        return CommitRequest("reindex", Operation.REPLACE, key_index=KeyIndexChange(index=KeyIndex.build(state), merge=FULL))

    _, result = commit_with_retries(table, plan, "reindex")
    assert result is not None
    return MaintenanceResult("reindex", result.version, bytes_added=result.bytes_written,
                             detail=f"rebuilt the {_summary(table.state().lineage.key_index, table)}")


def merge_key_index(table: TableContext | HasContext, full: bool = False, dry_run: bool = False) -> MaintenanceResult:
    """Merge key index segments as the policy asks (all of them into one base with ``full``).

    Builds the index first when the table has none. Commits nothing when
    there is nothing to merge; ``dry_run`` only says what would be merged.
    """
    table = context_of(table)
    _require_index(table)
    mode = FULL if full else MAINTENANCE

    def due(state: TableState) -> tuple[KeyIndex | None, bool]:
        """The index (None: not built yet, in a dry run) and whether a merge is due."""
        index = KeyIndex.open(state, build=not dry_run)
        if index is None:
            if dry_run:
                return None, True
            raise KeyViolationError(f"the live rows of {table.name} hold duplicate keys; the key index cannot be built")
        policy = MergePolicy.of(state.iceberg.metadata.properties)
        infos = [segment_info(s) for s in index.segments]
        return index, index.pending or index.outdated or next_merge(infos, policy, mode) is not None

    if dry_run:
        index, merge = due(table.refresh().state())
        summary = _summary(table.state().lineage.key_index, table)
        if index is None:
            return MaintenanceResult("merge-key-index", None, detail="would build the key index")
        return MaintenanceResult("merge-key-index", None, detail=f"{'would merge' if merge else 'nothing to merge;'} the {summary}")

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        index, merge = due(state)
        if not merge:
            return None
        return CommitRequest("merge-key-index", Operation.REPLACE, key_index=KeyIndexChange(index=index, merge=mode))

    _, result = commit_with_retries(table, plan, "merge-key-index")
    if result is None:
        return MaintenanceResult("merge-key-index", None, detail=f"nothing to merge; {_summary(table.state().lineage.key_index, table)}")
    return MaintenanceResult("merge-key-index", result.version, bytes_added=result.bytes_written,
                             detail=f"merged the {_summary(table.state().lineage.key_index, table)}")


def has_key_index(table: TableContext) -> bool:
    """Whether ``table`` keeps a key index (it has a key and the index is switched on)."""
    return bool(table.key) and index_enabled(table.iceberg)


def check_key_index(state: TableState, limit: int = 5) -> tuple[list[str], dict[str, int]]:
    """Differences between the key index of ``state`` and a scan of its key columns, and counts checked.

    A missing index is no problem (writers build it on first use); every
    live key must be in the index with the right row id, data file,
    position and versions, and the index must hold nothing else.
    """
    if not index_enabled(state.iceberg) or state.snapshot is None:
        return [], {}
    try:
        index = KeyIndex.open(state, build=False)
    except LineageError as exc:
        return [f"key index: {exc}"], {}
    if index is None:
        return [], {"key_index_segments": 0}
    try:
        truth = KeyIndex.build(state)
    except KeyViolationError as exc:
        return [f"key index: {exc}"], {}
    except Exception as exc:  # e.g. a data file is missing (reported above)
        if not isinstance(exc, (OSError, LineageError)) and not duck.is_error(exc):
            raise
        return [f"key index not checked: the key columns could not be scanned ({exc})"], {}
    expected = truth.live_entries()
    actual = index.live_entries()
    names = index.names
    problems: list[str] = []
    found = index.lookup(expected.select(names))
    hit = found.column("__input").to_numpy()
    missing = np.setdiff1d(np.arange(expected.num_rows), hit)
    if len(missing):
        sample = expected.take(pa.array(missing[:limit])).select(names).to_pylist()
        problems.append(f"key index lacks {len(missing)} live key(s), e.g. {sample}")
    want = expected.take(pa.array(hit))
    differs = np.zeros(len(hit), bool)
    for c in ENTRY_COLUMNS:
        differs |= ~pc.equal(found.column(c), want.column(c)).to_numpy(zero_copy_only=False)
    if differs.any():
        rows = np.flatnonzero(differs)[:limit]
        sample = [{"key": k, "index": a, "table": b} for k, a, b in zip(
            found.take(pa.array(rows)).select(names).to_pylist(),
            found.take(pa.array(rows)).select(list(ENTRY_COLUMNS)).to_pylist(),
            want.take(pa.array(rows)).select(list(ENTRY_COLUMNS)).to_pylist(), strict=True)]
        problems.append(f"key index entries of {int(differs.sum())} key(s) disagree with the table, e.g. {sample}")
    extra = truth.lookup(actual.select(names))
    if extra.num_rows < actual.num_rows:
        gone = np.setdiff1d(np.arange(actual.num_rows), extra.column("__input").to_numpy())
        sample = actual.take(pa.array(gone[:limit])).select(names).to_pylist()
        problems.append(f"key index holds {len(gone)} key(s) that are not live, e.g. {sample}")
    checked = {"key_index_segments": len(index.segments), "key_index_entries": actual.num_rows}
    return problems, checked
