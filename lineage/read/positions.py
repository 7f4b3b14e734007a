"""Column values of data files at given row positions, reading only the row groups that hold them.

The key index names each live image by (data file, position). When a write
needs the images' values (strict-mode ``-U`` checks), reading whole data files
would cost as much as a scan of the table; instead each file's Parquet footer
(cached per file: data files are immutable) says which row groups hold the
positions, and only those row groups and only the asked columns are decoded.
Decoded column chunks are kept in the process's decoded row-group cache
(:mod:`lineage.decoded_cache`, shared with the change feed's reader), so a
stream that commits every few seconds from one process does not decode the
same row groups again at every commit.

No delete files are read: the positions come from the key index, which only
names live images.

Columns are matched as the table's scans match them (:func:`lineage.read.scan.register_live_view`):
by name while every schema of the table names and types the columns as the
current one does, otherwise by Iceberg field id (a column the file lacks
reads as null, a promoted type is cast). :func:`values_at` returns None
when it cannot read the files this way (not local files, nested columns on
an evolved schema, a file without field ids); the caller then scans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lineage.decoded_cache as decoded_cache
from lineage.read.values import layout, row_group_columns
from lineage.storage.fileio import local_path


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def values_at(
    paths: Sequence[str],
    file_ids: np.ndarray,
    positions: np.ndarray,
    schema: pa.Schema,
    field_ids: dict[str, int] | None,
) -> pa.Table | None:
    """The ``schema`` columns of row ``positions[i]`` of data file ``paths[file_ids[i]]``, row for row.

    ``field_ids`` (column name -> Iceberg field id) as from
    :func:`lineage.schema.projection_field_ids`: None reads columns by name.
    Returns None when the files cannot be read this way (the caller scans).
    """
    if not all(_is_local(p) for p in paths):
        return None
    if field_ids is not None and any(pa.types.is_nested(f.type) for f in schema):
        return None
    file_ids = np.asarray(file_ids, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    order = np.lexsort((positions, file_ids))
    parts: list[pa.Table] = []
    bounds = np.searchsorted(file_ids[order], np.arange(len(paths) + 1))
    with decoded_cache.CACHE.read() as read:
        for i, path in enumerate(paths):
            rows = order[bounds[i] : bounds[i + 1]]
            if len(rows):
                part = _file_values(local_path(path), positions[rows], schema, field_ids, read)
                if part is None:
                    return None
                parts.append(part)
    if not parts:
        return schema.empty_table()
    # ``parts`` follow ``order``; put the rows back in the caller's order.
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order))
    return pa.concat_tables(parts).take(pa.array(inverse))


def _file_values(path: str, positions: np.ndarray, schema: pa.Schema, field_ids: dict[str, int] | None, read: int | None) -> pa.Table | None:
    """Values at sorted ``positions`` of one file."""
    info = layout(path)
    if field_ids is not None and not info.names:
        return None  # no field ids in the file: only a name mapping could read it
    if len(positions) and (positions[0] < 0 or positions[-1] >= info.starts[-1]):
        raise IndexError(f"positions {positions[0]}..{positions[-1]} out of range for {info.starts[-1]} rows in data file {path}")
    mapping = []  # (table column, file column) of the columns the file has
    for field in schema:
        name = field.name if field_ids is None else info.names.get(field_ids[field.name])
        if name is not None and info.arrow.get_field_index(name) >= 0:
            mapping.append((field.name, name))
    names = list(dict.fromkeys(name for _, name in mapping))
    if len(info.starts) == 2:  # one row group: positions are row numbers in it
        raw = row_group_columns(path, info, 0, names, read).take(pa.array(positions))
    else:
        groups = np.searchsorted(info.starts, positions, side="right") - 1
        wanted = np.unique(groups)
        # offset of each wanted group's first row in the concatenation of the wanted groups
        firsts = np.concatenate([[0], np.cumsum(np.diff(info.starts)[wanted])])
        take = positions - info.starts[groups] + firsts[np.searchsorted(wanted, groups)]
        raw = pa.concat_tables([row_group_columns(path, info, int(g), names, read) for g in wanted]).take(pa.array(take))
    # Strings decode fastest as dictionaries and are cast here, for the rows taken only; so are promoted types.
    have = {}
    for column, name in mapping:
        col, t = raw.column(name), schema.field(column).type
        have[column] = col if col.type == t else pc.cast(col, t)
    return pa.Table.from_arrays([have.get(f.name, pa.nulls(len(positions), f.type)) for f in schema], schema=schema)
