"""Row values at given positions of Parquet files, read by Iceberg field id.

The change feed, pre-image capture, re-homing and purge all need the values
of row images they know only by ``(file, position)``. This module reads just
the row groups holding those positions and just the columns asked for,
decodes string columns Parquet stored dictionary-encoded as dictionaries (the
strings of the rows taken are materialised, not those of the whole row
group), and matches columns by the
Iceberg field id the file records, so renamed columns keep their values,
columns added after the file was written read as null and promoted types are
cast. Row groups are decoded one at a time per worker, largest first (a
bulk load's big row group must not be left for last while the other worker
runs dry), so memory stays at a few row groups plus the values returned. A
row group too large to leave to one worker (more than its share of all) is
decoded by column parts in parallel (pyarrow's own column threads gain
less: 16 against 15 ms for the 1M-row group of the benchmark's table, 24 ms
on one thread).

Each file's footer facts (:func:`layout`: row groups, field ids, dictionary
columns, each column's bytes per row group, and which file column holds each
column asked for) are read once per process and shared with the write path's
reader (:func:`values_at`, for the images the key index names); so are the decoded column chunks,
kept within a budget by :mod:`lineage.decoded_cache` (a feed over recent
commits decodes the bulk load's row groups once, not at every call). A job
whose chunks are all kept only takes rows from them: it runs in the calling
thread, while the workers decode the others (a small feed reads a few rows
of each of dozens of small files: 1M-row table, last 5 commits, 29 files,
their read 6.95 -> 4.09 ms).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import lineage.decoded_cache as decoded_cache
import lineage.read.chunk_ranges as chunk_ranges
from lineage.arrays import stable_argsort
from lineage.memory import release_pool
from lineage.storage.fileio import ImmutableFileCache, file_stamp, local_path
import lineage.storage.files as store
from lineage.iceberg.schema import cast_nested, null_values

FIELD_ID = b"PARQUET:field_id"
WORKERS = 2  # decoding threads; the machines we target have few cores
SPLIT_BYTES = 4 << 20  # a row group over this many uncompressed bytes, and over a worker's share of all, is split by columns
DICTIONARY_SHARE = 1 / 16  # a string chunk whose dictionary page is larger than this share of it is read plain,
DICTIONARY_SMALL = 16 << 10  # unless the page is this small
ONE_DECODE_BYTES = 1 << 20  # rows taken from a row group whose columns asked for hold at most this (uncompressed): one decode


@dataclass(frozen=True)
class _Task:
    file: int  # index into the paths
    row_group: int
    start: int  # slice of the sorted positions this task returns
    end: int
    cost: int  # uncompressed bytes of the file columns it decodes (what decoding costs, roughly): the largest start first


@dataclass(frozen=True)
class _Job:
    """Part of a task one worker decodes: some of its file columns."""

    task: int
    columns: tuple[str, ...]
    cost: int


def _text(t: pa.DataType) -> str | None:
    """The family of a string or binary type, whatever its offset width ("string" or "binary"), else None."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return None


def file_columns(file_schema: pa.Schema, schema: pa.Schema, field_ids: dict[str, int] | None) -> list[str | None]:
    """For each column of ``schema``, the name of the file's column holding it (None: absent, reads as null)."""
    by_id = {}
    for f in file_schema:
        fid = (f.metadata or {}).get(FIELD_ID)
        if fid is not None:
            by_id[int(fid)] = f.name
    out: list[str | None] = []
    for f in schema:
        if by_id and field_ids and f.name in field_ids:
            out.append(by_id.get(field_ids[f.name]))
        else:
            out.append(f.name if f.name in file_schema.names else None)
    return out


def _conform(columns: dict[str, pa.ChunkedArray], sources: list[str | None], schema: pa.Schema, n: int) -> list[pa.Array]:
    cols = []
    for name, f in zip(sources, schema, strict=True):
        if name is None:
            cols.append(null_values(n, f.type))
            continue
        col = columns[name]
        if pa.types.is_dictionary(col.type):
            if _text(col.type.value_type) and _text(col.type.value_type) == _text(f.type):  # decoded by take_rows, in row order
                cols.append(col)
                continue
            col = col.cast(col.type.value_type)
        cols.append(col if col.type == f.type else cast_nested(col, f.type))
    return cols


@dataclass(frozen=True)
class FileLayout:
    """What a data file's footer says about where rows and columns are."""

    metadata: pq.FileMetaData
    starts: np.ndarray  # first row position of each row group, then the row count
    names: dict[int, str]  # Iceberg field id -> top-level Parquet column name
    arrow: pa.Schema  # the file's Arrow schema (top-level fields)
    dictionary: tuple[str, ...]  # string columns whose chunks are dictionary-encoded: decoded as dictionaries
    stamp: str  # size and modification time of the file when the footer was read
    column_bytes: dict[str, list[int]]  # uncompressed bytes of each top-level column, per row group
    # per (schema, field ids) asked for, file_columns() and the file columns read: a feed opens every file it
    # reads at each call
    columns_for: dict[tuple[object, ...], tuple[list[str | None], list[str], list[int]]] = field(default_factory=dict, compare=False,
                                                                                                   repr=False)


@dataclass(frozen=True)
class _File:
    path: str
    local: str  # the local filesystem path
    info: FileLayout  # the footer facts, read once per process (data files are immutable)
    sources: list[str | None]  # file column per requested column
    wanted: list[str]  # the file columns read (sorted, each once)
    starts: np.ndarray  # first position of each row group
    sizes: np.ndarray  # rows of each row group
    costs: list[int]  # uncompressed bytes of the wanted columns in each row group


# Data files are immutable and uniquely named; the stamp guards against a file replaced by hand.
_LAYOUTS: ImmutableFileCache[FileLayout] = ImmutableFileCache(4096)


def _layout(path: str, stamp: str) -> FileLayout:
    metadata = pq.read_metadata(store.source(path))
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    arrow = metadata.schema.to_arrow_schema()
    names = {int(f.metadata[FIELD_ID]): f.name for f in arrow if f.metadata and FIELD_ID in f.metadata}
    parquet = metadata.schema
    dictionary = tuple(
        f.name
        for f in arrow
        if (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
        and metadata.num_row_groups
        and all(_small_dictionary(metadata.row_group(g).column(_leaf(parquet, f.name))) for g in range(metadata.num_row_groups))
    )
    column_bytes: dict[str, list[int]] = {f.name: [0] * metadata.num_row_groups for f in arrow}
    for g in range(metadata.num_row_groups):
        chunks = metadata.row_group(g)
        for c in map(chunks.column, range(chunks.num_columns)):
            column_bytes[c.path_in_schema.split(".")[0]][g] += c.total_uncompressed_size
    return FileLayout(metadata, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]), names, arrow, dictionary, stamp,
                      column_bytes)


def _small_dictionary(chunk: pq.ColumnChunkMetaData) -> bool:
    """Whether a string column chunk is worth decoding as a dictionary: it has a dictionary page taking at
    most :data:`DICTIONARY_SHARE` of its bytes (or at most :data:`DICTIONARY_SMALL` bytes).

    A writer whose dictionary outgrew its limit (pyarrow's: 1 MiB) wrote the
    rest of the chunk plain, and reading that as a dictionary hashes every
    value again: a 1M-row chunk of distinct strings took 0.6-0.9 s and 85 MB
    to decode so, against 0.12 s and 44 MB plain.
    """
    if not chunk.has_dictionary_page:
        return False
    start, data = chunk.dictionary_page_offset, chunk.data_page_offset
    if not start or not data or data <= start or chunk.total_compressed_size <= 0:
        return True  # no offsets to measure the page by: as before
    return (data - start) <= max(DICTIONARY_SMALL, DICTIONARY_SHARE * chunk.total_compressed_size)


def _leaf(parquet: pq.ParquetSchema, name: str) -> int:
    return next(i for i in range(len(parquet)) if parquet.column(i).path == name)


def layout(path: str) -> FileLayout:
    """The footer facts of the local data file ``path``.

    Cached by path, size and modification time: Iceberg never rewrites a data
    file, but a file replaced by hand must not be served from the cache.
    """
    stamp = file_stamp(path)
    return _LAYOUTS.get(f"{path}\0{stamp}", lambda: _layout(path, stamp))


def _open(path: str, schema: pa.Schema, field_ids: dict[str, int] | None, ids_key: tuple[object, ...]) -> _File:
    local = local_path(path)
    info = layout(local)
    key = (schema, ids_key)
    known = info.columns_for.get(key)
    if known is None:
        sources = file_columns(info.arrow, schema, field_ids)
        wanted = sorted({s for s in sources if s is not None})
        costs = [sum(info.column_bytes[c][g] for c in wanted) for g in range(len(info.starts) - 1)]
        known = info.columns_for[key] = (sources, wanted, costs)
    sources, wanted, costs = known
    return _File(path, local, info, sources, wanted, info.starts[:-1], np.diff(info.starts), costs)


def _kept(f: _File, row_group: int, columns: Sequence[str], read: int) -> bool:
    """Whether the decoded row-group cache keeps every chunk of ``columns`` of ``row_group``; those it keeps are
    claimed for ``read`` (:meth:`lineage.decoded_cache.DecodedCache.claim`)."""
    key = decoded_cache.file_key(f.local, f.info.stamp)
    return decoded_cache.CACHE.claim([(key, row_group, c) for c in columns], read)


def _chunks_to_read(tasks: list[_Task], files: dict[int, _File], number: int | None) -> list[tuple[str, pq.FileMetaData, int, list[str]]]:
    """``(location, footer, row group, columns)`` of the chunks of ``tasks`` on an object store that the decoded
    row-group cache does not keep (``number``: its read number, None when it is off)."""
    out = []
    for t in tasks:
        f = files[t.file]
        if store.is_remote(f.path):
            key = decoded_cache.file_key(f.local, f.info.stamp)
            out.append((f.path, f.info.metadata, t.row_group,
                        [c for c in f.wanted if number is None or not decoded_cache.CACHE.kept((key, t.row_group, c))]))
    return out


def _column_sizes(f: _File, row_group: int) -> dict[str, int]:
    """Uncompressed bytes of each wanted file column in ``row_group`` (what decoding it costs, roughly)."""
    return {c: f.info.column_bytes[c][row_group] for c in f.wanted}


def _jobs(tasks: list[_Task], files: dict[int, _File]) -> list[_Job]:
    """The tasks as jobs, largest first.

    A task too large for one worker (over ``SPLIT_BYTES`` and over a
    worker's share of all the tasks, as a bulk load's row group among a few
    small files) becomes up to ``WORKERS`` column parts. With many large row
    groups each worker already has its own: splitting them costs more than
    it gains (the 10M feed of the last 5 commits: 0.27 against 0.30 s).
    """
    jobs = []
    share = sum(t.cost for t in tasks) // max(WORKERS, 1)
    for i, t in enumerate(tasks):
        f = files[t.file]
        if t.cost <= max(SPLIT_BYTES, share) or len(f.wanted) < 2 or WORKERS < 2:
            jobs.append(_Job(i, tuple(f.wanted), t.cost))
            continue
        parts: list[list[str]] = [[] for _ in range(min(WORKERS, len(f.wanted)))]
        loads = [0] * len(parts)
        for name, size in sorted(_column_sizes(f, t.row_group).items(), key=lambda kv: -kv[1]):
            k = loads.index(min(loads))  # greedy: the largest column left goes to the lightest part
            parts[k].append(name)
            loads[k] += size
        jobs.extend(_Job(i, tuple(cols), load) for cols, load in zip(parts, loads, strict=True))
    jobs.sort(key=lambda j: -j.cost)  # stable: equal costs keep the tasks' order
    return jobs


def row_group_columns(path: str, info: FileLayout, row_group: int, columns: Sequence[str], read: int | None) -> pa.Table:
    """File columns ``columns`` of one row group of the local file ``path`` (whose footer facts are ``info``), whole.

    Column chunks the decoded row-group cache keeps are not decoded again; the
    others are decoded and offered to it (``read``: the cache's read number,
    None when it is off). String columns Parquet stored dictionary-encoded come
    as dictionaries, whoever reads them, so a kept chunk has one form.
    """
    key = decoded_cache.file_key(path, info.stamp)
    got: dict[str, pa.ChunkedArray] = {}
    if read is not None:
        for c in columns:
            hit = decoded_cache.CACHE.get((key, row_group, c), read)
            if hit is not None:
                got[c] = hit
    missing = [c for c in columns if c not in got]
    if missing:
        strings = [c for c in info.dictionary if c in missing]
        pf = pq.ParquetFile(store.source(path), metadata=info.metadata, read_dictionary=strings or None)
        table = pf.read_row_group(row_group, columns=missing, use_threads=False)
        for name, col in zip(table.column_names, table.columns, strict=True):
            got[name] = col
            if read is not None:
                decoded_cache.CACHE.put((key, row_group, name), col, read)
        del table
    return pa.Table.from_arrays([got[c] for c in columns], names=list(columns))


def _read_columns(f: _File, positions: np.ndarray, row_group: int, columns: tuple[str, ...], read: int | None) -> pa.Table:
    """File columns ``columns`` of ``row_group`` at ``positions`` (sorted file positions in that row group)."""
    if not columns:
        return pa.table({})
    if len(positions) == int(f.sizes[row_group]):
        return row_group_columns(f.local, f.info, row_group, columns, read)
    # Rows taken from the group: one column decoded at a time, so that the decoder's buffers (a few
    # times the decoded column) are those of one column, not of the whole row group; a small group in one
    # decode (a change stream's strict check reads a few rows of each of its small files every commit).
    taken = pa.array(positions - int(f.starts[row_group]), pa.int64())
    if sum(f.info.column_bytes[c][row_group] for c in columns) <= ONE_DECODE_BYTES:
        cols = [c.take(taken) for c in row_group_columns(f.local, f.info, row_group, columns, read).columns]
    else:
        cols = [row_group_columns(f.local, f.info, row_group, (c,), read).column(0).take(taken) for c in columns]
    return _without_large_dictionaries(pa.Table.from_arrays(cols, names=list(columns)))


def _without_large_dictionaries(table: pa.Table) -> pa.Table:
    """``table`` with every dictionary column whose dictionary outnumbers its rows decoded.

    Rows taken from a row group keep the chunk's whole dictionary: a feed taking 45,000 rows of a
    1M-row group of distinct strings would hold all 1M strings per file until the rows are ordered
    (119 MB of pieces for 18 MB of values over ten such files). Small dictionaries stay, for the
    comparison of update pairs by index (:func:`take_rows` with ``decode=False``).
    """
    cols = list(table.columns)
    large = [i for i, c in enumerate(cols) if pa.types.is_dictionary(c.type) and sum(len(k.dictionary) for k in c.chunks) > table.num_rows]
    if not large:
        return table
    for i in large:
        cols[i] = cols[i].cast(cols[i].type.value_type)
    return pa.Table.from_arrays(cols, names=table.column_names)


@dataclass
class Gathered:
    """Values read for a list of requests: ``pieces`` concatenated hold request i's values at row ``rows[i]``.

    The pieces have the requested schema's columns, except that a string
    column Parquet stored dictionary-encoded stays a dictionary of those
    strings (:func:`take_rows` decodes it to the schema's type after
    ordering the rows).
    """

    pieces: list[pa.Table]
    rows: np.ndarray


class _NoFieldIds(Exception):
    """A file records no field ids while the caller asked to match columns by them only."""


def gather(paths: Sequence[str], file_index: np.ndarray, positions: np.ndarray, schema: pa.Schema,
           field_ids: dict[str, int] | None = None, cache: bool = True, *, by_id_only: bool = False) -> Gathered:
    """Read the values of ``schema``'s columns at ``(paths[file_index[i]], positions[i])`` for every i.

    ``field_ids`` maps column names to Iceberg field ids; files that record
    field ids are matched by them (else by name). Pairs may repeat; each
    distinct pair is read once. ``cache``: use and fill the decoded-chunk
    cache (:mod:`lineage.decoded_cache`); one-off bulk reads (maintenance,
    Spark executors) pass False. ``by_id_only``: a file without field ids
    raises ``_NoFieldIds`` instead of being matched by name.
    """
    n = len(positions)
    if n == 0:
        return Gathered([], np.zeros(0, np.int64))
    # In place where possible: at millions of requests every temporary array is tens of MB.
    pbits = max(1, int(positions.max()).bit_length())  # (file, position) packed into one key, as few bits as they need
    key = np.left_shift(file_index, pbits, dtype=np.int64)
    key |= positions
    order = stable_argsort(key)
    skey = key[order]
    del key
    first = np.empty(n, bool)
    first[0] = True
    np.not_equal(skey[1:], skey[:-1], out=first[1:])
    uniq = skey[first]
    del skey
    distinct = np.cumsum(first)
    distinct -= 1
    del first
    rows = np.empty(n, np.int64)
    rows[order] = distinct  # distinct pairs are read in sorted order
    del order, distinct
    ufile = uniq >> pbits
    upos = uniq
    upos &= (1 << pbits) - 1
    del uniq
    tasks: list[_Task] = []
    files: dict[int, _File] = {}
    bounds = np.flatnonzero(np.diff(ufile)) + 1
    ids_key = tuple(sorted(field_ids.items())) if field_ids else ()
    store.warm([paths[int(k)] for k in ufile[np.concatenate(([0], bounds))]])  # object-store footers: fetched at once
    for s, e in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(upos)])), strict=True):
        k = int(ufile[s])
        f = files[k] = _open(paths[k], schema, field_ids, ids_key)
        if by_id_only and field_ids is not None and not f.info.names:
            raise _NoFieldIds(paths[k])
        total = int(f.info.starts[-1])
        if int(upos[e - 1]) >= total:
            raise IndexError(f"position {int(upos[e - 1])} is out of range: past the end of {paths[k]} ({total} rows)")
        if len(f.sizes) == 1:  # most files of a table that commits often
            tasks.append(_Task(k, 0, int(s), int(e), f.costs[0]))
            continue
        rg = np.searchsorted(f.starts, upos[s:e], side="right") - 1
        rg_bounds = np.flatnonzero(np.diff(rg)) + 1
        for rs, re_ in zip(np.concatenate(([0], rg_bounds)), np.concatenate((rg_bounds, [e - s])), strict=True):
            row_group = int(rg[rs])
            tasks.append(_Task(k, row_group, int(s + rs), int(s + re_), f.costs[row_group]))

    jobs = _jobs(tasks, files)
    # Once the last job of a large row group is done, its thread hands the freed decoding buffers back (the
    # allocator keeps a thread's freed pages, which the next large job of that thread reuses, but the result
    # is built on top of them): not after every large job, whose successor would fault its pages in again.
    large = [len([j for j in jobs if tasks[j.task].cost > SPLIT_BYTES])]
    lock = threading.Lock()
    with decoded_cache.CACHE.read() if cache else nullcontext() as number, \
            chunk_ranges.prefetched(_chunks_to_read(tasks, files, number)):  # object stores: every chunk at once

        def run(j: _Job) -> pa.Table:
            t = tasks[j.task]
            out = _read_columns(files[t.file], upos[t.start:t.end], t.row_group, j.columns, number)
            if t.cost > SPLIT_BYTES:
                with lock:
                    large[0] -= 1
                    last = large[0] <= WORKERS - 1  # no large job is left for this thread: its buffers go back now
                if last:
                    release_pool()
            return out

        # A job whose chunks are all kept decodes nothing: it runs in this thread (a feed of a few commits is
        # mostly such jobs, one per small file, and handing each to a worker costs more than the job).
        # (claimed before any job runs: a large row group decoded first must not evict a small file's kept chunks)
        kept = [number is not None and _kept(files[tasks[j.task].file], tasks[j.task].row_group, j.columns, number) for j in jobs]
        parts: list[pa.Table] = [pa.table({})] * len(jobs)
        if len(jobs) - sum(kept) <= 1:
            parts = [run(j) for j in jobs]
        else:
            # Largest first: a bulk load's million-row group is often the last file numbered, and started
            # last it would run alone after the other worker has read every small file.
            with ThreadPoolExecutor(max_workers=WORKERS) as pool:
                decoding = {i: pool.submit(run, j) for i, j in enumerate(jobs) if not kept[i]}
                for i, j in enumerate(jobs):
                    if kept[i]:
                        parts[i] = run(j)
                for i, future in decoding.items():
                    parts[i] = future.result()
    read: list[dict[str, pa.ChunkedArray]] = [{} for _ in tasks]
    for j, part in zip(jobs, parts, strict=True):
        read[j.task].update(zip(part.column_names, part.columns, strict=True))
    del parts
    pieces = []
    for t, columns in zip(tasks, read, strict=True):
        pieces.append(pa.Table.from_arrays(_conform(columns, files[t.file].sources, schema, t.end - t.start), names=schema.names))
        columns.clear()
    return Gathered(pieces, rows)


def _ordered(chunks: list[pa.Array], indices: pa.Array | None, rows: int, f: pa.Field, decode: bool) -> pa.Array:
    """Elements ``indices`` (None: all) of the concatenated ``chunks``, as ``f.type`` (``chunks`` is emptied).

    Chunks that are all dictionaries of few distinct strings are reordered as
    dictionaries and decoded once in order: taking 3M random strings directly
    costs 120 ms, their dictionary indices 34 ms with the decoding. Mixed
    chunks (plain and encoded, or dictionaries of different types) and large
    dictionaries are decoded first.
    """
    encoded = [c for c in chunks if pa.types.is_dictionary(c.type)]
    mixed = len(encoded) < len(chunks) or len({c.type for c in encoded}) > 1
    if encoded and (mixed or sum(len(c.dictionary) for c in encoded) > max(rows, 1) // 8):
        chunks[:] = [c.cast(f.type) if pa.types.is_dictionary(c.type) else c for c in chunks]
    del encoded
    col = pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]  # dictionaries are unified
    chunks.clear()  # the caller's list: the chunks are freed before the take
    if indices is not None:
        col = col.take(indices)
    if not decode and pa.types.is_dictionary(col.type):
        return col
    return col if col.type == f.type else cast_nested(col, f.type)


def take_rows(pieces: list[pa.Table], rows: np.ndarray, schema: pa.Schema, decode: bool = True) -> pa.Table:
    """Rows ``rows`` of the concatenation of ``pieces`` (tables of ``schema``'s columns), built one column at a time.

    ``pieces`` is consumed: each column is dropped from it once its output
    column is built, so the peak stays near the pieces plus two columns,
    where taking from a chunked table would first copy every column whole.
    A string column may come dictionary-encoded (see :class:`Gathered`);
    with ``decode=False`` such a column is returned still encoded (see
    :func:`decoded`).
    """
    if not pieces:
        return schema.empty_table()
    indices = pa.array(rows, pa.int64())
    identity = len(rows) == sum(p.num_rows for p in pieces) and (len(rows) == 0 or (rows[0] == 0 and bool((np.diff(rows) == 1).all())))
    # The pieces' chunks by column, the pieces dropped: each column's chunks are freed once its output is built.
    by_column: list[list[pa.Array]] = [[] for _ in schema]
    for p in pieces:
        for chunks, f in zip(by_column, schema, strict=True):
            chunks.extend(p.column(f.name).chunks)
    pieces.clear()
    cols = []
    for i, f in enumerate(schema):
        cols.append(_ordered(by_column[i], None if identity else indices, len(rows), f, decode))
    if not decode and any(pa.types.is_dictionary(c.type) for c in cols):
        return pa.Table.from_arrays(cols, names=schema.names)
    return pa.Table.from_arrays(cols, schema=schema)


def decoded(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (from ``take_rows(..., decode=False)``) with its dictionary columns decoded, as ``schema``."""
    if not any(pa.types.is_dictionary(t) for t in table.schema.types):
        return table
    cols = [c.cast(f.type) if pa.types.is_dictionary(c.type) else c for c, f in zip(table.columns, schema, strict=True)]
    return pa.Table.from_arrays(cols, schema=schema)


def read_at(paths: Sequence[str], file_index: np.ndarray, positions: np.ndarray, schema: pa.Schema,
            field_ids: dict[str, int] | None = None, cache: bool = True, *, by_id_only: bool = False) -> pa.Table:
    """The values at ``(paths[file_index[i]], positions[i])`` for every i, in that order (see :func:`gather`)."""
    if len(positions) == 0:
        return schema.empty_table()
    got = gather(paths, file_index, positions, schema, field_ids, cache, by_id_only=by_id_only)
    return take_rows(got.pieces, got.rows, schema)


def values_at(paths: Sequence[str], file_ids: np.ndarray, positions: np.ndarray, schema: pa.Schema,
              field_ids: dict[str, int] | None) -> pa.Table | None:
    """:func:`read_at` for a caller that can fall back to a scan: None when the files cannot be read by position.

    That is: a file not on the local file system, nested columns on an
    evolved schema (``field_ids`` given), or a file without field ids when
    ``field_ids`` asks to match by them. The write path uses it for the
    images the key index names (strict-mode ``-U`` checks): no delete file
    is read, the index only names live images.
    """
    if not all("://" not in p or p.startswith("file:") for p in paths):
        return None
    if field_ids is not None and any(pa.types.is_nested(f.type) for f in schema):
        return None
    try:
        return read_at(paths, np.asarray(file_ids, dtype=np.int64), np.asarray(positions, dtype=np.int64), schema, field_ids,
                       by_id_only=True)
    except _NoFieldIds:
        return None  # only a name mapping could read that file


def read_files(paths: Sequence[str], schema: pa.Schema, field_ids: dict[str, int] | None = None, cache: bool = True) -> list[pa.Table]:
    """Every row of each file of ``paths``, in file order, as a table of ``schema``'s columns (one per file).

    Columns are matched as by :func:`gather`, string columns Parquet stored
    dictionary-encoded stay dictionaries (see :class:`Gathered`), and the
    decoded row-group cache is used and filled alike (``cache``), without
    gather's sorting of positions: the caller wants the files whole. Runs in
    the calling thread (a caller that reads many files splits them itself).
    """
    ids_key = tuple(sorted(field_ids.items())) if field_ids else ()
    store.warm(list(paths))  # object-store footers: fetched at once
    files = [_open(p, schema, field_ids, ids_key) for p in paths]
    out = []
    with decoded_cache.CACHE.read() if cache else nullcontext() as number:
        tasks = [_Task(k, g, 0, 0, f.costs[g]) for k, f in enumerate(files) for g in range(len(f.sizes))]
        with chunk_ranges.prefetched(_chunks_to_read(tasks, dict(enumerate(files)), number)):
            for f in files:
                groups = [row_group_columns(f.local, f.info, g, f.wanted, number) for g in range(len(f.sizes))]
                if not groups:
                    out.append(schema.empty_table())
                    continue
                columns = {c: pa.chunked_array([k for t in groups for k in t.column(c).chunks], type=groups[0].schema.field(c).type)
                           for c in f.wanted}
                out.append(pa.Table.from_arrays(_conform(columns, f.sources, schema, int(f.info.starts[-1])), names=schema.names))
    return out


def read_positions(path: str, positions: np.ndarray, schema: pa.Schema, field_ids: dict[str, int] | None = None) -> pa.Table:
    """The values at ``positions`` (any order) of one file."""
    return read_at([path], np.zeros(len(positions), np.int32), np.asarray(positions, np.int64), schema, field_ids)


def with_field_ids(table: pa.Table, field_ids: dict[str, int]) -> pa.Table:
    """``table`` whose columns carry their Iceberg field ids (written to Parquet, read back by :func:`gather`)."""
    fields = [f.with_metadata({FIELD_ID: str(field_ids[f.name]).encode()}) if f.name in field_ids else f for f in table.schema]
    return pa.Table.from_arrays(list(table.columns), schema=pa.schema(fields))
