"""Purge (GDPR): erase rows for good, from live data, pinned files and archives.

``purge(table, where)`` finds the live rows matching ``where`` and, in one
commit:

* rewrites every live data file that holds any image of those rows (live or
  deleted) as a copy with the same positions whose data columns are null for
  them; the copy keeps the file's lineage, its deletes are carried over, and
  the purged rows are deleted (so they leave the table as deletes at the
  purge version, recorded in the deleted-rows index);
* copies the still-needed images of every pinned file that left the
  snapshot into a fresh archive, with the purged rows' values nulled (the
  pinned files are then released);
* re-points the retained index segments at the rewritten files;
* records the purged row ids (cumulative), so the change feed flags every
  image of them with ``_purged = true``.

Then it expires every other snapshot and deletes the files only they, or the
released pinned files, referenced. Manifest entries of removed files are
written without column bounds, so no statistics keep the erased values.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
import uuid
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import DataFile
from pyiceberg.table.snapshots import Operation
from pyroaring import BitMap64

from index.deleted_rows import RemovedImages, forget_captured_values, read_index
from index.key_index import KeyIndexChange, index_enabled
from index.key_merge_policy import FULL
from index.purged import read_purged, write_purged
import lineage.decoded_cache as decoded_cache
import lineage.duck as duck
from lineage.commits.commit import CommitRequest
from lineage.context import HasContext, TableContext, context_of
from lineage.storage.deletes import positions_for, read_position_deletes
from lineage.storage.fileio import local_path, write_parquet
import lineage.maintenance.spark_rewrite as spark_rewrite
from lineage.maintenance._common import MaintenanceResult, commit_with_retries, position_delete_files, snapshot_files
from lineage.maintenance.rehome import archive_table, repoint
from lineage.maintenance.vacuum import expire_ids, vacuum
from lineage.storage.metadata import LineageList, index_dir
from lineage.sql.predicate import parse_predicate, quote_ident
from lineage.retention import window
from lineage.storage.rle import decode_sequence, decode_values
from lineage.read.scan import LINEAGE_SCHEMA, register_live_view
from lineage.iceberg.schema import cast_table, projection_field_ids
from lineage.state import TableState
from lineage.read.values import read_at
from lineage.storage.deletion_vectors import VectorTarget, write_vectors
from lineage.storage.writer import WrittenFile, write_copy, write_position_deletes
from lineage.properties import delete_granularity


def _erased(field: pa.Field, n: int, donor: object = None) -> pa.Array:
    """Values that reveal nothing: null; for a required column another kept row's value
    (it stays in the file's partition) or, when every row is erased, a neutral value."""
    if field.nullable:
        return pa.nulls(n, field.type)
    if donor is not None:
        return pa.array([donor] * n, field.type)
    t = field.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        value: object = ""
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        value = b""
    elif pa.types.is_boolean(t):
        value = False
    else:
        return pc.cast(pa.array([0] * n, pa.int64()), t, safe=False)
    return pa.array([value] * n, t)


def _partition_donors(iceberg, template: DataFile) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """For a file whose rows are all erased: values of required partition source columns that stay in its partition."""
    from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform

    spec = iceberg.metadata.specs()[template.spec_id]
    schema = iceberg.schema()
    out: dict[str, object] = {}
    for i, pf in enumerate(spec.fields):
        source = schema.find_field(pf.source_id)
        if not source.required:
            continue
        value = template.partition[i]
        if isinstance(pf.transform, (IdentityTransform, TruncateTransform)):
            out[source.name] = value
        elif isinstance(pf.transform, BucketTransform):
            fn = pf.transform.transform(source.field_type)
            for k in range(100_000):
                candidate: object = k if "int" in str(source.field_type) or "long" in str(source.field_type) else str(k)
                if fn(candidate) == value:
                    out[source.name] = candidate
                    break
    return out


def _null_rows(table: pa.Table, mask: np.ndarray, donors: dict[str, object] | None = None) -> pa.Table:
    """``table`` with the rows where ``mask`` is true erased (row count and order kept).

    Optional columns become null; required ones (keys) a neutral value. The
    change feed reports every data column of a purged image as null either way.
    """
    if not mask.any():
        return table
    keep = pa.array(~mask)
    first_kept = int(np.argmin(mask)) if not mask.all() else None
    cols = []
    for i in range(table.num_columns):
        donor = table.column(i)[first_kept].as_py() if first_kept is not None else (donors or {}).get(table.schema.field(i).name)
        cols.append(pc.if_else(keep, table.column(i), _erased(table.schema.field(i), table.num_rows, donor)))
    return pa.Table.from_arrays(cols, schema=table.schema)


def erased_copy(iceberg, path: str, schema: pa.Schema, mask: np.ndarray, template: DataFile, donors: dict[str, object] | None,  # type: ignore[no-untyped-def]
                lineage: tuple[np.ndarray, np.ndarray] | None = None) -> DataFile:
    """A copy of the data file at ``path`` (same rows, same positions) with the ``mask`` rows erased.

    ``lineage`` (row ids, updated versions by position) is written into the
    copy on Iceberg v3, so that its rows keep their native row lineage. The
    file is read by Iceberg field id when the table's schema has evolved (the
    shared reader of values): a file written before a column was added,
    renamed or promoted is copied with the current columns.
    """
    rows = int(template.record_count)
    data = read_at([path], np.zeros(rows, np.int64), np.arange(rows, dtype=np.int64), schema,
                   projection_field_ids(iceberg.metadata), cache=False)
    return write_copy(iceberg, cast_table(_null_rows(data, mask, donors), schema), template, lineage)


def purge(table: TableContext | HasContext, where: str | BooleanExpression, *, engine: str = "duckdb", spark: Any = None) -> MaintenanceResult:
    """Erase the live rows matching ``where`` and every earlier image of them (see the module docstring).

    ``engine="spark"``: Spark executors find the matching rows and rewrite the
    data files holding them (``spark``, or the active session). The purged
    rows' ids reach the driver either way: they are recorded in the purged-ids file.
    """
    table = context_of(table)
    spark = spark_rewrite.session_for(engine, spark)

    schema = table.arrow_schema
    field_ids = projection_field_ids(table.iceberg.metadata)
    ids = {f.name: f.field_id for f in table.iceberg.schema().fields}
    pred = parse_predicate(where, pa.schema(list(schema) + LINEAGE_SCHEMA))
    stats: dict[str, object] = {}

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        io = state.iceberg.io
        files = state.live_files()
        key = table.key if index_enabled(state.iceberg) else []
        keys = "".join(f", {quote_ident(k)}" for k in key)
        if spark is not None:  # the purged rows' pointers reach the driver: the purged ids are recorded there
            hits = spark_rewrite.matching_rows(state, files, pred, key, spark)
        else:
            con = duck.connect(isolated=True)
            try:
                duck.seal(con, register_live_view(con, "live", files, schema, field_ids), exact_floats=pred.reads_floats)
                hits = duck.fetch_arrow(con, f"SELECT __file_id, __pos, _row_id{keys} FROM live WHERE ({pred.sql})")
            finally:
                con.close()
        if hits.num_rows == 0:
            return None
        version = state.iceberg.metadata.next_sequence_number()
        new_ids = hits.column("_row_id").to_numpy()
        purged = BitMap64(read_purged(io, state.lineage.purged))
        purged.update(new_ids.tolist())
        purged_arr = np.array(list(purged), dtype=np.int64)

        # 1. live files holding any image of a purged row: same positions, values nulled
        hit_pos: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(0, np.int64))
        fid = hits.column("__file_id").to_numpy()
        for i in np.unique(fid):
            hit_pos[int(i)] = np.sort(hits.column("__pos").to_numpy()[fid == i])
        all_deletes = position_delete_files(snapshot_files(state)[1])
        rewritten: dict[str, str] = {}
        written: list[WrittenFile] = []
        removed_files: list[DataFile] = []
        removed_images: list[RemovedImages] = []
        delete_targets: list[tuple[DataFile, np.ndarray]] = []
        old_deleted: dict[str, np.ndarray] = {}
        for d in all_deletes:
            for p, pos in read_position_deletes(d.file_path).items():
                old_deleted[p] = np.union1d(old_deleted.get(p, np.zeros(0, np.int64)), pos)
        touched = []
        for i, f in enumerate(files):
            row_ids = decode_sequence(f.lineage.row_ids)
            mask = np.isin(row_ids, purged_arr)
            if mask.any():
                lineage = (row_ids, decode_values(f.lineage.updated))  # v3: the copy keeps native row lineage
                touched.append((i, f, row_ids, mask, _partition_donors(state.iceberg, f.data_file) if mask.all() else None, lineage))
        if spark is not None:  # executors read and write the copies
            copies = spark_rewrite.rewrite_copies(table, [(f, np.flatnonzero(m), d, lin) for _, f, _, m, d, lin in touched], spark, erased_copy)
        else:
            copies = [erased_copy(state.iceberg, f.path, schema, mask, f.data_file, donors, lin) for _, f, _, mask, donors, lin in touched]
        for (i, f, row_ids, mask, _, _), copy in zip(touched, copies, strict=True):
            created.append(copy.file_path)
            w = WrittenFile(copy, f.lineage.row_ids, f.lineage.created, f.lineage.updated)
            written.append(w)
            rewritten[f.path] = copy.file_path
            removed_files.append(f.data_file)
            positions = np.union1d(old_deleted.get(f.path, np.zeros(0, np.int64)), hit_pos[i])
            if f.resolved:
                # Rows equality deletes removed: the copy's data sequence number may put it out of their reach.
                positions = np.union1d(positions, positions_for(f.path, list(f.resolved)))
            if len(positions):
                delete_targets.append((w.data_file, positions))
            if len(hit_pos[i]):
                pos = hit_pos[i]
                created_v, updated_v = decode_values(f.lineage.created), decode_values(f.lineage.updated)
                removed_images.append(RemovedImages(w.data_file.file_path, pos, row_ids[pos], created_v[pos], updated_v[pos], version))
        # delete files that mention a rewritten file are replaced; their other entries are carried over
        removed_deletes = []
        live_by_path = {f.path: f.data_file for f in files}
        carried: set[str] = set()  # each data file once: on v3 one Puffin file is the entry of several vectors
        for d in all_deletes:
            paths = set(read_position_deletes(d.file_path))
            if paths & rewritten.keys():
                removed_deletes.append(d)
                carried.update(p for p in paths - rewritten.keys() if p in live_by_path)
        delete_targets.extend((live_by_path[p], old_deleted[p]) for p in sorted(carried))
        granularity, limit = delete_granularity(state.iceberg.metadata.properties)
        if state.iceberg.metadata.format_version >= 3:  # deletion vectors; the positions above already hold the old ones
            new_deletes, _ = write_vectors(state.iceberg, [VectorTarget(df, pos) for df, pos in delete_targets])
        else:
            new_deletes = write_position_deletes(state.iceberg, delete_targets, granularity, file_scoped_limit=limit) if delete_targets else []
        created.extend(d.file_path for d in new_deletes)

        # 2. pinned files that left the snapshot: needed images into a fresh archive, purged rows nulled
        oldest = window(state).oldest
        # Every other snapshot is expired right after this commit, so only the
        # current snapshot's files keep their contents; all other pinned files are re-homed.
        in_snapshots = {local_path(f.path) for f in files}
        needed: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
        for c in state.lineage.log.since(oldest):
            if c.index:
                seg = read_index(io, c.index)
                if seg.captured:  # values live in the segment; repoint (erase=) nulls the purged ones there
                    continue
                for e in seg.entries():
                    if e.file_path not in rewritten and local_path(e.file_path) not in in_snapshots:
                        needed[e.file_path].append((e.positions, e.row_ids))
        mapping: dict[str, tuple[str, dict[int, int] | None]] = {old: (new, None) for old, new in rewritten.items()}
        archive_path = None
        if needed:
            chosen = []
            for path, parts in needed.items():
                pos = np.concatenate([p for p, _ in parts])
                rid = np.concatenate([r for _, r in parts])
                order = np.argsort(pos, kind="stable")
                pos, rid = pos[order], rid[order]
                first = np.concatenate(([True], pos[1:] != pos[:-1]))
                chosen.append((path, pos[first], rid[first]))
            values = read_at([p for p, _, _ in chosen], np.repeat(np.arange(len(chosen)), [len(pos) for _, pos, _ in chosen]),
                             np.concatenate([pos for _, pos, _ in chosen]), schema, ids, cache=False)
            mask = np.isin(np.concatenate([rid for _, _, rid in chosen]), purged_arr)
            values = _null_rows(values, mask)
            archive_path = f"{index_dir(state.iceberg.metadata.location)}/archive-{uuid.uuid4()}.parquet"
            created.append(archive_path)
            write_parquet(io, archive_path, archive_table(values, ids))
            offset = 0
            for path, pos, _ in chosen:
                mapping[path] = (archive_path, {int(p): offset + k for k, p in enumerate(pos)})
                offset += len(pos)
        tag = str(uuid.uuid4())
        repoint_list, _ = repoint(state, mapping, oldest, tag, created, erase=purged_arr)
        purged_path = f"{index_dir(state.iceberg.metadata.location)}/{version:09d}-{tag}-purged.parquet"
        created.append(purged_path)
        write_purged(io, purged_path, purged)

        def transform(lst: LineageList) -> LineageList:
            return dataclasses.replace(repoint_list(lst), purged=purged_path)

        stats.update(rows=len(new_ids), files=len(rewritten), pinned=len(needed))
        return CommitRequest(
            "purge",
            Operation.OVERWRITE,
            written=written,
            delete_files=new_deletes,
            removed_files=removed_files + removed_deletes,
            removed_images=removed_images,
            deleted=len(new_ids),
            transform_list=transform,
            strip_removed_stats=True,
            # One new base without the purged keys: no segment still referenced holds their values.
            key_index=KeyIndexChange(removed_keys=hits.select(key), merge=FULL) if key else None,
        )

    started = time.time()
    _, result = commit_with_retries(table, plan, "purge")
    if result is None and not table.state().lineage.purged:
        return MaintenanceResult("purge", None, detail="no live row matches")
    # Only the current snapshot may survive: older ones reference unpurged files. This
    # cleanup also runs when nothing matched, so re-running a purge that crashed after
    # its commit finishes the job.
    current = table.iceberg.metadata.current_snapshot_id
    older = [s.snapshot_id for s in table.iceberg.metadata.snapshots if s.snapshot_id != current]
    if older:
        expire_ids(table, older)
    # Every unreferenced file written before the purge started may hold erased values.
    cleaned = vacuum(table, older_than=_dt.timedelta(seconds=max(0.0, time.time() - started)))
    # Values this process keeps decoded or parsed may be erased ones (other processes drop theirs as the
    # files they came from disappear: see lineage.decoded_cache).
    decoded_cache.clear()
    forget_captured_values()
    version = result.version if result else None
    what = (
        f"erased {stats['rows']} row(s); rewrote {stats['files']} live file(s) and re-homed images of {stats['pinned']} pinned file(s)"
        if result
        else "no live row matches; finished the cleanup of earlier purges"
    )
    return MaintenanceResult(
        "purge", version, files_removed=cleaned.files_removed, bytes_removed=cleaned.bytes_removed,
        detail=f"{what}; expired {len(older)} snapshot(s)",
    )
