"""Following the change feed as the table is written: each new range of versions with its changes.

:func:`follow` is a generator for Python services (forward each commit's
changes to a queue, mirror them into another store): it polls the table and
yields a :class:`ChangeRange` whenever the table moved past the last version
it yielded, the range's rows as a ``pyarrow.RecordBatchReader`` read part by
part (:func:`cdf.change_batches`), so memory holds one range's plan and one
batch whatever the table's size. A caller that stores ``to_version`` once it
has handled a range resumes exactly there with ``follow(table,
from_version=stored)``: ranges are start exclusive and end inclusive, like
:func:`cdf.changes`, so nothing is repeated or skipped.

:func:`next_end` is the step both followers take, this one and the Spark
Structured Streaming source (:mod:`cdf.spark_source`): where the next range
ends, given the commit log and the limits on versions and rows per range.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from cdf.api import DEFAULT_BATCH_ROWS, check_table, data_schema, feed_reader
from cdf.retention import resolve_range
from lineage.storage.commit_log import CommitEntry
from lineage.errors import InvalidArgumentError, VersionRangeError
from lineage.state import TableState
from lineage.table import Table


@dataclass(frozen=True)
class ChangeRange:
    """One step of :func:`follow`: the changes after ``from_version`` up to and including ``to_version``.

    ``changes`` yields the rows of ``cdf.changes(table, from_version,
    to_version)`` in the same order, batch by batch; it may yield none (the
    range holds only maintenance commits, which make no change events).
    Store ``to_version`` once the rows are handled: it is where to resume.
    """

    from_version: int
    to_version: int
    changes: pa.RecordBatchReader


def feed_rows(entry: CommitEntry) -> int:
    """The rows a commit adds to the per-version feed, from its log counts (an update is a pre- and a post-image)."""
    return entry.inserted + 2 * entry.updated + entry.deleted


def next_end(state: TableState, start: int, *, max_versions: int | None = None, max_rows: int | None = None,
             until: int | None = None) -> int:
    """Where the next range after version ``start`` ends: ``start`` itself when nothing was committed since.

    Without limits it is the current version (or ``until``, if lower). At
    most ``max_versions`` commits are taken, and no more commits once their
    feed rows (counted from the commit log: inserts, deletes and two rows per
    update) would pass ``max_rows``; the first commit is always taken, so a
    range never splits a version and always moves on.
    """
    entries = [c for c in state.lineage.log.since(start) if until is None or c.version <= until]
    if max_versions is not None:
        entries = entries[:max_versions]
    if max_rows is not None:
        taken, rows = 0, 0
        for c in entries:
            rows += feed_rows(c)
            if taken and rows > max_rows:
                break
            taken += 1
        entries = entries[:taken]
    return entries[-1].version if entries else start


def _whole(value: object, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{what} must be a whole number >= {low}, got {value!r}")
    return value


def follow(
    table: Table,
    from_version: int | None = None,
    to_version: int | None = None,
    *,
    from_timestamp: object = None,
    columns: Sequence[str] | None = None,
    poll_interval: float = 1.0,
    max_versions: int | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    stop: threading.Event | None = None,
) -> Iterator[ChangeRange]:
    """Follow the per-version change feed after ``from_version``: one :class:`ChangeRange` per step, as commits land.

    The start is exclusive, as in :func:`cdf.changes` (``from_timestamp``:
    the version current at that instant); it is checked by this call, so a
    start outside the retention window raises :class:`RetentionError` here.
    Each step looks at the table and yields the range up to its current
    version (at most ``max_versions`` versions); when nothing was committed
    it waits ``poll_interval`` seconds and looks again. Iteration ends after
    the range that reaches ``to_version`` (which may lie in the future), when
    ``stop`` (a ``threading.Event``) is set, or when the caller stops
    iterating. ``columns`` and ``batch_rows`` are those of
    :func:`cdf.change_batches`; the data columns are the table's at each
    step, so a range read after a schema change has the new columns.
    """
    table = check_table(table)
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
        raise InvalidArgumentError(f"poll_interval must be a number of seconds > 0, got {poll_interval!r}")
    if max_versions is not None:
        _whole(max_versions, "max_versions", 1)
    _whole(batch_rows, "batch_rows", 1)
    if stop is not None and not isinstance(stop, threading.Event):
        raise InvalidArgumentError(f"stop must be a threading.Event, got {type(stop).__name__}")
    state = table.state()
    start, _ = resolve_range(state, from_version, None, from_timestamp=from_timestamp)
    if to_version is not None and _whole(to_version, "to_version", 0) < start:
        raise VersionRangeError(f"the range is reversed: from {start} is after to {to_version}; pass to_version >= from_version")
    data_schema(table, columns)  # unknown columns fail now, not at the first step
    return _steps(table, start, to_version, columns, float(poll_interval), max_versions, batch_rows, stop)


def _steps(table: Table, start: int, to_version: int | None, columns: Sequence[str] | None, poll_interval: float,
           max_versions: int | None, batch_rows: int, stop: threading.Event | None) -> Iterator[ChangeRange]:
    while to_version is None or start < to_version:
        if stop is not None and stop.is_set():
            return
        state = table.state()
        end = next_end(state, start, max_versions=max_versions, until=to_version)
        if end == start:
            if stop is not None:
                stop.wait(poll_interval)
            else:
                time.sleep(poll_interval)
            continue
        a, b = resolve_range(state, start, end)  # retention and gaps, as for any feed
        yield ChangeRange(a, b, feed_reader(state, a, b, data_schema(table, columns), False, batch_rows))
        start = b
