"""Pointers to the row images a change feed needs: metadata only, never row values.

For a range ``(a, b]`` the feed needs every image that starts (``valid_from``)
or ends (``valid_to``) inside it. Both come from metadata of the current
snapshot, so the answer does not depend on old snapshots still existing:

* images live now whose lineage says they start in ``(a, b]``: found from the
  run-length encoded lineage of live files (files whose version span misses
  the range are skipped without being opened), minus the images removed
  since (which the index segments after ``a`` name);
* images removed at a version after ``a``: from the deleted-rows index
  segments of the commits after ``a``, kept when they start or end in the range.

The result, :class:`Pointers`, holds one entry per image: its lineage and
where its values are (a position in a data or archive file, or a row of the
values an index segment captured). Everything is built with whole-array
numpy operations; an engine reads the values of the images it outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from pyiceberg.io import FileIO

from index.deleted_rows import IndexSegment, read_index
from index.purged import is_purged, read_purged
from index.segment_rows import read_rows
from lineage.arrays import member, unique
from lineage.errors import LineageMetadataError, LostFileError
from lineage.storage.files import local_path, warm
from lineage.storage.metadata import FileLineage
from lineage.state import TableState

LIVE = -1  # valid_to of an image that is still live
RowRange = tuple[int, int]  # row ids from the first (inclusive) to the second (exclusive)
MASK_SLACK = 1 << 20  # live images are checked against the removed ones by a mask over their files' rows up to 4 per image plus this


@dataclass(frozen=True)
class Pointers:
    """Row images known from metadata: lineage, and where to read each one's values.

    ``source[i] >= 0`` means position ``loc[i]`` of ``files[source[i]]`` (a
    data or archive file); ``source[i] < 0`` means entry ``loc[i]`` of the
    index segment ``captured[-source[i] - 1]``, whose values it captured
    (columns named by Iceberg field id). ``valid_to`` is :data:`LIVE` for
    live images.
    ``purged`` flags images of rows whose values a purge erased (None when
    the table was never purged).
    """

    files: tuple[str, ...]
    captured: tuple[IndexSegment, ...]
    source: np.ndarray
    loc: np.ndarray
    row_id: np.ndarray
    created: np.ndarray
    valid_from: np.ndarray
    valid_to: np.ndarray
    purged: np.ndarray | None = None
    commit_ms: dict[int, int] = field(default_factory=dict)  # commit timestamps of the versions in range

    def __len__(self) -> int:
        return len(self.row_id)

    def select(self, rows: np.ndarray | slice) -> Pointers:
        """The pointers ``rows`` (indices, a mask or a slice), in that order: a feed keeps only the images it shows."""
        purged = None if self.purged is None else self.purged[rows]
        return Pointers(self.files, self.captured, self.source[rows], self.loc[rows], self.row_id[rows], self.created[rows],
                        self.valid_from[rows], self.valid_to[rows], purged, self.commit_ms)


class _Builder:
    """Collects pointer arrays from several parts, numbering files as they come."""

    def __init__(self) -> None:
        self.file_ids: dict[str, int] = {}
        self.captured: list[IndexSegment] = []
        self.parts: list[list[np.ndarray | None]] = []

    def file_id(self, path: str) -> int:
        return self.file_ids.setdefault(path, len(self.file_ids))

    def add(self, source: np.ndarray, loc: np.ndarray, row_id: np.ndarray, created: np.ndarray, valid_from: np.ndarray,
            valid_to: np.ndarray) -> None:
        if len(loc):
            self.parts.append([source, loc, row_id, created, valid_from, valid_to])

    def build(self, io: FileIO, purged_path: str | None, commit_ms: dict[int, int]) -> Pointers:
        if self.parts:  # one column at a time, releasing the parts' column: the peak is the parts plus one column
            cols = _columns(self.parts)
        else:
            cols = [np.zeros(0, np.int32)] + [np.zeros(0, np.int64)] * 5
        purged = None
        if purged_path:
            purged = is_purged(read_purged(io, purged_path), cols[2])
        return Pointers(tuple(self.file_ids), tuple(self.captured), cols[0].astype(np.int32, copy=False), *cols[1:], purged=purged,
                        commit_ms=commit_ms)


def index_segments(state: TableState, after: int, with_values: bool = True) -> list[IndexSegment]:
    """Index segments of the commits after version ``after`` (captured values loaded if ``with_values``)."""
    return [read_index(state.iceberg.io, c.index, with_values) for c in state.lineage.log.since(after) if c.index]


def commit_timestamps(state: TableState, a: int, b: int) -> dict[int, int]:
    """Commit timestamps (epoch ms) of the versions in ``(a, b]``."""
    return {c.version: c.timestamp_ms for c in state.lineage.log.since(a) if c.version <= b}


def _add_index(builder: _Builder, seg: IndexSegment, a: int, b: int, pinned: dict[str, set[int]], rows: RowRange | None = None) -> None:
    keep = ((seg.valid_from > a) & (seg.valid_from <= b)) | ((seg.valid_to > a) & (seg.valid_to <= b))
    if rows is not None:
        keep &= in_rows(seg.row_ids, rows)
    rows = np.flatnonzero(keep)
    if not len(rows):
        return
    if seg.values is None:  # the files these images are read from, and the versions that removed them
        pairs = unique(seg.file_index[rows].astype(np.int64) << 32 | seg.valid_to[rows])
        for f, v in zip((pairs >> 32).tolist(), (pairs & 0xFFFFFFFF).tolist(), strict=True):
            pinned.setdefault(seg.files[f], set()).add(v)
    # a segment whose every image is in range (a feed over the commits since its own) is added as it is:
    # the builder copies each column once, when it concatenates the parts
    pick = (lambda x: x) if len(rows) == len(seg) else (lambda x: x[rows])
    if seg.values is not None:
        builder.captured.append(seg)
        source = np.full(len(rows), -len(builder.captured), np.int32)
        loc = rows.astype(np.int64, copy=False)
    else:
        ids = np.array([builder.file_id(f) for f in seg.files], np.int32)
        source = ids[seg.file_index[rows]]
        loc = pick(seg.positions)
    builder.add(source, loc, pick(seg.row_ids), pick(seg.created), pick(seg.valid_from), pick(seg.valid_to))


def live_lineage(state: TableState) -> list[FileLineage]:
    """Lineage of every live data file of the snapshot.

    Only the data manifests are read (delete files do not matter here, see
    :func:`_live_runs`), which costs a fraction of planning a scan.
    """
    live = state.all_data_file_paths()
    by_file = state.lineage_by_file()
    missing = live - by_file.keys()
    if missing:
        raise LineageMetadataError(
            f"data file {sorted(missing)[0]} of version {state.version} has no lineage: it was written by a writer that "
            "does not maintain row lineage; rewrite the table through this library"
        )
    return [fl for path, (_, fl) in by_file.items() if path in live]


def _live_runs(files: list[FileLineage], a: int, b: int, builder: _Builder, segments: list[IndexSegment],
               rows: RowRange | None = None) -> None:
    """Images of live files that start in ``(a, b]`` (row ids in ``rows``), expanded from their lineage runs, less those removed since.

    An image that started after ``a`` and was removed since was removed after
    ``a``, so the index segments after ``a`` name it: they give the removed
    positions without reading the position delete files. Positions are
    numbered across the files read (a file's first follows the previous
    file's last), so that the removed ones are one mask over them.
    """
    runs: list[list[np.ndarray | None]] = []  # per file: first flat position, length, row id start, created, updated
    fids: list[int] = []  # per file read: the builder's id of the file, and how many of its runs are kept
    counts: list[int] = []
    bases: dict[str, tuple[int, int]] = {}  # a file's first flat position and row count, by path
    flat_base: list[int] = []  # the same by file id of the builder (0: not read here)
    total = 0
    for fl in files:
        if fl.max_updated <= a or fl.min_updated > b:
            continue
        pos_start, rid_start, created, updated = fl.breakpoints
        keep = (updated > a) & (updated <= b)
        count = int(np.count_nonzero(keep))
        if not count:
            continue
        length = np.diff(pos_start, append=fl.record_count)
        if rows is not None:  # runs clipped to the row ids in range (a run's row ids are consecutive)
            lo, hi = np.maximum(rid_start, rows[0]), np.minimum(rid_start + length, rows[1])
            keep &= hi > lo
            count = int(np.count_nonzero(keep))
            if not count:
                continue
            pos_start, rid_start, length = pos_start + (lo - rid_start), lo, hi - lo
        # a file written in the range keeps every run: its arrays are taken as they are (copied once, below)
        pick = (lambda x: x) if count == len(keep) else (lambda x: x[keep])  # noqa: B023
        fid = builder.file_id(fl.file_path)
        flat_base.extend([0] * (fid + 1 - len(flat_base)))
        flat_base[fid] = total
        bases[fl.file_path] = (total, fl.record_count)
        fids.append(fid)
        counts.append(count)
        runs.append([pick(pos_start) + total, pick(length), pick(rid_start), pick(created), pick(updated)])
        total += fl.record_count
    if not runs:
        return
    flat, length, rid, cre, upd = _columns(runs)  # copies: changed in place below
    src = np.repeat(np.array(fids, np.int32), counts)  # per run, its file
    rid -= flat  # per run: row id minus flat position, the same for each of its images
    # Image k of a run starting at image number s is at flat position start + k - s (one ramp for all runs).
    # Each image then takes its run's values by its run number: one gather per column, after the removed
    # images are dropped. Files rewritten row by row (a compacted file: updates keep each row's own created
    # version) have runs of one row: their runs are their images, nothing is expanded.
    n = int(length.sum())
    run: np.ndarray | None = None
    if n != len(length):
        first = np.cumsum(length)
        first -= length
        flat -= first
        del first
        run = np.repeat(np.arange(len(length), dtype=np.int32), length)
        flat = flat[run]
        flat += np.arange(n, dtype=np.int64)
    del length
    removed = _removed_flat(segments, bases, rows)
    if len(removed):
        if total <= 4 * len(flat) + MASK_SLACK:  # a mask over the files' rows costs less than a sort
            mask = np.ones(total, bool)
            mask[removed] = False
            alive = mask[flat]
            del mask
        else:  # a few images of large files: no mask over all their rows
            alive = ~member(flat, removed)
        if not alive.all():
            flat = flat[alive]
            run = np.flatnonzero(alive) if run is None else run[alive]
        del alive
    del removed
    if run is not None:
        src, rid, cre, upd = src[run], rid[run], cre[run], upd[run]
    del run
    rid += flat
    flat -= np.array(flat_base, np.int64)[src]  # back to positions within each file
    builder.add(src, flat, rid, cre, upd, np.full(len(flat), LIVE, np.int64))


def _columns(rows: list[list[np.ndarray | None]]) -> list[np.ndarray]:
    """Concatenate per-part column lists column by column, dropping each part's column once it is copied."""
    out = []
    for i in range(len(rows[0])):
        out.append(np.concatenate([r[i] for r in rows]))  # type: ignore[misc]
        for r in rows:
            r[i] = None
    rows.clear()
    return out


def _removed_flat(segments: list[IndexSegment], bases: dict[str, tuple[int, int]], ids: RowRange | None = None) -> np.ndarray:
    """The flat positions (first flat position of the file + position) of every index entry (row ids in ``ids``) pointing
    into one of the files of ``bases`` (path -> first flat position, row count); entries past a file's rows name no image.

    A segment's entries are in (file, position) order, so each file's are one slice: only the slices of the
    files in ``bases`` are read (most entries of a feed's segments point into files it does not read).
    """
    out = []
    for seg in segments:
        hits = [(i, bases[f]) for i, f in enumerate(seg.files) if f in bases]
        if not hits:
            continue
        bounds = np.searchsorted(seg.file_index, [b for i, _ in hits for b in (i, i + 1)])
        for (_, (first, rows)), s, e in zip(hits, bounds[0::2].tolist(), bounds[1::2].tolist(), strict=True):
            pos = seg.positions[s:e]
            keep = pos < rows
            if ids is not None:
                keep &= in_rows(seg.row_ids[s:e], ids)
            out.append(pos[keep] + first)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def change_pointers(state: TableState, a: int, b: int, rows: RowRange | None = None) -> Pointers:
    """Pointers to every image that starts or ends in ``(a, b]`` (see the module docstring), of the row ids in ``rows`` if given."""
    if b <= a:
        return _Builder().build(state.iceberg.io, state.lineage.purged, commit_timestamps(state, a, b))
    sources = PointerSources(state.iceberg.io, state.lineage.purged, commit_timestamps(state, a, b), state.version)
    if rows is None:
        segments = index_segments(state, a)
    else:  # a group's entries only, a few data files at a time: not the segments whole
        segments = [read_rows(state.iceberg.io, c.index, rows, with_values=True) for c in state.lineage.log.since(a) if c.index]
    return sources.pointers(segments, live_lineage(state), a, b, rows)


@dataclass(frozen=True)
class PointerSources:
    """What turns index segments and live files' lineage into :class:`Pointers`, without a table state (an executor has none)."""

    io: FileIO
    purged: str | None  # the purged-rows file, if the table was ever purged
    commit_ms: dict[int, int]
    version: int  # the table version the files are live at (for messages)

    def pointers(self, segments: list[IndexSegment], files: list[FileLineage], a: int, b: int,
                 rows: RowRange | None = None, check: bool = True) -> Pointers:
        """Pointers to the images of ``(a, b]`` (row ids in ``rows``): ``segments`` are the index segments after ``a``,
        ``files`` the lineage of the live files; ``check``: raise :class:`LostFileError` if a file they need is gone."""
        builder = _Builder()
        _live_runs(files, a, b, builder, segments, rows)
        pinned: dict[str, set[int]] = {}
        for seg in segments:
            _add_index(builder, seg, a, b, pinned, rows)
        if check:
            warm([*builder.file_ids, *pinned])  # object store: the footers of the files read, the checked ones with them, at once
            check_pinned(self.io, pinned, a, b)
        return builder.build(self.io, self.purged, self.commit_ms)


def in_rows(row_ids: np.ndarray, rows: RowRange) -> np.ndarray:
    """Which of ``row_ids`` are in ``rows``."""
    return (row_ids >= rows[0]) & (row_ids < rows[1])


def check_pinned(io: FileIO, pinned: dict[str, set[int]], a: int, b: int) -> None:
    """Raise :class:`LostFileError` if a data file holding removed images of ``(a, b]`` is gone.

    ``pinned`` maps each file to the versions whose removals point into it.
    Another engine's ``expire_snapshots`` (deleting unreachable files) or
    ``remove_orphan_files`` deletes data files that only this library's
    deleted-rows index still needs; the feed then refuses rather than answer
    without those images.
    """
    lost = sorted(p for p in pinned if not file_exists(io, p))
    if not lost:
        return
    versions = sorted(set().union(*(pinned[p] for p in lost)))
    raise LostFileError(
        f"the change feed from version {a} to {b} needs row images removed at version(s) {', '.join(map(str, versions))} "
        f"from data file {lost[0]}" + (f" and {len(lost) - 1} more file(s)" if len(lost) > 1 else "")
        + ", which no longer exists (deleted by another engine's expire_snapshots or remove_orphan_files?); "
        "`lineage verify` lists every lost file; read a range after those versions, or restore the file"
    )


def file_exists(io: FileIO, path: str) -> bool:
    """Whether the data file ``path`` exists: a local file is looked up directly (a feed checks dozens at every call)."""
    if path.startswith(("/", "file:")):
        return os.path.exists(local_path(path))
    return io.new_input(path).exists()
