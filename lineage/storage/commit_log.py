"""The commit log: one entry per commit, kept in immutable chunks plus a short tail.

Format 1 lineage lists copied the whole log into every list, so a commit
wrote bytes proportional to the number of earlier commits. From list format 2
on, a list holds:

* a **tail** of the newest entries (at most :data:`CHUNK_ENTRIES`);
* a reference to the **head chunk**, the newest sealed one. A chunk holds its
  entries and a reference to the chunk before it, so the chunks form a chain
  back to the first commit. From list format 3 on, a chunk is normally an
  earlier *list*: the commit whose parent's tail is full (``CHUNK_ENTRIES``
  entries) names the parent's list as its head chunk (that list's tail and
  head are exactly a chunk's entries and previous) and starts a tail of one
  entry, so sealing writes no file at all. A tail that grew longer otherwise
  (maintenance rewriting the log, a format-1 parent) is written out as chunk
  files (JSON, format ``lineage-log`` version 1), as format 2 always did;
* a **floor** once the log was expired (``Table.maintain`` / ``expire_log``,
  following the change-feed retention): entries at or below the floor version
  are no longer reachable; the floor keeps its own version and timestamp and,
  for each commit property key (checkpoints of materialized views, user
  properties), the newest dropped entry that carried it; for the id of a
  change stream, the newest dropped entry of *each* stream.

A commit therefore writes the list's tail and nothing else for the log: O(1)
bytes, one object (the list) per commit. Readers walk from the newest entry
back only as far as they need (a feed over the last ten commits reads the tail
and at most a chunk or two); chunks are immutable and cached by path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyiceberg.io import FileIO

from lineage.errors import LineageMetadataError, UnsupportedFormatError
from lineage.storage.fileio import ImmutableFileCache, read_json, write_json

LOG_FORMAT = "lineage-log"
LOG_FORMAT_VERSION = 1
LIST_FORMAT = "lineage-list"  # lineage lists (lineage.storage.metadata), whose log an earlier list's may name as its head chunk
# 1: whole commit log inline; 2: chunked commit log, segment sizes; 3: a head chunk may be an earlier list; 4: a small
# commit's lineage segment inside its list (lineage.storage.metadata) (reads 1 to 4)
LIST_FORMAT_VERSION = 4
CHUNK_ENTRIES = 32  # most entries of a list's tail: the next commit names that list as its head chunk
# Commit properties whose value names one of many sequences (a change stream's id): expiry keeps the newest entry of
# each value, where for any other key it keeps the newest entry that carries the key.
PROP_STREAM_ID = "lineage.user.stream-id"
SERIES_KEYS = frozenset({PROP_STREAM_ID})
# Prefixes of the commit properties a caller may add (a stream position, a consumer's checkpoint): kept in the
# snapshot summary and in the commit log, also for snapshots another engine (or the equality strategy) committed.
USER_PROPERTY_PREFIXES = ("lineage.user.", "mv.")


def user_properties(properties: dict[str, str]) -> dict[str, str]:
    """The caller's properties among a snapshot summary's (:data:`USER_PROPERTY_PREFIXES`)."""
    return {k: v for k, v in properties.items() if k.startswith(USER_PROPERTY_PREFIXES)}


@dataclass(frozen=True)
class CommitEntry:
    """One line of the commit log."""

    version: int
    snapshot_id: int
    timestamp_ms: int
    operation: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    segment: str | None = None
    index: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    # Set for a snapshot another engine committed (reconciled, lineage.reconcile): the engine's name, or "unknown".
    foreign: str | None = None
    # Set on the commit that another engine's expired snapshots were folded into (lineage.reconcile.gap): its
    # counts are the net change since the previous entry, and no change feed range may cross it.
    gap: bool = False

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in lists and chunks."""
        return {
            "version": self.version,
            "snapshot-id": self.snapshot_id,
            "timestamp-ms": self.timestamp_ms,
            "operation": self.operation,
            "inserted": self.inserted,
            "updated": self.updated,
            "deleted": self.deleted,
            "segment": self.segment,
            "index": self.index,
            **({"properties": self.properties} if self.properties else {}),
            **({"foreign": self.foreign} if self.foreign else {}),
            **({"gap": True} if self.gap else {}),
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> CommitEntry:
        """Parse one commit log entry."""
        return CommitEntry(
            version=int(obj["version"]),
            snapshot_id=int(obj["snapshot-id"]),
            timestamp_ms=int(obj["timestamp-ms"]),
            operation=str(obj["operation"]),
            inserted=int(obj.get("inserted", 0)),
            updated=int(obj.get("updated", 0)),
            deleted=int(obj.get("deleted", 0)),
            segment=obj.get("segment"),
            index=obj.get("index"),
            properties={str(k): str(v) for k, v in (obj.get("properties") or {}).items()},
            foreign=str(obj["foreign"]) if obj.get("foreign") else None,
            gap=bool(obj.get("gap", False)),
        )


@dataclass(frozen=True)
class ChunkRef:
    """A sealed chunk of the log: its path and the range of its entries."""

    path: str
    first_version: int
    last_version: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    count: int

    def to_json(self) -> dict[str, Any]:
        """The JSON object naming the chunk."""
        return {
            "path": self.path,
            "first-version": self.first_version,
            "last-version": self.last_version,
            "first-timestamp-ms": self.first_timestamp_ms,
            "last-timestamp-ms": self.last_timestamp_ms,
            "count": self.count,
        }

    @staticmethod
    def from_json(obj: dict[str, Any] | None) -> ChunkRef | None:
        """Parse a chunk reference (None stays None)."""
        if obj is None:
            return None
        return ChunkRef(
            str(obj["path"]), int(obj["first-version"]), int(obj["last-version"]),
            int(obj["first-timestamp-ms"]), int(obj["last-timestamp-ms"]), int(obj["count"]),
        )


@dataclass(frozen=True)
class LogFloor:
    """What expiry left of the log below its oldest reachable entry."""

    version: int  # the newest dropped entry: every entry at or below it is gone
    timestamp_ms: int
    kept: tuple[CommitEntry, ...] = ()  # newest dropped entry per commit property key, oldest first

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the list."""
        return {"version": self.version, "timestamp-ms": self.timestamp_ms, "kept": [c.to_json() for c in self.kept]}

    @staticmethod
    def from_json(obj: dict[str, Any] | None) -> LogFloor | None:
        """Parse a floor (None stays None)."""
        if obj is None:
            return None
        return LogFloor(int(obj["version"]), int(obj["timestamp-ms"]), tuple(CommitEntry.from_json(c) for c in obj.get("kept", ())))


def _kept_under(entry: CommitEntry) -> Iterator[str]:
    """The names under which expiry keeps ``entry``: each property key, and for a series key its value too.

    A series key (:data:`SERIES_KEYS`) names one of many independent
    sequences, e.g. the id of a change stream: every stream's newest
    position must survive, not only the newest stream's.
    """
    for key, value in entry.properties.items():
        yield f"{key}={value}" if key in SERIES_KEYS else key


@dataclass(frozen=True)
class _Chunk:
    entries: tuple[CommitEntry, ...]
    previous: ChunkRef | None


_CHUNK_CACHE: ImmutableFileCache[_Chunk] = ImmutableFileCache(4096)


def _read_chunk_uncached(fileio: FileIO, path: str) -> _Chunk:
    try:
        obj = read_json(fileio, path)
    except FileNotFoundError:
        raise LineageMetadataError(
            f"commit log chunk {path} is missing: the lineage metadata of this table is incomplete "
            "(was the file deleted by hand or by a foreign vacuum?)"
        ) from None
    except ValueError as exc:
        raise LineageMetadataError(f"commit log chunk {path} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise LineageMetadataError(f"commit log chunk {path} is not a JSON object")
    kind = obj.get("format")
    if kind not in (LOG_FORMAT, LIST_FORMAT):
        raise LineageMetadataError(f"{path} is not a {LOG_FORMAT} file (format tag {kind!r}); the lineage metadata is corrupt")
    try:
        version = int(obj.get("format-version"))
    except (TypeError, ValueError):
        raise LineageMetadataError(f"{path} has no readable format version ({obj.get('format-version')!r})") from None
    supported = LOG_FORMAT_VERSION if kind == LOG_FORMAT else LIST_FORMAT_VERSION
    if version > supported:
        raise UnsupportedFormatError(
            f"{path} uses {kind} format version {version}, but this release reads up to {supported}; upgrade the library"
        )
    try:
        if kind == LOG_FORMAT:
            return _Chunk(tuple(CommitEntry.from_json(c) for c in obj["entries"]), ChunkRef.from_json(obj.get("previous")))
        if version == 1:  # an earlier list of format 1: its whole log inline
            return _Chunk(tuple(CommitEntry.from_json(c) for c in obj["commits"]), None)
        log = obj["log"]  # an earlier list: its tail and head chunk
        return _Chunk(tuple(CommitEntry.from_json(c) for c in log.get("tail", ())), ChunkRef.from_json(log.get("head")))
    except (KeyError, TypeError, ValueError) as exc:
        raise LineageMetadataError(f"commit log chunk {path} is malformed: {exc!r}") from exc


def _read_chunk(fileio: FileIO, path: str) -> _Chunk:
    return _CHUNK_CACHE.get(path, lambda: _read_chunk_uncached(fileio, path))


def _write_chunk(fileio: FileIO, path: str, entries: tuple[CommitEntry, ...], previous: ChunkRef | None) -> int:
    size = write_json(
        fileio, path,
        {"format": LOG_FORMAT, "format-version": LOG_FORMAT_VERSION, "entries": [c.to_json() for c in entries],
         "previous": previous.to_json() if previous else None},
    )
    _CHUNK_CACHE.get(path, lambda: _Chunk(entries, previous))
    return size


@dataclass(frozen=True)
class CommitLog:
    """The log as one list sees it: tail, head chunk and floor (see the module docstring)."""

    tail: tuple[CommitEntry, ...] = ()
    head: ChunkRef | None = None
    floor: LogFloor | None = None
    io: FileIO | None = field(default=None, compare=False, repr=False)  # reads chunks on demand
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ reading
    def newest_first(self) -> Iterator[CommitEntry]:
        """Every reachable entry, newest first (chunks are read only as the walk reaches them)."""
        floor = self.floor.version if self.floor else None
        for c in reversed(self.tail):
            if floor is not None and c.version <= floor:
                return
            yield c
        ref = self.head
        while ref is not None:
            if floor is not None and ref.last_version <= floor:
                break
            chunk = self._chunk(ref.path)
            for c in reversed(chunk.entries):
                if floor is not None and c.version <= floor:
                    break
                yield c
            ref = chunk.previous
        if self.floor:
            yield from reversed(self.floor.kept)

    def entries(self) -> tuple[CommitEntry, ...]:
        """Every reachable entry, oldest first (read once per log object)."""
        if "entries" not in self._memo:
            self._memo["entries"] = tuple(reversed(list(self.newest_first())))
        return self._memo["entries"]

    def since(self, version: int) -> tuple[CommitEntry, ...]:
        """Entries with a version above ``version``, oldest first."""
        out = []
        for c in self.newest_first():
            if c.version <= version:
                break
            out.append(c)
        return tuple(reversed(out))

    def find(self, version: int) -> CommitEntry | None:
        """The entry of ``version``, or None."""
        for c in self.newest_first():
            if c.version == version:
                return c
            if c.version < version:
                return None
        return None

    def version_at(self, timestamp_ms: int) -> int | None:
        """The version current at ``timestamp_ms``: the newest entry at or before it (None: before every reachable one)."""
        for c in self.newest_first():
            if c.timestamp_ms <= timestamp_ms:
                return c.version
        return None

    def last(self) -> CommitEntry | None:
        """The newest entry."""
        return next(self.newest_first(), None)

    def chunk_paths(self, stop: Callable[[str], bool] | None = None) -> list[str]:
        """Paths of the chunks this log reaches, newest first; the walk ends early where ``stop(path)`` is true."""
        out = []
        floor = self.floor.version if self.floor else None
        ref = self.head
        while ref is not None and (floor is None or ref.last_version > floor):
            if stop is not None and stop(ref.path):
                break
            out.append(ref.path)
            ref = self._chunk(ref.path).previous
        return out

    def _kept_versions(self) -> set[int]:
        return {c.version for c in self.floor.kept} if self.floor else set()

    def _chunk(self, path: str) -> _Chunk:
        if self.io is None:
            raise LineageMetadataError(f"commit log chunk {path} cannot be read: the log was built without a FileIO")
        return _read_chunk(self.io, path)

    # ------------------------------------------------------------------ writing
    def append(self, entry: CommitEntry) -> CommitLog:
        """The log with ``entry`` added at the end."""
        return replace(self, tail=self.tail + (entry,), _memo={})

    def rewritten(self, transform: Callable[[CommitEntry], CommitEntry]) -> CommitLog:
        """Every reachable entry passed through ``transform``; all of them go to the tail (sealed on the next write)."""
        kept = tuple(transform(c) for c in self.floor.kept) if self.floor else ()
        kept_versions = self._kept_versions()
        live = tuple(transform(c) for c in self.entries() if c.version not in kept_versions)
        floor = replace(self.floor, kept=kept) if self.floor else None
        return CommitLog(tail=live, head=None, floor=floor, io=self.io)

    def expired(self, before_version: int) -> CommitLog:
        """The log without the entries older than ``before_version`` (see :class:`LogFloor`)."""
        kept_versions = self._kept_versions()
        dropped = [c for c in self.entries() if c.version < before_version and c.version not in kept_versions]
        if not dropped:
            return self
        newest = dropped[-1]
        kept: dict[str, CommitEntry] = {}
        for c in list(self.floor.kept if self.floor else ()) + dropped:
            for key in _kept_under(c):
                kept[key] = c
        kept_entries = tuple(sorted({c.version: c for c in kept.values()}.values(), key=lambda c: c.version))
        tail = tuple(c for c in self.tail if c.version > newest.version)
        return CommitLog(tail=tail, head=self.head, floor=LogFloor(newest.version, newest.timestamp_ms, kept_entries), io=self.io)

    def sealed(
        self, fileio: FileIO, path_of: Callable[[int], str], created: list[str], parent: tuple[str, CommitLog] | None = None
    ) -> tuple[CommitLog, int]:
        """The log with a tail of at most :data:`CHUNK_ENTRIES` entries; and the bytes of chunk files written.

        ``parent`` is ``(path, log)`` of the list this log's commit is based
        on (a list already written). When this log is that one plus one entry
        and the parent's tail is full, the parent's list becomes the head
        chunk and the tail holds the new entry alone: nothing is written.
        Otherwise a tail too long is written out as chunk files; ``path_of(i)``
        names the i-th chunk written, and every path is appended to
        ``created`` before its file is written.
        """
        if len(self.tail) <= CHUNK_ENTRIES:
            return self, 0
        if parent is not None:
            path, before = parent
            if len(before.tail) == CHUNK_ENTRIES and before.head == self.head and before.tail == self.tail[:-1]:
                part = before.tail
                _CHUNK_CACHE.get(path, lambda: _Chunk(part, before.head))
                head = ChunkRef(path, part[0].version, part[-1].version, part[0].timestamp_ms, part[-1].timestamp_ms, len(part))
                return CommitLog(tail=self.tail[-1:], head=head, floor=self.floor, io=fileio), 0
        head, written = self.head, 0
        for i, start in enumerate(range(0, len(self.tail), CHUNK_ENTRIES)):
            part = self.tail[start : start + CHUNK_ENTRIES]
            path = path_of(i)
            created.append(path)
            written += _write_chunk(fileio, path, part, head)
            head = ChunkRef(path, part[0].version, part[-1].version, part[0].timestamp_ms, part[-1].timestamp_ms, len(part))
        return CommitLog(tail=(), head=head, floor=self.floor, io=fileio), written

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The ``log`` object of a format-2 list."""
        return {
            "tail": [c.to_json() for c in self.tail],
            "head": self.head.to_json() if self.head else None,
            **({"floor": self.floor.to_json()} if self.floor else {}),
        }

    @staticmethod
    def from_json(obj: dict[str, Any], fileio: FileIO | None) -> CommitLog:
        """Parse the ``log`` object of a format-2 list."""
        return CommitLog(
            tail=tuple(CommitEntry.from_json(c) for c in obj.get("tail", ())),
            head=ChunkRef.from_json(obj.get("head")),
            floor=LogFloor.from_json(obj.get("floor")),
            io=fileio,
        )
