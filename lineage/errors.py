"""The project's exception hierarchy.

Every error a caller can provoke with bad input or a lost race is a subclass of
:class:`LineageError`, so ``except LineageError`` catches all expected failures
while genuine bugs still surface as ordinary Python exceptions.
"""

from __future__ import annotations


class LineageError(Exception):
    """Base class of every error raised on purpose by this project."""


class InvalidArgumentError(LineageError, ValueError):
    """An argument has a value that is not allowed (the message names it)."""


class TableNotFoundError(LineageError):
    """The named table does not exist in the catalog."""


class TableAlreadyExistsError(LineageError):
    """``create_table`` was asked for a name that is already taken."""


class UnknownColumnError(InvalidArgumentError):
    """A column named by the caller is not in the table's schema."""


class SchemaMismatchError(InvalidArgumentError):
    """Incoming data does not fit the table's schema."""


class BadPredicateError(InvalidArgumentError):
    """A ``where`` predicate or a ``set`` expression is not one allowed scalar expression (the message names what was refused)."""


class KeyViolationError(InvalidArgumentError):
    """A batch has null or duplicate values in the table key, or the table has no key."""


class UnknownVersionError(InvalidArgumentError):
    """A version (or timestamp) does not name a commit of this table."""


class CommitConflictError(LineageError):
    """Concurrent writers kept winning the commit race; nothing was committed."""


class VersionMovedError(CommitConflictError):
    """A write given ``expected_version`` found the table at another version; nothing was committed."""

    def __init__(self, table: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{table} is at version {actual}, not the expected version {expected}: another writer committed first; "
            "nothing was committed. Re-read the table and retry"
        )
        self.expected = expected
        self.actual = actual


class CatalogFailedError(CommitConflictError):
    """The catalog kept failing; after each failure the table was re-read and the write had not landed.

    Nothing was committed: retry when the catalog is back.
    """


class CatalogUnavailableError(LineageError):
    """The catalog could not be reached (its server down, restarting or unreachable) to read or change a table.

    Nothing was changed by the call that raised it. Check that the catalog's
    server runs and accepts connections, then call again. (A commit whose
    outcome the catalog could not confirm raises
    :class:`CommitStateUnknownError` instead.)
    """


class CommitStateUnknownError(LineageError):
    """A commit was sent but whether it landed could not be established (the catalog could not be read back).

    The table is safe either way: it is in the old or the new state, and the
    files the commit needs were kept. Do not retry blindly: once the catalog
    answers again, ask ``table.has_commit(snapshot_id)`` for each id in
    ``snapshot_ids`` and retry only if none landed (maintenance operations
    and materialized-view refreshes may simply be run again).
    """

    def __init__(self, table: str, snapshot_ids: list[int], cause: BaseException | None = None) -> None:
        self.table = table
        self.snapshot_ids = list(snapshot_ids)
        self.cause = cause
        super().__init__(self._message())

    def _message(self) -> str:
        why = f" ({type(self.cause).__name__}: {self.cause})" if self.cause is not None else ""
        if self.snapshot_ids:
            ids = ", ".join(str(i) for i in self.snapshot_ids)
            what = f"check table.has_commit(id) for snapshot id(s) {ids} and retry only if none landed"
        else:
            what = "re-read the table to see whether the change is there (running this operation again is safe)"
        return (
            f"the outcome of a commit to {self.table} is unknown: the catalog could not be read back after the commit call "
            f"failed{why}. The table holds either the old or the new state and nothing was cleaned up. Do not retry blindly: "
            f"when the catalog answers again, {what}"
        )

    def add_snapshot_ids(self, ids: list[int]) -> None:
        """Also name earlier attempts of the same operation whose outcome is open."""
        self.snapshot_ids = sorted(set(self.snapshot_ids) | set(ids))
        self.args = (self._message(),)


class LineageMetadataError(LineageError):
    """Lineage metadata is missing, unreadable or inconsistent with the Iceberg snapshot."""


class UnsupportedFormatError(LineageMetadataError):
    """A lineage or index file was written in a format version this release cannot read."""


class PuffinFormatError(LineageMetadataError):
    """A Puffin file or a deletion vector in it is not valid (wrong magic, length or CRC-32, truncated, bad footer)."""


class VersionRangeError(InvalidArgumentError):
    """A version range is reversed or otherwise malformed."""


class RetentionError(InvalidArgumentError):
    """A version range starts before the table's change-feed retention window.

    The message names the oldest version a range may start from.
    """


class HistoryGapError(RetentionError):
    """A change-feed range crosses a gap: versions another engine expired before this library reconciled them.

    Their net change is recorded at the first surviving version (commit log
    entry ``gap``); the message names it and the range that is still readable.
    """


class StreamPositionLostError(LineageError):
    """A change stream's last committed batch cannot be established any more, so a batch cannot be told new or replayed.

    Raised instead of applying the batch (which could apply it twice). The
    message names the stream, the reason (snapshots expired before this
    library recorded their positions) and what to do.
    """


class LostFileError(LineageMetadataError):
    """A data file that holds removed row images of a change-feed range was deleted (e.g. by another engine's
    ``expire_snapshots`` or ``remove_orphan_files``). The message names the file and the affected versions."""


class FeedSchemaChangedError(LineageError):
    """The change feed's columns changed under a running stream (the table's schema evolved, or a first purge
    added ``_purged``). The stream stops before it emits a batch of another shape; restart it from its
    checkpoint to read on with the new columns."""
