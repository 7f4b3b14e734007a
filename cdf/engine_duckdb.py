"""The change feed in the embedded engine (``engine="duckdb"``, the default), in this process.

The feed's rows are decided from metadata (:mod:`cdf.plan` over
:mod:`cdf.pointers`); then only the images the feed shows are read: the row
groups that hold them and the selected columns (:mod:`lineage.read.values`), or the
values an index segment captured. A per-version feed shows every image in its
range, so their values are read in a second thread while the feed is planned;
a net feed plans first and reads only the images it keeps. Update pairs get
``_changed_columns`` by comparing their two images column by column (the rule
of :mod:`cdf.plan`), net pairs equal in every selected column are dropped, and
the result is assembled column by column as an Arrow table. The engine keeps its public
name ``duckdb``: it is the embedded default, and the views over it live in
DuckDB (:mod:`cdf.views`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import cdf.plan as plan
from cdf.output import TIMESTAMP, change_schema, deleted_schema
from cdf.pointers import Pointers, change_pointers
from index.deleted_rows import IndexSegment, dictionary_values
from lineage.arrays import unique
from lineage.errors import LostFileError
from lineage.state import TableState
from lineage.read.values import Gathered, decoded, gather, take_rows

_CHANGE_NAMES = pa.array(plan.CHANGE_TYPES, pa.string())
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
            cols.append(pa.nulls(len(rows), f.type))
            continue
        col = taken.column(name)
        if pa.types.is_dictionary(col.type) and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
            cols.append(col)  # decoded by take_rows once the rows are in order
            continue
        cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(cols, names=data.names)


def _read_images(field_ids: dict[str, int], files: tuple[str, ...], captured: tuple[IndexSegment, ...], source: np.ndarray,
                 loc: np.ndarray, data: pa.Schema, cache: bool = True) -> Gathered:
    """The values of the images ``(source, loc)`` (see :class:`Pointers`): image i is row ``rows[i]`` of the pieces."""
    n = len(source)
    if n == 0 or int(source.min()) >= 0:  # no captured values: no copy of the pointers
        return gather(files, source, loc, data, field_ids, cache)
    from_files = np.flatnonzero(source >= 0)
    pieces: list[pa.Table] = []
    rows = np.zeros(n, np.int64)
    if len(from_files):
        got = gather(files, source[from_files], loc[from_files], data, field_ids, cache)
        pieces.extend(got.pieces)
        rows[from_files] = got.rows
        del got
    offset = sum(t.num_rows for t in pieces)
    for k in unique(source[source < 0]):
        idx = np.flatnonzero(source == k)
        wanted = unique(loc[idx])
        inverse = np.searchsorted(wanted, loc[idx])
        piece = _captured_piece(dictionary_values(captured[-int(k) - 1]), wanted, data, field_ids)
        pieces.append(piece)
        rows[idx] = offset + inverse
        offset += piece.num_rows
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
    ncols = len(names)
    # per pair, the number of changed columns (a uint8 matrix product is 5x faster than a sum over bools)
    counts = changed.view(np.uint8) @ np.ones(ncols, np.uint8) if ncols < 256 else changed.sum(axis=1)
    per_row = np.zeros(n, np.int32)
    per_row[pre] = counts
    per_row[pre + 1] = counts
    del counts
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    np.cumsum(per_row, out=offsets[1:])
    del per_row
    # The column numbers of each pair's list, twice (pre-image row, then post-image row), in row order:
    # a small-integer matrix of the pairs with -1 where a column did not change, read row by row.
    small = np.int8 if ncols < 128 else np.int32
    numbered = np.where(changed, np.arange(ncols, dtype=small), np.array(-1, small))
    both = np.concatenate((numbered, numbered), axis=1).ravel()
    del numbered
    which = both[np.flatnonzero(both >= 0)]
    del both
    # decoding a dictionary of the names costs a third of taking the strings by index
    child = pa.DictionaryArray.from_arrays(pa.array(which), pa.array(names, pa.string())).cast(pa.string())
    update = np.zeros(n, bool)
    update[pre] = True
    update[pre + 1] = True
    return pa.ListArray.from_arrays(pa.array(offsets), child, mask=pa.array(~update))


def _timestamps(commit_ms: dict[int, int], version: np.ndarray) -> pa.Array:
    if len(version) == 0:
        return pa.array([], pa.int64()).cast(TIMESTAMP)
    lo = int(version.min())
    lookup = np.full(int(version.max()) - lo + 1, -1, np.int64)
    for v, ms in commit_ms.items():
        if lo <= v < lo + len(lookup):
            lookup[v - lo] = ms
    ms = lookup[version - lo]
    return pa.array(ms, pa.int64(), mask=ms < 0).cast(TIMESTAMP)


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
    # decoding a dictionary of the four names costs a third of taking the strings by index
    return pa.DictionaryArray.from_arrays(pa.array(change, pa.int8()), _CHANGE_NAMES).cast(pa.string())


def changes(state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> pa.Table:
    """The change feed over ``(a, b]`` as an Arrow table."""
    p = change_pointers(state, a, b)
    if net:
        sk = plan.net(p, a, b)
        p = p.select(sk.pointer)  # row i of the feed shows image i; the other images' pointers are freed before values are read
        return read_part(PartPlan(a, b, p, sk.change, sk.version, data, net, field_ids(state)))
    # The per-version feed shows every image of p (one that starts and ends in the range twice),
    # so their values are read while the feed is planned and its change columns are built.
    commit_ms = p.commit_ms
    with ThreadPoolExecutor(max_workers=1) as pool:
        reading = pool.submit(_read_images, field_ids(state), p.files, p.captured, p.source, p.loc, data)
        sk = plan.per_version(p, a, b)
        shown = _Shown.of(p).select(sk.pointer)  # the locations were handed to the reader: only the lineage is kept
        del p  # frees the pointers' other columns while the values are read
        meta = _meta(sk, shown, commit_ms)
        got = reading.result()
        # string columns stay dictionary-encoded until the pairs are compared (by index)
        values = take_rows(got.pieces, got.rows[sk.pointer], data, decode=shown.purged is not None)
        del got
        if shown.purged is not None:
            values = _erase(values, shown.purged, data)
        return _assemble(values, sk, shown, commit_ms, data, net, meta, pool if len(sk) >= PARALLEL_ROWS else None)


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

    def without_captured_values(self) -> PartPlan:
        """The same part with every captured index segment reduced to its path (to ship it: values are read again by path)."""
        stubs = tuple(_segment_stub(seg) for seg in self.shown.captured)
        return replace(self, shown=replace(self.shown, captured=stubs))

    def with_captured_values(self, load: Callable[[str], IndexSegment]) -> PartPlan:
        """The part with the captured segments its rows read loaded again by ``load(path)`` (see :meth:`without_captured_values`)."""
        used = {int(-k - 1) for k in unique(self.shown.source[self.shown.source < 0])}
        if not used:
            return self
        segments = tuple(load(seg.path) if i in used else seg for i, seg in enumerate(self.shown.captured))
        return replace(self, shown=replace(self.shown, captured=segments))


def _segment_stub(seg: IndexSegment) -> IndexSegment:
    empty = np.zeros(0, np.int64)
    return IndexSegment(seg.path, (), np.zeros(0, np.int32), empty, empty, empty, empty, empty, None, seg.captured)


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
    with ThreadPoolExecutor(max_workers=1) as pool:
        reading = pool.submit(_part_values, part, cache)
        meta = None if part.net else _meta(sk, _Shown.of(shown), shown.commit_ms)
        return _assemble(reading.result(), sk, _Shown.of(shown), shown.commit_ms, part.data, part.net, meta, pool)


def _part_values(part: PartPlan, cache: bool = True) -> pa.Table:
    """The values of ``part``'s images (string columns may stay dictionaries: :func:`_assemble` decodes them)."""
    try:
        return image_values(part.field_ids, part.shown, None, part.data, decode=False, cache=cache)
    except FileNotFoundError as exc:  # a maintenance job removed a file after the feed was planned
        raise LostFileError(
            f"the change feed from version {part.a} to {part.b} was planned on a data file that is gone ({exc.filename or exc}); "
            "a vacuum, purge or another engine's maintenance removed it while the feed was being read: "
            "ask for the feed again (the range may then need to start later)"
        ) from exc


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


def _assemble(values: pa.Table, sk: plan.Skeleton, shown: _Shown, commit_ms: dict[int, int], data: pa.Schema, net: bool,
              meta: list[pa.Array] | None = None, pool: ThreadPoolExecutor | None = None) -> pa.Table:
    """The feed's rows from the values of the images ``sk`` shows (row for row) and their lineage ``shown``.

    ``meta``: :func:`_meta` of ``sk`` and ``shown``, if already built (valid only if no pair is dropped
    here, so not in net mode); ``pool``: a worker that decodes the dictionary columns while this thread
    builds ``_changed_columns``.
    """
    pre = sk.preimages
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
    decoding = pool.submit(decoded, values, data) if pool is not None else None
    lists = _changed_lists(len(sk), pre, changed, data.names)
    del changed
    if meta is None:
        meta = _meta(sk, shown, commit_ms)
    values = decoding.result() if decoding is not None else decoded(values, data)
    schema = change_schema(data, shown.purged is not None)
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
