"""On-disk lineage metadata: per-file segments and the per-snapshot lineage list.

Two immutable file kinds, both written before the Iceberg commit and made
visible by it (the snapshot summary points at the list):

* a **segment** (Parquet, ``lineage-segment`` format 1) holds, for each data
  file a commit added, the run-length encoded row ids, created versions and
  updated versions by position. A data file's lineage never changes while the
  file exists, so each file is described exactly once;
* a **lineage list** (JSON, ``lineage-list`` format 1) is written by every
  commit. It names the segments that still describe live data files, the
  table's next row id, and the commit log (version, snapshot id, timestamp,
  operation, counts, and the commit's deleted-rows index file), so the log
  outlives snapshot expiry, and (keyed tables) the key index segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from lineage.errors import LineageMetadataError, UnsupportedFormatError
from lineage.fileio import ImmutableFileCache, read_bytes, read_json, write_json, write_parquet
from lineage.rle import Runs

SEGMENT_FORMAT = "lineage-segment"
LIST_FORMAT = "lineage-list"
FORMAT_VERSION = 1

# Snapshot summary keys. The list path is the single pointer that makes a
# commit's lineage visible; the others are there for humans and quick checks.
SUMMARY_LIST = "lineage.list"
SUMMARY_VERSION = "lineage.version"
SUMMARY_NEXT_ROW_ID = "lineage.next-row-id"
SUMMARY_OPERATION = "lineage.operation"
SUMMARY_FORMAT_VERSION = "lineage.format-version"

_SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("record_count", pa.int64(), nullable=False),
        pa.field("row_id_starts", pa.list_(pa.int64()), nullable=False),
        pa.field("row_id_lengths", pa.list_(pa.int64()), nullable=False),
        pa.field("created_values", pa.list_(pa.int64()), nullable=False),
        pa.field("created_lengths", pa.list_(pa.int64()), nullable=False),
        pa.field("updated_values", pa.list_(pa.int64()), nullable=False),
        pa.field("updated_lengths", pa.list_(pa.int64()), nullable=False),
    ]
)


def check_format(kind: str, found_kind: str | None, found_version: Any, path: str, supported: int = FORMAT_VERSION) -> None:
    """Refuse files of another kind or of a newer format version than ``supported``."""
    if found_kind != kind:
        raise LineageMetadataError(f"{path} is not a {kind} file (format tag {found_kind!r}); the lineage metadata is corrupt")
    try:
        version = int(found_version)
    except (TypeError, ValueError):
        raise LineageMetadataError(f"{path} has no readable format version ({found_version!r})") from None
    if version > supported:
        raise UnsupportedFormatError(
            f"{path} uses {kind} format version {version}, but this release reads up to {supported}; upgrade the library"
        )


def write_tagged_parquet(fileio: FileIO, path: str, table: pa.Table, kind: str) -> int:
    """Write ``table`` as a Parquet file tagged with its format ``kind`` and version; return its size."""
    tagged = table.replace_schema_metadata({"lineage.format": kind, "lineage.format-version": str(FORMAT_VERSION)})
    return write_parquet(fileio, path, tagged)


def open_tagged_parquet(fileio: FileIO, path: str, kind: str, what: str, supported: int = FORMAT_VERSION) -> pq.ParquetFile:
    """Open a tagged Parquet file (all of it read into memory), checking its tag; the caller picks the columns.

    ``what`` names the file in errors ("lineage segment"). A missing,
    unreadable or foreign file is a :class:`LineageMetadataError`.
    """
    try:
        pf = pq.ParquetFile(pa.BufferReader(read_bytes(fileio, path)))
    except FileNotFoundError:
        raise LineageMetadataError(
            f"{what} {path} is missing: the lineage metadata of this table is incomplete "
            "(was the file deleted by hand or by a foreign vacuum?)"
        ) from None
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise LineageMetadataError(f"{what} {path} is unreadable: {exc}") from exc
    meta = {k.decode(): v.decode() for k, v in (pf.schema_arrow.metadata or {}).items()}
    check_format(kind, meta.get("lineage.format"), meta.get("lineage.format-version"), path, supported)
    return pf


def read_tagged_parquet(fileio: FileIO, path: str, kind: str, what: str) -> pa.Table:
    """Read a file written by :func:`write_tagged_parquet`, checking its tag (see :func:`open_tagged_parquet`)."""
    pf = open_tagged_parquet(fileio, path, kind, what)
    try:
        return pf.read(use_threads=False)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise LineageMetadataError(f"{what} {path} is unreadable: {exc}") from exc


@dataclass(frozen=True)
class FileLineage:
    """Lineage of every position of one data file."""

    file_path: str
    record_count: int
    row_ids: Runs
    created: Runs
    updated: Runs

    def __post_init__(self) -> None:
        for name in ("row_ids", "created", "updated"):
            if getattr(self, name).total != self.record_count:
                raise LineageMetadataError(
                    f"lineage of {self.file_path}: {name} covers {getattr(self, name).total} rows, file has {self.record_count}"
                )

    @property
    def min_updated(self) -> int:
        """Smallest valid-from version of any image in the file."""
        return int(self.updated.values.min()) if len(self.updated) else 0

    @property
    def max_updated(self) -> int:
        """Largest valid-from version of any image in the file."""
        return int(self.updated.values.max()) if len(self.updated) else 0


def write_segment(fileio: FileIO, path: str, files: list[FileLineage]) -> int:
    """Write a segment describing ``files``; return its size in bytes."""
    cols: dict[str, list[Any]] = {f.name: [] for f in _SEGMENT_SCHEMA}
    for fl in files:
        cols["file_path"].append(fl.file_path)
        cols["record_count"].append(fl.record_count)
        for prefix, runs, first in (("row_id", fl.row_ids, "starts"), ("created", fl.created, "values"), ("updated", fl.updated, "values")):
            cols[f"{prefix}_{first}"].append(runs.values)
            cols[f"{prefix}_lengths"].append(runs.lengths)
    return write_tagged_parquet(fileio, path, pa.table(cols, schema=_SEGMENT_SCHEMA), SEGMENT_FORMAT)


def _read_segment_uncached(fileio: FileIO, path: str) -> tuple[FileLineage, ...]:
    table = read_tagged_parquet(fileio, path, SEGMENT_FORMAT, "lineage segment")
    out = []
    try:
        for row in table.to_pylist():
            runs = {}
            for name, first in (("row_id", "starts"), ("created", "values"), ("updated", "values")):
                values = np.array(row[f"{name}_{first}"], np.int64)
                lengths = np.array(row[f"{name}_lengths"], np.int64)
                if len(values) != len(lengths) or (lengths <= 0).any():
                    raise ValueError(f"{name} runs are malformed")
                runs[name] = Runs(values, lengths)
            out.append(FileLineage(row["file_path"], int(row["record_count"]), runs["row_id"], runs["created"], runs["updated"]))
    except LineageMetadataError:
        raise
    except Exception as exc:  # missing columns, nulls, wrong types
        raise LineageMetadataError(f"lineage segment {path} has damaged content: {exc!r}") from None
    return tuple(out)


_SEGMENT_CACHE = ImmutableFileCache(4096)
_LIST_CACHE = ImmutableFileCache(256)


def read_segment(fileio: FileIO, path: str) -> tuple[FileLineage, ...]:
    """Read a segment (cached by path: segments are immutable)."""
    return _SEGMENT_CACHE.get(path, lambda: _read_segment_uncached(fileio, path))


@dataclass(frozen=True)
class CommitEntry:
    """One line of the commit log kept in every lineage list."""

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

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the list file."""
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
        )


@dataclass(frozen=True)
class LineageList:
    """The lineage state of one snapshot."""

    version: int
    next_row_id: int
    segments: tuple[str, ...] = ()
    commits: tuple[CommitEntry, ...] = field(default_factory=tuple)
    purged: str | None = None  # purged-rows file: row ids whose values were erased (GDPR)
    key_index: tuple[str, ...] | None = None  # key index segments, oldest first (index.key_index); None: no index

    @staticmethod
    def empty() -> LineageList:
        """The state of a table with no commits."""
        return LineageList(version=0, next_row_id=0)

    def with_commit(self, entry: CommitEntry, segments: tuple[str, ...], next_row_id: int) -> LineageList:
        """The list of the next snapshot."""
        return replace(self, version=entry.version, next_row_id=next_row_id, segments=segments, commits=self.commits + (entry,))


def write_list(fileio: FileIO, path: str, lst: LineageList) -> int:
    """Write a lineage list; return its size in bytes."""
    return write_json(
        fileio,
        path,
        {
            "format": LIST_FORMAT,
            "format-version": FORMAT_VERSION,
            "version": lst.version,
            "next-row-id": lst.next_row_id,
            "segments": list(lst.segments),
            "commits": [c.to_json() for c in lst.commits],
            **({"purged": lst.purged} if lst.purged else {}),
            **({"key-index": list(lst.key_index)} if lst.key_index is not None else {}),
        },
    )


def read_list(fileio: FileIO, path: str) -> LineageList:
    """Read a lineage list (cached by path: lists are immutable)."""
    return _LIST_CACHE.get(path, lambda: _read_list_uncached(fileio, path))


def _read_list_uncached(fileio: FileIO, path: str) -> LineageList:
    try:
        obj = read_json(fileio, path)
    except FileNotFoundError:
        raise LineageMetadataError(f"lineage list {path} is missing: the lineage metadata of this table is incomplete (was the file deleted by hand or by a foreign vacuum?)") from None
    except ValueError as exc:
        raise LineageMetadataError(f"lineage list {path} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise LineageMetadataError(f"lineage list {path} is not a JSON object")
    check_format(LIST_FORMAT, obj.get("format"), obj.get("format-version"), path)
    try:
        return LineageList(
            version=int(obj["version"]),
            next_row_id=int(obj["next-row-id"]),
            segments=tuple(obj["segments"]),
            commits=tuple(CommitEntry.from_json(c) for c in obj["commits"]),
            purged=obj.get("purged"),
            key_index=tuple(obj["key-index"]) if obj.get("key-index") is not None else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LineageMetadataError(f"lineage list {path} is malformed: {exc!r}") from exc
