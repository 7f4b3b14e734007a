"""Pointers to the row images a change feed needs: metadata only, never row values.

For a range ``(a, b]`` the feed needs every image that starts (``valid_from``)
or ends (``valid_to``) inside it. Both come from metadata of the current
snapshot, so the answer does not depend on old snapshots still existing:

* images live now whose lineage says they start in ``(a, b]``: found from the
  run-length encoded lineage of live files (files whose version span misses
  the range are skipped without being opened), minus the positions the
  current snapshot deletes;
* images removed at a version after ``a``: from the deleted-rows index
  segments of the commits after ``a``, kept when they start or end in the range.

The result is one Arrow table with ``file_path``, ``pos``, ``_row_id``,
``_row_created_at_version``, ``_valid_from`` and ``_valid_to`` (null while
live), which an engine joins with the Parquet files to get values.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.deleted_rows import RemovedImages, read_index_segment
from index.purged import is_purged, read_purged
from lineage.deletes import positions_for
from lineage.fileio import local_path
from lineage.rle import combined_breakpoints
from lineage.state import LiveFile, TableState

POINTER_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("pos", pa.int64(), nullable=False),
        pa.field("_row_id", pa.int64(), nullable=False),
        pa.field("_row_created_at_version", pa.int64(), nullable=False),
        pa.field("_valid_from", pa.int64(), nullable=False),
        pa.field("_valid_to", pa.int64(), nullable=True),
    ]
)


def _table(file_path: str, pos: np.ndarray, row_id: np.ndarray, created: np.ndarray, valid_from: np.ndarray, valid_to: np.ndarray | None) -> pa.Table:
    n = len(pos)
    to = pa.nulls(n, pa.int64()) if valid_to is None else pa.array(valid_to, pa.int64())
    return pa.Table.from_arrays(
        [pa.array(np.full(n, file_path, dtype=object), pa.string()), pa.array(pos, pa.int64()), pa.array(row_id, pa.int64()),
         pa.array(created, pa.int64()), pa.array(valid_from, pa.int64()), to],
        schema=POINTER_SCHEMA,
    )


def removed_images(state: TableState, after: int, upto: int | None = None) -> list[RemovedImages]:
    """Index entries of images removed by commits with version in ``(after, upto]``."""
    upto = state.version if upto is None else upto
    out: list[RemovedImages] = []
    for c in state.lineage.log.since(after):
        if c.version <= upto and c.index:
            out.extend(read_index_segment(state.iceberg.io, c.index))
    return out


def _live_pointers(live: LiveFile, a: int, b: int) -> pa.Table | None:
    fl = live.lineage
    if fl.max_updated <= a or fl.min_updated > b:
        return None
    pos_start, rid_start, created, updated = combined_breakpoints(fl.row_ids, fl.created, fl.updated)
    ends = np.append(pos_start[1:], fl.record_count)
    keep = (updated > a) & (updated <= b)
    if not keep.any():
        return None
    lengths = (ends - pos_start)[keep]
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.repeat(pos_start[keep], lengths) + offsets
    rid = np.repeat(rid_start[keep], lengths) + offsets
    cre = np.repeat(created[keep], lengths)
    upd = np.repeat(updated[keep], lengths)
    if live.deletes:
        alive = ~np.isin(pos, positions_for(live.path, [d.file_path for d in live.deletes]))
        pos, rid, cre, upd = pos[alive], rid[alive], cre[alive], upd[alive]
    if len(pos) == 0:
        return None
    return _table(live.path, pos, rid, cre, upd, None)


def with_purged_flag(state: TableState, pointers: pa.Table) -> pa.Table:
    """Add ``_purged`` (images of rows erased by a purge) when the table has ever been purged."""
    if not state.lineage.purged:
        return pointers
    bitmap = read_purged(state.iceberg.io, state.lineage.purged)
    return pointers.append_column("_purged", pa.array(is_purged(bitmap, pointers.column("_row_id").to_numpy()), pa.bool_()))


def change_pointers(state: TableState, a: int, b: int) -> pa.Table:
    """Pointers to every image that starts or ends in ``(a, b]`` (see module docstring)."""
    parts: list[pa.Table] = []
    if b > a:
        # Files whose images all start outside (a, b] are skipped here, before any work is queued:
        # a table with a long history has many files and a short range touches few of them.
        touched = [f for f in state.live_files() if f.lineage.max_updated > a and f.lineage.min_updated <= b]
        with ThreadPoolExecutor(max_workers=4) as pool:
            for t in pool.map(lambda f: _live_pointers(f, a, b), touched):
                if t is not None:
                    parts.append(t)
        for r in removed_images(state, a):
            in_range = ((r.valid_from > a) & (r.valid_from <= b)) | ((r.valid_to > a) & (r.valid_to <= b))
            if in_range.any():
                parts.append(
                    _table(r.file_path, r.positions[in_range], r.row_ids[in_range], r.created[in_range], r.valid_from[in_range],
                           np.full(int(in_range.sum()), r.valid_to, np.int64))
                )
    return with_purged_flag(state, pa.concat_tables(parts) if parts else POINTER_SCHEMA.empty_table())


def deletion_pointers(state: TableState, since: int, until: int) -> pa.Table:
    """Pointers to the last image of every row deleted (not updated) in ``(since, until]``.

    An image removed at version t is a delete unless an image of the same row
    id starts at t; images starting at t are live now or in the index, and
    their row ids are known from metadata alone.
    """
    removed = removed_images(state, since)
    ended = [r for r in removed if since < r.valid_to <= until]
    if not ended:
        return with_purged_flag(state, POINTER_SCHEMA.empty_table())
    versions = sorted({r.valid_to for r in ended})
    lo, hi = versions[0] - 1, versions[-1]
    starts = change_pointers_starts(state, removed, lo, hi)
    parts = []
    for r in ended:
        key = np.stack([r.row_ids, np.full(len(r), r.valid_to)], axis=1)
        updated = _rows_in(key, starts)
        gone = ~updated
        if gone.any():
            parts.append(_table(r.file_path, r.positions[gone], r.row_ids[gone], r.created[gone], r.valid_from[gone],
                                np.full(int(gone.sum()), r.valid_to, np.int64)))
    return with_purged_flag(state, pa.concat_tables(parts) if parts else POINTER_SCHEMA.empty_table())


def change_pointers_starts(state: TableState, removed: list[RemovedImages], lo: int, hi: int) -> np.ndarray:
    """``(row_id, valid_from)`` pairs of every image that starts in ``(lo, hi]``."""
    pairs = []
    for f in state.live_files():
        t = _live_pointers(f, lo, hi) if not f.deletes else _live_pointers_ignoring_deletes(f, lo, hi)
        if t is not None:
            pairs.append(np.stack([t.column("_row_id").to_numpy(), t.column("_valid_from").to_numpy()], axis=1))
    for r in removed:
        m = (r.valid_from > lo) & (r.valid_from <= hi)
        if m.any():
            pairs.append(np.stack([r.row_ids[m], r.valid_from[m]], axis=1))
    return np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)


def _live_pointers_ignoring_deletes(live: LiveFile, lo: int, hi: int) -> pa.Table | None:
    return _live_pointers(LiveFile(live.data_file, (), live.lineage), lo, hi)


def _rows_in(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """For each (row_id, version) row of ``keys``, whether it occurs in ``table``."""
    if len(table) == 0:
        return np.zeros(len(keys), bool)
    k = pa.table({"r": keys[:, 0], "v": keys[:, 1], "i": np.arange(len(keys))})
    t = pa.table({"r": table[:, 0], "v": table[:, 1]})
    hit = k.join(t, keys=["r", "v"], join_type="left semi").column("i").to_numpy()
    out = np.zeros(len(keys), bool)
    out[hit] = True
    return out


def fetch_values(pointers: pa.Table, columns: list[str]) -> pa.Table:
    """Row values at the pointed positions, in pointer order (reads only the row groups needed)."""
    if pointers.num_rows == 0:
        return pa.table({})
    order = pc.sort_indices(pointers, [("file_path", "ascending"), ("pos", "ascending")])
    sorted_ptr = pointers.take(order).select(["file_path", "pos"])
    paths = sorted_ptr.column("file_path").to_numpy(zero_copy_only=False)
    pos = sorted_ptr.column("pos").to_numpy()
    bounds = np.flatnonzero(paths[1:] != paths[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(paths)]))

    def read(span: tuple[int, int]) -> pa.Table:
        s, e = span
        return _read_positions(paths[s], pos[s:e], columns)

    with ThreadPoolExecutor(max_workers=4) as pool:
        pieces = list(pool.map(read, zip(starts, ends)))
    values = pa.concat_tables(pieces, promote_options="permissive")
    inverse = np.empty(len(order), np.int64)
    inverse[order.to_numpy()] = np.arange(len(order))
    return values.take(pa.array(inverse))


def _read_positions(path: str, positions: np.ndarray, columns: list[str]) -> pa.Table:
    pf = pq.ParquetFile(local_path(path))
    present = [c for c in columns if c in pf.schema_arrow.names]  # columns added later read as null
    sizes = np.array([pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)], np.int64)
    rg_start = np.cumsum(sizes) - sizes
    rg_of = np.searchsorted(rg_start, positions, side="right") - 1
    pieces = []
    for rg in np.unique(rg_of):
        mask = rg_of == rg
        t = pf.read_row_group(int(rg), columns=present)
        pieces.append(t.take(pa.array(positions[mask] - rg_start[rg])))
    out = pa.concat_tables(pieces)
    for c in columns:
        if c not in present:
            out = out.append_column(c, pa.nulls(out.num_rows))
    return out.select(columns)


def pointer_runs(pointers: pa.Table) -> pa.Table:
    """Compress pointers into runs: consecutive positions with consecutive row ids and equal versions.

    A run ``(file_path, pos_start, length, row_id_start, created, valid_from,
    valid_to)`` stands for ``length`` pointers. A fresh append in the range is
    one run, so shipping runs to a distributed engine costs O(runs).
    """
    if pointers.num_rows == 0:
        return pa.table({"file_path": pa.array([], pa.string()), "pos_start": pa.array([], pa.int64()), "length": pa.array([], pa.int64()),
                         "row_id_start": pa.array([], pa.int64()), "_row_created_at_version": pa.array([], pa.int64()),
                         "_valid_from": pa.array([], pa.int64()), "_valid_to": pa.array([], pa.int64())})
    p = pointers.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    path = p.column("file_path").to_numpy(zero_copy_only=False)
    pos = p.column("pos").to_numpy()
    rid = p.column("_row_id").to_numpy()
    cre = p.column("_row_created_at_version").to_numpy()
    vf = p.column("_valid_from").to_numpy()
    vt_col = p.column("_valid_to")
    vt = vt_col.fill_null(-1).to_numpy()
    pur = p.column("_purged").to_numpy(zero_copy_only=False) if "_purged" in p.column_names else np.zeros(len(pos), bool)
    same = (path[1:] == path[:-1]) & (pos[1:] == pos[:-1] + 1) & (rid[1:] == rid[:-1] + 1) & (cre[1:] == cre[:-1]) & (vf[1:] == vf[:-1]) & (vt[1:] == vt[:-1])
    same &= pur[1:] == pur[:-1]
    starts = np.concatenate(([0], np.flatnonzero(~same) + 1))
    lengths = np.diff(np.concatenate((starts, [len(pos)])))
    vt_runs = pa.array(vt[starts], pa.int64())
    vt_runs = pc.if_else(pc.equal(vt_runs, -1), pa.nulls(len(starts), pa.int64()), vt_runs)
    out = pa.table(
        {
            "file_path": pa.array(path[starts], pa.string()),
            "pos_start": pa.array(pos[starts], pa.int64()),
            "length": pa.array(lengths, pa.int64()),
            "row_id_start": pa.array(rid[starts], pa.int64()),
            "_row_created_at_version": pa.array(cre[starts], pa.int64()),
            "_valid_from": pa.array(vf[starts], pa.int64()),
            "_valid_to": vt_runs,
        }
    )
    if "_purged" in p.column_names:
        out = out.append_column("_purged", pa.array(pur[starts], pa.bool_()))
    return out
