"""Giving freed memory back to the operating system after large operations.

Arrow's allocator (mimalloc in the pyarrow wheels) and the C library's
``malloc`` keep pages they freed for later reuse. After a bulk append or a
change feed of a million rows, a long-lived process (a stream writer, an MV
refresh job, a notebook) would otherwise sit at its high-water mark: measured
on a 1M-row table, 560 MB resident after 25 writes and one feed, of which
about 200 MB were freed pages, against 344 MB once they were returned.

:func:`release_if_grown` runs at the end of every write (``run_write``) and
every change feed in this process. It reads the resident size (one read of
``/proc/self/statm``, Linux only; elsewhere it does nothing) and only when the
process grew by more than the slack since the last release (at the end of a
change feed, not counting what the caches of :func:`count_as_kept` hold more
than then) does it ask Arrow's
pool and glibc's ``malloc_trim`` to return free pages (about half a
millisecond on a small heap, ~10 ms after a feed of millions of rows). The
slack is ``LINEAGE_MEMORY_SLACK_MB`` (default 64); a negative value turns the
release off.

Since the releases bound what is kept, glibc's own trimming at every ``free``
is switched off when this module is imported (:func:`tune_malloc`): by
default glibc hands a freed block at the top of its heap back to the kernel
as soon as it exceeds the largest block freed so far, so every call of a
change feed faulted its arrays' pages in again (a third of the CPU time of a
feed of 295,000 rows at 1M: 81 against 59 ms). Free memory now stays for the
next operation, and :func:`release_if_grown` returns it once the process has
grown by more than the slack. Nothing is changed when releases are off, when
the C library is not glibc, or when the environment tunes ``malloc`` itself
(``MALLOC_*_`` variables or ``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable

import pyarrow as pa

from lineage.errors import InvalidArgumentError

log = logging.getLogger(__name__)

ENV_SLACK = "LINEAGE_MEMORY_SLACK_MB"
DEFAULT_SLACK_MB = 64

_lock = threading.Lock()
_floor: list[int | None] = [None]  # resident bytes right after the last release (None: never released)
_floor_kept = [0]  # bytes the caches of count_as_kept held at the floor
_KEPT: list[Callable[[], int]] = []


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _libc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to trim
        return None


# glibc's mallopt parameters, and the values set: blocks up to glibc's largest mmap threshold come from the
# heap (no mapping per array), and freeing never trims the heap by itself (release_if_grown does).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD = 1 << 30
_MMAP_THRESHOLD = 32 << 20
_MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


@functools.cache
def tune_malloc() -> bool:
    """Keep freed memory in glibc's heap for the next operation instead of trimming at every ``free`` (see the module docstring).

    Returns whether the allocator was tuned (once per process).
    """
    if any(name in os.environ for name in _MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        if slack_bytes() is None:
            return False
    except InvalidArgumentError:
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def _malloc_trim() -> None:
    trim = _libc_trim()
    if trim is not None:
        trim(0)


def slack_bytes() -> int | None:
    """Growth tolerated before a release, from ``LINEAGE_MEMORY_SLACK_MB`` (None: releases are off)."""
    raw = os.environ.get(ENV_SLACK, str(DEFAULT_SLACK_MB))
    try:
        mb = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"{ENV_SLACK} must be a whole number of MB (negative: off), got {raw!r}") from None
    return None if mb < 0 else mb << 20


def release_if_grown(resident: int | None = None, *, discount_kept: bool = False) -> bool:
    """Return free memory to the OS if the process grew by more than the slack since the last release.

    ``discount_kept``: what the caches of :func:`count_as_kept` hold more
    than at the last release is not counted as growth (the end of a change
    feed, see :func:`count_as_kept`). ``resident`` overrides the measured
    resident size (for tests). Returns whether a release ran.
    """
    return _release_past_slack(resident, within=False, discount_kept=discount_kept)


def release_within(resident: int | None = None) -> bool:
    """Return free memory to the OS between the phases of one large operation, if it grew by more than the slack.

    Arrow's pool (mimalloc), glibc's heap (NumPy and Python objects) and
    DuckDB's allocator each keep the pages they freed, and none can use the
    others': a write that matches a million rows in one allocator, then writes
    delete files in another and builds its key-index delta in a third peaked
    at the sum of their high-water marks (the upsert of 1M keys into a
    100M-row table: 568 MB, 467 MB with releases between its phases). Unlike
    :func:`release_if_grown` the floor is not raised to what the operation
    holds mid-way, so the release at its end still returns what it freed.
    ``resident`` overrides the measured resident size (for tests). Returns
    whether a release ran.
    """
    return _release_past_slack(resident, within=True, discount_kept=False)


def _release_past_slack(resident: int | None, *, within: bool, discount_kept: bool) -> bool:
    try:
        slack = slack_bytes()
    except InvalidArgumentError as exc:  # runs after commits: a bad setting must not turn a committed write into an error
        log.warning("%s; memory is not released", exc)
        return False
    if slack is None:
        return False
    now = _resident_bytes() if resident is None else resident
    if now is None:
        return False
    kept = _kept_bytes()
    with _lock:
        floor, floor_kept = _floor[0], _floor_kept[0]
        if floor is not None:
            grown = now - floor - (kept - floor_kept if discount_kept else 0)
            if grown <= slack:
                if not within and grown < 0:  # growth counts from the lowest point seen since the last release
                    _floor[0], _floor_kept[0] = now, kept
                return False
        _release(now, resident)
        if within:  # the floor stays where the operation started (or unset)
            after = _floor[0]
            if floor is None or after is None or floor <= after:
                _floor[0], _floor_kept[0] = floor, floor_kept
    return True


def count_as_kept(held: Callable[[], int]) -> None:
    """Register a bounded cache: ``held()`` is the bytes it keeps, which ``release_if_grown(discount_kept=True)``
    does not count as growth.

    A release only returns free pages. When a change feed fills a cache with
    what it decoded, a release on that growth returns the feed's other freed
    pages, which the next feed faults in again: in the 1M-row benchmark's
    process (writes, then five calls of the feed of all commits), the second
    call keeps the row groups it decodes (about 43 MB) and crossed the slack,
    so the third call took 10-30% more CPU than the fourth. The end of a
    change feed therefore counts growth net of what the registered caches
    hold more than at the last release (a cache that shrank leaves what it
    freed counted); writes count all growth, so the memory a process holds
    between writes is bounded as before.
    """
    _KEPT.append(held)


def _kept_bytes() -> int:
    return sum(held() for held in _KEPT)


def release_at_end(resident: int | None = None) -> bool:
    """Return free memory to the OS at the end of a long streamed operation, whatever the slack (unless releases are off).

    A stream returns memory between its parts only past the slack, so up to
    the slack of freed pages (and its plan, freed last) would otherwise stay
    with the process after it. Returns whether a release ran.
    """
    try:
        if slack_bytes() is None:
            return False
    except InvalidArgumentError as exc:
        log.warning("%s; memory is not released", exc)
        return False
    now = _resident_bytes() if resident is None else resident
    if now is None:
        return False
    with _lock:
        _release(now, resident)
    return True


def release_pool() -> bool:
    """Return the free pages of Arrow's pool to the OS now (unless releases are off); returns whether it ran.

    Called by a decoding worker after a large column chunk (:mod:`lineage.read.values`): the chunk's
    buffers are freed once its rows are taken, but mimalloc keeps a thread's freed pages resident for a
    while, so the other worker's chunks and the feed's result came on top of them (the first feed of
    the 1M-row benchmark, its 1M-row group read in two threads: 15-30 MB lower peak, same CPU time).
    Only Arrow's pool: no ``malloc_trim``, no resident-size bookkeeping.
    """
    try:
        if slack_bytes() is None:
            return False
    except InvalidArgumentError:
        return False
    pa.default_memory_pool().release_unused()
    return True


def _release(now: int, resident: int | None) -> None:
    pa.default_memory_pool().release_unused()
    _malloc_trim()
    after = _resident_bytes() if resident is None else resident
    _floor[0] = now if after is None else after
    _floor_kept[0] = _kept_bytes()


def load_pandas_for_pyarrow() -> None:
    """Have pyarrow import pandas now, in the importing thread, as it does at its first conversion of values.

    pyarrow imports pandas the first time it converts NumPy or Python values
    (``pa.array``, ``pa.scalar``, importing ``pyarrow.dataset``), under a lock
    of its own. Left to a feed's first conversion, that could happen in a
    decoding thread while another thread imports a module that converts
    values (pyiceberg's Arrow I/O imports ``pyarrow.dataset``): each waits for
    the other's lock. Every real use converts values, so nothing is saved by
    deferring it.
    """
    pa.array(range(0), pa.int8())


tune_malloc()
load_pandas_for_pyarrow()
