"""The Spark change feed planned by executors, one group of row ids per task: the driver names files, never rows.

The driver hands every task the same :class:`FeedSource` (paths of the index
segments after the range's start, of the lineage segments and live data
files, the commit timestamps: nothing that grows with the changed rows) and
one range of row ids (:func:`cdf.groups.even_ranges`, cut from the commit
log's counts). The task builds its range's pointers and plan with the
embedded engine's code (:func:`cdf.pointers.change_pointers`'s core,
:func:`cdf.stream.plan_pointers`), reads the values with its reader
(:func:`cdf.stream.read_parts`: parts of bounded rows and bytes) and returns
the feed's rows with a sort key; Spark then orders them as the feed is
ordered (commit version, row id, the pre-image or delete before the
post-image or insert). The rows are those of the embedded engine because
every group is a feed of its own (:mod:`cdf.groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import cdf.plan as plan
from cdf.engine_duckdb import PartPlan
from cdf.groups import ALL_ROWS, Unit, even_ranges
from cdf.pointers import Pointers, PointerSources, RowRange, commit_timestamps
from cdf.stream import DEFAULT_BATCH_BYTES, plan_pointers, read_parts
from index.segment_rows import read_rows
from lineage.errors import LineageMetadataError
from lineage.spark import executor_io
from lineage.state import TableState
from lineage.storage.metadata import FileLineage, read_segment
from lineage.iceberg.schema import cast_nested

AFTER = "__after"  # the sort key's last part: 1 for an insert or post-image, 0 for a delete or pre-image
TASK_BATCH_ROWS = 1_000_000


@dataclass(frozen=True)
class FeedSource:
    """Where the pointers of a feed over versions after ``a`` come from, by path only (what a task is sent)."""

    io_properties: dict[str, str]
    location: str
    index: tuple[str, ...]  # the index segments of the commits after a
    lineage: tuple[str, ...]  # the snapshot's lineage segments, oldest first
    live: frozenset[str]  # the snapshot's live data files
    purged: str | None
    commit_ms: dict[int, int]
    version: int
    field_ids: dict[str, int]

    @classmethod
    def of(cls, state: TableState, a: int, b: int) -> FeedSource:
        """The source of ``state``'s feed over ``(a, b]``."""
        return cls(dict(state.iceberg.io.properties), state.iceberg.metadata.location,
                   tuple(c.index for c in state.lineage.log.since(a) if c.index), tuple(state.lineage.segments),
                   frozenset(state.all_data_file_paths()), state.lineage.purged, commit_timestamps(state, a, b), state.version,
                   {f.name: f.field_id for f in state.iceberg.schema().fields})

    def pointers(self, a: int, b: int, rows: RowRange) -> Pointers:
        """The pointers of ``(a, b]`` with row ids in ``rows`` (run by a task; lost files were checked by the driver)."""
        io = executor_io(self.io_properties, self.location)
        by_file: dict[str, FileLineage] = {}
        for seg in self.lineage:  # a later segment's lineage of a file replaces an earlier one's
            by_file.update((fl.file_path, fl) for fl in read_segment(io, seg))
        missing = self.live - by_file.keys()
        if missing:
            raise LineageMetadataError(
                f"data file {sorted(missing)[0]} of version {self.version} has no lineage: it was written by a writer that "
                "does not maintain row lineage; rewrite the table through this library"
            )
        files = [by_file[p] for p in self.live]
        segments = [read_rows(io, p, rows, with_values=True) for p in self.index]  # this group's entries only
        return PointerSources(io, self.purged, self.commit_ms, self.version).pointers(segments, files, a, b, rows, check=False)


def group_reader(source: FeedSource, ranges: list[RowRange], a: int, b: int, data: pa.Schema, net: bool,
                 width: int, out: Any, deleted: bool = False) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: group numbers in (``ranges[k]``), the feed rows of those groups out, with :data:`AFTER`.

    ``width`` guesses the bytes of an output row, for the first part of a group; ``out`` is the Spark schema of
    the rows (:func:`spark_schema`), whose Arrow types the rows are cast to. ``deleted``: the rows are those of
    ``deleted_rows`` instead (the per-version feed's deletes, :func:`deleted_columns`), without :data:`AFTER`.
    """

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(out, timezone="UTC")
        for batch in batches:
            for k in batch.column(0).to_pylist():
                unit = Unit(a, b, ranges[int(k)])
                for part in unit_parts(source, unit, data, net, TASK_BATCH_ROWS, width, deleted):
                    if deleted:
                        part = deleted_columns(part, data)
                    else:
                        after = pc.is_in(part.column("_change_type"), pa.array(["insert", "update_postimage"])).cast(pa.int8())
                        part = part.append_column(AFTER, after)
                    yield from cast_to(part, target).to_batches()

    return read


def unit_parts(source: FeedSource, unit: Unit, data: pa.Schema, net: bool, batch_rows: int, width: int,
               deleted: bool = False) -> Iterator[pa.Table]:
    """The feed rows of ``unit`` (its range ``(lo, hi]``, its row ids), planned and read here, in parts of at most
    ``batch_rows`` rows and about :data:`cdf.stream.DEFAULT_BATCH_BYTES` (``width``: a first guess of a row's bytes).

    ``deleted``: only the deletes of the per-version feed (``deleted_rows``). Runs in a task: the pointers and
    plan are those of this unit alone, dropped when its last part is read.
    """
    rows = ALL_ROWS if unit.rows is None else unit.rows
    feed = plan_pointers(source.pointers(unit.lo, unit.hi, rows), unit.lo, unit.hi, data, net, source.field_ids)
    if deleted:
        feed = only_deletes(feed)
    yield from read_parts(feed, batch_rows, DEFAULT_BATCH_BYTES, width, False, whole=False)


def stream_units(state: TableState, a: int, b: int, batch_rows: int) -> list[Unit]:
    """The per-version feed over ``(a, b]`` as units of about ``batch_rows`` images each by the commit log's counts, in
    the feed's order: consecutive versions together while their images fit (the feed over ``(lo, hi]`` is their
    feeds one after the other), a larger version alone, cut into equal row-id ranges (:func:`cdf.groups.even_ranges`)."""
    counts = {c.version: c.inserted + 2 * c.updated + c.deleted for c in state.lineage.log.since(a) if c.version <= b}
    out: list[Unit] = []
    lo, held = a, 0
    for v in range(a + 1, b + 1):
        n = counts.get(v, 0)
        if lo < v - 1 and held + n > batch_rows:  # versions lo+1 .. v-1 make a unit
            out.append(Unit(lo, v - 1, None))
            lo, held = v - 1, 0
        if n > batch_rows:
            out.extend(Unit(v - 1, v, rows) for rows in even_ranges(state, v - 1, v, batch_rows))
            lo = v
        else:
            held += n
    if lo < b:
        out.append(Unit(lo, b, None))
    return out


def cast_to(part: pa.Table, target: pa.Schema) -> pa.Table:
    """``part``'s columns, in order, cast to ``target``'s types (the Arrow types of the Spark schema a task declares)."""
    return pa.Table.from_arrays([cast_nested(c, f.type) for c, f in zip(part.columns, target, strict=True)], schema=target)


def only_deletes(feed: PartPlan) -> PartPlan:
    """The rows of a per-version ``feed`` that delete a row (what ``deleted_rows`` shows: rows updated live on)."""
    keep = np.flatnonzero(feed.change == plan.DELETE)
    return replace(feed, shown=feed.shown.select(keep), change=feed.change[keep], version=feed.version[keep])


def deleted_columns(part: pa.Table, data: pa.Schema) -> pa.Table:
    """Feed rows of deletes as ``deleted_rows`` rows: the data columns, the version and time of the delete, the lineage."""
    renamed = {"_commit_version": "_row_deleted_at_version", "_commit_timestamp": "_row_deleted_at_timestamp"}
    keep = [*data.names, "_commit_version", "_commit_timestamp", "_row_id", "_row_created_at_version",
            "_row_last_updated_at_version", *(["_purged"] if "_purged" in part.column_names else [])]
    return part.select(keep).rename_columns([renamed.get(n, n) for n in keep])


def spark_schema(schema: pa.Schema) -> Any:
    """``schema`` as Spark's ``StructType`` (what the tasks' Arrow batches are declared as)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
