"""A commit's key index delta segment built in bounded memory, for commits that add or remove many keys.

The delta segment of a commit (level 0, sorted by key hash) holds an entry
for every live row of the data files it adds and a tombstone for every key
it removes without adding it again. Built in memory
(:func:`index.key_index.delta_segment`) it costs about 160 bytes per key at
its peak, so a commit removing or rewriting millions of rows grew by
hundreds of MB for it. When the planner knows which removed keys no new
row has (``KeyIndexChange.tombstones``: a delete's removed keys; none for an
update that keeps every key), :func:`spooled_delta` builds the same segment
with the bounded build of :mod:`index.key_build`: the entries of one new
data file at a time (in slices of :data:`CHUNK_ROWS`) and the tombstones in
slices become fixed-width records, kept in memory up to
:data:`DELTA_BUDGET` bytes and spilled to temporary files in hash ranges
beyond it, then written range by range. A key that is both an entry and a
tombstone, or twice an entry, is refused as the in-memory build refuses it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile

import index.key_build as key_build
from index.key_entries import file_entries
from index.key_segment import Segment
from index.key_store import INT_ENTRIES
from lineage.storage.metadata import FileLineage

if TYPE_CHECKING:
    from index.key_index import KeyIndex

DELTA_BUDGET = 8 << 20  # record bytes a delta holds in memory before it spills
CHUNK_ROWS = 65_536  # entries turned into records at a time (each chunk is sorted into hash ranges: copies of it)
SPOOL_ROWS = 131_072  # deltas of more entries and tombstones than this are built here, smaller ones in memory


def spools(written: Sequence[FileLineage], tombstones: pa.Table | None) -> bool:
    """Whether a delta of the rows of ``written`` and ``tombstones`` is large enough to be built by :func:`spooled_delta`."""
    return tombstones is not None and sum(fl.record_count for fl in written) + tombstones.num_rows > SPOOL_ROWS


def spooled_delta(
    io: FileIO, index: KeyIndex, written: Sequence[FileLineage], delete_files: Sequence[DataFile], known: Mapping[str, pa.Table],
    tombstones: pa.Table, *, base: bool, budget: int = DELTA_BUDGET,
) -> Segment | None:
    """The delta segment of a commit adding the live rows of ``written`` (less those its ``delete_files`` remove) and
    removing the keys ``tombstones``; with ``base`` (no older segment) a base of the entries alone. None when empty."""
    tombstones = tombstones if not base else tombstones.schema.empty_table()
    rows = sum(fl.record_count for fl in written) + tombstones.num_rows
    if not rows:
        return None
    max_pos = max((fl.record_count for fl in written), default=0)
    max_version = max([0] + [int(r.values.max()) for fl in written for r in (fl.created, fl.updated) if len(r)])
    paths = [fl.file_path for fl in written]
    chunks = _chunks(io, index, written, delete_files, known, tombstones)
    return key_build.spooled_base(index.key, paths, chunks, rows=rows, max_pos=max_pos, max_version=max_version, budget=budget,
                                  level=0, base=base)


def _chunks(
    io: FileIO, index: KeyIndex, written: Sequence[FileLineage], delete_files: Sequence[DataFile], known: Mapping[str, pa.Table],
    tombstones: pa.Table,
) -> Iterator[key_build.EntryChunk]:
    for i, fl in enumerate(written):
        entries = file_entries(io, index, [fl], delete_files, known)
        for start in range(0, entries.num_rows, CHUNK_ROWS):
            yield key_build.entry_chunk(entries.slice(start, CHUNK_ROWS), index.names, i)
        del entries
    for start in range(0, tombstones.num_rows, CHUNK_ROWS):
        keys = index.conform_keys(tombstones.slice(start, CHUNK_ROWS))
        m = keys.num_rows
        yield key_build.EntryChunk(keys, np.full(m, key_build.TOMBSTONE_FILE, np.int32), {c: np.zeros(m, np.int64) for c in INT_ENTRIES})
