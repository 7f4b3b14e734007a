"""What became of a commit: landed, known not to have landed, or unknown.

A catalog call can fail after the commit landed (the reply was lost), and the
read-back that would tell can fail too. Every commit path of the project
goes through this module, under one rule: **a file written for an attempt
is deleted only when the attempt is known not to have landed.**

* :func:`send` makes one catalog call and, if it fails with anything but
  pyiceberg's ``CommitFailedException`` (the catalog refused it: known not
  landed), reloads the table from the catalog and looks for the attempt
  (its snapshot id; for metadata-only commits a caller-given check). Found:
  the call succeeded. Not found: :class:`CommitPending`. The reload failed
  every time: :class:`~lineage.errors.CommitStateUnknownError` (also when the
  catalog itself said the state is unknown, pyiceberg's REST
  ``CommitStateUnknownException``, and the commit is not visible yet: the
  server may still apply it, so it is not retried).
* An attempt that was not found is not yet known to be lost. Every commit of
  ours asserts the snapshot ``main`` pointed at when it was planned, so once
  ``main`` points elsewhere and the attempt's snapshot is not in the table's
  history, it can never land: only then are its files deleted.
  :class:`CommitLoop` keeps these attempts while it retries, recognises one
  that landed late (it reports it as the operation's result instead of
  committing the change again) and releases the dead ones.
* Metadata-only commits (table properties, snapshot expiry) write no files
  of ours and are idempotent: :func:`commit_metadata` retries them after
  establishing that the previous try did not land.

:func:`find_commit` tells whether a commit on ``main`` carries a property
(an idempotency token such as a change-stream batch id; :func:`newest_commit`
searches any commit log, e.g. a planned state's), and
:func:`has_commit` whether a snapshot id was committed; both consult the
lineage commit log as well, so they still answer after snapshot expiry.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.metadata import TableMetadata

from lineage.errors import CatalogFailedError, CommitStateUnknownError, LineageError
from lineage.storage.metadata import SUMMARY_LIST, CommitEntry, read_list
from lineage.state import main_branch_snapshots

log = logging.getLogger(__name__)

T = TypeVar("T")
_NONE = object()  # no earlier attempt landed

RELOAD_TRIES = 4  # reads of the catalog made to establish an outcome before it is declared unknown
METADATA_TRIES = 3  # tries of a metadata-only commit whose catalog call failed transiently
RELOAD_PAUSE = 0.05  # seconds before the second read-back; doubled before each later one


def backoff(attempt: int) -> None:
    """Sleep before retry ``attempt`` (1-based): exponential, capped at 2 s, jittered."""
    time.sleep(min(2.0, 0.01 * 2 ** min(attempt, 8)) * random.uniform(0.5, 1.5))


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a catalog hiccup worth retrying (a locked or lost database connection, a timeout)."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover - sqlalchemy comes with pyiceberg's SQL catalog
        return isinstance(exc, (ConnectionError, TimeoutError))
    return isinstance(exc, (OperationalError, ConnectionError, TimeoutError))


class CommitPending(Exception):
    """A commit call failed and the reloaded table does not hold the attempt (yet).

    ``retryable`` says whether the failure was transient. Internal: the
    commit loops catch it; it never reaches a caller.
    """

    def __init__(self, cause: BaseException, retryable: bool) -> None:
        super().__init__(f"the commit call failed and the commit is not in the table: {cause}")
        self.cause = cause
        self.retryable = retryable


@dataclass
class Attempt:
    """One try at a commit: the files written for it and what is known of its outcome."""

    files: list[str] = field(default_factory=list)  # every file written for this attempt
    snapshot_id: int | None = None  # the snapshot it commits (set when the commit call is made)
    parent_id: int | None = None  # main's snapshot it asserts (None: an empty table)
    sent: bool = False  # the commit call was made: the attempt may have landed
    number: int = 0
    result: Any = None  # what the commit reports (CommitResult), known before the call
    describe: Callable[[Any], Any] | None = None  # turns ``result`` into the operation's return value


def reload(
    refresh: Callable[[], Any], what: str, tries: int = RELOAD_TRIES, retry: Callable[[BaseException], bool] | None = None
) -> BaseException | None:
    """Reload a table from its catalog with ``refresh``; the last error if every try failed, else None.

    Failures are retried (with a short pause) while ``retry`` says so (by default always).
    """
    error: BaseException | None = None
    for i in range(tries):
        try:
            refresh()
            return None
        except Exception as exc:  # noqa: BLE001 - any failure to read back leaves the outcome open
            error = exc
            if retry is not None and not retry(exc):
                return exc
            log.info("%s: reading the table back from the catalog failed (try %d of %d): %s", what, i + 1, tries, type(exc).__name__)
            if i + 1 < tries:
                time.sleep(RELOAD_PAUSE * 2**i)
    return error


def _commit_log(iceberg: IcebergTable) -> Iterator[CommitEntry]:
    """The lineage commit log of ``main``'s newest snapshot that has one, newest first (empty if none).

    Read lazily: the log's older chunks are read only if the caller goes that far.
    """
    for snap in reversed(main_branch_snapshots(iceberg)):
        summary = snap.summary.additional_properties if snap.summary else {}
        if SUMMARY_LIST in summary:
            return read_list(iceberg.io, summary[SUMMARY_LIST]).log.newest_first()
    return iter(())


def has_commit(iceberg: IcebergTable, snapshot_id: int) -> bool:
    """Whether snapshot ``snapshot_id`` was committed to the table (in its metadata or its lineage commit log)."""
    if iceberg.metadata.snapshot_by_id(snapshot_id) is not None:
        return True
    return any(c.snapshot_id == snapshot_id for c in _commit_log(iceberg))


def find_commit(iceberg: IcebergTable, key: str, value: str) -> CommitEntry | None:
    """The newest commit on ``main`` whose properties hold ``key = value``, or None.

    The properties are those a writer passed with its commit (they are in
    the snapshot summary and the lineage commit log), e.g. a change-stream
    batch id or ``mv.source-version``: a writer that retries after a lost
    reply calls this on freshly loaded metadata to learn whether its batch
    already landed.
    """
    return newest_commit(_commit_log(iceberg), lambda props: props.get(key) == value)


def newest_commit(newest_first: Iterable[CommitEntry], match: Callable[[Mapping[str, str]], bool]) -> CommitEntry | None:
    """The first entry of a commit log read newest first whose properties satisfy ``match``, or None.

    The search stops at the first hit, so a writer that commits often finds
    its last commit among the last few entries (and a lazily read log is
    read no further).
    """
    return next((c for c in newest_first if match(c.properties)), None)


def _main_head(metadata: TableMetadata) -> int | None:
    snap = metadata.current_snapshot()
    return snap.snapshot_id if snap is not None else None


def _state_of(iceberg: IcebergTable, attempt: Attempt) -> str:
    """``landed``, ``open`` (may still land) or ``dead`` (can never land), on ``iceberg``'s loaded metadata."""
    if attempt.snapshot_id is None:
        return "dead"
    if iceberg.metadata.snapshot_by_id(attempt.snapshot_id) is not None:
        return "landed"
    if _main_head(iceberg.metadata) == attempt.parent_id:
        return "open"  # main has not moved: the attempt's assertion still holds
    try:  # main moved on: the attempt landed (and was expired since) or never will
        return "landed" if has_commit(iceberg, attempt.snapshot_id) else "dead"
    except (LineageError, OSError) as exc:
        log.info("could not read the commit log to settle snapshot %s: %s", attempt.snapshot_id, exc)
        return "open"


def send(iceberg: IcebergTable, call: Callable[[], None], landed: Callable[[IcebergTable], bool], what: str) -> None:
    """Make the catalog call ``call``; if it fails, establish from a fresh read whether it landed.

    Returns when the call succeeded or its commit is found (``landed`` on the
    reloaded table). Raises ``CommitFailedException`` when the catalog refused
    the commit, :class:`CommitPending` when the commit is not in the reloaded
    table, and :class:`~lineage.errors.CommitStateUnknownError` when the table
    cannot be read back or the catalog said the outcome is unknown and the
    commit is not visible yet.
    """
    try:
        call()
        return
    except CommitFailedException:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever it was, the commit may have landed
        error = reload(iceberg.refresh, what)
        name = ".".join(iceberg.name()[-2:])
        if error is not None:
            raise CommitStateUnknownError(name, [], exc) from exc
        try:
            found = landed(iceberg)
        except Exception as check:  # noqa: BLE001 - e.g. an unreadable commit log: still unknown
            raise CommitStateUnknownError(name, [], check) from exc
        if found:
            log.warning("%s: the catalog call failed (%s) but the commit landed; reporting success", what, type(exc).__name__)
            return
        if isinstance(exc, CommitStateUnknownException):
            raise CommitStateUnknownError(name, [], exc) from exc  # the server itself may still commit it
        raise CommitPending(exc, is_transient(exc)) from exc


def delete_files(iceberg: IcebergTable, paths: Iterable[str]) -> None:
    """Best-effort removal of files written for an attempt known not to have landed."""
    for path in paths:
        try:
            iceberg.io.delete(path)
        except Exception:  # noqa: BLE001 - vacuum removes what is left
            log.debug("could not remove %s (vacuum will)", path)


class CommitLoop(Generic[T]):
    """Runs one operation's commit attempts: re-plans after lost races, never commits a change twice.

    ``refresh`` reloads the table from the catalog (``iceberg`` then returns
    the reloaded pyiceberg table). ``shared`` are files every attempt uses
    (an append's data files, written once): they are deleted only when the
    operation ends without a commit and no attempt may still land.
    """

    def __init__(
        self,
        name: str,
        iceberg: Callable[[], IcebergTable],
        refresh: Callable[[], Any],
        retries: int,
        shared: list[str] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.name = name
        self.log = logger
        self._iceberg = iceberg
        self._refresh = refresh
        self.retries = retries
        self.shared = shared if shared is not None else []
        self.pending: list[Attempt] = []

    def run(self, attempt_fn: Callable[[Attempt], T], give_up: Callable[[int], BaseException]) -> T:
        """Call ``attempt_fn`` until one attempt commits (or has nothing to commit); its value is returned.

        ``attempt_fn`` plans against the freshly loaded table, records every
        file it writes in ``attempt.files`` and commits through
        :func:`lineage.commits.commit.commit_change` (or returns without committing).
        ``give_up(n)`` is raised after ``n`` lost races in a row.
        """
        transient: BaseException | None = None
        for number in range(1, self.retries + 2):
            landed = self._start()
            if landed is not _NONE:
                return landed  # type: ignore[return-value]
            attempt = Attempt(number=number)
            try:
                value = attempt_fn(attempt)
            except CommitFailedException as exc:
                self.log.info("%s lost a race (attempt %d): %s", self.name, number, exc)
                delete_files(self._iceberg(), attempt.files)
                transient = None
            except CommitPending as exc:
                self.log.info("%s: the catalog call failed and the commit is not in the table (attempt %d): %s", self.name, number, exc.cause)
                self.pending.append(attempt)
                self._settle()
                if not exc.retryable:
                    self._end(None)
                    raise exc.cause from None
                transient = exc.cause
            except CommitStateUnknownError as exc:
                exc.add_snapshot_ids([a.snapshot_id for a in self.pending + [attempt] if a.snapshot_id is not None])
                raise  # nothing is cleaned up: every attempt's files stay for vacuum
            except BaseException:
                if attempt.sent:  # interrupted inside the catalog call: the attempt may have landed
                    self.pending.append(attempt)
                else:
                    delete_files(self._iceberg(), attempt.files)
                self._end(None)
                raise
            else:
                self._end(attempt if attempt.sent else None)
                return value
            backoff(number)
        landed = self._start()  # a last look: one of the failed calls may have landed meanwhile
        if landed is not _NONE:
            return landed  # type: ignore[return-value]
        self._end(None)
        if transient is not None:
            raise CatalogFailedError(
                f"{self.name}: the catalog failed {self.retries + 1} times (last: {type(transient).__name__}: {transient}); "
                "each time the table was read back and the commit had not landed. Nothing was committed: retry when the catalog is back"
            ) from transient
        raise give_up(self.retries + 1)

    def _start(self) -> Any:
        """Reload the table; the value of an earlier attempt found to have landed, else ``_NONE``."""
        # With attempts in doubt a failing read is retried (it decides their fate); otherwise Table.refresh's own retries do.
        error = reload(self._refresh, self.name, tries=RELOAD_TRIES if self.pending else 1)
        if error is not None:
            if self.pending:
                raise CommitStateUnknownError(self.name, [a.snapshot_id for a in self.pending if a.snapshot_id is not None], error)
            raise error
        landed = self._settle()
        if landed is None:
            return _NONE
        self.log.warning("%s: attempt %d landed after its catalog call failed; not committing the change again", self.name, landed.number)
        self._end(landed)
        return landed.describe(landed.result) if landed.describe else landed.result

    def _settle(self) -> Attempt | None:
        """Forget pending attempts that can never land (deleting their files); return one that landed."""
        ice = self._iceberg()
        still: list[Attempt] = []
        landed = None
        for a in self.pending:
            state = _state_of(ice, a)
            if state == "landed":
                landed = a
            elif state == "dead":
                delete_files(ice, a.files)
            else:
                still.append(a)
        self.pending = still
        return landed

    def _end(self, landed: Attempt | None) -> None:
        """The operation is over: release what can be released."""
        ice = self._iceberg()
        if landed is not None:
            # main now points at (or past) the landed snapshot, so no other attempt can land
            for a in self.pending:
                if a is not landed and a.snapshot_id is not None and ice.metadata.snapshot_by_id(a.snapshot_id) is None:
                    delete_files(ice, [f for f in a.files if f not in landed.files])
            self.pending = []
            return
        self._settle()
        if not self.pending:
            delete_files(ice, self.shared)
        else:
            self.log.warning("%s: %d attempt(s) may still land; their files are kept (vacuum removes them if not)", self.name, len(self.pending))


def commit_metadata(
    iceberg: IcebergTable,
    apply: Callable[[IcebergTable], None],
    landed: Callable[[IcebergTable], bool],
    what: str,
    tries: int = METADATA_TRIES,
) -> None:
    """Commit a metadata-only change (properties, snapshot expiry) that writes no file of ours.

    ``apply`` makes the commit against ``iceberg``'s loaded metadata and must
    be idempotent (it is called again after a try that did not land);
    ``landed`` tells from reloaded metadata whether the change is there.
    Raises ``CommitFailedException`` if the catalog refused it,
    :class:`~lineage.errors.CatalogFailedError` after ``tries``
    transient failures, :class:`~lineage.errors.CommitStateUnknownError`
    when the outcome cannot be established.
    """
    for number in range(1, tries + 1):
        try:
            send(iceberg, lambda: apply(iceberg), landed, what)
            return
        except CommitPending as exc:
            if not exc.retryable:
                raise exc.cause from None
            if number == tries:
                raise CatalogFailedError(
                    f"{what}: the catalog failed {tries} times (last: {exc.cause}); the change did not land. Retry when the catalog is back"
                ) from exc.cause
            backoff(number)
