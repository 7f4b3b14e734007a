"""Key index entries of the rows of data files: what a commit's new files (or a build's files) add to the index.

:func:`file_entries` gives the entry of every live row of some data files
(key columns read by name or handed over, lineage decoded from the files'
runs, positions the commit's own position deletes remove left out);
:mod:`index.key_index` builds segments from them.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent

from index.key_segment import CREATED, POS, ROW_ID, UPDATED, entry_schema
from lineage.errors import LineageMetadataError
from lineage.storage.deletes import PATH_FIELD_ID, read_position_deletes
from lineage.storage.metadata import FileLineage
from lineage.storage.rle import decode_sequence, decode_values
import lineage.storage.written_keys as written_keys

if TYPE_CHECKING:
    from index.key_index import KeyIndex


def file_entries(
    io: FileIO, index: KeyIndex, written: Sequence[FileLineage], delete_files: Sequence[DataFile], known: Mapping[str, pa.Table],
    narrow: bool = False,
) -> pa.Table:
    """Entries for the rows of data files (a commit's new files, or live files without delete files) that
    ``delete_files`` (position deletes) leave live: key columns read by name (or taken from ``known``),
    lineage decoded from the files' runs. ``narrow``: integer columns whose values fit come as int32
    (what :func:`make_segment` stores; a build of 10M entries then writes half the bytes)."""
    schema = entry_schema(index.key)
    if not written:
        return schema.empty_table()
    dead = _deleted_now([fl.file_path for fl in written], delete_files)
    key_parts: list[pa.Table] = []
    ints: dict[str, list[np.ndarray]] = {ROW_ID: [], POS: [], CREATED: [], UPDATED: []}
    file_ids: list[np.ndarray] = []
    for i, fl in enumerate(written):
        keys = known.get(fl.file_path)
        if keys is None:
            keys = read_file_keys(io, fl.file_path, index.names)
        if keys.num_rows != fl.record_count:
            raise LineageMetadataError(f"{fl.file_path} has {keys.num_rows} rows, its lineage {fl.record_count}")
        keys = index.conform_keys(keys)
        gone = dead.get(fl.file_path)
        if gone is None:  # every row is live: no gather
            pos = np.arange(fl.record_count, dtype=np.int64)
            key_parts.append(keys)
            ints[ROW_ID].append(decode_sequence(fl.row_ids))
            ints[CREATED].append(decode_values(fl.created))
            ints[UPDATED].append(decode_values(fl.updated))
        else:
            keep = np.ones(fl.record_count, bool)
            keep[gone[gone < fl.record_count]] = False
            pos = np.flatnonzero(keep)
            key_parts.append(keys.take(pa.array(pos)))
            ints[ROW_ID].append(decode_sequence(fl.row_ids)[pos])
            ints[CREATED].append(decode_values(fl.created)[pos])
            ints[UPDATED].append(decode_values(fl.updated)[pos])
        ints[POS].append(pos)
        file_ids.append(np.full(len(pos), i, np.int32))
    # The file path as a dictionary (one string per file, not per row): segments store it that way.
    files = pa.DictionaryArray.from_arrays(pa.array(np.concatenate(file_ids), pa.int32()), pa.array([fl.file_path for fl in written], pa.string()))
    keys = pa.concat_tables(key_parts)

    def joined(name: str) -> pa.Array:
        parts = ints[name]
        fits = narrow and all(not len(p) or (int(p.min()) >= _INT32.min and int(p.max()) <= _INT32.max) for p in parts)
        dtype = np.int32 if fits else np.int64
        if len(parts) == 1:
            return pa.array(parts[0].astype(dtype, copy=False))
        return pa.array(np.concatenate(parts, dtype=dtype))

    columns = [keys.column(k.name) for k in index.key] + [joined(ROW_ID), files] + [joined(c) for c in (POS, CREATED, UPDATED)]
    return pa.Table.from_arrays(columns, names=schema.names)


_INT32 = np.iinfo(np.int32)


def read_file_keys(io: FileIO, path: str, names: list[str]) -> pa.Table:
    """Key columns of a data file a commit writes (by name: it was written with the current schema); from memory when
    this process wrote the file (:mod:`lineage.storage.written_keys`)."""
    kept = written_keys.known(path, names)
    if kept is not None:
        return kept
    with io.new_input(path).open() as f:
        return pq.ParquetFile(f).read(columns=names, use_threads=False)


def _deleted_now(paths: list[str], delete_files: Sequence[DataFile]) -> dict[str, np.ndarray]:
    """Positions of ``paths`` removed by the commit's own position delete files."""
    wanted = set(paths)
    ordered = sorted(wanted)
    out: dict[str, np.ndarray] = {}
    for d in delete_files:
        if d.content != DataFileContent.POSITION_DELETES:
            continue
        lo = (d.lower_bounds or {}).get(PATH_FIELD_ID)
        hi = (d.upper_bounds or {}).get(PATH_FIELD_ID)
        if lo is not None and hi is not None:
            first = bisect.bisect_left(ordered, lo.decode())
            if first == len(ordered) or ordered[first] > hi.decode():
                continue  # no new file's path is in its path range (most delete files name one data file)
        for p, pos in read_position_deletes(d.file_path).items():
            if p in wanted:
                out[p] = np.union1d(out.get(p, np.zeros(0, np.int64)), pos)
    return out
