"""CONVERT: turn every live equality delete file into position delete files, changing no reader's answer.

Iceberg's rule for an equality delete file with data sequence number ``d``:
it removes the rows of data files with a data sequence number strictly below
``d`` (same partition, or every partition for an unpartitioned spec) that
equal one of its rows in its ``equality_ids`` columns, NULL matching NULL.
CONVERT resolves each one to the positions it removes, per data file, and
commits one ``replace`` snapshot that removes the equality delete files and
adds position delete files **carrying the data sequence number ``d`` of the
equality delete they replace**. A position delete applies to its data file
when the file's data sequence number is ``<= d``, which holds for every file
the equality delete applied to, so every reader sees the same rows before and
after; afterwards the table holds no equality delete files.

The snapshot carries ``lineage.operation = convert-deletes`` and no lineage
list: it changes no row (a reconciler sees only delete files replaced by
position deletes of rows that were already deleted). It works on any
Iceberg v2 table (adoption converts first).

Concurrency: the commit asserts the snapshot it was planned on; when another
writer commits first (new equality deletes included) the attempt's files are
removed and CONVERT plans again on the new head.

Resolution (:func:`resolve_equality_deletes`) reads the equality columns of
each affected data file and joins them with the delete rows in DuckDB.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation, Snapshot

from lineage import duck
from lineage.commit import commit_files
from lineage.errors import CommitConflictError
from lineage.fileio import local_path
from lineage.maintenance._common import MaintenanceResult
from lineage.metadata import SUMMARY_OPERATION
from lineage.outcome import Attempt, CommitLoop
from lineage.planning import live_entries, plan_snapshot, sequence_of
from lineage.writer import write_position_deletes

OPERATION = "convert-deletes"
FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class ConvertResult(MaintenanceResult):
    """What CONVERT did: equality delete files (and their rows) replaced by position delete files (and positions)."""

    equality_files: int = 0
    equality_rows: int = 0
    position_files: int = 0
    positions: int = 0
    data_files: int = 0  # data files that got position deletes
    attempts: int = 0


@dataclass(frozen=True)
class Resolved:
    """Positions one equality delete file removes from one data file."""

    delete_file: DataFile
    sequence_number: int  # the equality delete's data sequence number
    data_file: DataFile
    positions: np.ndarray


def _columns_by_field_id(path: str, field_ids: Iterable[int]) -> pa.Table:
    """The columns of a Parquet file with the given Iceberg field ids, named ``c<id>`` (by id, whatever their names)."""
    schema = pq.read_schema(local_path(path))
    by_id = {int(f.metadata[FIELD_ID]): f.name for f in schema if f.metadata and FIELD_ID in f.metadata}
    ids = list(field_ids)
    missing = [i for i in ids if i not in by_id]
    table = pq.read_table(local_path(path), columns=[by_id[i] for i in ids if i in by_id])
    out = {f"c{i}": table.column(by_id[i]) for i in ids if i in by_id}
    for i in missing:  # a column added after the file was written: null in every row
        out[f"c{i}"] = pa.nulls(table.num_rows)
    return pa.table(out) if out else pa.table({})


def resolve_equality_deletes(iceberg: IcebergTable, snapshot: Snapshot) -> tuple[list[Resolved], dict[str, tuple[DataFile, int]]]:
    """Per live equality delete file of ``snapshot``, the positions it removes from each data file it applies to.

    Returns the resolutions and every live equality delete file by path with
    its data sequence number (also those that apply to no data file).
    """
    equality: dict[str, tuple[DataFile, int]] = {}
    for entry in live_entries(iceberg, snapshot.manifests(iceberg.io)):
        if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
            equality[entry.data_file.file_path] = (entry.data_file, sequence_of(entry))
    if not equality:
        return [], equality
    out: list[Resolved] = []
    deletes_cache: dict[str, pa.Table] = {}
    con = duck.connect()
    try:
        for planned in plan_snapshot(iceberg, snapshot):
            by_ids: dict[tuple[int, ...], list[DataFile]] = defaultdict(list)
            for d in planned.equality_deletes:
                by_ids[tuple(d.equality_ids or ())].append(d)
            for ids, files in by_ids.items():
                data = _columns_by_field_id(planned.data_file.file_path, ids)
                data = data.append_column("__pos", pa.array(np.arange(data.num_rows, dtype=np.int64)))
                parts = []
                for i, d in enumerate(files):
                    if d.file_path not in deletes_cache:
                        deletes_cache[d.file_path] = _columns_by_field_id(d.file_path, ids)
                    parts.append(deletes_cache[d.file_path].append_column("__del", pa.array(np.full(deletes_cache[d.file_path].num_rows, i, np.int32))))
                out.extend(_match(con, planned.data_file, data, pa.concat_tables(parts), files, ids, equality))
    finally:
        con.close()
    return out, equality


def _match(
    con: duckdb.DuckDBPyConnection,
    data_file: DataFile,
    data: pa.Table,
    deletes: pa.Table,
    files: list[DataFile],
    ids: tuple[int, ...],
    equality: dict[str, tuple[DataFile, int]],
) -> list[Resolved]:
    """Positions of ``data`` equal (NULL = NULL) to a row of each delete file, in DuckDB."""
    con.register("__data", data)
    con.register("__deletes", deletes)
    on = " AND ".join(f"d.c{i} IS NOT DISTINCT FROM e.c{i}" for i in ids)
    hits = duck.fetch_arrow(con, f"SELECT DISTINCT e.__del, d.__pos FROM __data d JOIN __deletes e ON {on} ORDER BY 1, 2")
    con.unregister("__data")
    con.unregister("__deletes")
    which = hits.column("__del").to_numpy()
    pos = hits.column("__pos").to_numpy()
    out = []
    for i in np.unique(which):
        f = files[int(i)]
        out.append(Resolved(f, equality[f.file_path][1], data_file, pos[which == i].astype(np.int64)))
    return out


def convert_equality_deletes(iceberg: IcebergTable, refresh: Callable[[], IcebergTable], name: str) -> ConvertResult:
    """CONVERT every live equality delete file of ``iceberg``'s ``main`` (see the module docs).

    ``refresh`` reloads ``iceberg`` from the catalog (the commit loop calls it
    before every attempt); ``name`` names the table in messages.
    """
    retries = int(iceberg.metadata.properties.get("commit.retry.num-retries", 20))
    table = [iceberg]

    def attempt(a: Attempt) -> ConvertResult:
        ice = table[0]
        snap = ice.metadata.current_snapshot()
        if snap is None:
            return ConvertResult(OPERATION, None, attempts=a.number)
        resolved, equality = resolve_equality_deletes(ice, snap)
        if not equality:
            return ConvertResult(OPERATION, None, detail="no equality delete files", attempts=a.number)
        # One position delete file per (equality delete sequence number, data file): the number is per delete file.
        groups: dict[tuple[int, str], list[np.ndarray]] = defaultdict(list)
        targets: dict[str, DataFile] = {}
        for r in resolved:
            groups[(r.sequence_number, r.data_file.file_path)].append(r.positions)
            targets[r.data_file.file_path] = r.data_file
        added: list[DataFile] = []
        sequence_numbers: dict[str, int] = {}
        positions = 0
        for (seq, path), parts in sorted(groups.items()):
            pos = np.unique(np.concatenate(parts))
            positions += len(pos)
            (f,) = write_position_deletes(ice, [(targets[path], pos)])
            a.files.append(f.file_path)
            added.append(f)
            sequence_numbers[f.file_path] = seq
        removed = [f for f, _ in equality.values()]
        snapshot_id = ice.metadata.new_snapshot_id()
        result = ConvertResult(
            OPERATION, ice.metadata.next_sequence_number(), files_added=len(added), files_removed=len(removed),
            bytes_added=sum(f.file_size_in_bytes for f in added), bytes_removed=sum(f.file_size_in_bytes for f in removed),
            detail=f"{len(removed)} equality delete file(s) ({sum(f.record_count for f in removed)} rows) -> "
            f"{len(added)} position delete file(s) ({positions} positions in {len(targets)} data file(s))",
            equality_files=len(removed), equality_rows=sum(f.record_count for f in removed), position_files=len(added),
            positions=positions, data_files=len(targets), attempts=a.number,
        )
        a.result = result
        commit_files(
            ice, operation=Operation.REPLACE, added=added, removed=removed, properties={SUMMARY_OPERATION: OPERATION},
            timestamp_ms=max(int(time.time() * 1000), snap.timestamp_ms + 1), snapshot_id=snapshot_id, attempt=a,
            delete_sequence_numbers=sequence_numbers,
        )
        return result

    def reload() -> None:
        table[0] = refresh()

    loop: CommitLoop[ConvertResult] = CommitLoop(f"{name}: {OPERATION}", lambda: table[0], reload, retries)
    return loop.run(
        attempt,
        lambda n: CommitConflictError(
            f"gave up after {n} attempts: other writers kept committing to {name}; nothing was converted. "
            "Retry later or raise the table property commit.retry.num-retries"
        ),
    )
