"""A scan without a filter read straight with pyarrow: a file at a time, in parallel, no SQL engine in between.

:func:`lineage.read.batched_scan.read_all` answers a scan with one DuckDB
query over the live view (:func:`lineage.read.scan.register_live_view`): the
view joins every row with its file's lineage runs and anti-joins it with the
deleted positions, which suits a ``where`` (pruning, predicates pushed to the
Parquet reader). A scan with no ``where`` needs none of that: each data file's
columns are read by Iceberg field id with pyarrow, its deleted positions
(position delete files, deletion vectors and resolved equality deletes, as
:func:`lineage.storage.deletes.positions_for` reads them) are dropped with
one ``take``, and its lineage columns are the file's runs decoded at the
positions kept. Files are read in parallel, small remote files fetched whole
at once first (:mod:`lineage.storage.prefetch`), larger ones by byte range.
This is how a full scan of a table on an object store costs what pyiceberg's
own scan costs, rather than a DuckDB database with ``httpfs`` loaded plus the
query.

:func:`read_plain` returns None where it does not apply, and the caller reads
with DuckDB: a ``where``, a column of a nested or unusual type, a file
with equality deletes or written without Parquet field ids, or anything
pyarrow refuses to read or cast (the DuckDB path then reports it its way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat

import lineage.storage.files as store
import lineage.storage.prefetch as prefetch
import lineage.storage.s3_get as s3_get
from lineage.columns import CREATED_AT, LINEAGE_COLUMNS, ROW_ID, UPDATED_AT
from lineage.state import LiveFile, sized
from lineage.storage.deletes import live_positions, positions_for, read_position_deletes
from lineage.storage.rle import decode_sequence, decode_values
from lineage.iceberg.schema import cast_nested, null_values

FIELD_ID_KEY = b"PARQUET:field_id"
MAX_THREADS = 8  # files decoded at once (pyarrow releases the GIL; each file's read is itself multi-threaded)


def read_plain(
    files: Sequence[LiveFile], columns: Sequence[str], target: pa.Schema, field_ids: Mapping[str, int] | None, where_sql: str
) -> pa.Table | None:
    """The live rows of ``files`` as ``target`` (``columns``: data columns by name, lineage columns), or None when
    this reader does not apply (see the module docstring). ``field_ids``: the data columns' Iceberg field ids, or
    None when every file names the columns as the table does (:func:`lineage.iceberg.schema.projection_field_ids`)."""
    if where_sql.strip().upper() != "TRUE" or not files or not columns:
        return None
    data = [c for c in columns if c not in LINEAGE_COLUMNS]
    if any((field_ids is not None and c not in field_ids) or not _plain(target.field(c).type) for c in data):
        return None
    if any(f.equality_deletes for f in files):
        return None
    try:
        with prefetch.local_copies(sized(files)) as copies:  # small files: one GET each, all at once
            for f in files:
                for d in f.deletes:
                    if d.file_path in copies:
                        read_position_deletes(d.file_path, copies[d.file_path])  # parsed once, from the copy
            threads = min(MAX_THREADS, s3_get.parallel_reads(), len(files))
            with ThreadPoolExecutor(threads, thread_name_prefix="lineage-scan") as pool:
                parts = list(pool.map(lambda f: _read_file(f, copies.get(f.path), data, columns, target, field_ids), files))
    except (pa.ArrowException, OSError):
        return None  # DuckDB's reader reads it, or says what is wrong with the file
    if any(p is None for p in parts):
        return None
    return pa.concat_tables(parts)


def _plain(dtype: pa.DataType) -> bool:
    """Whether a column of this type reads the same through pyarrow as through DuckDB (flat types, microseconds)."""
    if pat.is_timestamp(dtype):
        return dtype.unit == "us"
    return (pat.is_integer(dtype) or pat.is_floating(dtype) or pat.is_decimal(dtype) or pat.is_boolean(dtype) or pat.is_date32(dtype)
            or pat.is_string(dtype) or pat.is_large_string(dtype) or pat.is_binary(dtype) or pat.is_large_binary(dtype))


def _read_file(f: LiveFile, local: str | None, data: Sequence[str], columns: Sequence[str], target: pa.Schema,
               field_ids: Mapping[str, int] | None) -> pa.Table | None:
    """The live rows of one file as ``target``, or None when its columns cannot be matched (no field ids, or a
    column missing where columns match by name)."""
    pf = pq.ParquetFile(local) if local is not None else store.parquet_file(f.path)
    if field_ids is None:  # every schema names the columns alike: the file has them all, by name
        present = set(pf.schema_arrow.names)
        if any(c not in present for c in data):
            return None
        field_ids = {c: i for i, c in enumerate(data)}
        by_id = {i: c for i, c in enumerate(data)}
    else:
        by_id = {}
        for field in pf.schema_arrow:
            raw = (field.metadata or {}).get(FIELD_ID_KEY)
            if raw is not None:
                by_id[int(raw)] = field.name
        if data and not by_id:
            return None
    names = [by_id[field_ids[c]] for c in data if field_ids[c] in by_id]
    table = pf.read(columns=names) if names else None
    rows = pf.metadata.num_rows
    dead = positions_for(f.path, f.delete_paths)
    keep = live_positions(rows, dead) if len(dead) else None
    kept = rows if keep is None else len(keep)
    taken = pa.array(keep) if keep is not None else None
    arrays: dict[str, pa.ChunkedArray | pa.Array] = {}
    for c in data:
        dtype = target.field(c).type
        fid = field_ids[c]
        if fid not in by_id:  # added to the table after the file was written
            arrays[c] = null_values(kept, dtype)
            continue
        col = table.column(by_id[fid])
        arrays[c] = cast_nested(col.take(taken) if taken is not None else col, dtype)
    if any(c in LINEAGE_COLUMNS for c in columns):
        lin = f.lineage
        decoded = {ROW_ID: decode_sequence(lin.row_ids), CREATED_AT: decode_values(lin.created), UPDATED_AT: decode_values(lin.updated)}
        for c in LINEAGE_COLUMNS:
            if c in columns:
                values = decoded[c] if keep is None else decoded[c][keep]
                arrays[c] = pa.array(np.asarray(values, np.int64))
    return pa.Table.from_arrays([arrays[c] for c in columns], schema=target)
