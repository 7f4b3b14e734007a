"""The streamed change feed: one compact plan, cut into parts by rows and bytes as they are read.

:func:`cdf.change_batches` plans the feed from metadata, one group of row ids
at a time when it is large (:func:`feed_parts`, :mod:`cdf.groups`; the first
group by the call, so a bad range or a lost file raises there), keeping per row only what reading
it needs: where the image's values are, its lineage, its change code and
commit version (:func:`plan_feed`, 33 bytes a row while versions, positions
and row ids fit in 32 bits, up to 53 when they need 64; 53 always before). The parts are cut from that plan
when the reader gets to them (numpy slices: no copy), each at most
``batch_rows`` rows and about ``batch_bytes`` of output (update pairs kept
whole), read by :func:`cdf.engine_duckdb.read_part`, handed on and dropped
before the next one is read, with freed memory returned to the operating
system in between (:func:`lineage.memory.release_if_grown`).

Bytes per row are estimated for the first part from the data columns
(fixed widths, and for strings and binaries the decoded size the live
files' metadata suggests), and from the second part on measured: the
widest part read so far sets the rows of the next.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa

import cdf.captured as captured
import cdf.engine_duckdb as engine_duckdb
import cdf.groups as groups
import cdf.plan as plan
from cdf.pointers import Pointers, change_pointers, commit_timestamps
from lineage.memory import release_if_grown
from lineage.read.batched_scan import decoded_bytes
from lineage.state import TableState

DEFAULT_BATCH_BYTES = 64 << 20
META_BYTES = 96  # the change columns of one output row: five 64-bit values, the change type and _changed_columns
VARIABLE_GUESS = 64  # bytes per string or binary value when no file metadata is at hand
GUESS_ROWS = 65_536  # at most this many rows in a first part whose width was guessed
SMALL_FEED = 4096  # a feed of at most this many rows is not worth planning the table's files for (a follow() step)

_INT32 = np.iinfo(np.int32)


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` as int32 when its values fit (versions, file positions, row ids of most tables), else as it is."""
    if a.dtype != np.int64 or not len(a):
        return a
    if int(a.min()) >= _INT32.min and int(a.max()) <= _INT32.max:
        return a.astype(np.int32)
    return a


def plan_bytes(feed: engine_duckdb.PartPlan) -> int:
    """The bytes a planned feed's arrays hold."""
    s = feed.shown
    arrays = (s.source, s.loc, s.row_id, s.created, s.valid_from, s.valid_to, s.purged, feed.change, feed.version)
    return sum(x.nbytes for x in arrays if x is not None)


def part_end(feed: engine_duckdb.PartPlan, start: int, rows: int) -> int:
    """Where a part of ``feed`` starting at row ``start`` with at most ``rows`` rows ends (one row more to keep a pair whole)."""
    j = min(start + max(1, rows), len(feed))
    if feed.change[j - 1] == plan.PREIMAGE:  # its post-image is row j
        j += 1
    return j


def part_of(feed: engine_duckdb.PartPlan, start: int, end: int) -> engine_duckdb.PartPlan:
    """Rows ``start`` to ``end`` (exclusive) of ``feed`` as a part of their own (views, no copy)."""
    rows = slice(start, end)
    return replace(feed, shown=feed.shown.select(rows), change=feed.change[rows], version=feed.version[rows])


def plan_feed(state: TableState, a: int, b: int, data: pa.Schema, net: bool, unit: groups.Unit | None = None) -> engine_duckdb.PartPlan:
    """The feed over ``(a, b]`` planned from metadata (errors such as a lost file are raised here), kept compact.

    Row k shows image k of the plan's pointers, update pairs adjacent
    (pre-image first): the whole feed as one part, from which
    :func:`part_of` cuts parts without copying. ``unit``: only that group of
    the feed (:mod:`cdf.groups`), a feed over ``(unit.lo, unit.hi]`` of its own.
    """
    if unit is not None:
        a, b = unit.lo, unit.hi
    p = change_pointers(state, a, b, None if unit is None else unit.rows)
    return plan_pointers(p, a, b, data, net, engine_duckdb.field_ids(state), None if unit is None else unit.version)


def plan_pointers(p: Pointers, a: int, b: int, data: pa.Schema, net: bool, field_ids: dict[str, int],
                  version: int | None = None) -> engine_duckdb.PartPlan:
    """:func:`plan_feed` of the pointers ``p`` of ``(a, b]`` (``version``: only that commit version's rows)."""
    sk = plan.net(p, a, b) if net else plan.per_version(p, a, b)
    if version is not None:  # a net group read version by version
        keep = sk.version == version
        sk = plan.Skeleton(sk.pointer[keep], sk.change[keep], sk.version[keep])
    pointer = sk.pointer
    # column by column: one column's copy is alive at a time besides the pointers
    cols = {name: _narrow(getattr(p, name)[pointer]) for name in ("source", "loc", "row_id", "created", "valid_from", "valid_to")}
    purged = None if p.purged is None else p.purged[pointer]
    shown = Pointers(p.files, p.captured, purged=purged, commit_ms=p.commit_ms, **cols)
    del p, pointer
    return engine_duckdb.PartPlan(a, b, shown, sk.change, _narrow(sk.version), data, net, field_ids)


def plan_parts(state: TableState, a: int, b: int, data: pa.Schema, net: bool, part_rows: int) -> list[engine_duckdb.PartPlan]:
    """The feed over ``(a, b]`` planned (:func:`plan_feed`) and cut into parts of at most ``part_rows`` rows.

    An update pair is never split (a part may hold one row more than
    ``part_rows`` to keep it whole), so every part is a feed of its own: net
    parts drop their equal pairs, and ``_changed_columns`` compares images
    of the same part. The parts are views of one plan.
    """
    feed = plan_feed(state, a, b, data, net)
    parts, start = [], 0
    while start < len(feed):
        end = part_end(feed, start, part_rows)
        parts.append(part_of(feed, start, end))
        start = end
    return parts


def row_bytes(state: TableState, data: pa.Schema, rows: int) -> tuple[int, bool]:
    """Estimated output bytes per feed row of ``data``'s columns, and whether that is measured rather than guessed.

    Fixed-width columns count their width; strings and binaries the decoded
    size :func:`lineage.read.batched_scan.decoded_bytes` estimates from the
    live files' metadata (four times their compressed size: an overestimate
    for most data, short for very repetitive long strings), or
    :data:`VARIABLE_GUESS` bytes a value for a table without live files and
    for a feed of at most :data:`SMALL_FEED` ``rows`` when the state has not
    planned its files (its width is then measured after its first part).
    """
    fixed, variable = META_BYTES, []
    for f in data:
        try:
            fixed += max(1, f.type.bit_width // 8)
        except ValueError:
            variable.append(f)
    if not variable:
        return fixed, True
    known = state.files_if_known()
    if known is None and rows <= SMALL_FEED:  # a small feed is one part anyway: no planning of the files for it
        return fixed + VARIABLE_GUESS * len(variable), False
    files = list(known.files.values()) if known is not None else state.live_files()  # planned once per state
    total = sum(int(f.data_file.record_count) for f in files)
    if not total:
        return fixed + VARIABLE_GUESS * len(variable), False
    ids = {f.name: f.field_id for f in state.iceberg.schema().fields}
    only = pa.schema(variable)
    return fixed + math.ceil(sum(decoded_bytes(f, only, ids) for f in files) / total), True


def read_parts(feed: engine_duckdb.PartPlan, batch_rows: int, batch_bytes: int | None, first_row_bytes: int, measured: bool,
               whole: bool = True) -> Iterator[pa.Table]:
    """The rows of ``feed`` as consecutive tables of at most ``batch_rows`` rows and about ``batch_bytes`` bytes.

    ``first_row_bytes`` sizes the first part (at most :data:`GUESS_ROWS`
    rows unless ``measured``); from then on the widest part read so far
    sets the rows of the next. ``batch_bytes=None`` cuts by rows only. A part
    of one row (or one pair) is read whatever its size. A feed read in one
    part uses the decoded row-group cache, as :func:`cdf.changes` does; one
    read in several neither uses nor fills it: its parts would decode the
    same row groups again (rows are ordered by version, then row id, so each
    version's images go through the files anew), filling the cache to its
    budget with chunks a one-off stream reads at most a few times (at 30M
    rows the cache held its 256 MB after the feed and doubled the feed's
    peak growth, for no gain in time). ``whole=False``: ``feed`` is one group
    of a larger feed, read without the cache even in one part.
    """
    start, n = 0, len(feed)
    width, seen = max(1, first_row_bytes), 0
    cache = None
    while start < n:
        rows = batch_rows
        if batch_bytes is not None:
            rows = min(rows, max(1, batch_bytes // width))
            if not measured:
                rows = min(rows, GUESS_ROWS)
        end = part_end(feed, start, rows)
        if cache is None:  # one part: the decoded row-group cache as for changes(); more: neither used nor filled
            cache = whole and end >= n
        table = engine_duckdb.read_part(part_of(feed, start, end), cache)
        start = end
        if table.num_rows:
            seen = max(seen, math.ceil(table.get_total_buffer_size() / table.num_rows))
            width, measured = seen, True
            yield table
        del table
        release_if_grown()


def feed_parts(state: TableState, a: int, b: int, data: pa.Schema, net: bool, batch_rows: int, batch_bytes: int | None,
               group_rows: int | None = None) -> Iterator[pa.Table]:
    """The feed over ``(a, b]`` as :func:`read_parts` reads it, one group of row ids (:mod:`cdf.groups`) at a time.

    The first group is planned by this call (a bad range or a lost file
    raises here, and every later group's files are checked now too); each
    next one when the reader gets to it, after the previous one's plan and
    parts were dropped. A feed of at most ``group_rows`` images (default
    :data:`cdf.groups.GROUP_ROWS`) is one group.
    """
    limit = groups.GROUP_ROWS if group_rows is None else group_rows
    assembled = None if net else _assembled_parts(state, a, b, data, batch_rows, batch_bytes, limit)
    if assembled is not None:
        return assembled
    todo = groups.units(state, a, b, net, limit)
    first = next(todo)
    try:
        feed = plan_feed(state, a, b, data, net, first)
        if first.rows is not None:
            groups.check_files(state, a, b)  # the later groups' files are there too
        width, measured = row_bytes(state, data, len(feed))
    finally:
        release_if_grown()
    planned = [feed]
    del feed

    def read() -> Iterator[pa.Table]:
        nonlocal width, measured
        while planned:
            for part in read_parts(planned.pop(), batch_rows, batch_bytes, width, measured, first.rows is None):
                width, measured = max(width, math.ceil(part.get_total_buffer_size() / max(1, part.num_rows))), True
                yield part
                del part
            unit = next(todo, None)
            if unit is not None:
                planned.append(plan_feed(state, a, b, data, net, unit))
                release_if_grown()

    return read()


def _assembled_parts(state: TableState, a: int, b: int, data: pa.Schema, batch_rows: int, batch_bytes: int | None,
                     group_rows: int) -> Iterator[pa.Table] | None:
    """The per-version feed over ``(a, b]`` of a table that captures pre-images, every version assembled from its
    stored pieces (:mod:`cdf.captured`), one version at a time; None unless each version can be so and holds at
    most ``group_rows`` images (the others are planned by groups, as any feed)."""
    if not captured.capturing(state):
        return None
    versions = captured.stored(state, a, b)
    if not all(isinstance(s, captured.Stored) and s.images <= group_rows for s in versions):
        return None
    parts = captured.stored_parts(versions, data, engine_duckdb.field_ids(state), commit_timestamps(state, a, b),  # type: ignore[arg-type]
                                  batch_rows, batch_bytes, a, b)

    def read() -> Iterator[pa.Table]:
        for part in parts:
            yield part
            del part
            release_if_grown()

    return read()
