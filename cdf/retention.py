"""Which versions a change feed may span: the retention window and range resolution.

The guarantee is set by two table properties:

* ``lineage.cdf.retention.versions`` = N: ranges may start at any of the last N versions;
* ``lineage.cdf.retention.days`` = D: ranges may start at any version that was
  current at some time in the last D days.

With both set, either suffices (the window is the longer of the two). With
neither, every version since the table's creation is available. A table made
a lineage table by ``lineage.adopt`` has no feed before its adoption version:
ranges start there at the earliest.
"""

from __future__ import annotations

import datetime as _dt

from lineage.storage.commit_log import CommitEntry
from lineage.errors import HistoryGapError, InvalidArgumentError, RetentionError, UnknownVersionError, VersionRangeError
from lineage.properties import RETENTION_DAYS, RETENTION_VERSIONS
from lineage.retention import Window, window  # noqa: F401  (re-exported: the feed's API)
from lineage.state import TableState

# The window itself is read by maintenance too (what vacuum, purge and rehome must keep): it lives in lineage.retention.
PROP_RETENTION_VERSIONS = RETENTION_VERSIONS
PROP_RETENTION_DAYS = RETENTION_DAYS


def timestamp_ms(ts: object, what: str) -> int:
    """``ts`` (datetime, naive = UTC; ISO-8601 string; epoch milliseconds) as epoch milliseconds; ``what`` names it in errors."""
    if isinstance(ts, _dt.datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=_dt.timezone.utc)
        return int(ts.timestamp() * 1000)
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return int(ts)
    if isinstance(ts, str):
        try:
            return timestamp_ms(_dt.datetime.fromisoformat(ts), what)
        except ValueError:
            pass
    raise InvalidArgumentError(f"{what} must be a datetime, an ISO-8601 string or epoch milliseconds, got {ts!r}")


def version_at(win: Window, ts: object, what: str) -> int:
    """The version that was current at timestamp ``ts`` (0 before the first commit)."""
    ms = timestamp_ms(ts, what)
    version = win.log.version_at(ms)
    if version is None:  # before every reachable commit: before the table's first, or inside the expired part of the log
        return win.log.floor.version if win.log.floor else 0
    return version


def _check_version(win: Window, v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgumentError(f"{what} must be an integer version, got {v!r}")
    floor = max(win.log.floor.version if win.log.floor else 0, win.adopted or 0)
    # versions up to the floor of an expired log were commits; a range starting there is refused by retention
    known = 0 <= v <= floor or (v <= win.current and win.log.find(v) is not None)
    if not known and 0 < v < win.current:
        gap = next((c for c in win.log.since(v) if c.gap), None)
        if gap is not None and _before(win, gap.version) < v:  # a version folded into a gap: say so
            raise _gap_error(win, gap, f"{what}={v} lies in a gap")
    if not known or v > win.current:
        raise UnknownVersionError(
            f"{what}={v} is not a version of this table; versions run from 0 to {win.current} "
            f"and the oldest available start is {win.oldest}"
        )
    return v


def resolve_range(
    state: TableState,
    from_version: int | None = None,
    to_version: int | None = None,
    *,
    from_timestamp: object = None,
    to_timestamp: object = None,
) -> tuple[int, int]:
    """Validate a range and return ``(a, b)``: changes after version a up to and including b."""
    win = window(state)
    if from_version is not None and from_timestamp is not None:
        raise InvalidArgumentError("pass from_version or from_timestamp, not both")
    if to_version is not None and to_timestamp is not None:
        raise InvalidArgumentError("pass to_version or to_timestamp, not both")
    if from_version is None and from_timestamp is None:
        raise InvalidArgumentError("from_version (or from_timestamp) is required")
    a = version_at(win, from_timestamp, "from_timestamp") if from_timestamp is not None else _check_version(win, from_version, "from_version")
    if to_timestamp is not None:
        b = version_at(win, to_timestamp, "to_timestamp")
    elif to_version is not None:
        b = _check_version(win, to_version, "to_version")
    else:
        b = win.current
    if a > b:
        raise VersionRangeError(
            f"the range is reversed: from {a} is after to {b}; the start is exclusive and the end inclusive, so pass from <= to"
        )
    if win.adopted is not None and a < win.adopted:
        raise RetentionError(
            f"version {a} is before version {win.adopted}, where this Iceberg table was adopted as a lineage table "
            f"(lineage.adopt): its change feed starts at version {win.adopted}; pass from_version >= {win.adopted}"
        )
    if a < win.oldest:
        raise RetentionError(
            f"version {a} is older than the change-feed retention window; the oldest available version is {win.oldest} "
            f"(table properties {PROP_RETENTION_VERSIONS}, {PROP_RETENTION_DAYS})"
        )
    _check_gaps(win, a, b)
    return a, b


def _check_gaps(win: Window, a: int, b: int) -> None:
    """Refuse a range ``(a, b]`` that crosses a gap (lineage.reconcile.gap): its per-version changes are unknown."""
    for c in win.log.since(a):
        if c.version > b:
            return
        if c.gap:
            raise _gap_error(win, c, f"the change feed from version {a} to {b} crosses a gap")


def _before(win: Window, version: int) -> int:
    """The version of the log entry before ``version`` (0: none)."""
    return next((e.version for e in win.log.newest_first() if e.version < version), 0)


def _gap_error(win: Window, gap: CommitEntry, what: str) -> HistoryGapError:
    v = gap.version
    return HistoryGapError(
        f"{what}: another engine expired the snapshots after version {_before(win, v)} up to version {v} before this "
        f"library reconciled them, so only their net change is known (recorded at version {v}); read from version {v} on "
        f"(from_version >= {v})"
    )
