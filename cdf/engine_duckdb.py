"""The change feed in the embedded engine (``engine="duckdb"``, the default), in this process.

The feed's rows are decided from metadata (:mod:`cdf.plan` over
:mod:`cdf.pointers`); then only the images the feed shows are read: the row
groups that hold them and the selected columns (:mod:`lineage.read.values`), or the
values an index segment captured. A per-version feed shows every image in its
range, so their values are read in a second thread while the feed is planned;
a net feed plans first and reads only the images it keeps. Update pairs get
``_changed_columns`` by comparing their two images column by column (the rule
of :mod:`cdf.plan`), net pairs equal in every selected column are dropped, and
the result is assembled column by column as an Arrow table. A large
per-version feed puts its values in feed order and compares its pairs in two
halves of its columns, one per thread, then builds ``_changed_columns`` in one
thread while the other decodes strings and builds the other change columns.
The engine keeps its public name ``duckdb``: it is the embedded default, and
the views over it live in DuckDB (:mod:`cdf.views`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import cdf.plan as plan
import cdf.threads as threads
from cdf.output import TIMESTAMP, deleted_schema, encoded_change_schema
from cdf.pointers import Pointers, change_pointers
from index.deleted_rows import IndexSegment, dictionary_values
from lineage.arrays import stable_argsort
from lineage.errors import LostFileError
from lineage.state import TableState
from lineage.read.values import Gathered, decoded, gather, take_rows
from lineage.iceberg.schema import cast_nested, null_values

_CHANGE_NAMES = pa.array(plan.CHANGE_TYPES, pa.string())
_ENTRY_BITS = 40  # an entry of an index segment fits in 40 bits (a key packs the segment above it)
PARALLEL_ROWS = 50_000  # feeds (and parts) from this many rows read their values in a second thread while the change columns are built


def field_ids(state: TableState) -> dict[str, int]:
    """Iceberg field id of every column of the current schema, by name (values are matched by id)."""
    return {f.name: f.field_id for f in state.iceberg.schema().fields}


def _captured_piece(values: pa.Table, rows: np.ndarray, data: pa.Schema, field_ids: dict[str, int]) -> pa.Table:
    """Rows ``rows`` (ascending, distinct) of an index segment's captured values as a table of ``data``'s columns
    (matched by field id; string columns may stay dictionaries, as the values of data files, see :class:`Gathered`)."""
    taken = values if len(rows) == values.num_rows else values.take(pa.array(rows, pa.int64()))
    cols = []
    for f in data:
        name = str(field_ids[f.name])
        if name not in taken.column_names:  # a column added after the capture: null, as in the data file
            cols.append(null_values(len(rows), f.type))
            continue
        col = taken.column(name)
        if pa.types.is_dictionary(col.type) and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
            cols.append(col)  # decoded by take_rows once the rows are in order
            continue
        cols.append(col if col.type == f.type else cast_nested(col, f.type))
    return pa.Table.from_arrays(cols, names=data.names)


def captured_values(segment: IndexSegment, data: pa.Schema, field_ids: dict[str, int]) -> pa.Table:
    """Every captured value of ``segment``, entry by entry, as a table of ``data``'s columns (matched by field id;
    string columns of few values stay dictionaries, as when a feed takes some of them)."""
    values = dictionary_values(segment)
    return _captured_piece(values, np.arange(values.num_rows), data, field_ids)


def _read_images(field_ids: dict[str, int], files: tuple[str, ...], captured: tuple[IndexSegment, ...], source: np.ndarray,
                 loc: np.ndarray, data: pa.Schema, cache: bool = True) -> Gathered:
    """The values of the images ``(source, loc)`` (see :class:`Pointers`): image i is row ``rows[i]`` of the pieces."""
    n = len(source)
    if n == 0 or int(source.min()) >= 0:  # no captured values: no copy of the pointers
        return gather(files, source, loc, data, field_ids, cache)
    negative = source < 0
    ncap = int(np.count_nonzero(negative))
    from_files: slice | np.ndarray
    cap: slice | np.ndarray
    if negative[n - ncap:].all():  # the captured images last (a per-version feed's pointers): slices, not gathers
        from_files, cap = slice(0, n - ncap), slice(n - ncap, n)
    else:
        from_files, cap = np.flatnonzero(~negative), np.flatnonzero(negative)
    del negative
    pieces: list[pa.Table] = []
    rows = np.empty(n, np.int64)  # every image is read from a file or from a segment
    if ncap < n:
        got = gather(files, source[from_files], loc[from_files], data, field_ids, cache)
        pieces.extend(got.pieces)
        rows[from_files] = got.rows
        del got
    offset = sum(t.num_rows for t in pieces)
    # One pass groups the captured images by segment (a feed of 25 commits has 25 segments): the distinct
    # (segment, entry) keys in order, and each image's number among them, which is its row of the pieces.
    key = np.negative(source[cap], dtype=np.int64)
    key -= 1
    key <<= _ENTRY_BITS
    key |= loc[cap]
    if len(key) > 1 and not bool((key[1:] > key[:-1]).all()):  # a per-version feed's are in order already
        order = stable_argsort(key)
        cap = (np.arange(cap.start, cap.stop) if isinstance(cap, slice) else cap)[order]
        key = key[order]
        del order
        first = np.empty(len(key), bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        number = np.cumsum(first)
        number += offset - 1
        rows[cap] = number
        key = key[first]
        del first, number
    else:
        rows[cap] = np.arange(offset, offset + ncap)
    del cap
    segment = key >> _ENTRY_BITS
    key &= (1 << _ENTRY_BITS) - 1
    bounds = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    for s, e in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [len(key)])).tolist(), strict=True):
        pieces.append(_captured_piece(dictionary_values(captured[int(segment[s])]), key[s:e], data, field_ids))
    return Gathered(pieces, rows)


def _erase(values: pa.Table, purged: np.ndarray, data: pa.Schema) -> pa.Table:
    """``values`` with the rows of purged images null in every column."""
    erased = pa.array(purged)
    nullable = pa.schema([f.with_nullable(True) for f in data])
    return pa.Table.from_arrays([pc.if_else(erased, pa.nulls(len(purged), f.type), values.column(f.name)) for f in data], schema=nullable)


def image_values(state: TableState | dict[str, int], p: Pointers, pointer: np.ndarray | None, data: pa.Schema,
                 decode: bool = True, cache: bool = True) -> pa.Table:
    """The values of ``data``'s columns of the images ``pointer`` (in that order; None: every image of ``p``).

    ``state`` is the table's state, or the field ids of its columns
    (:func:`field_ids`). Purged images read as null. ``decode=False`` may
    leave string columns dictionary-encoded (see :func:`lineage.read.values.take_rows`).
    ``cache=False`` neither uses nor fills the decoded row-group cache.
    """
    ids = state if isinstance(state, dict) else field_ids(state)
    source, loc = (p.source, p.loc) if pointer is None else (p.source[pointer], p.loc[pointer])
    got = _read_images(ids, p.files, p.captured, source, loc, data, cache)
    values = take_rows(got.pieces, got.rows, data, decode=decode or p.purged is not None)
    if p.purged is not None:
        values = _erase(values, p.purged if pointer is None else p.purged[pointer], data)
    return values


def _distinct(x: pa.Array, y: pa.Array) -> np.ndarray:
    """Null-safe "is distinct from" of two equal-length arrays (NaN equals NaN); dictionaries compare their values."""
    if pa.types.is_dictionary(x.type):
        x, y = x.cast(x.type.value_type), y.cast(y.type.value_type)
    t = x.type
    if pa.types.is_nested(t):
        return np.array([u != v for u, v in zip(x.to_pylist(), y.to_pylist(), strict=True)], bool)
    differ = pc.fill_null(pc.not_equal(x, y), False)
    if pa.types.is_floating(t):
        differ = pc.and_(differ, pc.invert(pc.and_(pc.fill_null(pc.is_nan(x), False), pc.fill_null(pc.is_nan(y), False))))
    one_null = pc.xor(pc.is_null(x), pc.is_null(y))
    return pc.or_(differ, one_null).to_numpy(zero_copy_only=False)


def _distinct_numpy(col: pa.Array, pre: np.ndarray) -> np.ndarray | None:
    """:func:`_distinct` of rows ``pre`` and ``pre + 1`` in numpy, where that is exact and cheaper; else None.

    Dictionary columns compare their indices when the dictionary's values are
    distinct (equal values, equal indices); fixed-width columns without nulls
    compare their values (floats: NaN equals NaN).
    """
    t = col.type
    if pa.types.is_dictionary(t):
        d = col.dictionary
        if d.null_count or pc.count_distinct(d).as_py() != len(d):  # a null or repeated value: indices do not decide
            return None
        codes = col.indices.to_numpy(zero_copy_only=False)  # nulls come out as some index: masked below
        differ = codes[pre] != codes[pre + 1]
        if col.null_count:
            null = col.is_null().to_numpy(zero_copy_only=False)
            a, b = null[pre], null[pre + 1]
            differ = (differ & ~a & ~b) | (a ^ b)
        return differ
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
    if col.null_count or not (numeric or pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_duration(t)):
        return None
    x = col.to_numpy(zero_copy_only=False)
    u, v = x[pre], x[pre + 1]
    differ = u != v
    if pa.types.is_floating(t):
        differ &= ~(np.isnan(u) & np.isnan(v))
    return differ


def changed_matrix(values: pa.Table, pre: np.ndarray) -> np.ndarray:
    """For each pair (pre-image row ``pre[k]``, post-image row ``pre[k] + 1``): which columns are distinct.

    String columns may be dictionary-encoded (``take_rows(..., decode=False)``).
    """
    out = np.zeros((len(pre), values.num_columns), bool)
    if len(pre):
        a, b = None, None
        for j, chunked in enumerate(values.columns):
            col = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
            fast = _distinct_numpy(col, pre)
            if fast is None:
                if a is None:
                    a, b = pa.array(pre, pa.int64()), pa.array(pre + 1, pa.int64())
                fast = _distinct(col.take(a), col.take(b))  # a dictionary column: only the taken rows are decoded
            out[:, j] = fast
    return out


def _changed_lists(n: int, pre: np.ndarray, changed: np.ndarray, names: list[str]) -> pa.Array:
    """``_changed_columns``: the pair's list on both rows of each update pair, null elsewhere."""
    offsets, null = _list_layout(n, pre, changed)
    return pa.ListArray.from_arrays(offsets, _list_elements(changed, names), mask=null)


def _list_layout(n: int, pre: np.ndarray, changed: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """The offsets and the null mask of :func:`_changed_lists` (a large feed builds them in its second thread)."""
    counts = _pair_counts(changed)
    per_row = np.zeros(n, np.int32)
    per_row[pre] = counts
    per_row[pre + 1] = counts
    del counts
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    np.cumsum(per_row, out=offsets[1:])
    del per_row
    null = np.ones(n, bool)
    null[pre] = False
    null[pre + 1] = False
    return pa.array(offsets), pa.array(null)


def _pair_counts(changed: np.ndarray) -> np.ndarray:
    """Per pair, the number of changed columns (int64; a uint8 matrix product is 5x faster than a sum over bools)."""
    ncols = changed.shape[1]
    if ncols < 256:
        return (changed.view(np.uint8) @ np.ones(ncols, np.uint8)).astype(np.int64)
    return changed.sum(axis=1, dtype=np.int64)


def _list_elements(changed: np.ndarray, names: list[str]) -> pa.Array:
    """The elements of :func:`_changed_lists`, in row order: each pair's changed column numbers, twice (pre-image
    row, then post-image row), as indices into the names (``cdf.output.CHANGED_COLUMNS_ENCODED``: no string copied).

    Placed column by column: pair k's list starts at twice the changed columns of the pairs before it, and a
    column's element goes after those of the earlier columns that changed in the pair, and again ``count`` later
    (1M-row benchmark, 125,000 pairs of 5 columns: 2.8 ms, against 3.4 for reading a pairs-by-columns matrix).
    """
    ncols = changed.shape[1]
    counts = _pair_counts(changed)
    filled = np.cumsum(counts)  # each pair's next free element: its first one, then one more per changed column
    filled -= counts
    filled *= 2
    elements = np.empty(int(filled[-1]) + 2 * int(counts[-1]) if len(counts) else 0, np.int32)
    for j in range(ncols):
        pairs = np.flatnonzero(changed[:, j])
        if not len(pairs):
            continue
        at = filled[pairs]
        elements[at] = j
        at += counts[pairs]
        elements[at] = j
        filled[pairs] += 1
    return pa.DictionaryArray.from_arrays(pa.array(elements), pa.array(names, pa.string()))


def _timestamps(commit_ms: dict[int, int], version: np.ndarray) -> pa.Array:
    if len(version) == 0:
        return pa.array([], pa.int64()).cast(TIMESTAMP)
    lo = int(version.min())
    lookup = np.full(int(version.max()) - lo + 1, -1, np.int64)
    for v, ms in commit_ms.items():
        if lo <= v < lo + len(lookup):
            lookup[v - lo] = ms
    ms = lookup[version - lo]
    missing = ms < 0  # a version without a commit entry: null
    return pa.array(ms, pa.int64(), mask=missing if missing.any() else None).cast(TIMESTAMP)


@dataclass(frozen=True)
class _Shown:
    """The lineage of the images a feed shows, row for row: what its output needs once their values are read."""

    row_id: np.ndarray
    created: np.ndarray
    valid_from: np.ndarray
    purged: np.ndarray | None

    @classmethod
    def of(cls, p: Pointers) -> _Shown:
        """Of every image of ``p``, in its order (no copy)."""
        return cls(p.row_id, p.created, p.valid_from, p.purged)

    def select(self, rows: np.ndarray) -> _Shown:
        """Rows ``rows`` (indices or a mask), in that order."""
        return _Shown(self.row_id[rows], self.created[rows], self.valid_from[rows], None if self.purged is None else self.purged[rows])


def _change_names(change: np.ndarray) -> pa.Array:
    """``_change_type`` (cdf.output.CHANGE_TYPE_ENCODED): the change codes, as they are, indices into the four names."""
    return pa.DictionaryArray.from_arrays(pa.array(change, pa.int8()), _CHANGE_NAMES)


def changes(state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> pa.Table:
    """The change feed over ``(a, b]`` as an Arrow table (its threads hand the GIL over promptly: :mod:`cdf.threads`)."""
    with threads.prompt_handover():
        return _changes(state, a, b, data, net)


def _changes(state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> pa.Table:
    p = change_pointers(state, a, b)
    if net:
        sk = plan.net(p, a, b)
        p = p.select(sk.pointer)  # row i of the feed shows image i; the other images' pointers are freed before values are read
        return read_part(PartPlan(a, b, p, sk.change, sk.version, data, net, field_ids(state)))
    # The per-version feed shows every image of p (one that starts and ends in the range twice),
    # so their values are read while the feed is planned and its change columns are built.
    commit_ms = p.commit_ms
    pool = threads.worker()
    reading = pool.submit(_read_images, field_ids(state), p.files, p.captured, p.source, p.loc, data)
    sk = plan.per_version(p, a, b)
    shown = _Shown.of(p).select(sk.pointer)  # the locations were handed to the reader: only the lineage is kept
    del p  # frees the pointers' other columns while the values are read
    parallel = len(sk) >= PARALLEL_ROWS and shown.purged is None and len(data) > 1
    # built now, while the values are read; a large feed builds them with its decoding instead, while this
    # thread builds _changed_columns (planning alone takes longer than reading captured values)
    meta = None if parallel else _meta(sk, shown, commit_ms)
    got = reading.result()
    # string columns stay dictionary-encoded until the pairs are compared (by index)
    rows = got.rows[sk.pointer]
    if not parallel:
        values = take_rows(got.pieces, rows, data, decode=shown.purged is not None)
        del got, rows
        if shown.purged is not None:
            values = _erase(values, shown.purged, data)
        return _assemble(values, sk, shown, commit_ms, data, net, meta, pool if len(sk) >= PARALLEL_ROWS else None)
    values, changed = _ordered_halves(got, rows, sk.preimages, data, pool)
    del got, rows
    return _assemble(values, sk, shown, commit_ms, data, net, meta, pool, changed)


def _ordered_halves(got: Gathered, rows: np.ndarray, pre: np.ndarray, data: pa.Schema,
                    pool: ThreadPoolExecutor) -> tuple[pa.Table, np.ndarray]:
    """``take_rows(got.pieces, rows, data, decode=False)`` and its :func:`changed_matrix` at ``pre``, the columns
    split in two halves of about equal bytes, one ordered and compared by ``pool``'s worker, one by this thread."""
    halves: list[list[int]] = [[], []]
    load = [0, 0]
    for i in sorted(range(len(data)), key=lambda i: -_width(data[i].type)):
        k = int(load[1] < load[0])
        halves[k].append(i)
        load[k] += _width(data[i].type)
    schemas = [pa.schema([data[i] for i in sorted(h)]) for h in halves]
    parts = [[p.select(s.names) for p in got.pieces] for s in schemas]
    got.pieces.clear()

    def half(k: int) -> tuple[pa.Table, np.ndarray]:
        values = take_rows(parts[k], rows, schemas[k], decode=False)
        return values, changed_matrix(values, pre)

    other = pool.submit(half, 1)
    mine = half(0)
    theirs = other.result()
    by_name = {}
    for values, changed in (mine, theirs):
        for j, name in enumerate(values.column_names):
            by_name[name] = (values.column(j), changed[:, j])
    cols = [by_name[f.name][0] for f in data]
    changed = np.empty((len(pre), len(data)), bool)
    for j, f in enumerate(data):
        changed[:, j] = by_name[f.name][1]
    return pa.Table.from_arrays(cols, names=data.names), changed


def _width(t: pa.DataType) -> int:
    """Bytes per value a column's take copies, roughly (variable-width values count 16)."""
    try:
        return max(t.bit_width // 8, 1)
    except ValueError:
        return 16


@dataclass(frozen=True)
class PartPlan:
    """Consecutive rows of a planned feed over ``(a, b]``, update pairs whole: all that reading them needs.

    Row k shows image k of ``shown`` with change code ``change[k]`` at
    version ``version[k]``; ``data`` are the columns to read, matched by
    ``field_ids``. A part holds no table handle, so it can be pickled and
    read in another process (the Spark stream's executors,
    :mod:`cdf.spark_source`) with :func:`read_part`.
    """

    a: int
    b: int
    shown: Pointers
    change: np.ndarray
    version: np.ndarray
    data: pa.Schema
    net: bool
    field_ids: dict[str, int]

    def __len__(self) -> int:
        return len(self.change)


def read_part(part: PartPlan, cache: bool = True) -> pa.Table:
    """The rows of ``part``: its images' values read (data files or captured segments), pairs compared, rows assembled.

    From :data:`PARALLEL_ROWS` rows on, the values are read by a second thread while this one builds the
    change columns (per-version parts: a net part may drop pairs once their values are compared).
    ``cache=False``: the decoded row-group cache is neither used nor filled (:mod:`lineage.decoded_cache`).
    """
    shown = part.shown
    sk = plan.Skeleton(np.arange(len(part.change)), part.change, part.version)
    if len(sk) < PARALLEL_ROWS:
        return _assemble(_part_values(part, cache), sk, _Shown.of(shown), shown.commit_ms, part.data, part.net)
    pool = threads.worker()
    reading = pool.submit(_part_values, part, cache)
    meta = None if part.net else _meta(sk, _Shown.of(shown), shown.commit_ms)
    return _assemble(reading.result(), sk, _Shown.of(shown), shown.commit_ms, part.data, part.net, meta, pool)


def _part_values(part: PartPlan, cache: bool = True) -> pa.Table:
    """The values of ``part``'s images (string columns may stay dictionaries: :func:`_assemble` decodes them)."""
    try:
        return image_values(part.field_ids, part.shown, None, part.data, decode=False, cache=cache)
    except FileNotFoundError as exc:  # a maintenance job removed a file after the feed was planned
        raise lost_file(part.a, part.b, exc) from exc


def lost_file(a: int, b: int, exc: FileNotFoundError) -> LostFileError:
    """The error of a feed over ``(a, b]`` whose planned data file was removed before its values were read."""
    return LostFileError(
        f"the change feed from version {a} to {b} was planned on a data file that is gone ({exc.filename or exc}); "
        "a vacuum, purge or another engine's maintenance removed it while the feed was being read: "
        "ask for the feed again (the range may then need to start later)"
    )


def _meta(sk: plan.Skeleton, shown: _Shown, commit_ms: dict[int, int]) -> list[pa.Array]:
    """The change columns that do not depend on values: every one but ``_changed_columns``, in output order, then ``_purged``."""
    meta = [
        _change_names(sk.change),
        pa.array(sk.version, pa.int64()),
        _timestamps(commit_ms, sk.version),
        pa.array(shown.row_id, pa.int64()),
        pa.array(shown.created, pa.int64()),
        pa.array(shown.valid_from, pa.int64()),
    ]
    if shown.purged is not None:
        meta.append(pa.array(shown.purged, pa.bool_()))
    return meta


def assemble(values: pa.Table, sk: plan.Skeleton, row_id: np.ndarray, created: np.ndarray, valid_from: np.ndarray,
             commit_ms: dict[int, int], data: pa.Schema) -> pa.Table:
    """The per-version feed's rows ``sk`` from the values and lineage of the images they show, row for row (string
    columns may be dictionaries), in this thread: what a feed builds once it has read its values."""
    return _assemble(values, sk, _Shown(row_id, created, valid_from, None), commit_ms, data, False)


def _assemble(values: pa.Table, sk: plan.Skeleton, shown: _Shown, commit_ms: dict[int, int], data: pa.Schema, net: bool,
              meta: list[pa.Array] | None = None, pool: ThreadPoolExecutor | None = None,
              changed: np.ndarray | None = None) -> pa.Table:
    """The feed's rows from the values of the images ``sk`` shows (row for row) and their lineage ``shown``.

    ``meta``: :func:`_meta` of ``sk`` and ``shown``, if already built (valid only if no pair is dropped
    here, so not in net mode); ``pool``: a worker that decodes the dictionary columns (and builds ``meta``
    if not given, and the offsets of ``_changed_columns``) while this thread builds the elements of
    ``_changed_columns``; ``changed``: :func:`changed_matrix` of
    ``values``, if already computed.
    """
    pre = sk.preimages
    if changed is None:
        changed = changed_matrix(values, pre)
    if net:  # a pair whose images are equal in every selected column is no change
        same = pre[~changed.any(axis=1)]
        if len(same):
            keep = np.ones(len(sk), bool)
            keep[same] = keep[same + 1] = False
            sk, values, changed = sk.without_pairs(same), values.filter(pa.array(keep)), changed[changed.any(axis=1)]
            shown = shown.select(keep)
            pre = sk.preimages
            meta = None

    def rest() -> tuple[pa.Table, list[pa.Array], tuple[pa.Array, pa.Array]]:
        built = _meta(sk, shown, commit_ms) if meta is None else meta
        return decoded(values, data), built, _list_layout(len(sk), pre, changed)

    later = pool.submit(rest) if pool is not None else None
    elements = _list_elements(changed, data.names)
    values, meta, (offsets, null) = later.result() if later is not None else rest()
    del changed
    lists = pa.ListArray.from_arrays(offsets, elements, mask=null)
    schema = encoded_change_schema(data, shown.purged is not None)
    return pa.Table.from_arrays(list(values.columns) + meta[:6] + [lists] + meta[6:], schema=schema)


def deleted_rows(state: TableState, since: int, until: int, data: pa.Schema) -> pa.Table:
    """Rows deleted in ``(since, until]`` with their last values."""
    p = change_pointers(state, since, until)
    sk = plan.deleted(p, since, until)
    p = p.select(sk.pointer)  # as in a net feed: row i shows image i
    values = image_values(state, p, None, data)
    meta = [
        pa.array(sk.version, pa.int64()),
        _timestamps(p.commit_ms, sk.version),
        pa.array(p.row_id, pa.int64()),
        pa.array(p.created, pa.int64()),
        pa.array(p.valid_from, pa.int64()),
    ]
    if p.purged is not None:
        meta.append(pa.array(p.purged, pa.bool_()))
    return pa.Table.from_arrays(list(values.columns) + meta, schema=deleted_schema(data, p.purged is not None))
