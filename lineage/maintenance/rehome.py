"""Re-home pinned images: copy the few still-needed deleted images out of big files.

A data file that left the snapshot stays on disk while the deleted-rows index
points into it. When only a small fraction of its rows are still needed, the
needed images are copied (values and all) into a compact archive file owned
by the index, the index segments are re-pointed to it in one commit, and the
big file is released for the next vacuum. Work is done in batches of files
so memory stays bounded. Images whose values an index segment captured pin
nothing and are left alone.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.table.snapshots import Operation

from index.deleted_rows import read_index, read_index_segment, write_index_segment
from lineage.commits.commit import CommitRequest
from lineage.context import HasContext, TableContext, context_of
from lineage.errors import InvalidArgumentError
from lineage.storage.fileio import local_path, write_parquet
from lineage.maintenance._common import MaintenanceResult, commit_with_retries
from lineage.storage.metadata import LineageList, index_dir
from lineage.retention import window
from lineage.state import TableState
from lineage.read.values import read_at, with_field_ids
import lineage.storage.files as store

ARCHIVE_FORMAT = "deleted-rows-archive"


def archive_table(values: pa.Table, field_ids: dict[str, int]) -> pa.Table:
    """Archived images as written: columns carry their Iceberg field ids (renames keep them readable), format tag."""
    return with_field_ids(values, field_ids).replace_schema_metadata({"lineage.format": ARCHIVE_FORMAT, "lineage.format-version": "1"})


def snapshot_data_paths(state: TableState) -> set[str]:
    """Local paths of data files referenced by any retained snapshot."""
    out: set[str] = set()
    io = state.iceberg.io
    for snap in state.iceberg.metadata.snapshots:
        for manifest in snap.manifests(io):
            if manifest.content == 0:
                out.update(local_path(e.data_file.file_path) for e in manifest.fetch_manifest_entry(io, discard_deleted=True))
    return out


def repoint(state: TableState, mapping: dict[str, tuple[str, dict[int, int] | None]], oldest: int, tag: str, created: list[str],
            erase: np.ndarray | None = None):  # type: ignore[no-untyped-def]
    """Rewrite the retained index segments whose entries point into ``mapping``'s files.

    ``mapping`` maps an old file path to ``(new path, old position -> new
    position)`` (``None``: positions unchanged). ``erase`` (row ids) also
    rewrites segments that captured values of those rows, with the values
    nulled. Captured values move with their entries. Returns a function that
    applies the new segment paths to a lineage list.
    """
    replaced: dict[int, str] = {}
    for c in state.lineage.log.since(oldest):
        if not c.index:
            continue
        entries = read_index_segment(state.iceberg.io, c.index, with_values=True)
        hit = [np.isin(e.row_ids, erase) if erase is not None and e.values is not None else None for e in entries]
        if not any(e.file_path in mapping for e in entries) and not any(h is not None and h.any() for h in hit):
            continue
        new_entries = []
        for e, h in zip(entries, hit, strict=True):
            if h is not None and h.any():
                e = dataclasses.replace(e, values=_null_rows(e.values, h))
            if e.file_path not in mapping:
                new_entries.append(e)
                continue
            new_path, positions = mapping[e.file_path]
            if positions is not None and e.values is not None and not all(int(p) in positions for p in e.positions):
                # Captured values: the entry needs no file, and the archive (built from entries without values) lacks its rows.
                new_entries.append(e)
                continue
            new_pos = e.positions if positions is None else np.array([positions[int(p)] for p in e.positions], np.int64)
            order = np.argsort(new_pos, kind="stable")
            new_entries.append(e.take(order, new_path, new_pos[order]))
        path = f"{index_dir(state.iceberg.metadata.location)}/{c.version:09d}-{tag}-deleted-rows.parquet"
        created.append(path)
        write_index_segment(state.iceberg.io, path, new_entries)
        replaced[c.version] = path

    def transform(lst: LineageList) -> LineageList:
        return lst.replace_commits(lambda c: dataclasses.replace(c, index=replaced[c.version]) if c.version in replaced else c)

    return transform, replaced


def _null_rows(values: pa.Table, mask: np.ndarray) -> pa.Table:
    """Captured values with the rows where ``mask`` is true erased (null)."""
    keep = pa.array(~mask)
    return pa.Table.from_arrays([pc.if_else(keep, c, pa.nulls(len(mask), c.type)) for c in values.columns], names=values.column_names)


def rehome(table: TableContext | HasContext, max_live_fraction: float = 0.1, max_files: int = 64) -> MaintenanceResult:
    """Move still-needed images out of pinned files where they are at most ``max_live_fraction`` of the rows."""
    table = context_of(table)

    if not 0 < max_live_fraction <= 1:
        raise InvalidArgumentError(f"max_live_fraction must be in (0, 1], got {max_live_fraction!r}")
    schema = table.arrow_schema
    stats: dict[str, int] = {}

    def plan(state: TableState, created: list[str]) -> CommitRequest | None:
        oldest = window(state).oldest
        in_snapshots = snapshot_data_paths(state)
        needed: dict[str, list[np.ndarray]] = defaultdict(list)
        for c in state.lineage.log.since(oldest):
            if c.index:
                seg = read_index(state.iceberg.io, c.index)
                if seg.captured:  # its values are in the segment: the files it names are not pinned
                    continue
                for e in seg.entries():
                    if local_path(e.file_path) not in in_snapshots:
                        needed[e.file_path].append(e.positions)
        chosen = []
        for path, parts in needed.items():
            rows = pq.ParquetFile(store.source(path)).metadata.num_rows
            count = len(np.unique(np.concatenate(parts)))
            if count <= max_live_fraction * rows and count < rows:
                chosen.append((path, np.unique(np.concatenate(parts)), rows))
        chosen = chosen[:max_files]
        if not chosen:
            return None
        field_ids = {f.name: f.field_id for f in state.iceberg.schema().fields}
        values = read_at([p for p, _, _ in chosen], np.repeat(np.arange(len(chosen)), [len(pos) for _, pos, _ in chosen]),
                         np.concatenate([pos for _, pos, _ in chosen]), schema, field_ids, cache=False)
        tag = str(uuid.uuid4())
        archive = f"{index_dir(state.iceberg.metadata.location)}/archive-{tag}.parquet"
        created.append(archive)
        size = write_parquet(state.iceberg.io, archive, archive_table(values, field_ids))
        mapping: dict[str, tuple[str, dict[int, int] | None]] = {}
        offset = 0
        for path, pos, _ in chosen:
            mapping[path] = (archive, {int(p): offset + i for i, p in enumerate(pos)})
            offset += len(pos)
        transform, replaced = repoint(state, mapping, oldest, tag, created)
        stats.update(files=len(chosen), rows=int(offset), size=size, released=sum(r for _, _, r in chosen), segments=len(replaced))
        return CommitRequest("rehome", Operation.REPLACE, transform_list=transform)

    _, result = commit_with_retries(table, plan, "rehome")
    if result is None:
        return MaintenanceResult("rehome", None, detail="no pinned file is sparse enough to re-home")
    return MaintenanceResult(
        "rehome", result.version, files_added=1, bytes_added=stats["size"],
        detail=f"copied {stats['rows']} image(s) out of {stats['files']} file(s) holding {stats['released']} rows; "
        f"re-pointed {stats['segments']} index segment(s); run vacuum to delete the released files",
    )
