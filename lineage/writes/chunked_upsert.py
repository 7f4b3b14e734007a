"""Upserts through the key index in chunks of the batch: the new rows are written as the batch is matched.

A plain upsert (or merge) on a table with a key index matches its batch
with the live rows by key lookups (:func:`lineage.writes.key_checks.match_upserts`).
Matched whole, a batch of a million rows held the lookup's results, the
images (the batch rows that update a live row, with their row ids) and the
inserts all at once, then their concatenation sorted, then the files'
lineage. A batch of more than :data:`CHUNK_ROWS` rows is matched a chunk at
a time instead: each chunk's new images and inserts (images first, by row
id; inserts with fresh ids, in batch order) are buffered and written as data
files once the buffer holds :data:`lineage.writes.grouped.FLUSH_BYTES`, and
at the end. What stays for the commit is the removed images' pointers and
lineage (40 bytes each) and their keys; the write loop writes their delete
files and index segment as for any plan. The new files are handed over
already written (``Plan.prewritten``), so the commit is the same single
commit; a failure removes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from index.key_index import KeyIndex, KeyIndexChange
from lineage.context import TableContext
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID
from lineage.memory import release_within
from lineage.state import LiveFile, TableState
from lineage.storage.writer import WrittenFile, with_fresh_rows, write_data_files
from lineage.writes import grouped, key_checks
from lineage.writes.plan import Plan

CHUNK_ROWS = 131_072  # batch rows matched at a time


def chunked_upsert(
    table: TableContext, state: TableState, index: KeyIndex, files: list[LiveFile], batch: pa.Table, dkeys: pa.Table | None,
    operation: str, properties: dict[str, str],
) -> Plan:
    """The plan of an upsert of ``batch`` (and deletes of ``dkeys``, checked disjoint already) matched chunk by chunk."""
    ice = state.iceberg
    written: list[WrittenFile] = []
    buffered: list[pa.Table] = []
    removed: list[pa.Table] = []
    keys: list[pa.Table] = []
    updated = inserted = 0

    def flush() -> None:
        if buffered:
            data = pa.concat_tables(buffered)
            buffered.clear()
            written.extend(write_data_files(ice, data))

    try:
        for start in range(0, batch.num_rows, CHUNK_ROWS):
            m = key_checks.match_upserts(index, files, batch.slice(start, CHUNK_ROWS), None)
            images = m.images.append_column(pa.field(HIDDEN_ROW_ID, pa.int64(), False), m.row_ids).append_column(
                pa.field(HIDDEN_CREATED, pa.int64(), False), m.created).sort_by(HIDDEN_ROW_ID)
            buffered.append(with_fresh_rows(images, m.inserts))
            removed.append(m.removed)
            keys.append(m.removed_keys)
            updated += m.updated
            inserted += m.inserts.num_rows
            del m, images
            if sum(t.nbytes for t in buffered) >= grouped.FLUSH_BYTES:
                flush()
            release_within()  # the chunk's lookup (NumPy, glibc's heap) freed: its pages go back before Arrow's grow
        deleted = 0
        if dkeys is not None and dkeys.num_rows:
            gone = index.lookup(dkeys)
            deleted = gone.num_rows
            removed.append(key_checks.removed_pointers(files, gone))
            keys.append(gone.select(index.names))
        flush()
    except BaseException:
        for w in written:
            ice.io.delete(w.data_file.file_path)
        raise
    removed_keys = pa.concat_tables(keys)
    change = KeyIndexChange(removed_keys=removed_keys, index=index, tombstones=removed_keys.slice(updated))  # updated keys are written again
    return Plan(operation, files=files, removed=pa.concat_tables(removed), prewritten=written, inserted=inserted, updated=updated,
                deleted=deleted, properties=properties, key_index=change)


def uses_chunks(batch: pa.Table, index: KeyIndex | None, skip_unchanged: bool, files: Sequence[LiveFile]) -> bool:
    """Whether an upsert of ``batch`` goes chunk by chunk (an indexed plain upsert of more than :data:`CHUNK_ROWS` rows)."""
    return index is not None and not skip_unchanged and batch.num_rows > CHUNK_ROWS and bool(files)
