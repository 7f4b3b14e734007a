"""Reading Iceberg position delete files: which positions of which data file they remove.

Every reader of position deletes (the change feed's pointers, compaction,
purge, verify) goes through :func:`read_position_deletes`, which parses a
delete file once and caches the result by path (delete files are immutable
and their names are unique).
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent

import lineage.iceberg.v3_manifests as v3_manifests
import lineage.storage.puffin as puffin
from lineage.storage.fileio import ImmutableFileCache
import lineage.storage.files as store

PATH_FIELD_ID = 2147483546  # the spec's reserved field id of a position delete file's file_path

_EMPTY = np.zeros(0, np.int64)
_EMPTY.setflags(write=False)
# Parsed delete files, bounded by the positions held (8M: 64 MiB of positions). A change stream with
# partition-scoped deletes has hundreds of live delete files that every read of a data file consults.
_CACHE: ImmutableFileCache[dict[str, np.ndarray]] = ImmutableFileCache(
    8_000_000, weigh=lambda parsed: 1 + sum(len(a) for a in parsed.values()), max_share=0.5
)


def read_position_deletes(path: str) -> dict[str, np.ndarray]:
    """Data file path -> sorted unique positions removed by the position delete file at ``path``."""
    return _CACHE.get(path, lambda: _read(path))


def _read(path: str) -> dict[str, np.ndarray]:
    if path.endswith(".puffin"):  # deletion vectors (Iceberg v3): one blob per data file
        return puffin.read_puffin_deletion_vectors(None, path)
    # Read synchronously (no dataset scanner): these files are small and many.
    table = pq.ParquetFile(store.source(path)).read(columns=["file_path", "pos"], use_threads=False)
    paths = table.column("file_path").to_numpy(zero_copy_only=False)
    pos = table.column("pos").to_numpy()
    if len(paths) == 0:
        return {}
    order = np.lexsort((pos, paths))
    paths, pos = paths[order], pos[order]
    bounds = np.flatnonzero(paths[1:] != paths[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(paths)]))
    out = {str(paths[s]): np.unique(pos[s:e]) for s, e in zip(starts, ends, strict=True)}
    for arr in out.values():
        arr.setflags(write=False)  # shared by every caller through the cache
    return out


def positions_for(data_path: str, delete_paths: list[str]) -> np.ndarray:
    """Sorted unique positions of ``data_path`` removed by any of ``delete_paths``."""
    parts = [read_position_deletes(p).get(data_path, _EMPTY) for p in delete_paths]
    parts = [p for p in parts if len(p)]
    if not parts:
        return _EMPTY
    return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))


def live_positions(record_count: int, dead: np.ndarray) -> np.ndarray:
    """Sorted positions ``0..record_count-1`` not in ``dead`` (a mask: linear, where a set difference sorts)."""
    keep = np.ones(record_count, bool)
    dead = np.asarray(dead, np.int64)
    keep[dead[(dead >= 0) & (dead < record_count)]] = False
    return np.flatnonzero(keep).astype(np.int64, copy=False)


def referenced_data_path(delete_file: DataFile) -> str | None:
    """The single data file a file-scoped position delete file or a deletion vector applies to.

    From ``referenced_data_file`` (v3 manifests; always set for a deletion
    vector), else from the file's ``file_path`` bounds.
    """
    if delete_file.content != DataFileContent.POSITION_DELETES:
        return None
    named = v3_manifests.referenced_data_file(delete_file)
    if named is not None:
        return named
    lo = (delete_file.lower_bounds or {}).get(PATH_FIELD_ID)
    hi = (delete_file.upper_bounds or {}).get(PATH_FIELD_ID)
    return lo.decode() if lo and lo == hi else None


def path_in_bounds(delete_file: DataFile, data_path: str) -> bool:
    """Whether ``data_path`` lies within the ``file_path`` bounds of a position delete file (True without bounds).

    Bounds are UTF-8 bytes, and byte order is the spec's string order, so a
    truncated bound still brackets every path the file names.
    """
    lo = (delete_file.lower_bounds or {}).get(PATH_FIELD_ID)
    hi = (delete_file.upper_bounds or {}).get(PATH_FIELD_ID)
    if lo is None and hi is None:
        return True
    raw = data_path.encode()
    return (lo is None or lo <= raw) and (hi is None or raw <= hi)
