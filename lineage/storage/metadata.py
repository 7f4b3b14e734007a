"""On-disk lineage metadata: per-file segments and the per-snapshot lineage list.

Two immutable file kinds, both written before the Iceberg commit and made
visible by it (the snapshot summary points at the list):

* a **segment** (Parquet, ``lineage-segment`` format 1 or 2) holds, for each
  data file a commit added, the run-length encoded row ids, created versions
  and updated versions by position. A data file's lineage never changes while
  the file exists, so each file is described exactly once. Format 2 (Iceberg
  v3 tables only) leaves out the row ids of a file whose rows keep their ids
  in its own ``_row_id`` column: it records the file's ``first_row_id`` and a
  checksum of its ids instead, and a reader takes them from the data file
  (:func:`~lineage.storage.lineage_columns.native_row_ids`), as every v3
  reader does. Segments without such a file are still written as format 1;
* a **lineage list** (JSON, ``lineage-list`` format 4, or 5 when the segment
  written inside it is of format 2; formats 1 to 3 are still
  read) is written by every commit. It names the segments that still describe
  live data files (with their sizes), the table's next row id, and the commit
  log (version, snapshot id, timestamp, operation, counts, and the commit's
  deleted-rows index file), so the log outlives snapshot expiry. The log is
  kept in immutable chunks plus a short tail (:mod:`lineage.storage.commit_log`), so a
  list does not grow with the number of commits; small segments are merged on
  commit (:mod:`lineage.commits.merge_rule`), so neither does the segment list.
  The list also names the key index segments of a keyed table
  (:mod:`index.key_index`).

From list format 4 on, a commit whose segment is small (at most
:data:`INLINE_SEGMENT_RUNS` runs) writes it inside its list instead of as a
file of its own, one object fewer per small commit: the list's ``segment``
holds the segment's rows as JSON, and lists name it ``<list path>#segment``
(:func:`segment_object` gives the object that holds a segment). It is read,
cached and merged like any segment; the list that holds it is kept as long as
a list names the segment.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from lineage.arrays import list_array
from lineage.storage.commit_log import LIST_FORMAT, LIST_FORMAT_VERSION, CommitEntry, CommitLog
from lineage.errors import LineageMetadataError, UnsupportedFormatError
from lineage.storage.fileio import ImmutableFileCache, read_bytes, read_json, write_json, write_parquet
from lineage.storage.lineage_columns import native_row_ids
from lineage.storage.rle import Runs, combined_breakpoints, encode_sequence

SEGMENT_FORMAT = "lineage-segment"
FORMAT_VERSION = 1  # segments and the tagged Parquet files of the index
# Segments naming a file whose row ids its data file holds (FileLineage.native_first_row_id); lists holding such a segment.
SEGMENT_FORMAT_VERSION_NATIVE = 2
LIST_FORMAT_VERSION_NATIVE = 5

# Snapshot summary keys. The list path is the single pointer that makes a
# commit's lineage visible; the others are there for humans and quick checks.
# Where this library writes its own files, under the table's location. The directories start with "_":
# Iceberg's orphan-file removal (DeleteOrphanFiles, CALL system.remove_orphan_files) does not descend into
# hidden directories, so it cannot take our files, which no Iceberg metadata references, for orphans.
# Tables written before keep their files in metadata/lineage and metadata/index (lists name files by path).
LINEAGE_DIR = "metadata/_lineage"
INDEX_DIR = "metadata/_index"


def lineage_dir(location: str) -> str:
    """The folder of lineage segments, lists and log chunks of the table at ``location``."""
    return f"{location.rstrip('/')}/{LINEAGE_DIR}"


def index_dir(location: str) -> str:
    """The folder of deleted-rows index, key index, archive and purge files of the table at ``location``."""
    return f"{location.rstrip('/')}/{INDEX_DIR}"


SUMMARY_LIST = "lineage.list"
SUMMARY_VERSION = "lineage.version"
SUMMARY_NEXT_ROW_ID = "lineage.next-row-id"
SUMMARY_OPERATION = "lineage.operation"
SUMMARY_FORMAT_VERSION = "lineage.format-version"
SUMMARY_STRATEGY = "lineage.write-strategy"  # the change-stream strategy of a commit (lineage.writes.changelog_equality)
STRATEGY_EQUALITY = "equality"  # its value for an equality-delete commit

INLINE_SUFFIX = "#segment"  # a segment written inside its list (format 4) is named <list path>#segment
# Most runs (row ids, created and updated versions, over its files) a segment inside a list holds: about 20 bytes of
# JSON a run, so at most ~80 KiB more to read with the list, against a request of its own (a fold of small files
# with scattered row ids has about a run per row).
INLINE_SEGMENT_RUNS = 4096


def inline_segment_path(list_path: str) -> str:
    """The name of the segment written inside the list at ``list_path``."""
    return list_path + INLINE_SUFFIX


def is_inline_segment(path: str) -> bool:
    """Whether the segment ``path`` is written inside a lineage list (see the module docstring)."""
    return path.endswith(INLINE_SUFFIX)


def segment_object(path: str) -> str:
    """The object that holds the segment ``path``: its file, or the list it is written in."""
    return path[: -len(INLINE_SUFFIX)] if is_inline_segment(path) else path


def fits_in_list(files: list[FileLineage]) -> bool:
    """Whether a segment describing ``files`` is small enough to be written inside its commit's list."""
    return sum(f.stored_runs for f in files) <= INLINE_SEGMENT_RUNS


BREAKPOINTS_KEPT_RUNS = 1 << 16  # FileLineage.breakpoints kept for files of at most this many runs
# Runs of a segment's files encoded at once (a row group): a commit that rewrote a million scattered rows has a million
# runs over the files it wrote, whose list columns and Parquet pages were built all at once (40 MB more at the commit's peak).
SEGMENT_PART_RUNS = 1 << 18
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
# Format 2: the first_row_id of a file whose row ids are its data file's (row id runs left empty) and their checksum.
_NATIVE_FIELDS = (pa.field("row_ids_native", pa.int64()), pa.field("row_id_sum", pa.int64()))
_SEGMENT_SCHEMA_NATIVE = pa.schema(list(_SEGMENT_SCHEMA) + list(_NATIVE_FIELDS))


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


def write_tagged_parquet(
    fileio: FileIO, path: str, table: pa.Table | Iterable[pa.Table], kind: str, *, use_dictionary: bool = True, version: int = FORMAT_VERSION
) -> int:
    """Write ``table`` (or parts of one schema, a row group each: :func:`~lineage.storage.fileio.write_parquet`) as a Parquet
    file tagged with its format ``kind`` and ``version``; return its size."""
    tag = {"lineage.format": kind, "lineage.format-version": str(version)}
    if isinstance(table, pa.Table):
        return write_parquet(fileio, path, table.replace_schema_metadata(tag), use_dictionary=use_dictionary)
    return write_parquet(fileio, path, (t.replace_schema_metadata(tag) for t in table), use_dictionary=use_dictionary)


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


def read_tagged_parquet(fileio: FileIO, path: str, kind: str, what: str, supported: int = FORMAT_VERSION) -> pa.Table:
    """Read a file written by :func:`write_tagged_parquet`, checking its tag (see :func:`open_tagged_parquet`)."""
    pf = open_tagged_parquet(fileio, path, kind, what, supported)
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
    # Iceberg v3: the file's first_row_id when its rows' row ids are the data file's own (its _row_id column, else
    # first_row_id plus the position): a segment then stores no row ids for it (format 2). None: stored as runs.
    native_first_row_id: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("row_ids", "created", "updated"):
            if getattr(self, name).total != self.record_count:
                raise LineageMetadataError(
                    f"lineage of {self.file_path}: {name} covers {getattr(self, name).total} rows, file has {self.record_count}"
                )

    @property
    def stored_runs(self) -> int:
        """Runs a segment stores for this file (its row ids none when they are the data file's own)."""
        return (0 if self.native_first_row_id is not None else len(self.row_ids)) + len(self.created) + len(self.updated)

    @cached_property
    def min_updated(self) -> int:
        """Smallest valid-from version of any image in the file."""
        return int(self.updated.values.min()) if len(self.updated) else 0

    @cached_property
    def max_updated(self) -> int:
        """Largest valid-from version of any image in the file."""
        return int(self.updated.values.max()) if len(self.updated) else 0

    @property
    def breakpoints(self) -> tuple[np.ndarray, ...]:
        """:func:`~lineage.storage.rle.combined_breakpoints` of the three encodings (read-only arrays): a change feed
        expands the lineage of the files it reads at every call.

        Kept with the file's lineage (which the segment cache keeps) up to :data:`BREAKPOINTS_KEPT_RUNS` runs;
        a file with more, such as the new images of a million scattered rows (a run each), has them computed
        at each call (milliseconds, O(runs)) instead of holding 32 bytes a run for as long as its segment is
        cached (18 MB after the 10M-row benchmark's three commits, growing with the rows they change).
        """
        kept = self.__dict__.get("_breakpoints")
        if kept is not None:
            return kept
        out = combined_breakpoints(self.row_ids, self.created, self.updated)
        for a in out:
            a.setflags(write=False)
        if len(out[0]) <= BREAKPOINTS_KEPT_RUNS:
            self.__dict__["_breakpoints"] = out  # a frozen dataclass: set as cached_property sets its value
        return out


def _has_native(files: list[FileLineage]) -> bool:
    return any(fl.native_first_row_id is not None for fl in files)


def _row_id_sum(runs: Runs) -> int:
    """The sum of the row ids of ``runs`` modulo 2**64 (as int64 arithmetic wraps): a check on ids read from a data file."""
    with np.errstate(over="ignore"):
        lengths = runs.lengths.astype(np.int64)
        total = np.sum(runs.values * lengths + lengths * (lengths - 1) // 2, dtype=np.int64)
    return int(total)


_NO_RUNS = np.zeros(0, np.int64)


def _segment_columns(files: list[FileLineage]) -> dict[str, list[Any]]:
    """The segment's columns (:data:`_SEGMENT_SCHEMA`, with :data:`_NATIVE_FIELDS` when a file's row ids are its data
    file's), a value per file; the runs' arrays as they are."""
    schema = _SEGMENT_SCHEMA_NATIVE if _has_native(files) else _SEGMENT_SCHEMA
    cols: dict[str, list[Any]] = {f.name: [] for f in schema}
    for fl in files:
        cols["file_path"].append(fl.file_path)
        cols["record_count"].append(fl.record_count)
        native = fl.native_first_row_id is not None
        row_ids = Runs(_NO_RUNS, _NO_RUNS) if native else fl.row_ids
        for prefix, runs, first in (("row_id", row_ids, "starts"), ("created", fl.created, "values"), ("updated", fl.updated, "values")):
            cols[f"{prefix}_{first}"].append(runs.values)
            cols[f"{prefix}_lengths"].append(runs.lengths)
        if "row_ids_native" in cols:
            cols["row_ids_native"].append(fl.native_first_row_id)
            cols["row_id_sum"].append(_row_id_sum(fl.row_ids) if native else None)
    return cols


def write_segment(fileio: FileIO, path: str, files: list[FileLineage]) -> int:
    """Write a segment describing ``files``; return its size in bytes.

    The runs' arrays become list columns without a conversion per value, and
    are stored without dictionary encoding: a commit that rewrote a million
    scattered rows has a million runs, whose dictionary cost ~170 MB to build
    and made the file larger.
    """
    native = _has_native(files)
    version = SEGMENT_FORMAT_VERSION_NATIVE if native else FORMAT_VERSION
    schema = _SEGMENT_SCHEMA_NATIVE if native else _SEGMENT_SCHEMA
    size = write_tagged_parquet(
        fileio, path, (_segment_rows(p, schema) for p in _segment_parts(files) or [[]]), SEGMENT_FORMAT, use_dictionary=False, version=version
    )
    _SEGMENT_CACHE.get(path, lambda: tuple(files))
    return size


def _segment_parts(files: list[FileLineage]) -> list[list[FileLineage]]:
    """``files`` cut into consecutive parts of about :data:`SEGMENT_PART_RUNS` runs (a file with more alone)."""
    parts: list[list[FileLineage]] = []
    held = SEGMENT_PART_RUNS
    for fl in files:
        runs = fl.stored_runs
        if held + runs > SEGMENT_PART_RUNS:
            parts.append([])
            held = 0
        parts[-1].append(fl)
        held += runs
    return parts


def _segment_rows(files: list[FileLineage], schema: pa.Schema) -> pa.Table:
    """The rows of a segment of ``schema`` describing ``files``."""
    cols = _segment_columns(files)
    if schema is _SEGMENT_SCHEMA_NATIVE and "row_ids_native" not in cols:  # a part without such a file
        cols.update({f.name: [None] * len(files) for f in _NATIVE_FIELDS})
    arrays = [pa.array(cols[f.name], f.type) if not pa.types.is_list(f.type) else list_array(cols[f.name]) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def inline_segment(path: str, files: list[FileLineage]) -> tuple[tuple[dict[str, Any], ...], int]:
    """The rows of a segment describing ``files`` as its list holds them (JSON objects, one per file), and their
    size in bytes; ``path`` (:func:`inline_segment_path`) is remembered, so this process reads it from memory."""
    cols = _segment_columns(files)
    rows = tuple({name: v.tolist() if isinstance(v, np.ndarray) else v for name, v in zip(cols, values)} for values in zip(*cols.values()))
    _SEGMENT_CACHE.get(path, lambda: tuple(files))
    return rows, len(json.dumps(rows, separators=(",", ":")))


def _file_lineage(row: dict[str, Any]) -> FileLineage:
    runs = {}
    for name, first in (("row_id", "starts"), ("created", "values"), ("updated", "values")):
        values = np.array(row[f"{name}_{first}"], np.int64)
        lengths = np.array(row[f"{name}_lengths"], np.int64)
        if values.ndim != 1 or len(values) != len(lengths) or (lengths <= 0).any():
            raise ValueError(f"{name} runs are malformed")
        runs[name] = Runs(values, lengths)
    path, count, first_row_id = str(row["file_path"]), int(row["record_count"]), row.get("row_ids_native")
    if first_row_id is not None:
        runs["row_id"] = _native_runs(path, count, int(first_row_id), int(row["row_id_sum"]))
    return FileLineage(path, count, runs["row_id"], runs["created"], runs["updated"], first_row_id)


def _native_runs(path: str, count: int, first_row_id: int, checksum: int) -> Runs:
    """The row ids of the data file ``path`` read from the file (format 2), checked against the segment's checksum."""
    try:
        runs = encode_sequence(native_row_ids(path, first_row_id, count))
    except FileNotFoundError:
        raise LineageMetadataError(
            f"data file {path} is missing: its lineage segment takes the file's row ids from it (was it deleted by hand?)"
        ) from None
    if _row_id_sum(runs) != checksum:
        raise LineageMetadataError(f"the row ids in data file {path} are not the ones its lineage segment recorded")
    return runs


def _inline_rows(fileio: FileIO, path: str) -> tuple[Any, ...]:
    """The rows of the segment ``path`` written inside a list (the list read, or taken from the cache)."""
    try:
        rows = read_list(fileio, segment_object(path)).inline_segment
    except UnsupportedFormatError:
        raise
    except LineageMetadataError as exc:
        raise LineageMetadataError(f"lineage segment {path} cannot be read: {exc}") from None
    if rows is None:
        raise LineageMetadataError(f"lineage segment {path} is missing: the list {segment_object(path)} holds no segment")
    return rows


def _read_segment_uncached(fileio: FileIO, path: str) -> tuple[FileLineage, ...]:
    rows = (
        _inline_rows(fileio, path) if is_inline_segment(path)
        else read_tagged_parquet(fileio, path, SEGMENT_FORMAT, "lineage segment", SEGMENT_FORMAT_VERSION_NATIVE).to_pylist()
    )
    try:
        return tuple(_file_lineage(row) for row in rows)
    except LineageMetadataError:
        raise
    except Exception as exc:  # missing columns, nulls, wrong types
        raise LineageMetadataError(f"lineage segment {path} has damaged content: {exc!r}") from None


_SEGMENT_CACHE = ImmutableFileCache(4096)
_LIST_CACHE = ImmutableFileCache(256)


def read_segment(fileio: FileIO, path: str) -> tuple[FileLineage, ...]:
    """Read a segment (cached by path: segments are immutable)."""
    return _SEGMENT_CACHE.get(path, lambda: _read_segment_uncached(fileio, path))


@dataclass(frozen=True)
class LineageList:
    """The lineage state of one snapshot.

    ``segments`` are oldest first; ``segment_bytes`` gives their sizes where
    known (format-1 lists did not record them). ``log`` is the commit log
    (:mod:`lineage.storage.commit_log`); ``commits`` reads all of it, the log's own
    methods read only what they need. Optional fields are listed in
    :data:`_OPTIONAL_FIELDS`, so a new one is one dataclass field plus one
    line there.
    """

    version: int
    next_row_id: int
    segments: tuple[str, ...] = ()
    log: CommitLog = field(default_factory=CommitLog)
    purged: str | None = None  # purged-rows file: row ids whose values were erased (GDPR)
    key_index: tuple[str, ...] | None = None  # key index segments, oldest first (index.key_index); None: no index
    adopted: int | None = None  # the version at which lineage.adopt made an existing Iceberg table a lineage table
    # Resolved-delete files (lineage.iceberg.equality): positions that equality deletes of reconciled snapshots remove.
    resolved_deletes: tuple[str, ...] | None = None
    # Format 4: the rows of this list's commit's segment when it is written here (named inline_segment_path(list path)).
    inline_segment: tuple[dict[str, Any], ...] | None = None
    segment_bytes: Mapping[str, int] = field(default_factory=dict, compare=False)

    @staticmethod
    def empty() -> LineageList:
        """The state of a table with no commits."""
        return LineageList(version=0, next_row_id=0)

    @property
    def commits(self) -> tuple[CommitEntry, ...]:
        """Every reachable commit log entry, oldest first."""
        return self.log.entries()

    def with_commit(
        self, entry: CommitEntry, segments: tuple[str, ...], next_row_id: int, segment_bytes: Mapping[str, int] | None = None
    ) -> LineageList:
        """The list of the next snapshot (its log not yet sealed: see :meth:`CommitLog.sealed`)."""
        named = set(segments)
        sizes = {s: n for s, n in {**self.segment_bytes, **(segment_bytes or {})}.items() if s in named}
        return replace(self, version=entry.version, next_row_id=next_row_id, segments=segments, log=self.log.append(entry), segment_bytes=sizes)

    def sealed_log(
        self, fileio: FileIO, path_of: Callable[[int], str], created: list[str], parent: tuple[str, CommitLog] | None = None
    ) -> tuple[LineageList, int]:
        """The list with its log tail sealed if it is too long (see :meth:`CommitLog.sealed`); and the bytes written."""
        log, written = self.log.sealed(fileio, path_of, created, parent)
        return (self if log is self.log else replace(self, log=log)), written

    def replace_commits(self, transform: Callable[[CommitEntry], CommitEntry]) -> LineageList:
        """The list with every log entry passed through ``transform`` (maintenance re-pointing index files)."""
        return replace(self, log=self.log.rewritten(transform))


# Optional list fields: (attribute, JSON key, to JSON, from JSON). Absent or None values are not written.
_OPTIONAL_FIELDS: tuple[tuple[str, str, Callable[[Any], Any], Callable[[Any], Any]], ...] = (
    ("purged", "purged", str, str),
    ("key_index", "key-index", list, tuple),  # key index segments, oldest first; absent: the table has no index
    ("adopted", "adopted", int, int),  # adoption version: the change feed starts there (cdf.retention)
    ("resolved_deletes", "resolved-deletes", list, tuple),  # resolved equality deletes (lineage.iceberg.equality)
    ("inline_segment", "segment", list, tuple),  # format 4: the commit's segment, written here (read_segment decodes it)
)


def write_list(fileio: FileIO, path: str, lst: LineageList) -> int:
    """Write a lineage list in the current format (:data:`LIST_FORMAT_VERSION`, or :data:`LIST_FORMAT_VERSION_NATIVE`
    when it holds a segment of format 2); return its size in bytes."""
    native = any(row.get("row_ids_native") is not None for row in lst.inline_segment or ())
    obj: dict[str, Any] = {
        "format": LIST_FORMAT,
        "format-version": LIST_FORMAT_VERSION_NATIVE if native else LIST_FORMAT_VERSION,
        "version": lst.version,
        "next-row-id": lst.next_row_id,
        "segments": [{"path": s, "bytes": int(lst.segment_bytes.get(s, 0))} for s in lst.segments],
        "log": lst.log.to_json(),
    }
    for attr, key, to_json, _ in _OPTIONAL_FIELDS:
        value = getattr(lst, attr)
        if value is not None:
            obj[key] = to_json(value)
    return write_json(fileio, path, obj)


def read_list(fileio: FileIO, path: str) -> LineageList:
    """Read a lineage list of format 1 to 5 (cached by path: lists are immutable)."""
    return _LIST_CACHE.get(path, lambda: _read_list_uncached(fileio, path))


def remember_list(path: str, lst: LineageList) -> None:
    """Put a list this process just wrote into the cache, so reading it back costs nothing."""
    _LIST_CACHE.get(path, lambda: lst)


def _read_list_uncached(fileio: FileIO, path: str) -> LineageList:
    try:
        obj = read_json(fileio, path)
    except FileNotFoundError:
        raise LineageMetadataError(f"lineage list {path} is missing: the lineage metadata of this table is incomplete (was the file deleted by hand or by a foreign vacuum?)") from None
    except ValueError as exc:
        raise LineageMetadataError(f"lineage list {path} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise LineageMetadataError(f"lineage list {path} is not a JSON object")
    check_format(LIST_FORMAT, obj.get("format"), obj.get("format-version"), path, LIST_FORMAT_VERSION_NATIVE)
    try:
        if int(obj["format-version"]) == 1:
            # Format 1: segment paths only, the whole commit log inline.
            segments, sizes = tuple(obj["segments"]), {}
            log = CommitLog(tail=tuple(CommitEntry.from_json(c) for c in obj["commits"]), io=fileio)
        else:
            segments = tuple(str(s["path"]) for s in obj["segments"])
            sizes = {str(s["path"]): int(s.get("bytes", 0)) for s in obj["segments"]}
            log = CommitLog.from_json(obj["log"], fileio)
        optional = {attr: from_json(obj[key]) for attr, key, _, from_json in _OPTIONAL_FIELDS if obj.get(key) is not None}
        return LineageList(
            version=int(obj["version"]), next_row_id=int(obj["next-row-id"]), segments=segments, log=log, segment_bytes=sizes, **optional
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LineageMetadataError(f"lineage list {path} is malformed: {exc!r}") from exc
