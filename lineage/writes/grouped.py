"""Deletes and updates by predicate in bounded memory: the matched rows handled a group of data files at a time.

A delete or update whose files to scan hold more than one group of rows
(:func:`group_rows`, ``LINEAGE_WRITE_GROUP_ROWS``, 4,000,000 by default)
does not materialise every matched row of the commit at once. The files are
cut into consecutive groups of at most that many rows (a larger file is a
group of its own), and for each group in turn:

1. the predicate runs in a sealed DuckDB database of the group's files alone
   (closed after the group, so its memory goes back);
2. the group's removed images become position deletes (Iceberg v2, merged
   with our earlier file-scoped delete file of each data file) or deletion
   vectors (v3), and their rows of the commit's deleted-rows index segment
   are appended to it as a row group (:class:`index.deleted_rows_stream.IndexSegmentWriter`);
3. an update's new images (same row ids) are buffered and written as data
   files once the buffer holds :data:`FLUSH_BYTES`, and at the end.

Delete targets are buffered the same way (:data:`FLUSH_POSITIONS`), so a
commit writes a delete file per data file (v2, file-scoped) or one Puffin
file per flush (v3), not one per group; new data files hold up to 16 MB of
images each. What stays for the whole commit is a few bytes per matched
row: the removed images' key values (for the key index; its delta segment
is built in bounded memory, :mod:`index.key_delta`) and the new files' row
ids. The commit itself is the same single atomic commit, with the files
already written (the write loop's ``prewritten`` fields, as the Spark
engine hands them over); a failure removes what the groups wrote.

Used for merge-on-read only, and not by an update that sets a key column
(its clash check spans the whole commit): those take the one-piece plan.
Small files are not folded into the commit on this path (the files of a
table this large are rarely small).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile

from index.deleted_rows import RemovedImages, captured_values
from index.deleted_rows_stream import IndexSegmentWriter
from index.key_index import KeyIndexChange
import lineage.duck as duck
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError
from lineage.memory import release_within
from lineage.read.scan import register_live_view
from lineage.sql.predicate import Predicate
from lineage.state import LiveFile, TableState
from lineage.storage.deletion_vectors import VectorTarget
from lineage.storage.merged_deletes import write_file_deletes
from lineage.storage.metadata import index_dir
from lineage.storage.rle import encode_values
from lineage.storage.writer import WrittenFile, write_data_files
from lineage.columns import HIDDEN_ROW_ID
from lineage.writes.capture import split_old
from lineage.writes.plan import Plan
from lineage.writes.rows import REMOVED_COLS, by_row_id, conform_images, group_removed

ENV_GROUP_ROWS = "LINEAGE_WRITE_GROUP_ROWS"
DEFAULT_GROUP_ROWS = 4_000_000
FLUSH_BYTES = 16 << 20  # new images buffered before they are written as data files
FLUSH_POSITIONS = 131_072  # removed positions buffered before they are written as delete files


def group_rows() -> int:
    """Source rows per group of data files, from ``LINEAGE_WRITE_GROUP_ROWS`` (default 4,000,000)."""
    raw = os.environ.get(ENV_GROUP_ROWS, str(DEFAULT_GROUP_ROWS))
    try:
        rows = int(raw)
    except ValueError:
        rows = 0
    if rows < 1:
        raise InvalidArgumentError(f"{ENV_GROUP_ROWS} must be a positive whole number of rows, got {raw!r}")
    return rows


def file_groups(files: Sequence[LiveFile], rows: int) -> list[list[int]]:
    """Consecutive indexes into ``files`` holding at most ``rows`` rows each (a larger file alone)."""
    groups: list[list[int]] = []
    held = rows
    for i, f in enumerate(files):
        n = int(f.data_file.record_count)
        if held + n > rows or not groups:
            groups.append([])
            held = 0
        groups[-1].append(i)
        held += n
    return groups


def is_grouped(files: Sequence[LiveFile]) -> bool:
    """Whether a write over ``files`` takes the grouped path (they hold more than one group of rows)."""
    return sum(int(f.data_file.record_count) for f in files) > group_rows()


@dataclass(frozen=True)
class GroupQuery:
    """What one group's query selects: the SELECT list over the view ``live`` and whether it carries new images."""

    select: str  # REMOVED_COLS first (delete), or the images' columns, then REMOVED_COLS (update); then key columns, old values
    key: list[str]  # the key columns (as selected: named ``key`` for a delete, ``__old_key_<i>`` for an update)
    images: list[str] = field(default_factory=list)  # an update's image columns (data columns, hidden row id, created)


@dataclass
class _Outputs:
    """What the groups wrote so far, and what is buffered."""

    delete_files: list[DataFile] = field(default_factory=list)
    replaced: dict[str, DataFile] = field(default_factory=dict)
    written: list[WrittenFile] = field(default_factory=list)
    keys: list[pa.Table] = field(default_factory=list)
    targets: list[VectorTarget] = field(default_factory=list)
    images: list[pa.Table] = field(default_factory=list)
    removed: int = 0


def grouped_plan(
    table: TableContext, state: TableState, files: list[LiveFile], pred: Predicate, query: GroupQuery, operation: str, capture: bool,
    field_ids: dict[str, int],
) -> Plan:
    """The plan of a delete (``query.images`` empty) or update of the rows ``pred`` matches in ``files``, written group by group."""
    ice = state.iceberg
    version = ice.metadata.next_sequence_number()
    schema = table.arrow_schema
    value_ids = {f.name: f.field_id for f in ice.schema().fields}
    index = IndexSegmentWriter(ice.io, f"{index_dir(ice.metadata.location)}/{version:09d}-{uuid.uuid4()}-deleted-rows.parquet", version)
    out = _Outputs()

    def flush_deletes() -> None:
        if out.targets:
            new, replaced = write_file_deletes(ice, out.targets)
            out.delete_files.extend(new)
            out.replaced.update((d.file_path, d) for d in replaced)
            out.targets = []

    def flush_images() -> None:
        if out.images:
            # each group's images are sorted; groups of files appended in turn hold disjoint ranges of row ids, in
            # whatever order the snapshot lists the files: put in order of their first row id, they need no sorted copy
            out.images.sort(key=lambda t: t.column(HIDDEN_ROW_ID)[0].as_py() if t.num_rows else -1)
            images = by_row_id(out.images)  # empties the buffer: sorted a column at a time, if at all
            # the created versions of rows in row id order come in long runs: kept encoded until the commit
            out.written.extend(replace(w, created=encode_values(w.created)) if isinstance(w.created, np.ndarray) else w
                               for w in write_data_files(ice, images))

    try:
        for g in file_groups(files, group_rows()):
            gfiles = [files[i] for i in g]
            rows = _query(gfiles, schema, field_ids, pred, query.select)
            if not rows.num_rows:
                continue
            rows, values = split_old(rows, schema) if capture else (rows, None)
            removed = rows.select(REMOVED_COLS.split(", "))
            groups = group_removed(removed)
            if values is not None:
                values = captured_values(values, value_ids)
            index.add([
                RemovedImages(gfiles[fid].path, c["__pos"], c["_row_id"], c["_row_created_at_version"], c["_row_last_updated_at_version"],
                              version, None if values is None else values.take(pa.array(c["__row"])))
                for fid, c in groups.items()
            ])
            out.targets.extend(VectorTarget(gfiles[fid].data_file, c["__pos"], gfiles[fid].deletes) for fid, c in groups.items())
            out.removed += removed.num_rows
            if query.key:
                out.keys.append(owned(rows.select(query.key)))
            if query.images:
                # sorted a group at a time (a copy of its own: the group's DuckDB result is not kept), so that the buffer
                # of later groups' images is in order too when the files are, and is written without a sorted copy of it all
                images = conform_images(rows.select(query.images), ice.schema(), table.key, operation)
                out.images.append(images.sort_by(HIDDEN_ROW_ID))
                if sum(t.nbytes for t in out.images) >= FLUSH_BYTES:
                    flush_images()
            del rows, removed, groups, values
            if sum(len(t.positions) for t in out.targets) >= FLUSH_POSITIONS:
                flush_deletes()
            release_within()  # the group's DuckDB result and Arrow buffers are freed: their pages go back
        flush_deletes()
        flush_images()
        written_index = index.close()
    except BaseException:
        index.abort()
        for path in [d.file_path for d in out.delete_files] + [w.data_file.file_path for w in out.written]:
            ice.io.delete(path)
        raise
    change = None
    if query.key:
        keys = pa.concat_tables(out.keys).rename_columns(table.key) if out.keys else None
        change = KeyIndexChange.of_removal(keys, rewritten=bool(query.images))
    counts = {"updated": out.removed} if query.images else {"deleted": out.removed}
    return Plan(operation, prewritten=out.written, prewritten_deletes=out.delete_files, prewritten_index=written_index,
                prewritten_replaced=list(out.replaced.values()), key_index=change, **counts)


def owned(table: pa.Table) -> pa.Table:
    """A copy of ``table`` in buffers of its own (Arrow's pool).

    A column of a DuckDB result exported to Arrow shares its release with
    the whole result: keeping one column (e.g. the removed keys, held for
    the whole commit) would keep every column of every group's result
    alive, about 100 bytes per matched row instead of the key's 8.
    """
    return table.take(pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _query(files: list[LiveFile], schema: pa.Schema, field_ids: dict[str, int], pred: Predicate, select: str) -> pa.Table:
    """``select`` over the live rows of ``files`` that ``pred`` matches, in a sealed database of its own (closed after)."""
    con = duck.connect(isolated=True)
    try:
        duck.seal(con, register_live_view(con, "live", files, schema, field_ids), exact_floats=pred.reads_floats)
        return duck.fetch_arrow(con, f"SELECT {select} FROM live WHERE ({pred.sql})")
    finally:
        con.close()
