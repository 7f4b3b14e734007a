"""The decoded row-group cache: column chunks of data files, kept between reads within a byte budget.

A change feed reads pre-images where they live, and the oldest, largest
files hold most of them: every feed over recent commits decodes the same
row groups of the bulk load again, and decoding them (zstd) is most of such a
feed's time (a 1M-row group of five columns: about 20 ms of CPU, for 25,000
pre-images). Data files are immutable, so :mod:`lineage.read.values` keeps the
column chunks it decoded here, keyed by file (path, size and modification
time), row group and column, and takes the next read's rows from them; so
does the write path's reader (:func:`lineage.read.values.values_at`: a change
stream's strict checks, key lookups that need values), and one budget
covers both.
A chunk is only served for a file that still exists unchanged (the reader
checks the file before it looks here). A purge clears the cache of its own
process; in another process, the first read 10 seconds or more after the
last sweep drops the chunks of files that are gone (so a process that stops
reading keeps them until it reads again, ends, or calls :func:`clear`).

The budget is ``LINEAGE_ROW_GROUP_CACHE_MB`` (environment variable, MB,
default 256; 0 turns the cache off), read at the start of each read. A chunk
is kept the second time a read decodes it, not the first: a process that
reads a feed once (a batch job) keeps nothing, and does not pay for keeping
it (the decoded chunks stay allocated instead of being reused by the next row
group, so the read touches that much more fresh memory: the 10M-row feed of
25 commits took 2.2 s in a fresh process keeping them, 0.9 s without), while
one that reads again keeps what it decodes from its second read on. The
first sight of a chunk is remembered as its key only (a bounded list of
recent keys, which hold no values and simply age out). A chunk larger than a
quarter of the budget is not kept.
Eviction is least recently used,
except that a chunk used by a read still under way is not evicted for
another chunk of about its size: when one read needs more than the budget
(ten 1M-row groups of a 10M-row table), it keeps what fits and decodes the
rest again next time, where plain LRU would evict every chunk just before it
is needed. It is evicted for a chunk at least :data:`DISPLACE_RATIO` times
smaller, though: a small chunk costs more to decode per byte (a file's and a
column's fixed costs: a 100,000-row file of five columns decodes at 79 ns a
row, a 1M-row group of the same columns at 41), so the budget goes to the
small files first and the large row groups share what is left (10M-row
table, feed of the last 5 commits: every chunk of its 24 small files
decoded again at each call, 0.18 s of CPU, while 34 of the bulk load's 50
chunks stayed).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa

from lineage.errors import InvalidArgumentError
from lineage.memory import count_as_kept
from lineage.storage.fileio import file_stamp

ENV_BUDGET = "LINEAGE_ROW_GROUP_CACHE_MB"
DEFAULT_BUDGET_MB = 256
MAX_SHARE = 0.25  # a chunk over this share of the budget is returned but not kept
SWEEP_SECONDS = 10.0  # how often a read drops the chunks of files that no longer exist
DISPLACE_RATIO = 4  # a chunk used by a running read is evicted only for one at least this many times smaller
SEEN_KEYS = 8192  # keys of chunks decoded once and not kept, remembered so that the next decoding keeps them

Key = tuple[str, int, str]  # (file_key(path, stamp), row group, file column)


def file_key(path: str, stamp: str) -> str:
    """The file part of a chunk's key: the local path and the file's stamp (:func:`lineage.storage.fileio.file_stamp`)."""
    return f"{path}\0{stamp}"


def budget_bytes() -> int:
    """The cache's budget in bytes, from ``LINEAGE_ROW_GROUP_CACHE_MB`` (0: off)."""
    raw = os.environ.get(ENV_BUDGET, str(DEFAULT_BUDGET_MB))
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not 0 <= mb < float("inf"):
        raise InvalidArgumentError(f"{ENV_BUDGET} must be a number of MB, 0 or more (0 turns the cache off), got {raw!r}")
    return int(mb * 2**20)


@dataclass
class _Entry:
    value: pa.ChunkedArray
    weight: int
    read: int  # the last read that used it


class DecodedCache:
    """A thread-safe LRU of decoded column chunks that never evicts for a read the chunks that read uses."""

    def __init__(self) -> None:
        self._items: OrderedDict[Key, _Entry] = OrderedDict()
        self._seen: OrderedDict[Key, int] = OrderedDict()  # key -> the read that decoded it and did not keep it
        self._held = 0
        self._budget = 0
        self._reads = 0
        self._active: set[int] = set()
        self._swept = time.monotonic()
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes of the chunks kept."""
        return self._held

    def __len__(self) -> int:
        return len(self._items)

    @contextmanager
    def read(self) -> Iterator[int | None]:
        """One read's scope: yields its number (None when the cache is off) for :meth:`get` and :meth:`put`."""
        budget = budget_bytes()
        if time.monotonic() - self._swept > SWEEP_SECONDS:
            self.sweep()
        with self._lock:
            self._budget = budget
            self._shrink(self._held - budget, partial=True)
            if budget == 0:
                number = None
            else:
                self._reads += 1
                number = self._reads
                self._active.add(number)
        try:
            yield number
        finally:
            if number is not None:
                with self._lock:
                    self._active.discard(number)

    def get(self, key: Key, read: int) -> pa.ChunkedArray | None:
        """The chunk kept for ``key``, or None; a hit belongs to ``read`` from now on."""
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                return None
            self._items.move_to_end(key)
            entry.read = read
            return entry.value

    def kept(self, key: Key) -> bool:
        """Whether a chunk is kept for ``key`` (a look only: no hit is counted, the order is unchanged)."""
        with self._lock:
            return key in self._items

    def claim(self, keys: list[Key], read: int) -> bool:
        """Mark the chunks kept for ``keys`` as used by ``read`` (so that its other chunks do not evict them before it
        gets to them: a read decodes its largest row groups first); return whether every key is kept."""
        with self._lock:
            every = True
            for key in keys:
                entry = self._items.get(key)
                if entry is None:
                    every = False
                else:
                    entry.read = read
            return every

    def put(self, key: Key, value: pa.ChunkedArray, read: int) -> bool:
        """Keep ``value`` if an earlier read decoded it too and it fits the budget after evicting chunks no read
        under way uses; return whether kept."""
        weight = value.nbytes
        with self._lock:
            if key in self._items or weight > self._budget * MAX_SHARE:
                return False
            if self._seen.get(key, read) == read:  # its first decoding (or a repeat within one read): the key only
                self._seen[key] = read
                self._seen.move_to_end(key)
                while len(self._seen) > SEEN_KEYS:
                    self._seen.popitem(last=False)
                return False
            if not self._shrink(self._held + weight - self._budget, smaller=weight):
                return False
            del self._seen[key]
            self._items[key] = _Entry(value, weight, read)
            self._held += weight
            return True

    def sweep(self) -> int:
        """Drop the chunks of files that no longer exist as they were when read; return how many were dropped.

        A key's file part is :func:`file_key` of the file's path and stamp.
        """
        self._swept = time.monotonic()
        with self._lock:
            files = {k[0] for k in self._items}
        gone = {f for f in files if not _unchanged(f)}
        if not gone:
            return 0
        with self._lock:
            dropped = [k for k in self._items if k[0] in gone]
            for k in dropped:
                self._held -= self._items.pop(k).weight
        return len(dropped)

    def clear(self) -> None:
        """Drop every chunk (and forget the keys seen once)."""
        with self._lock:
            self._items.clear()
            self._seen.clear()
            self._held = 0

    def _shrink(self, excess: int, partial: bool = False, smaller: int | None = None) -> bool:
        """Evict least recently used chunks no active read uses until ``excess`` bytes are freed; then, for a chunk of
        ``smaller`` bytes, chunks of running reads at least :data:`DISPLACE_RATIO` times larger, largest first.

        Returns whether they were; if not, nothing is evicted, unless
        ``partial`` (a lowered budget: evict what can be).
        """
        if excess <= 0:
            return True
        victims = []
        for key, entry in self._items.items():  # oldest first
            if entry.read not in self._active:
                victims.append(key)
                excess -= entry.weight
                if excess <= 0:
                    break
        if excess > 0 and smaller is not None:
            large = [(e.weight, k) for k, e in self._items.items() if e.read in self._active and e.weight >= DISPLACE_RATIO * smaller]
            for w, key in sorted(large, key=lambda wk: -wk[0]):
                victims.append(key)
                excess -= w
                if excess <= 0:
                    break
        if excess > 0 and not partial:
            return False
        for key in victims:
            self._held -= self._items.pop(key).weight
        return excess <= 0


def _unchanged(file: str) -> bool:
    """Whether the file a :func:`file_key` names still exists with the same stamp."""
    path, _, stamp = file.partition("\0")
    try:
        return file_stamp(path) == stamp
    except OSError:
        return False


CACHE = DecodedCache()
count_as_kept(lambda: CACHE.held)  # what it keeps is no freed memory for lineage.memory to return


def clear() -> None:
    """Drop every decoded chunk this process keeps (they are also evicted as the budget requires)."""
    CACHE.clear()
