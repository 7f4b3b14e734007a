"""The per-version feed of a table that captures pre-images, assembled from what each commit stored.

With ``lineage.cdf.capture-preimages=true`` a commit stores the values of the
images it removes in its index segment, and its new data files hold the
images it starts (update post-images and inserts; rows a copy-on-write
rewrite keeps are moved images, not started ones). So the per-version feed of
version ``v`` needs nothing else: its ends are the entries of ``v``'s segment,
its starts the rows of ``v``'s own files whose lineage says they were written
at ``v``, both found from ``v``'s commit alone (:func:`stored`). No pointer
into the live files is built and no row id of another commit is looked at:
each version's rows are ordered and paired on their own
(:func:`cdf.plan.per_version` over that version's images only), its values are
its segment's captured values and its files read whole
(:func:`lineage.read.values.read_files`), and the feed over ``(a, b]`` is its
versions' feeds one after the other, which is what the per-version feed is
(see :mod:`cdf.groups`). Versions are assembled by two threads at once.

A version is assembled so only when its stored pieces are exactly its
images; any other version is left to :mod:`cdf.engine_duckdb` (the same rows,
planned from the live files and every index segment since): a commit
another engine made (or a gap of expired foreign snapshots), a segment
without captured values (capture was off then), a table that was ever purged
(erased values), counts that disagree with the commit log (images written and
removed by the same commit), or a file that is gone (vacuumed after its
snapshot expired; a compacted table still has its rows, elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

import cdf.engine_duckdb as engine_duckdb
import cdf.plan as plan
import cdf.threads as threads
from cdf.output import encoded_change_schema
from cdf.pointers import commit_timestamps, file_exists
from index.deleted_rows import IndexSegment, read_index
from lineage.errors import LineageMetadataError
from lineage.properties import capture_preimages
from lineage.read.values import read_files, take_rows
from lineage.state import TableState
from lineage.storage.fileio import ImmutableFileCache
from lineage.storage.files import is_remote
from lineage.storage.metadata import FileLineage, read_segment

PARALLEL_IMAGES = 20_000  # a range with more images than this has its versions assembled by two threads
CHUNK_IMAGES = 65_536  # consecutive versions are assembled together up to about this many images (a larger version alone)


@dataclass(frozen=True)
class Written:
    """The rows of one data file that its commit started: positions ``positions`` (None: every row)."""

    lineage: FileLineage
    positions: np.ndarray | None
    row_id: np.ndarray
    created: np.ndarray

    def __len__(self) -> int:
        return len(self.row_id)


@dataclass(frozen=True)
class Stored:
    """What version ``version``'s commit stored: the images it removed, with their values, and the ones it wrote."""

    version: int
    removed: IndexSegment | None
    written: tuple[Written, ...]

    @property
    def images(self) -> int:
        """The images the version's feed shows (an update counts two)."""
        return (0 if self.removed is None else len(self.removed)) + sum(len(w) for w in self.written)


# The rows each commit's files started, by (lineage segment, version): row ids and created versions (and positions
# in a rewritten file), expanded from the runs once, not at every feed (a file of scattered updates has a run a row).
WRITTEN_BYTES = 64 << 20
_WRITTEN: ImmutableFileCache[tuple[Written, ...]] = ImmutableFileCache(
    WRITTEN_BYTES, weigh=lambda ws: sum(w.row_id.nbytes + w.created.nbytes + (0 if w.positions is None else w.positions.nbytes) for w in ws),
    max_share=0.25)


def capturing(state: TableState) -> bool:
    """Whether the table captures pre-images now and was never purged: the feed may be assembled from commits."""
    return capture_preimages(state.iceberg.metadata.properties) and not state.lineage.purged


def stored(state: TableState, a: int, b: int) -> list[Stored | int]:
    """For each version of ``(a, b]`` in order: its :class:`Stored` pieces, or the version itself when its feed
    cannot be assembled from them (see the module docstring)."""
    io = state.iceberg.io
    out: list[Stored | int] = []
    for c in state.lineage.log.since(a):
        if c.version > b:
            break
        removed = None
        if c.foreign or c.gap:
            out.append(c.version)
            continue
        if c.index:
            removed = read_index(io, c.index, with_values=True)
            if removed.values is None or len(removed) != c.updated + c.deleted:
                out.append(c.version)
                continue
        written = _written(state, c.segment, c.version) if c.segment else ()
        if written is None or sum(len(w) for w in written) != c.inserted + c.updated:
            out.append(c.version)
            continue
        out.append(Stored(c.version, removed, written))
    return out


def _written(state: TableState, segment: str, version: int) -> tuple[Written, ...] | None:
    """The rows the files of the lineage segment ``segment`` (of ``version``'s commit) started; None if a file is gone."""
    try:
        written = _WRITTEN.get((segment, version), lambda: _expanded(read_segment(state.iceberg.io, segment), version))
    except LineageMetadataError:  # removed with the expired snapshot that referenced it: the live files still say
        return None
    return written if all(_present(state, w.lineage.file_path) for w in written) else None


def _expanded(files: tuple[FileLineage, ...], version: int) -> tuple[Written, ...]:
    """The rows of ``files`` (a commit's lineage segment) that ``version`` started, with their row ids and created versions."""
    out = []
    for fl in files:
        if fl.max_updated < version:
            continue  # a compacted or rewritten file of earlier images: none started here
        pos, rid, created, updated = fl.breakpoints
        length = np.diff(pos, append=fl.record_count)
        keep = updated == version
        whole = bool(keep.all())
        if not whole:  # a copy-on-write rewrite: its kept rows are moved images, its new ones runs of their own
            pos, rid, created, length = pos[keep], rid[keep], created[keep], length[keep]
        n = int(length.sum())
        first = np.cumsum(length) - length  # each run's first row among those kept
        step = np.arange(n, dtype=np.int64)
        row_id = np.repeat(rid - first, length) + step
        positions = None if whole else np.repeat(pos - first, length) + step
        out.append(Written(fl, positions, row_id, np.repeat(created, length)))
    return tuple(out)


def _present(state: TableState, path: str) -> bool:
    """Whether the data file ``path`` can be read: a live file is; another is looked up (a local file directly)."""
    if not is_remote(path):
        return file_exists(state.iceberg.io, path)
    return path in state.all_data_file_paths() or file_exists(state.iceberg.io, path)


def rows(chunk: list[Stored], data: pa.Schema, field_ids: dict[str, int], commit_ms: dict[int, int], cache: bool = True) -> pa.Table:
    """The per-version feed of the consecutive versions ``chunk`` (the rows of :func:`cdf.changes` over them), from
    their stored pieces: every removed image an end, every written one a start (:func:`cdf.plan.events`), the
    values those of the segments and of the files read whole. Raises FileNotFoundError if a file was removed meanwhile.
    """
    removed = [s for s in chunk if s.removed is not None and len(s.removed)]
    written = [(s.version, w) for s in chunk for w in s.written if len(w)]
    ends = [s.removed for s in removed]
    row_id = np.concatenate([e.row_ids for e in ends] + [w.row_id for _, w in written] + [np.zeros(0, np.int64)])
    version = np.concatenate([e.valid_to for e in ends] + [np.full(len(w), v, np.int64) for v, w in written] + [np.zeros(0, np.int64)])
    n_ends = sum(len(e) for e in ends)
    sk = plan.events(np.arange(len(row_id)), version.copy(), row_id.copy(), n_ends)
    created = np.concatenate([e.created for e in ends] + [w.created for _, w in written] + [np.zeros(0, np.int64)])
    version[:n_ends] = np.concatenate([e.valid_from for e in ends] + [np.zeros(0, np.int64)])  # now each image's valid-from
    pieces = [engine_duckdb.captured_values(e, data, field_ids) for e in ends]
    files = read_files([w.lineage.file_path for _, w in written], data, field_ids, cache)
    for (_, w), t in zip(written, files, strict=True):
        pieces.append(t if w.positions is None else t.take(pa.array(w.positions)))
    del files
    values = take_rows(pieces, sk.pointer, data, decode=False)  # string columns may stay dictionaries: assemble decodes them
    at = sk.pointer
    return engine_duckdb.assemble(values, sk, row_id[at], created[at], version[at], commit_ms, data)


def changes(state: TableState, a: int, b: int, data: pa.Schema) -> pa.Table | None:
    """The per-version feed over ``(a, b]``, its versions assembled from their stored pieces where they can be;
    None when the table does not capture pre-images (or no version of the range can be assembled so)."""
    if not capturing(state):
        return None
    versions = stored(state, a, b)
    if not any(isinstance(s, Stored) for s in versions):
        return None
    jobs = _jobs(versions)
    field_ids = engine_duckdb.field_ids(state)
    commit_ms = commit_timestamps(state, a, b)
    done: dict[int, pa.Table | None] = {}

    def assemble(numbers: list[int]) -> dict[int, pa.Table | None]:
        out: dict[int, pa.Table | None] = {}
        for k in numbers:
            try:
                out[k] = rows(jobs[k], data, field_ids, commit_ms)  # type: ignore[arg-type]
            except FileNotFoundError:  # vacuumed since it was looked up: these versions as the engine plans them
                out[k] = None
        return out

    with threads.prompt_handover():
        mine, theirs = _shares(jobs)
        other = threads.worker().submit(assemble, theirs) if theirs else None
        done.update(assemble(mine))
        for k, job in enumerate(jobs):
            if isinstance(job, tuple):  # versions the engine plans, in this thread (it hands its reads to the worker)
                done[k] = engine_duckdb.changes(state, job[0], job[1], data, False)
        if other is not None:
            done.update(other.result())
        tables = []
        for k, job in enumerate(jobs):
            table = done.pop(k)
            if table is None:
                first, last = job[0].version, job[-1].version  # type: ignore[index]
                table = engine_duckdb.changes(state, first - 1, last, data, False)
            if table.num_rows:
                tables.append(table)
    return pa.concat_tables(tables) if tables else encoded_change_schema(data).empty_table()


def _jobs(versions: list[Stored | int], chunk_images: int = CHUNK_IMAGES) -> list[list[Stored] | tuple[int, int]]:
    """The versions as jobs in order: consecutive stored versions in chunks of about ``chunk_images`` images (a
    larger version alone), each run of other versions as one range ``(lo, hi]``."""
    jobs: list[list[Stored] | tuple[int, int]] = []
    size = 0
    for s in versions:
        if isinstance(s, Stored):
            if jobs and isinstance(jobs[-1], list) and size + s.images <= chunk_images:
                jobs[-1].append(s)
                size += s.images
            else:
                jobs.append([s])
                size = s.images
        elif jobs and isinstance(jobs[-1], tuple) and jobs[-1][1] == s - 1:
            jobs[-1] = (jobs[-1][0], s)
        else:
            jobs.append((s - 1, s))
    return jobs


def _shares(jobs: list[list[Stored] | tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The stored chunks split between this thread and the worker by images, about evenly (all here when they are few)."""
    numbered = [(k, sum(s.images for s in j)) for k, j in enumerate(jobs) if isinstance(j, list)]
    if sum(n for _, n in numbered) <= PARALLEL_IMAGES or len(numbered) < 2:
        return [k for k, _ in numbered], []
    loads, shares = [0, 0], ([], [])
    for k, n in sorted(numbered, key=lambda kn: -kn[1]):
        i = int(loads[1] < loads[0])
        shares[i].append(k)
        loads[i] += n
    return sorted(shares[0]), sorted(shares[1])


def stored_parts(versions: list[Stored], data: pa.Schema, field_ids: dict[str, int], commit_ms: dict[int, int], batch_rows: int,
                 batch_bytes: int | None, a: int, b: int) -> Iterator[pa.Table]:
    """The rows of ``versions`` (every version of a range ``(a, b]``), one version at a time, cut into parts of at most
    ``batch_rows`` rows and about ``batch_bytes`` bytes (one row more where that keeps an update pair whole)."""
    for s in versions:
        try:
            table = rows([s], data, field_ids, commit_ms)
        except FileNotFoundError as exc:
            raise engine_duckdb.lost_file(a, b, exc) from exc
        yield from _cut(table, batch_rows, batch_bytes)
        del table


def _cut(table: pa.Table, batch_rows: int, batch_bytes: int | None) -> Iterator[pa.Table]:
    """``table`` (one version's feed) as consecutive slices of at most ``batch_rows`` rows and about ``batch_bytes``
    bytes, an update pair never split (a slice may hold one row more)."""
    n = table.num_rows
    if not n:
        return
    rows = batch_rows
    if batch_bytes is not None:
        rows = min(rows, max(1, batch_bytes * n // max(1, table.get_total_buffer_size())))
    if rows >= n:
        yield table
        return
    change = table.column("_change_type").combine_chunks().indices.to_numpy(zero_copy_only=False)
    start = 0
    while start < n:
        end = min(start + rows, n)
        if change[end - 1] == plan.PREIMAGE:
            end += 1
        yield table.slice(start, end - start)
        start = end
