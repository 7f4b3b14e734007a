"""A Spark delete or update in one pass: each task matches its files' rows and writes what replaces them.

The predicate pass of :mod:`lineage.spark_match` hands its matches to the
same Python task that found them, which writes, for its data files:

* their position delete files (or, on Iceberg v3, their deletion vectors),
  when the table's delete granularity makes them file-scoped whatever the
  other tasks match (``file``, or ``auto`` in a partition with no more live
  files than ``lineage.write.delete.file-scoped-limit``: see
  :func:`lineage.properties.delete_granularity`);
* the index segment row of each file (:func:`lineage.writes.spark_removed.index_blob`);
* with the key index on, the removed images' keys (a scratch file);
* for an update, the new images, to a scratch file.

Nothing is shuffled and nothing the size of the matched rows reaches the
driver. Each task writes its files' index rows (and the positions of a
delete file whose scope depends on what every task matched) to a scratch
file beside the index segment. An update's task writes its new images as
data files itself each time it holds 16 MB of them (the embedded engine's
rule for large updates, :data:`lineage.writes.grouped.FLUSH_BYTES`; sorted
by row id, so their lineage compresses into runs) and leaves what is left
at its end in a scratch file. A second job of one task reads the scratch
files back, writes those partition-scoped delete files, the commit's single
index segment and the tasks' remaining images as data files (for a small
update, as many files as the embedded engine writes), and deletes the
scratch files. The driver runs two Spark jobs and collects
one record per data file touched, one per partition-scoped delete file, one
per data file written and one for the segment; its own work is planning and
the commit. Both jobs run on ``mapInArrow``, whose Python workers the
session's other DataFrame work keeps warm (an RDD job would start a second
pool of them, each worker importing this library afresh).
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import lineage.spark as spark_io
import lineage.spark_match as spark_match
import lineage.storage.files as store
import lineage.storage.spark_read as spark_read
import lineage.writes.spark_scratch as spark_scratch
from lineage.columns import HIDDEN_ROW_ID
from lineage.context import TableContext
from lineage.state import LiveFile, TableState
from lineage.storage.fileio import local_path, write_bytes
from lineage.storage.writer import WrittenFile, spec_id_of
from lineage.writes.grouped import FLUSH_BYTES
from lineage.writes.spark_removed import (
    RemovalContext, RemovedOnSpark, assemble, index_blob, removal_context, removed_of, write_deletes, write_keys, write_segment,
)

_WHOLE_FILE = 1 << 62  # slice length that keeps every file in one piece: a task writes each of its files' deletes itself


@dataclass(frozen=True)
class OnePass:
    """What every task of the job needs: the removal's facts, the predicate pass, and what to write.

    ``deferred`` maps the local path of each file whose delete file's scope
    depends on the other tasks' matches to its partition's group number;
    ``images`` names the columns of the new images (an update), else None.
    """

    removal: RemovalContext
    spec: spark_match.MatchPass
    tasks: list[list[spark_match.FileSlice]]
    deferred: dict[str, int]
    images: list[str] | None
    key: list[str]
    scratch: str  # prefix of the tasks' scratch files (beside the index segment)
    flush_bytes: int = FLUSH_BYTES  # new images a task holds before it writes them as data files


def remove_in_one_pass(spark: Any, table: TableContext, state: TableState, files: list[LiveFile], spec: spark_match.MatchPass,
                       key: list[str], capture: bool, images: list[str] | None = None) -> tuple[RemovedOnSpark, list[WrittenFile]]:
    """Executors remove the live rows of ``files`` that ``spec`` matches, in one pass over them; what they wrote.

    ``spec.out`` holds :data:`lineage.writes.spark_removed.POINTER_COLUMNS`,
    the removed images' key values ``__old_key_<i>`` and, with ``capture``,
    their old values ``__old_<i>``; with ``images`` (an update) also those
    columns of the new images, written as data files. The commit that uses
    the result must be made on ``state``.
    """
    session = spark_io.spark_session(spark)
    if not files:
        return RemovedOnSpark(), []
    removal = removal_context(table, state, files, key, capture)
    tasks = spark_match.deal(spark_match.slices(files, _WHOLE_FILE), session.sparkContext.defaultParallelism)
    job = OnePass(removal, spec, tasks, _deferred(files, removal, table.iceberg.metadata.default_spec_id), images, key,
                  removal.prefix, FLUSH_BYTES)
    ids = session.range(0, len(tasks), 1, numPartitions=len(tasks))
    try:
        with spark_io.executor_errors():  # bad input an executor found: the project's error
            rows = ids.mapInArrow(spark_read.with_settings(_match_and_write(job)), _RECORD).collect()  # one per data file touched
            if not rows:
                return RemovedOnSpark(), []
            ledgers = sorted({p for r in rows if r["__ledgers"] for p in r["__ledgers"].split("\n")})
            last = _Finish(removal, sorted({r["__scratch"] for r in rows}), sorted({r["__new"] for r in rows if r["__new"]}), key, ledgers)
            finished = session.range(0, 1, 1, numPartitions=1).mapInArrow(spark_read.with_settings(_finish(last)), _FINISHED).collect()
    except BaseException:
        spark_scratch.discard(table.iceberg.io, job.scratch)  # the write fails: what its tasks wrote goes with it
        raise
    later = {r["__path"]: r["__deletes"] for r in finished if r["__path"] is not None}  # one per deferred group
    written = [w for r in rows if r["__written"] is not None for w in pickle.loads(r["__written"])]  # the tasks' flushes
    written += [pickle.loads(r["__data"]) for r in finished if r["__data"] is not None]
    # the pickled lineage of the files written (16 bytes per updated row when their row ids are scattered) is not
    # kept beside what it was loaded into for the rest of the commit
    segment = [(r["__size"], r["__images"]) for r in finished if r["__size"] is not None][0]
    rows = [{**{k: v for k, v in r.asDict().items() if k != "__written"}, "__deletes": later.get(r["__path"], r["__deletes"])} for r in rows]
    del finished
    return assemble(removal, table.iceberg.io, key, rows, *segment), written


@dataclass(frozen=True)
class _Finish:
    """What the last job's task needs: the removal's facts and the tasks' scratch files (index rows, deferred positions)."""

    removal: RemovalContext
    scratch: list[str]
    images: list[str]  # the new images' scratch files (an update)
    key: list[str]
    ledgers: list[str]  # the tasks' ledgers (:mod:`lineage.writes.spark_scratch`), deleted with the scratch files


def _deferred(files: Sequence[LiveFile], removal: RemovalContext, default_spec: int) -> dict[str, int]:
    """The files whose delete file's scope the job's last task decides, with their partition's number (see the module docstring)."""
    if removal.vectors or removal.granularity == "file":
        return {}
    groups: dict[tuple, list[str]] = {}
    for f in files:
        groups.setdefault((spec_id_of(f.data_file, default_spec), repr(f.data_file.partition)), []).append(local_path(f.path))
    out: dict[str, int] = {}
    for n, members in enumerate(groups.values()):
        if removal.granularity == "partition" or len(members) > removal.file_scoped_limit:
            out.update(dict.fromkeys(members, n))
    return out


def _match_and_write(job: OnePass) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The first job: each task number's files matched, their deletes, index rows, keys and new images written (:data:`_RECORD` rows)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for number in [int(i) for b in batches for i in b.column(0).to_pylist()]:
            records = list(_task(job, number))
            if records:
                yield pa.RecordBatch.from_pylist(records, schema=_RECORD_ARROW)

    return run


def _task(job: OnePass, number: int) -> Iterator[dict[str, Any]]:
    ctx = job.removal
    target = ctx.target()
    ledger = spark_scratch.Ledger(target.io, job.scratch)
    images = _ImageFlush(target, job.key, job.flush_bytes, ledger) if job.images is not None else None
    parts = []
    for batch in spark_match.evaluate_files([p.file for p in job.tasks[number]], job.spec):
        if images is not None:  # the new images leave the task's memory in bounded pieces; the rest is a few dozen bytes a row
            got = pa.Table.from_batches([batch])
            images.add(got.select(job.images))
            parts.extend(got.drop_columns([c for c in job.images if c not in _KEEP]).to_batches())
        else:
            parts.append(batch)
    if not parts:
        return
    found = pa.Table.from_batches(parts)
    del parts
    found = found.sort_by([("__path", "ascending"), ("__pos", "ascending")])
    paths = found.column("__path").combine_chunks().dictionary_encode()
    ids = paths.indices.to_numpy()
    bounds = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), len(ids)]
    matched = [(paths.dictionary[int(ids[s])].as_py(), found.slice(s, e - s)) for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    keys = write_keys(ctx, target, found, number)
    direct = [(path, m.column("__pos").to_numpy()) for path, m in matched if path not in job.deferred]
    deletes = None
    if direct:
        new_deletes = write_deletes(ctx, target, direct, "file")
        ledger.wrote([d.file_path for d in new_deletes[0]])
        deletes = pickle.dumps(new_deletes)
    later = [path in job.deferred for path, _ in matched]
    scratch = pa.table({"__path": [path for path, _ in matched], "__index": [index_blob(removed_of(ctx, path, m)) for path, m in matched],
                        "__group": pa.array([job.deferred.get(path) for path, _ in matched], pa.int32()),
                        "__positions": [m.column("__pos").to_numpy().astype(np.int64).tobytes() if d else None
                                        for (_, m), d in zip(matched, later, strict=True)]}, schema=_SCRATCH)
    scratch_path = f"{job.scratch}-{uuid.uuid4()}-rows.arrow"  # named per attempt: a task run again writes anew
    _write_arrow(target.io, scratch_path, scratch)
    images_path, written = None, None
    if images is not None:
        rest = images.rest()
        if rest is not None and rest.num_rows:  # the last task writes the tasks' remainders together, as the embedded engine would
            images_path = f"{job.scratch}-{uuid.uuid4()}-images.arrow"
            _write_arrow(target.io, images_path, rest)
        written = pickle.dumps(images.written) if images.written else None
    for (path, m), d in zip(matched, later, strict=True):
        yield {"__path": path, "__images": m.num_rows, "__deletes": None if d else deletes, "__keys": keys, "__scratch": scratch_path,
               "__new": images_path, "__written": written, "__ledgers": "\n".join(ledger.paths) or None}
        written = None  # the task's data files travel once
        ledger.paths = []
        if not d:
            deletes = None  # the task's delete files travel once


_KEEP = {"__path", "__pos"}  # columns of the matches the removal needs even when an update's images name them too


class _ImageFlush:
    """An update task's new images, written as data files each time :data:`lineage.writes.grouped.FLUSH_BYTES` of them
    are held (the embedded engine's rule for an update of many rows: data files of up to 16 MB of images each,
    sorted by row id), so a task holds at most that much of them whatever it matches; :meth:`rest` is what is
    left at the end, which the job's last task writes with the other tasks' remainders."""

    def __init__(self, target: Any, key: list[str], flush_bytes: int, ledger: spark_scratch.Ledger) -> None:
        self.target, self.key, self.flush_bytes, self.ledger = target, key, flush_bytes, ledger
        self.held: list[pa.Table] = []
        self.bytes = 0
        self.written: list[WrittenFile] = []

    def add(self, images: pa.Table) -> None:
        """Hold ``images``; write what is held once it reaches the flush size."""
        self.held.append(images)
        self.bytes += images.nbytes
        if self.bytes >= self.flush_bytes:
            new = pa.concat_tables(self.held).sort_by(HIDDEN_ROW_ID)
            self.held, self.bytes = [], 0
            files = list(spark_io.written_files(self.target, new, self.target.metadata, self.key))
            self.ledger.wrote([w.data_file.file_path for w in files])
            self.written.extend(files)

    def rest(self) -> pa.Table | None:
        """The images held and not written."""
        return pa.concat_tables(self.held) if self.held else None


def _write_arrow(io: Any, path: str, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    write_bytes(io, path, sink.getvalue().to_pybytes())


def _read_arrow(io: Any, path: str) -> pa.Table:
    with io.new_input(path).open() as f:
        return pa.ipc.open_file(pa.BufferReader(f.read())).read_all()


def _finish(last: _Finish) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The last job (one task): the deferred delete files and the index segment written from the scratch files (:data:`_FINISHED` rows)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        ctx = last.removal
        target = ctx.target()
        files = pa.concat_tables([_read_arrow(target.io, p) for p in last.scratch]).to_pylist()
        groups: dict[int, list[dict[str, Any]]] = {}
        for f in files:
            if f["__group"] is not None:
                groups.setdefault(f["__group"], []).append(f)
        out = []
        ledger = spark_scratch.Ledger(target.io, ctx.prefix)
        for members in groups.values():
            written = write_deletes(ctx, target, [(m["__path"], np.frombuffer(m["__positions"], np.int64)) for m in members], ctx.granularity)
            ledger.wrote([d.file_path for d in written[0]])
            out.append({"__path": members[0]["__path"], "__deletes": pickle.dumps(written)})
        size, images = write_segment(ctx, target.io, [f["__index"] for f in files])
        out.append({"__size": size, "__images": images})
        if last.images:
            new = pa.concat_tables([_read_arrow(target.io, p) for p in last.images]).sort_by(HIDDEN_ROW_ID)
            data = list(spark_io.written_files(target, new, target.metadata, last.key))
            ledger.wrote([w.data_file.file_path for w in data])
            out.extend({"__data": pickle.dumps(w)} for w in data)
        store.delete_many(last.scratch + last.images + last.ledgers + ledger.paths)
        yield pa.RecordBatch.from_pylist(out, schema=_FINISHED_ARROW)

    return run


# a task's record: a data file it touched, and the task's scratch files (index rows; new images)
_RECORD_ARROW = pa.schema([("__path", pa.string()), ("__images", pa.int64()), ("__deletes", pa.binary()), ("__keys", pa.string()),
                           ("__scratch", pa.string()), ("__new", pa.string()), ("__written", pa.binary()), ("__ledgers", pa.string())])
_RECORD = "__path string, __images long, __deletes binary, __keys string, __scratch string, __new string, __written binary, __ledgers string"
# a task's scratch file: per data file touched, its index segment row and, when its delete file's scope is the last task's to decide,
# its group and positions
_SCRATCH = pa.schema([("__path", pa.string()), ("__index", pa.binary()), ("__group", pa.int32()), ("__positions", pa.binary())])
# the last task's record: a deferred group's delete files (on its first file's __path), the index segment (__size, __images)
# or a data file of new images (__data: a pickled WrittenFile)
_FINISHED_ARROW = pa.schema([("__path", pa.string()), ("__deletes", pa.binary()), ("__size", pa.int64()), ("__images", pa.int64()),
                             ("__data", pa.binary())])
_FINISHED = "__path string, __deletes binary, __size long, __images long, __data binary"
