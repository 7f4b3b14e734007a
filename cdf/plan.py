"""The change data feed, defined once over pointers, before any value is read.

Input: :class:`~cdf.pointers.Pointers`, one entry per row image with
``_row_id``, ``_row_created_at_version``, ``valid_from`` (the version that
wrote the image) and ``valid_to`` (the version that removed it; live images
have none). Output: a :class:`Skeleton`, one entry per row of the feed: the
image it shows, its change type and commit version, in the feed's order.

**Per-version mode** (docs/design.md, "Change feed"): every image starting in ``(a, b]``
is a start event at its ``valid_from``, every image ending there an end event
at its ``valid_to``. Events are ordered by (version, row id, end before
start). An end directly followed by a start of the same row at the same
version is an update pair (pre-image, then post-image); any other end is a
delete and any other start an insert.

**Net mode**: per row id, the image live at ``a`` (it ends in the range) and
the image live at ``b`` (it starts in the range and is still live at ``b``).
Both → an update pair; only the first → a delete; only the second → an
insert. The commit version is the last version in the range that started or
ended an image of the row. Ordered by (commit version, row id, pre-image
first). Everything is keyed by row id; nothing is compared on values here.

**Deleted rows** are the deletes of the per-version feed over the range,
ordered by (version, row id).

Update pairs are adjacent in a skeleton, pre-image first. What depends on
values is left to the engines, and is the same rule for all of them
(:data:`CHANGED_RULE`): ``_changed_columns`` of a pair names, in column
order, the selected columns whose values are distinct in the two images
(null-safe: null equals null; NaN equals NaN), and in net mode a pair whose
images are equal in every selected column is dropped. The embedded engine
applies the rule to Arrow arrays (:mod:`cdf.engine_duckdb`); the Spark
engine renders it as SQL (:func:`changed_sql`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cdf.dialect import Dialect
from cdf.pointers import LIVE, Pointers
from lineage.arrays import sort_in_place, stable_argsort

INSERT, PREIMAGE, POSTIMAGE, DELETE = 0, 1, 2, 3
CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")
CHANGED_RULE = "names of the selected columns whose values are distinct between the pre- and post-image (null = null, NaN = NaN)"

OUTPUT_COLUMNS = (
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
    "_row_id",
    "_row_created_at_version",
    "_row_last_updated_at_version",
    "_changed_columns",
)


@dataclass(frozen=True)
class Skeleton:
    """The rows of a feed before values: the pointer each row shows, its change code and commit version.

    Update pairs are adjacent (pre-image at ``i``, post-image at ``i + 1``).
    """

    pointer: np.ndarray
    change: np.ndarray
    version: np.ndarray

    def __len__(self) -> int:
        return len(self.pointer)

    @property
    def preimages(self) -> np.ndarray:
        """Row indices of the pre-images (their post-image is the next row)."""
        return np.flatnonzero(self.change == PREIMAGE)

    def without_pairs(self, preimages: np.ndarray) -> Skeleton:
        """The skeleton without the pairs whose pre-image rows are ``preimages``."""
        if not len(preimages):
            return self
        keep = np.ones(len(self), bool)
        keep[preimages] = False
        keep[preimages + 1] = False
        return Skeleton(self.pointer[keep], self.change[keep], self.version[keep])

    def only(self, change: int) -> Skeleton:
        """The rows of one change type."""
        keep = self.change == change
        return Skeleton(self.pointer[keep], self.change[keep], self.version[keep])


def feed_order(primary: np.ndarray, row_id: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The order by (``primary`` version, row id, ``last`` 0/1), stable.

    Versions span little and row ids fit in far fewer than 64 bits, so the
    three keys pack into one integer, sorted by :func:`~lineage.arrays.stable_argsort`.
    """
    if len(row_id) == 0:
        return np.zeros(0, np.int64)
    plo, rlo = int(primary.min()), int(row_id.min())
    pbits, rbits = (int(primary.max()) - plo).bit_length(), (int(row_id.max()) - rlo).bit_length()
    if pbits + rbits + 1 > 62:
        return np.lexsort((last, row_id, primary))
    # in place: at millions of events each temporary costs its page faults
    key = np.subtract(primary, plo, dtype=np.int64)
    key <<= rbits + 1
    r = np.subtract(row_id, rlo, dtype=np.int64)
    r <<= 1
    key |= r
    del r
    key |= last
    return stable_argsort(key, overwrite=True)


def per_version(p: Pointers, a: int, b: int) -> Skeleton:
    """The per-version feed over ``(a, b]`` (see the module docstring)."""
    ends = np.flatnonzero((p.valid_to > a) & (p.valid_to <= b))
    starts = np.flatnonzero((p.valid_from > a) & (p.valid_from <= b))
    n_ends = len(ends)
    pointer = np.concatenate((ends, starts))
    version = np.empty(len(pointer), np.int64)
    np.take(p.valid_to, ends, out=version[:n_ends])
    np.take(p.valid_from, starts, out=version[n_ends:])
    del ends, starts
    return events(pointer, version, p.row_id[pointer], n_ends)


def events(pointer: np.ndarray, version: np.ndarray, row_id: np.ndarray, n_ends: int) -> Skeleton:
    """The per-version feed of its events: image ``pointer[i]`` of row ``row_id[i]`` ends (the first ``n_ends``) or
    starts (the rest) at ``version[i]``; ordered and paired as the module docstring says. ``version`` and
    ``row_id`` (int64) are used as work arrays."""
    packed = _sorted_events(version, row_id, n_ends, overwrite=True)
    if packed is None:
        return _per_version_unpacked(pointer, version, row_id, n_ends)
    del row_id, version
    key, order, plo, rbits = packed
    del packed
    pointer = pointer[order]
    del order
    # the sorted keys hold the version and the start bit: no gather of them by the order
    start = np.empty(len(key), np.int8)
    np.bitwise_and(key, 1, out=start, casting="unsafe")
    start = start.view(bool)
    # an update pair: an end, then the start of the same row at the same version (the next key, start bit set)
    pair = key[1:] == key[:-1] + 1
    pair &= ~start[:-1]
    key >>= rbits + 1
    key += plo
    return Skeleton(pointer, _change_codes(start, pair), key)


def _sorted_events(version: np.ndarray, row_id: np.ndarray, n_ends: int,
                   overwrite: bool = False) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """The events (the first ``n_ends`` ends, the rest starts) sorted by (version, row id, end before start).

    Returns the sorted keys ``(version - plo) << (rbits + 1) | (row id - its min) << 1 | start``, the order
    that sorts the events (equal keys keep their input order), ``plo`` and ``rbits``; None when the key and
    the event number do not fit in 63 bits together. ``overwrite``: int64 ``version`` and ``row_id`` may be
    used as work arrays when the keys fit (their values are then lost).
    """
    n = len(row_id)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 0
    plo, rlo = int(version.min()), int(row_id.min())
    rbits = (int(row_id.max()) - rlo).bit_length()
    nbits = max((n - 1).bit_length(), 1)
    if (int(version.max()) - plo).bit_length() + rbits + 1 + nbits > 63:
        return None
    # in place from here: each temporary costs its page faults
    own = overwrite and version.dtype == np.int64 and row_id.dtype == np.int64
    key = np.subtract(version, plo, out=version) if own else np.subtract(version, plo, dtype=np.int64)
    key <<= rbits + 1
    r = np.subtract(row_id, rlo, out=row_id) if own else np.subtract(row_id, rlo, dtype=np.int64)
    r <<= 1
    key |= r
    del r
    key[n_ends:] |= 1
    key <<= nbits
    key |= np.arange(n, dtype=np.int64)  # the event number below the key: a plain sort is a stable one
    sort_in_place(key)
    order = key & ((1 << nbits) - 1)
    key >>= nbits
    return key, order, plo, rbits


def _per_version_unpacked(pointer: np.ndarray, version: np.ndarray, row_id: np.ndarray, n_ends: int) -> Skeleton:
    """:func:`per_version` of events whose keys do not pack into 63 bits."""
    start = np.concatenate((np.zeros(n_ends, np.int8), np.ones(len(pointer) - n_ends, np.int8)))
    order = feed_order(version, row_id, start)
    # one array at a time, so that at most one extra copy is alive (a feed of millions of rows)
    pointer = pointer[order]
    start = start[order]
    version = version[order]
    row_id = row_id[order]
    del order
    pair = (row_id[1:] == row_id[:-1]) & (version[1:] == version[:-1]) & (start[:-1] == 0) & (start[1:] == 1)
    return Skeleton(pointer, _change_codes(start == 1, pair), version)


def _change_codes(start: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """The change code of each event, from whether it starts an image and whether it and the next form a pair.

    A pair is an end followed by a start: int8 throughout (at millions of rows an int64 temporary is tens of MB).
    """
    codes = np.where(start, np.int8(INSERT), np.int8(DELETE))
    at = np.flatnonzero(pair)
    codes[at] = PREIMAGE
    at += 1
    codes[at] = POSTIMAGE
    return codes


def net(p: Pointers, a: int, b: int) -> Skeleton:
    """The net feed over ``(a, b]`` (see the module docstring)."""
    starts = (p.valid_from > a) & (p.valid_from <= b)
    ends = (p.valid_to > a) & (p.valid_to <= b)
    either = starts | ends
    if either.all():  # pointers built for (a, b] hold only such images: no copy
        pointer, s, e, vf, vt, row_id = np.arange(len(p)), starts, ends, p.valid_from, p.valid_to, p.row_id
    else:
        pointer = np.flatnonzero(either)
        s, e = starts[pointer], ends[pointer]
        vf, vt, row_id = p.valid_from[pointer], p.valid_to[pointer], p.row_id[pointer]
    del either
    at_a = vf <= a
    at_b = s & ((vt == LIVE) | (vt > b))
    last = np.maximum(np.where(s, vf, 0), np.where(e, vt, 0))
    # the commit version of a row: the last version in range that touched any of its images
    version = np.zeros(len(pointer), np.int64)
    if len(pointer):
        by_row = stable_argsort(row_id)
        sorted_rows = row_id[by_row]
        group_start = np.flatnonzero(np.concatenate(([True], sorted_rows[1:] != sorted_rows[:-1])))
        group_max = np.maximum.reduceat(last[by_row], group_start)
        version[by_row] = np.repeat(group_max, np.diff(np.append(group_start, len(pointer))))
    keep = at_a | at_b
    pointer, version, at_b, row_id = pointer[keep], version[keep], at_b[keep].astype(np.int64), row_id[keep]
    order = feed_order(version, row_id, at_b)
    pointer, version, at_b, row_id = pointer[order], version[order], at_b[order], row_id[order]
    pair = row_id[1:] == row_id[:-1]  # a row keeps at most its image at a and its image at b, in that order
    pre = np.concatenate((pair, [False]))
    post = np.concatenate(([False], pair))
    change = np.where(at_b == 1, np.where(post, np.int8(POSTIMAGE), np.int8(INSERT)), np.where(pre, np.int8(PREIMAGE), np.int8(DELETE)))
    return Skeleton(pointer, change, version)


def deleted(p: Pointers, since: int, until: int) -> Skeleton:
    """Rows deleted (not updated) in ``(since, until]``: the deletes of the per-version feed."""
    return per_version(p, since, until).only(DELETE)


def changed_sql(d: Dialect, columns: list[str], pre_prefix: str, post_prefix: str) -> str:
    """:data:`CHANGED_RULE` as SQL over a pair's columns (``<prefix><i>`` for column i).

    ``IS DISTINCT FROM`` is null-safe, and SQL engines compare NaN equal to NaN.
    """
    items = [
        f"CASE WHEN {d.ident(f'{pre_prefix}{i}')} IS DISTINCT FROM {d.ident(f'{post_prefix}{i}')} THEN {d.string(c)} END"
        for i, c in enumerate(columns)
    ]
    return d.non_null_strings(items)
