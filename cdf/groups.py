"""A large change feed cut into groups of row ids, each bounded by rows, so that no process holds the whole feed's pointers.

The feed's rows are keyed by row id: an update pair is two images of one row,
and a net feed collapses each row's images. So the images of a range of row
ids make a feed of their own (:func:`cdf.pointers.change_pointers` with
``rows``), and the feed is the union of those of consecutive ranges. Order is
kept the same way: the per-version feed over ``(a, b]`` is its versions' feeds
one after the other (each ``(v - 1, v]``, ordered by row id), so each
version's ranges are read in row-id order; the net feed is ordered by each
row's commit version, so each range's net feed is planned once per version
and keeps that version's rows.

How many images a range holds is known before any pointer is built:

* :func:`histogram` counts them per bin of row ids from metadata the embedded
  feed reads anyway (index segments' row ids, live files' lineage runs),
  exactly bounding each group (a skewed predicate, say ``id < 1000000``, gives
  narrow ranges there and wide ones elsewhere);
* :func:`even_ranges` cuts the row ids into equal ranges from the commit
  log's counts alone, for a planner that must read no row id (the Spark
  driver: its executors build each range's pointers).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from cdf.pointers import RowRange, check_pinned, live_lineage
from index.deleted_rows import INDEX_FORMAT, INDEX_FORMAT_VERSION, VALUE_PREFIX
from index.segment_rows import pieces
from lineage.state import TableState
from lineage.storage.metadata import open_tagged_parquet

GROUP_ROWS = 500_000  # images planned at a time (about 40 MB of pointers and plan)
BINS = 65_536  # bins of row ids a histogram counts in
ALL_ROWS: RowRange = (0, 1 << 62)


@dataclass(frozen=True)
class Unit:
    """One group of a feed over ``(a, b]``: the images of ``(lo, hi]`` with row ids in ``rows``.

    ``version``: keep only the rows of that commit version (a net feed,
    planned over the whole range, read version by version).
    """

    lo: int
    hi: int
    rows: RowRange | None  # None: the whole feed in one group
    version: int | None = None


def logged_images(state: TableState, lo: int, hi: int) -> int:
    """The images the commit log says versions ``(lo, hi]`` started or ended (an update counts two)."""
    return sum(c.inserted + 2 * c.updated + c.deleted for c in state.lineage.log.since(lo) if c.version <= hi)


def histogram(state: TableState, lo: int, hi: int, width: int) -> np.ndarray:
    """Images starting or ending in ``(lo, hi]`` per bin of ``width`` row ids (an upper bound: an image removed
    since counts in its live file's lineage and in the index segment that removed it)."""
    nbins = max(1, math.ceil(state.lineage.next_row_id / width)) + 1
    counts = np.zeros(nbins, np.int64)
    for c in state.lineage.log.since(lo):
        for seg in pieces(state.iceberg.io, c.index) if c.index else ():  # a few data files at a time
            keep = ((seg.valid_from > lo) & (seg.valid_from <= hi)) | ((seg.valid_to > lo) & (seg.valid_to <= hi))
            if keep.any():
                counts += np.bincount(np.minimum(seg.row_ids[keep] // width, nbins - 1), minlength=nbins)
    starts, ends = [], []
    for fl in live_lineage(state):
        if fl.max_updated <= lo or fl.min_updated > hi:
            continue
        pos_start, rid_start, _, updated = fl.breakpoints
        keep = (updated > lo) & (updated <= hi)
        if keep.any():
            length = np.append(pos_start[1:], fl.record_count) - pos_start
            starts.append(rid_start[keep])
            ends.append(rid_start[keep] + length[keep])
    if starts:
        edges = np.arange(nbins + 1, dtype=np.int64) * width
        counts += np.diff(_covered(np.concatenate(starts), edges) - _covered(np.concatenate(ends), edges))
    return counts


def _covered(points: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """For each edge x, the sum over ``points`` p below it of ``x - p`` (row ids of runs ``[s, e)`` below x: this of
    the starts less this of the ends)."""
    points = np.sort(points)
    below = np.searchsorted(points, edges, side="left")
    prefix = np.concatenate(([0], np.cumsum(points)))
    return below * edges - prefix[below]


def cut(counts: np.ndarray, width: int, group_rows: int) -> list[RowRange]:
    """Consecutive row-id ranges covering every row id, each holding at most ``group_rows`` of ``counts`` (or one bin)."""
    cum = np.cumsum(counts)
    out, i, done = [], 0, 0
    while i < len(counts):
        j = max(int(np.searchsorted(cum, done + group_rows, side="right")), i + 1)
        out.append((i * width, j * width))
        done, i = int(cum[j - 1]), j
    if not out:
        return [ALL_ROWS]
    out[0] = (ALL_ROWS[0], out[0][1])
    out[-1] = (out[-1][0], ALL_ROWS[1])  # nothing is left out, whatever the histogram missed
    return out


def row_ranges(state: TableState, lo: int, hi: int, group_rows: int = GROUP_ROWS) -> list[RowRange]:
    """Row-id ranges whose images of ``(lo, hi]`` are at most ``group_rows`` each, by :func:`histogram`."""
    width = max(1, math.ceil(state.lineage.next_row_id / BINS), group_rows // 64)
    return cut(histogram(state, lo, hi, width), width, group_rows)


def units(state: TableState, a: int, b: int, net: bool, group_rows: int = GROUP_ROWS) -> Iterator[Unit]:
    """The groups of the feed over ``(a, b]`` in the feed's order (see the module docstring), planned as they are reached."""
    if logged_images(state, a, b) <= group_rows:
        yield Unit(a, b, None)
        return
    if net:
        ranges = row_ranges(state, a, b, group_rows)
        for v in range(a + 1, b + 1):
            for rows in ranges:
                yield Unit(a, b, rows, v)
        return
    for v in range(a + 1, b + 1):
        images = logged_images(state, v - 1, v)  # the log's counts are a guide: no version is skipped on them
        for rows in [ALL_ROWS] if images <= group_rows else row_ranges(state, v - 1, v, group_rows):
            yield Unit(v - 1, v, rows)


def even_ranges(state: TableState, a: int, b: int, group_rows: int = GROUP_ROWS, least: int = 1) -> list[RowRange]:
    """Equal row-id ranges, as many as the commit log's images of ``(a, b]`` need at ``group_rows`` each (at least ``least``)."""
    n = max(1, least, math.ceil(logged_images(state, a, b) / group_rows))
    top = max(1, state.lineage.next_row_id)
    bounds = [ALL_ROWS[0]] + [top * k // n for k in range(1, n)] + [ALL_ROWS[1]]
    return [(bounds[k], bounds[k + 1]) for k in range(n)]


def check_files(state: TableState, a: int, b: int) -> None:
    """Raise :class:`~lineage.errors.LostFileError` if a data file holding removed images of ``(a, b]`` is gone (what
    planning the whole feed would raise), reading only each index segment's file names and versions, no row id."""
    pinned: dict[str, set[int]] = {}
    io = state.iceberg.io
    for c in state.lineage.log.since(a):
        if not c.index:
            continue
        pf = open_tagged_parquet(io, c.index, INDEX_FORMAT, "deleted-rows index segment", INDEX_FORMAT_VERSION)
        if any(n.startswith(VALUE_PREFIX) for n in pf.schema_arrow.names):
            continue  # captured values: the feed reads the removed images from the segment, not the data files
        t = pf.read(columns=["file_path", "valid_to", "valid_from_values"], use_threads=False)
        for path, to, starts in zip(*(t.column(n).to_pylist() for n in t.column_names), strict=True):
            if a < to <= b or any(a < v <= b for v in starts):
                pinned.setdefault(path, set()).add(to)
    check_pinned(io, pinned, a, b)
