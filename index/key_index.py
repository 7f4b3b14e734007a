"""The key index: for keyed tables, key -> the live image of that key.

An entry is ``key -> (_row_id, __file_path, __pos, _row_created_at_version,
_row_last_updated_at_version)``. The index is a log-structured list of
immutable segments (:mod:`index.key_segment`), oldest first, named by the
``key-index`` field of the lineage list; the Iceberg commit that publishes
the list is the single atomic point, so a crash leaves a commit with its
index change or no commit at all. A lookup searches the segments newest
first; the first record of a key wins (a tombstone means "no live image").

**Maintenance by every commit.** Each commit that changes which image is live
(writes, compaction, purge) passes a :class:`KeyIndexChange` in its
``CommitRequest``; :func:`next_key_index` (called by ``commit_change``) then
writes one *delta* segment: an entry for every live row of every data file
the commit adds (key values read from the new files' key columns, lineage
from the commit's own runs; positions that the commit's position deletes
remove are left out) and a tombstone for every removed key not re-added.
The cost is O(change). A commit that changes no live image (rewrite of
delete files, re-homing) keeps the index as it is; one that changes images
without a ``KeyIndexChange`` drops it (the list then names none), so a write
path that does not know the index can never leave it stale: the next write
that needs the index rebuilds it.

**Merge policy** (table properties ``lineage.key-index.*``, :mod:`index.key_merge_policy`):
deltas merge in tiers, and into a new base (tombstones dropped) when the
segments after the base grow too large or too many. Writers do merges of
bounded size; maintenance (:func:`lineage.maintenance.merge_key_index`) does
the rest.

**Missing or stale index.** A table created before the key index, a list
without an index reference, or segments written for another key definition
or hash function: :meth:`KeyIndex.open` builds the index from one scan of
the key columns (in bounded memory: :mod:`index.key_build`), and the write
that asked for it commits it. The
index is disabled (and dropped by writes) with the table property
``lineage.key-index.enabled=false``, and when ``lineage.key.enforce=false``
(a table that may hold duplicate keys cannot map a key to one image).

**API** (stable; the change-stream writer builds on it)::

    idx = KeyIndex.open(state)            # KeyIndex | None (no key / disabled)
    hits = idx.lookup(keys)               # pa.Table: key columns, _row_id, __file_path, __pos,
                                          # _row_created_at_version, _row_last_updated_at_version,
                                          # __input (row of ``keys``); absent keys have no row
    CommitRequest(..., key_index=KeyIndexChange(removed_keys=..., index=idx))

``removed_keys`` holds the key values of every live image the commit removes
(one row per removed image); new entries come from the commit's new data
files. :func:`delta_segment` builds the delta from explicit entries.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable

from index.key_hash import hash_name, key_hash
from index.key_merge_policy import HASHES, WRITER, MergePolicy, SegmentInfo, next_merge, writer_slice
from index.key_segment import (
    CREATED,
    FILE_PATH,
    POS,
    ROW_ID,
    SEGMENT_FORMAT_VERSION,
    UPDATED,
    KeyField,
    Segment,
    distinct_keys,
    drop_tombstones,
    entry_schema,
    make_segment,
    merge_segments,
    read_key_segment,
    remember_written,
    rewritten,
    with_path,
    write_key_segment,
)
import index.key_build as key_build
import index.key_delta as key_delta
from index.key_entries import file_entries, read_file_keys  # noqa: F401 (read_file_keys: re-exported, lineage.writes.spark)
import index.key_merge as key_merge
import lineage.duck as duck
from lineage.errors import InvalidArgumentError, KeyViolationError, LineageMetadataError
from lineage.storage.metadata import FileLineage, index_dir
from lineage.sql.predicate import quote_ident
from lineage.properties import KEY_ENFORCE, KEY_INDEX_BUILD_MEMORY, KEY_INDEX_DEFER_ROWS, KEY_INDEX_ENABLED, read
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import arrow_schema, projection_field_ids
from lineage.state import LiveFile, TableState

log = logging.getLogger(__name__)

PROP_ENABLED = KEY_INDEX_ENABLED
PROP_DEFER_ROWS = KEY_INDEX_DEFER_ROWS
INPUT = "__input"
SEGMENT_SUFFIX = "-keys.kix"  # format 3 files; formats 1 and 2 were named *-keys.arrow
# Peak bytes per key of the in-memory build (about 130 at 10M keys): tables whose keys fit the build budget
# at this rate are built in memory, larger ones by the bounded build of index.key_build.
IN_MEMORY_BYTES_PER_KEY = 160
MIN_CHUNK_ROWS, MAX_CHUNK_ROWS = 1 << 16, 1 << 20  # rows of the files read at a time by the bounded build
LOOKUP_SLICE = 1 << 12  # probes of a large lookup resolved together (their pages then released)


# ---------------------------------------------------------------- table facts


def table_key(iceberg: IcebergTable) -> tuple[KeyField, ...]:
    """The table's key columns as the index records them (empty for a table without a key)."""
    schema = iceberg.schema()
    arrow = arrow_schema(schema)
    # identifier_field_ids is an ordered list in the table metadata (identifier_field_names is a set, its
    # order differs between processes): the order fixes how a multi-column key is hashed.
    names = [schema.find_column_name(fid) for fid in schema.identifier_field_ids]
    return tuple(KeyField(fid, name, arrow.field(name).type) for fid, name in zip(schema.identifier_field_ids, names, strict=True))


def index_enabled(iceberg: IcebergTable) -> bool:
    """Whether the table keeps a key index: it has a key, enforces it, and the index is not switched off."""
    props = iceberg.metadata.properties
    if not iceberg.schema().identifier_field_ids:
        return False
    return bool(read(props, KEY_INDEX_ENABLED)) and bool(read(props, KEY_ENFORCE))


def defers_build(index: KeyIndex, iceberg: IcebergTable, rows: int) -> bool:
    """Whether an append of ``rows`` rows planned with ``index`` leaves the index to its first keyed use.

    Only when the index holds no entry (the table has no live key, so the
    append needs no lookup) and the append has at least
    ``lineage.key-index.defer-rows`` rows (default 100,000; 0 never defers).
    The commit then names no index, exactly as after a write path that does
    not know it: the next write that needs the index builds it from one scan
    of the key columns and commits it, and ``verify`` accepts its absence.
    """
    if index.entries or rows == 0:
        return False
    limit = int(read(iceberg.metadata.properties, KEY_INDEX_DEFER_ROWS))
    return limit > 0 and rows >= limit


def segment_info(s: Segment) -> SegmentInfo:
    """What the merge policy knows of ``s``."""
    return SegmentInfo(s.level, s.base, s.entries, s.hash_range)


# ---------------------------------------------------------------- the index


class KeyIndex:
    """The key index of one table state (see the module docstring)."""

    def __init__(self, key: tuple[KeyField, ...], segments: Sequence[Segment], version: int = 0, source: tuple[str, ...] | None = None) -> None:
        self.key = key
        self.segments = tuple(segments)  # oldest first
        self.version = version  # the table version it describes
        self.source = source  # the lineage list's reference it was opened from (None: built in memory)

    @property
    def names(self) -> list[str]:
        """The key column names."""
        return [k.name for k in self.key]

    @property
    def entries(self) -> int:
        """Records (entries and tombstones) in all segments: 0 for the index of a table with no live key."""
        return sum(s.entries for s in self.segments)

    @property
    def pending(self) -> bool:
        """Whether some segment (a fresh build) is not written yet; the next commit that carries this index writes it."""
        return any(s.path is None for s in self.segments)

    @property
    def outdated(self) -> bool:
        """Whether some segment is in an older file format (``reindex`` and key index maintenance rewrite it)."""
        return any(s.format_version < SEGMENT_FORMAT_VERSION for s in self.segments)

    @staticmethod
    def open(state: TableState, *, build: bool = True) -> KeyIndex | None:
        """The index of ``state``; built in memory when missing or stale (unless ``build`` is False).

        Returns None for tables without a key index (no key, disabled, or a
        table whose live rows hold duplicate keys: then callers fall back to
        scanning the key columns).
        """
        if not index_enabled(state.iceberg):
            return None
        key = table_key(state.iceberg)
        ref = state.lineage.key_index
        if ref is not None:
            segments = [read_key_segment(state.iceberg.io, p) for p in ref]
            stale = [s.path for s in segments if not _compatible(s, key)]
            if not stale:
                return KeyIndex(key, segments, state.version, ref)
            log.info("key index of %s is stale (written for another key or hash): %s", ".".join(state.iceberg.name()), stale[:3])
        if not build:
            return None
        try:
            return KeyIndex.build(state)
        except KeyViolationError as exc:
            log.warning("no key index for %s: %s", ".".join(state.iceberg.name()), exc)
            return None

    @staticmethod
    def build(state: TableState) -> KeyIndex:
        """Build the index from one scan of the live key columns (committed by the next commit that carries it).

        A table whose keys fit the build budget (``lineage.key-index.build-memory-bytes``, at about 160 bytes
        per key) is built in memory; a larger one by the bounded build of :mod:`index.key_build`, which gives
        the same segment in a temporary file (memory-mapped) and keeps the budget whatever the table's size.
        """
        key = table_key(state.iceberg)
        if not key:
            raise InvalidArgumentError(f"table {'.'.join(state.iceberg.name())} has no key, so it has no key index")
        files = state.live_files()
        if not files:  # an empty table: nothing to scan, an index of no segment
            return KeyIndex(key, [], state.version, state.lineage.key_index)
        shell = KeyIndex(key, [], state.version)
        # Files without delete files (position, equality or resolved), read by name (valid while no schema renamed or retyped a column): the key
        # columns straight from Parquet, lineage from the list's runs, as a commit's delta does. The rest through
        # the live view, which applies delete files (ours and foreign equality deletes) and field-id projection.
        by_name = projection_field_ids(state.iceberg.metadata) is None
        untouched = [by_name and not f.delete_paths and not f.equality_deletes for f in files]
        direct = [f for f, u in zip(files, untouched, strict=True) if u]
        scanned = [f for f, u in zip(files, untouched, strict=True) if not u]
        rows = sum(f.lineage.record_count for f in files)
        budget = int(read(state.iceberg.metadata.properties, KEY_INDEX_BUILD_MEMORY))
        if rows * IN_MEMORY_BYTES_PER_KEY > budget:  # the bounded build (index.key_build): the same segment
            chunks = _entry_chunks(state, shell, direct, scanned, _chunk_rows(budget))
            segment = key_build.spooled_base(key, [f.path for f in direct + scanned], chunks, rows=rows, budget=budget,
                                             max_pos=max(f.lineage.record_count for f in files), max_version=_max_version(state, files))
            segment = segment or make_segment(key, entry_schema(key).empty_table(), level=0, base=True)
            return KeyIndex(key, [segment], state.version, state.lineage.key_index)
        # only direct files: their integer columns may come as int32 (nothing to concatenate them with)
        parts = [file_entries(state.iceberg.io, shell, [f.lineage for f in direct], (), {}, narrow=not scanned)] if direct else []
        if scanned:
            parts.append(_scanned_entries(state, key, scanned))
        entries = parts[0] if len(parts) == 1 else pa.concat_tables([parts[0], parts[1].cast(parts[0].schema)])
        segment = make_segment(key, entries, level=0, base=True)
        dup = key_build.duplicate_keys(segment)
        if dup:
            raise key_build.duplicate_error(dup)
        return KeyIndex(key, [segment], state.version, state.lineage.key_index)

    def conform_keys(self, keys: pa.Table) -> pa.Table:
        """``keys``' key columns, cast to the table's key types (other columns ignored)."""
        missing = [n for n in self.names if n not in keys.column_names]
        if missing:
            raise KeyViolationError(f"lookup keys must carry the key column(s) {missing}")
        out = []
        for k in self.key:
            col = keys.column(k.name)
            if col.null_count:
                raise KeyViolationError(f"key column {k.name!r} is null in {col.null_count} row(s)")
            out.append(col if col.type.equals(k.type) else col.cast(k.type))
        return pa.Table.from_arrays(out, schema=pa.schema([pa.field(k.name, k.type, nullable=False) for k in self.key]))

    def lookup(self, keys: pa.Table) -> pa.Table:
        """Live images of ``keys``: one row per input row whose key is live, in input order.

        Columns: the key columns, ``_row_id``, ``__file_path``, ``__pos``,
        ``_row_created_at_version``, ``_row_last_updated_at_version`` and
        ``__input`` (the row of ``keys``). Cost: O(k log n) per segment.
        """
        keys = self.conform_keys(keys)
        schema = entry_schema(self.key).append(pa.field(INPUT, pa.int64(), nullable=False))
        if not self.entries:  # an empty index (e.g. the first append of a table)
            return schema.empty_table()
        hashes = key_hash(keys)
        order = np.argsort(hashes, kind="stable")  # sorted probes touch the pages in order
        # A large lookup goes a slice of sorted probes at a time, and each slice's pages of the mapped segment
        # files are dropped from the process's resident memory after it: what a lookup holds mapped stays
        # bounded by the slice, not by the segments' size (a 1% upsert touches most pages of a large index).
        sliced = len(order) > LOOKUP_SLICE and self.entries > LOOKUP_SLICE * 64  # a small index: one pass, as its pages are few
        parts: list[pa.Table] = []
        step = LOOKUP_SLICE if sliced else max(1, len(order))
        for start in range(0, len(order), step):
            parts += self._probe(keys, hashes, order[start : start + step])
            if sliced:
                for seg in self.segments:
                    seg.release()
        if not parts:
            return schema.empty_table()
        found = pa.concat_tables(parts)
        return found.take(pa.array(np.argsort(found.column(INPUT).to_numpy(), kind="stable")))

    def _probe(self, keys: pa.Table, hashes: np.ndarray, unresolved: np.ndarray) -> list[pa.Table]:
        """The live images of rows ``unresolved`` of ``keys`` (in hash order), segments newest first."""
        resolved = np.zeros(keys.num_rows, bool)
        parts: list[pa.Table] = []
        for seg in reversed(self.segments):
            if not len(unresolved):
                break
            probes = unresolved
            if seg.hash_range is not None:  # a base piece answers for its hash range only, and for all of it
                lo, hi = seg.hash_range
                ordered = hashes[unresolved]  # ascending: the probes go in hash order
                end = len(ordered) if hi >= HASHES else int(np.searchsorted(ordered, np.uint64(hi)))
                probes = unresolved[int(np.searchsorted(ordered, np.uint64(lo))) : end]
                if not len(probes):
                    continue
            rows, records = seg.probe(hashes, keys, probes)
            if len(rows):
                live = ~seg.dead(records)
                if live.any():
                    hit = rows[live]
                    parts.append(seg.take(records[live], keys.take(pa.array(hit))).append_column(INPUT, pa.array(hit, pa.int64())))
                resolved[rows] = True
            if seg.hash_range is not None:
                resolved[probes] = True  # absent from the piece: no live image (older segments hold nothing newer)
            elif not len(rows):
                continue
            unresolved = unresolved[~resolved[unresolved]]
        return parts

    def live_entries(self) -> pa.Table:
        """Every live entry (all segments merged in memory: O(n), for verify and tests)."""
        if not self.segments:
            return entry_schema(self.key).empty_table()
        merged = self.segments[0] if len(self.segments) == 1 else merge_segments(self.segments, base=True, level=0)
        return merged.live()


def _scanned_entries(state: TableState, key: tuple[KeyField, ...], files: Sequence[LiveFile]) -> pa.Table:
    """Entries for the live rows of ``files``, from one DuckDB scan of the live view."""
    names = [k.name for k in key]
    schema = pa.schema([pa.field(k.name, k.type, nullable=False) for k in key])
    con = duck.connect()
    try:
        register_live_view(con, "live", files, schema, projection_field_ids(state.iceberg.metadata))
        cols = ", ".join(quote_ident(n) for n in names)
        found = duck.fetch_arrow(con, f"SELECT {cols}, _row_id, __file_id, __pos, _row_created_at_version, _row_last_updated_at_version FROM live")
    finally:
        con.close()
    paths = pa.array([f.path for f in files], pa.string())
    entries = found.select(names).cast(schema)
    file_ids = found.column("__file_id").combine_chunks().cast(pa.int32()) if found.num_rows else pa.array([], pa.int32())
    return (
        entries.append_column(ROW_ID, found.column("_row_id").cast(pa.int64()))
        .append_column(FILE_PATH, pa.DictionaryArray.from_arrays(file_ids, paths))
        .append_column(POS, found.column("__pos").cast(pa.int64()))
        .append_column(CREATED, found.column("_row_created_at_version").cast(pa.int64()))
        .append_column(UPDATED, found.column("_row_last_updated_at_version").cast(pa.int64()))
    )


def _entry_chunks(state: TableState, shell: KeyIndex, direct: Sequence[LiveFile], scanned: Sequence[LiveFile],
                  chunk_rows: int) -> Iterator[key_build.EntryChunk]:
    """The entries of the live rows of ``direct`` then ``scanned`` files (see :meth:`KeyIndex.build`), a group of
    files of about ``chunk_rows`` rows at a time; file ordinals count ``direct`` then ``scanned``."""
    first = 0
    for group in _groups(direct, chunk_rows):
        yield key_build.entry_chunk(file_entries(state.iceberg.io, shell, [f.lineage for f in group], (), {}), shell.names, first)
        first += len(group)
    for group in _groups(scanned, chunk_rows):
        yield key_build.entry_chunk(_scanned_entries(state, shell.key, group), shell.names, first)
        first += len(group)


def _chunk_rows(budget: int) -> int:
    """Rows a bounded build reads (or merges) at a time under ``budget``."""
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, budget // 256))


def _max_version(state: TableState, files: Sequence[LiveFile]) -> int:
    """The largest version an entry of ``files`` can carry (their lineage's runs, and the state's version)."""
    return max([state.version] + [int(r.values.max()) for f in files for r in (f.lineage.created, f.lineage.updated) if len(r)])


def _groups(files: Sequence[LiveFile], rows: int) -> Iterator[list[LiveFile]]:
    """Consecutive groups of ``files`` of at most ``rows`` rows each (a larger file alone)."""
    group: list[LiveFile] = []
    total = 0
    for f in files:
        if group and total + f.lineage.record_count > rows:
            yield group
            group, total = [], 0
        group.append(f)
        total += f.lineage.record_count
    if group:
        yield group


def _compatible(segment: Segment, key: tuple[KeyField, ...]) -> bool:
    return segment.hash == hash_name() and len(segment.key) == len(key) and all(
        a.field_id == b.field_id and a.name == b.name and a.type.equals(b.type) for a, b in zip(segment.key, key, strict=True)
    )


# ---------------------------------------------------------------- commits


@dataclass
class KeyIndexChange:
    """How one commit changes the key index (``CommitRequest.key_index``).

    ``removed_keys``: key values of every live image the commit removes, one
    row per removed image (None when it removes none). ``index``: the index
    the commit was planned with (a fresh build is written by this commit);
    None opens the base state's index (and the commit drops the index when
    the state has none). ``merge``: ``writer``, ``maintenance`` or ``full``
    (see :func:`next_merge`). ``written_keys``: optional key columns of new
    data files by path, when the planner has them (saves reading them back).
    ``tombstones``: when the planner knows them, the removed keys that no
    new row of the commit has (a delete's removed keys; none, an empty
    table, for an update keeping every key): a large delta is then built in
    bounded memory (:mod:`index.key_delta`).
    """

    removed_keys: pa.Table | None = None
    index: KeyIndex | None = None
    merge: str = WRITER
    written_keys: dict[str, pa.Table] = field(default_factory=dict)
    tombstones: pa.Table | None = None

    @classmethod
    def of_removal(cls, removed_keys: pa.Table | None, *, rewritten: bool, index: KeyIndex | None = None) -> KeyIndexChange:
        """The change of a commit removing the images whose keys are ``removed_keys``: a delete's removed keys
        are its tombstones; with ``rewritten`` (an update of no key column, an upsert) the commit writes every
        removed key again and none is. Knowing them, the commit builds a large delta in bounded memory."""
        tombstones = None if removed_keys is None else removed_keys.schema.empty_table() if rewritten else removed_keys
        return cls(removed_keys=removed_keys, index=index, tombstones=tombstones)


def next_key_index(
    state: TableState,
    change: KeyIndexChange | None,
    written: Sequence[FileLineage],
    delete_files: Sequence[DataFile],
    removed_images: int,
    removed_data_files: int,
    version: int,
    created: list[str],
    *,
    tag: str | None = None,
) -> tuple[tuple[str, ...] | None, int]:
    """The key-index reference of the commit at ``version`` on top of ``state``, and bytes written.

    ``written`` is the lineage of every data file the commit adds;
    ``delete_files`` its new position delete files; ``removed_images`` and
    ``removed_data_files`` count the images and data files it removes.
    Paths of files written are appended to ``created``; with ``tag`` new
    segments are named from it (deterministic names for reconciliation).
    """
    if not index_enabled(state.iceberg):
        return None, 0
    moves = bool(written) or removed_images > 0 or removed_data_files > 0
    if change is None:
        return (None if moves else state.lineage.key_index), 0
    index = change.index if change.index is not None else KeyIndex.open(state, build=False)
    if index is None:
        return None, 0
    if index.version != state.version or (not index.pending and index.source != state.lineage.key_index):
        raise LineageMetadataError(f"internal: the key index was opened at version {index.version}, the commit is based on {state.version}")
    io = state.iceberg.io
    removed = change.removed_keys
    if removed_images and (removed is None or removed.num_rows != removed_images):
        raise LineageMetadataError(
            f"internal: the commit removes {removed_images} image(s) but names the keys of {0 if removed is None else removed.num_rows}"
        )
    segments = [s for s in index.segments if _kept(s)]
    if moves and key_delta.spools(written, change.tombstones):  # many keys: built in bounded memory
        delta = key_delta.spooled_delta(io, index, written, delete_files, change.written_keys, change.tombstones, base=not segments)
        if delta is not None and delta.entries:
            segments.append(delta)
    elif moves:
        entries = file_entries(io, index, written, delete_files, change.written_keys)
        delta = delta_segment(index, entries, removed)
        if delta is not None and not segments:
            # Nothing older: the delta is the whole index. Its tombstones (of keys that were never
            # live here) hide nothing, so it becomes the base as it is, without a merge.
            delta = drop_tombstones(delta) if not delta.base else delta
            delta = replace(delta, base=True, level=0)
        if delta is not None and delta.entries:
            segments.append(delta)
    policy = MergePolicy.of(state.iceberg.metadata.properties)
    props = state.iceberg.metadata.properties
    if moves and len(segments) >= 2 and segments[-2].path is None and segments[-1].path is None and _fits(props, segments[-2:]):
        # The index this commit builds (the first keyed write after a bulk append) is not written yet: its delta joins
        # it, so the commit writes one segment, not two (a build too large for memory keeps its delta apart).
        start = len(segments) - 2
        segments[start:] = [_merged(props, segments[start:], base=start == 0, level=segments[start].level)]
    while (step := next_merge([segment_info(s) for s in segments], policy, change.merge)) is not None:
        start, level = step
        segments[start:] = [_merged(props, segments[start:], base=start == 0, level=level)]
    if change.merge == WRITER and (piece := writer_slice([segment_info(s) for s in segments], policy)) is not None:
        segments = key_merge.sliced(segments, piece)  # a bounded step of a merge into a new base
    if change.merge != WRITER:  # maintenance rewrites segments of older formats (writers' cost stays O(change))
        segments = [_rewritten(props, s) if s.format_version < SEGMENT_FORMAT_VERSION else s for s in segments]
    size = 0
    location = state.iceberg.metadata.location
    segments = [s for s in segments if _kept(s)]  # an empty index is no segment at all
    for i, seg in enumerate(segments):
        if seg.path is None:
            name = f"{tag}-{i}" if tag is not None else f"{version:09d}-{uuid.uuid4()}"
            path = f"{index_dir(location)}/{name}{SEGMENT_SUFFIX}"
            created.append(path)
            size += write_key_segment(io, path, seg, version)
            segments[i] = with_path(seg, path)
            remember_written(segments[i])
    return tuple(s.path for s in segments if s.path), size


def _kept(segment: Segment) -> bool:
    """Whether ``segment`` stays in the list: it holds a record, or it is a base piece (whose range must stay covered)."""
    return segment.entries > 0 or segment.hash_range is not None


def _merged(props: Mapping[str, str], segments: Sequence[Segment], *, base: bool, level: int) -> Segment:
    """``merge_segments(segments, ...)``: a merge into a base too large for the build budget range by range
    (:mod:`index.key_merge`: the same segment in bounded memory), any other in memory."""
    if base and not _fits(props, segments):
        budget = int(read(props, KEY_INDEX_BUILD_MEMORY))
        return key_merge.bounded_base_merge(segments, level=level, budget=budget, chunk_rows=_chunk_rows(budget))
    return merge_segments(segments, base=base, level=level)


def _fits(props: Mapping[str, str], segments: Sequence[Segment]) -> bool:
    """Whether ``segments`` merge in memory under the build budget (``lineage.key-index.build-memory-bytes``)."""
    return sum(s.entries for s in segments) * IN_MEMORY_BYTES_PER_KEY <= int(read(props, KEY_INDEX_BUILD_MEMORY))


def _rewritten(props: Mapping[str, str], segment: Segment) -> Segment:
    """``rewritten(segment)`` (a segment of an older format, to be written in the current one); a large base
    range by range, as a merge of itself alone."""
    if segment.base and segment.entries * IN_MEMORY_BYTES_PER_KEY > int(read(props, KEY_INDEX_BUILD_MEMORY)):
        return _merged(props, [segment], base=True, level=segment.level)
    return rewritten(segment)


def delta_segment(index: KeyIndex, entries: pa.Table, removed_keys: pa.Table | None) -> Segment | None:
    """A level-0 segment: ``entries`` (key + entry columns, unique keys) and tombstones for
    the ``removed_keys`` not among them. None when both are empty."""
    tombstones = None
    if removed_keys is not None and removed_keys.num_rows:
        removed = index.conform_keys(removed_keys)
        if entries.num_rows:
            added = make_segment(index.key, entries.select(entry_schema(index.key).names))
            rows, _ = added.probe(key_hash(removed), removed, np.arange(removed.num_rows))
            keep = np.ones(removed.num_rows, bool)
            keep[rows] = False
            removed = removed.filter(pa.array(keep))
        tombstones = distinct_keys(removed)
    if not entries.num_rows and (tombstones is None or not tombstones.num_rows):
        return None
    segment = make_segment(index.key, entries.select(entry_schema(index.key).names), tombstones, level=0, base=False)
    dup = key_build.duplicate_keys(segment)
    if dup:
        raise KeyViolationError(f"the commit would leave several live rows with the same key, e.g. {dup}")
    return segment
