"""Reading Iceberg position delete files: which positions of which data file they remove.

Every reader of position deletes (the change feed's pointers, compaction,
purge, verify) goes through :func:`read_position_deletes`, which parses a
delete file once and caches the result by path (delete files are immutable
and their names are unique). A Puffin file of deletion vectors (Iceberg v3)
reads the same way: referenced data file -> positions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent

import lineage.storage.manifests_v3 as manifests_v3
from lineage.storage.fileio import ImmutableFileCache
import lineage.storage.puffin as puffin
import lineage.storage.files as store

PATH_FIELD_ID = 2147483546  # the spec's reserved field id of a position delete file's file_path

_EMPTY = np.zeros(0, np.int64)
_EMPTY.setflags(write=False)
# Parsed delete files, bounded by the positions held (8M: 64 MiB of positions). A change stream with
# partition-scoped deletes has hundreds of live delete files that every read of a data file consults.
_CACHE: ImmutableFileCache[dict[str, np.ndarray]] = ImmutableFileCache(
    8_000_000, weigh=lambda parsed: 1 + sum(len(a) for a in parsed.values()), max_share=0.5
)


def read_position_deletes(path: str, local: str | None = None) -> dict[str, np.ndarray]:
    """Data file path -> sorted unique positions removed by the position delete file at ``path`` (read from ``local``,
    a copy fetched beforehand, when given and not cached)."""
    return _CACHE.get(path, lambda: _read(local or path))


def forget() -> None:
    """Drop the parsed delete files (a benchmark measuring a reader in another process calls it)."""
    _CACHE.clear()


def _read(path: str) -> dict[str, np.ndarray]:
    if is_puffin(path):  # Iceberg v3 deletion vectors (lineage.storage.deletion_vectors writes one per file)
        out = puffin.read_puffin_deletion_vectors(_StoreIO(), path)
        for arr in out.values():
            arr.setflags(write=False)
        return out
    # Read synchronously (no dataset scanner): most of these files are small. The paths come dictionary-encoded
    # (one string per data file, an int32 per row): a commit's delete file spanning every data file of a 100M-row
    # table held 782,207 rows, and a Python string per row cost ~150 MB at the peak of each read.
    table = pq.ParquetFile(store.source(path), read_dictionary=["file_path"]).read(columns=["file_path", "pos"], use_threads=False)
    if table.num_rows == 0:
        return {}
    column = table.column("file_path").unify_dictionaries()  # a dictionary per row group, made one
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in column.chunks])
    # each dictionary entry's rank among the distinct paths: groups come in path order, as the paths name them
    names, rank = np.unique(np.array(column.chunk(0).dictionary.to_pylist(), dtype=object), return_inverse=True)
    ranks = rank[codes]
    pos = table.column("pos").to_numpy()
    order = np.lexsort((pos, ranks))
    ranks, pos = ranks[order], pos[order]
    bounds = np.flatnonzero(ranks[1:] != ranks[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(ranks)]))
    out = {str(names[ranks[s]]): np.unique(pos[s:e]) for s, e in zip(starts, ends, strict=True)}
    for arr in out.values():
        arr.setflags(write=False)  # shared by every caller through the cache
    return out


class _StoreIO:
    """The part of a pyiceberg FileIO the Puffin reader uses, over :mod:`lineage.storage.files` (any registered store)."""

    def new_input(self, path: str) -> _StoreIO:
        self._path = path
        return self

    def open(self):  # type: ignore[no-untyped-def]
        return store.open_input(self._path) if store.is_remote(self._path) else open(store.local_path(self._path), "rb")


def vector_table(paths: Sequence[str], data_paths: Collection[str] | None = None) -> pa.Table:
    """(file_path, pos) rows of every deletion vector in the Puffin files ``paths``, as a position delete file has them;
    with ``data_paths``, of the vectors of those data files only (a commit's Puffin file holds the vectors of every
    file it deleted from, a large file's among them)."""
    names: list[str] = []
    parts: list[np.ndarray] = []
    for p in paths:
        for data_path, pos in read_position_deletes(p).items():
            if data_paths is not None and data_path not in data_paths:
                continue
            names.append(data_path)
            parts.append(pos)
    if not parts:
        return pa.table({"file_path": pa.array([], pa.string()), "pos": pa.array([], pa.int64())})
    which = np.repeat(np.arange(len(parts), dtype=np.int32), [len(p) for p in parts])
    file_path = pa.DictionaryArray.from_arrays(pa.array(which, pa.int32()), pa.array(names, pa.string())).cast(pa.string())
    return pa.table({"file_path": file_path, "pos": pa.array(np.concatenate(parts), pa.int64())})


def remember_vectors(path: str, vectors: dict[str, np.ndarray]) -> None:
    """Keep the vectors of a Puffin file this process just wrote, so reading them back costs nothing."""
    for arr in vectors.values():
        arr.setflags(write=False)
    _CACHE.get(path, lambda: vectors)


def is_puffin(path: str) -> bool:
    """Whether a delete file is a Puffin file of deletion vectors (Iceberg v3) rather than a Parquet position delete file."""
    return path.endswith(".puffin")


def positions_for(data_path: str, delete_paths: list[str], copies: Mapping[str, str] | None = None) -> np.ndarray:
    """Sorted unique positions of ``data_path`` removed by any of ``delete_paths`` (``copies``: local copies of remote
    delete files, read instead when a file is not parsed yet)."""
    copies = copies or {}
    parts = [read_position_deletes(p, copies.get(p)).get(data_path, _EMPTY) for p in delete_paths]
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
    named = manifests_v3.referenced_data_file(delete_file)
    if named is not None:
        return named
    lo = (delete_file.lower_bounds or {}).get(PATH_FIELD_ID)
    hi = (delete_file.upper_bounds or {}).get(PATH_FIELD_ID)
    return lo.decode() if lo and lo == hi else None


def delete_identity(delete_file: DataFile) -> tuple[str, tuple[int, int] | None]:
    """What names one delete-file entry: its path, and for a deletion vector its blob's range in the Puffin file.

    One Puffin file holds the vectors of several data files, each its own
    entry: removing one vector must not remove the others (``DataFile``
    compares by path alone).
    """
    return delete_file.file_path, manifests_v3.content_range(delete_file)


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
