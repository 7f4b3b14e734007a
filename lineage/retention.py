"""The retention window of a table's change feed: the oldest version a feed range may start at.

Set by two table properties (:mod:`lineage.properties`):

* ``lineage.cdf.retention.versions`` = N: ranges may start at any of the last N versions;
* ``lineage.cdf.retention.days`` = D: ranges may start at any version that was
  current at some time in the last D days.

With both set, either suffices (the window is the longer of the two). With
neither, every version since the table's creation is available. A table made
a lineage table by ``lineage.adopt`` has no feed before its adoption version.

The change feed (:mod:`cdf.retention`) resolves ranges inside the window;
maintenance keeps what the window needs (vacuum, purge, rehome, verify).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lineage.storage.commit_log import CommitEntry, CommitLog
from lineage.properties import RETENTION_DAYS, RETENTION_VERSIONS, read
from lineage.state import TableState


@dataclass(frozen=True)
class Window:
    """The versions a change-feed range may use: start >= ``oldest``, end <= ``current``.

    ``log`` is the commit log; it is read only as far back as a question needs.
    """

    oldest: int
    current: int
    log: CommitLog
    adopted: int | None = None  # the adoption version (lineage.adopt): no range starts before it

    @property
    def commits(self) -> tuple[CommitEntry, ...]:
        """Every reachable commit log entry, oldest first."""
        return self.log.entries()


def window(state: TableState, now_ms: int | None = None) -> Window:
    """The retention window of ``state``'s table at its current version."""
    props = state.iceberg.metadata.properties
    log = state.lineage.log
    current = state.version
    n = read(props, RETENTION_VERSIONS)
    d = read(props, RETENTION_DAYS)
    # An expired log (Table.maintain) reaches back to its floor: ranges may start there, not before.
    adopted = state.lineage.adopted
    floor = max(log.floor.version if log.floor else 0, adopted or 0)
    if n is None and d is None:
        return Window(floor, current, log, adopted)
    candidates = []
    if n is not None:
        candidates.append(max(0, current - int(n)))
    if d is not None:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        horizon = int(now_ms - d * 86_400_000)
        # The version current at the horizon: the last commit at or before it.
        candidates.append(log.version_at(horizon) or 0)
    return Window(max(floor, min(candidates)), current, log, adopted)
