"""Deletes on Iceberg v3 tables: one deletion vector per data file, merged with the file's current deletes.

In v3 no position delete file may be added; a delete is a deletion vector (a
``deletion-vector-v1`` blob in a Puffin file, :mod:`lineage.storage.puffin`),
at most one per data file in a snapshot. So a commit that deletes rows of a
data file writes a new vector holding the file's earlier deleted positions
(its current vector, and any position delete file of the table's v2 past)
plus the new ones, and removes the vector it replaces.

The vectors of one commit share one Puffin file (as Iceberg Java writes
them). Each vector's manifest entry records ``referenced_data_file``,
``content_offset`` and ``content_size_in_bytes`` (the v3 fields), and also the
referenced path as the lower and upper bound of the reserved ``file_path``
field (2147483546), the metrics a position delete file scoped to one data file
has: readers that plan by bounds (this library's planner, which reads manifests
with pyiceberg's v2 schema) pair the vector with its one data file. Since a
Puffin file holds several vectors, a vector leaves the snapshot by entry, not
by path: :func:`vector_removal` names it by its Puffin file and referenced data
file, and the commit removes that entry only.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.locations import load_location_provider
from pyiceberg.types import StringType
from pyroaring import BitMap

import lineage.storage.manifests_v3 as manifests_v3
import lineage.storage.puffin as puffin
from lineage.storage.writer import spec_id_of
from lineage.storage.deletes import PATH_FIELD_ID, is_puffin, positions_for, read_position_deletes, referenced_data_path, remember_vectors


@dataclass(frozen=True)
class VectorTarget:
    """Positions to delete from one data file, and the delete files that apply to it now."""

    data_file: DataFile
    positions: np.ndarray
    current: Sequence[DataFile] = ()


def vector_removal(delete_file: DataFile, data_path: str) -> DataFile:
    """What a commit removes to drop the vector of ``data_path`` held in ``delete_file``'s Puffin file (that entry only)."""
    return manifests_v3.as_v3(delete_file, referenced_data_file=data_path)


def is_vector_removal(delete_file: DataFile) -> bool:
    """Whether a removed file names one vector of a Puffin file (see :func:`vector_removal`)."""
    return manifests_v3.is_deletion_vector(delete_file) and manifests_v3.referenced_data_file(delete_file) is not None


def vectors_of(data_paths: set[str], deletes: Sequence[DataFile]) -> list[DataFile]:
    """The delete entries that leave with the data files ``data_paths``: their vectors, and position delete files scoped to one of them.

    A position delete file naming other data files too stays (a vector
    supersedes it for this file: readers ignore position delete files where a
    vector applies, and this library's readers take the union, which a new
    vector contains). A vector is named by its Puffin file and its data file
    (:func:`vector_removal`); one without ``file_path`` bounds (another
    engine's) is found by reading its Puffin file.
    """
    out = []
    for d in deletes:
        if d.content != DataFileContent.POSITION_DELETES:
            continue
        target = referenced_data_path(d)
        if not is_puffin(d.file_path):
            if target in data_paths:
                out.append(d)
        elif target is not None:
            if target in data_paths:
                out.append(vector_removal(d, target))
        else:
            out.extend(vector_removal(d, p) for p in sorted(data_paths & read_position_deletes(d.file_path).keys()))
    return out


def replaced_by_vector(data_path: str, current: Sequence[DataFile]) -> list[DataFile]:
    """The delete entries a new vector of ``data_path`` replaces (see :func:`vectors_of`)."""
    return vectors_of({data_path}, current)


def write_vectors(iceberg: IcebergTable, targets: Sequence[VectorTarget]) -> tuple[list[DataFile], list[DataFile]]:
    """Write one deletion vector per target; return the new delete-file entries and the delete files they replace.

    Each vector holds the target's positions and every position the file's
    ``current`` delete files remove. Targets without positions are skipped.
    """
    metadata = iceberg.metadata
    vectors: list[tuple[str, np.ndarray | BitMap]] = []
    arrays: dict[str, np.ndarray] = {}
    data_files: list[DataFile] = []
    replaced: list[DataFile] = []
    for t in targets:
        path = t.data_file.file_path
        new = np.asarray(t.positions, np.int64)
        if len(new) == 0:
            continue
        current = [d for d in t.current if d.content == DataFileContent.POSITION_DELETES]
        kept = _BITMAPS.current(path, current) if new.min() >= 0 and new.max() < 1 << 32 else None
        if kept is not None:  # the file's vector as this process wrote it: the new positions added, nothing read or sorted
            bitmap = kept.copy()
            bitmap.update(new.astype(np.uint32))
            bitmap.run_optimize()
            vectors.append((path, bitmap))
            arrays[path] = np.frombuffer(bitmap.to_array(), np.uint32).astype(np.int64)
        else:
            arrays[path] = merge_positions(positions_for(path, [d.file_path for d in current]), new)
            small = len(arrays[path]) == 0 or arrays[path][-1] < 1 << 32
            vectors.append((path, puffin.bitmap_of(arrays[path]) if small else arrays[path]))
        data_files.append(t.data_file)
        replaced.extend(replaced_by_vector(path, t.current))
    if not vectors:
        return [], []
    provider = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
    location = provider.new_data_location(f"{uuid.uuid4()}-dv.puffin")
    blobs = puffin.write_deletion_vectors(iceberg.io, location, vectors)
    remember_vectors(location, arrays)
    _BITMAPS.keep(location, [(p, v) for p, v in vectors if isinstance(v, BitMap)])
    return [vector_entry(b, f, metadata.default_spec_id) for b, f in zip(blobs, data_files, strict=True)], replaced


@dataclass
class _KeptBitmaps:
    """The bitmaps of the deletion vectors this process wrote last, by (Puffin file, data file), for the next commit
    that deletes from the same file: a file's vector grows by the few positions of each commit, and adding them to
    the kept bitmap costs microseconds where decoding, merging and encoding a large vector costs milliseconds."""

    size: int = 256
    _entries: OrderedDict[tuple[str, str], BitMap] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def current(self, data_path: str, current: Sequence[DataFile]) -> BitMap | None:
        """The bitmap of ``data_path``'s current vector (``current``: its position deletes now) if this process kept
        it, an empty one when the file has no deletes yet, else None. Never to be changed: copy it."""
        if not current:
            return BitMap()
        if len(current) != 1 or not is_puffin(current[0].file_path) or referenced_data_path(current[0]) != data_path:
            return None
        with self._lock:
            return self._entries.pop((current[0].file_path, data_path), None)

    def keep(self, puffin_path: str, vectors: Sequence[tuple[str, BitMap]]) -> None:
        """Keep the bitmaps just written to ``puffin_path`` (the oldest leave once more than ``size`` are kept)."""
        with self._lock:
            for data_path, bitmap in vectors:
                self._entries[(puffin_path, data_path)] = bitmap
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


_BITMAPS = _KeptBitmaps()


def merge_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Sorted unique positions of ``old`` (sorted unique already: a file's current vector) and ``new``.

    Linear in ``old`` (a search and one insert), where a union sorts both: the
    vector of a large file grows commit after commit while each commit adds few.
    """
    new = np.unique(np.asarray(new, np.int64))
    old = np.asarray(old, np.int64)
    if len(old) == 0:
        return new
    at = np.searchsorted(old, new)
    fresh = (at == len(old)) | (old[np.minimum(at, len(old) - 1)] != new)
    return np.insert(old, at[fresh], new[fresh])


def vector_entry(blob: puffin.DeletionVectorBlob, data_file: DataFile, default_spec_id: int) -> DataFile:
    """The delete-file manifest entry of one deletion vector of ``data_file`` (same partition and spec)."""
    bound = to_bytes(StringType(), blob.referenced_data_file)
    # The v3 data_file struct in field order (DATA_FILE_TYPE[3]): built positionally, as a commit builds one per vector.
    out = DataFile(
        DataFileContent.POSITION_DELETES, blob.path, FileFormat.PUFFIN, data_file.partition, blob.record_count,
        blob.file_size_in_bytes,
        None, None, None, None,  # column sizes, value counts, null and NaN value counts
        {PATH_FIELD_ID: bound}, {PATH_FIELD_ID: bound},  # lower and upper bounds of file_path: the one data file
        None, None, None, None,  # key metadata, split offsets, equality ids, sort order id
        None, blob.referenced_data_file, blob.content_offset, blob.content_size_in_bytes,  # first_row_id (none: a delete file)
    )
    out.spec_id = spec_id_of(data_file, default_spec_id)
    return out
