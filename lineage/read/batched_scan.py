"""A scan as a stream of Arrow record batches, in memory bounded by a group of files, not by the table.

:meth:`lineage.Table.scan` builds one Arrow table of every matching row.
:func:`scan_batches` reads the live files in groups of at most
``group_bytes`` of decoded rows (estimated from the files' metadata without
reading them, files with many lineage runs counted for their join too:
:func:`scan_weight`; one file when a file is larger), evaluates the
``where`` on each group in a DuckDB database of its own and hands the rows on
as record batches before it reads the next group. Peak memory is one group's
decoded rows plus DuckDB's buffer pool (limited by
``LINEAGE_DUCKDB_MEMORY_LIMIT``), whatever the table's size.

Each group is materialised in a temporary DuckDB table and exported from
it a record batch at a time: exporting the live view straight to a
record-batch reader hung in DuckDB 1.5.5 (see
:func:`lineage.duck.fetch_arrow`); exporting a materialised table does
not, and the group is then held once (in DuckDB) rather than twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression

import lineage.duck as duck
import lineage.read.arrow_scan as arrow_scan
import lineage.storage.prefetch as prefetch
from lineage.columns import LINEAGE_COLUMNS, LINEAGE_SCHEMA
from lineage.commits.merge_rule import pack_from_end
from lineage.errors import BadPredicateError, InvalidArgumentError, LineageMetadataError, UnknownColumnError
from lineage.read.scan import file_paths, register_live_view
from lineage.sql.predicate import parse_predicate, prunable_columns, quote_ident
from lineage.storage.files import is_remote
from lineage.state import LiveFile, TableState, sized
from lineage.iceberg.schema import cast_table

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

DEFAULT_GROUP_BYTES = 128 << 20
DEFAULT_BATCH_ROWS = 65_536
# read_all on an object store: data files this large are read while the smaller ones (at least this many) arrive
PIPELINE_FILE_BYTES = 256 << 10
PIPELINE_MIN_FILES = 8
T = TypeVar("T")


@dataclass(frozen=True)
class BatchedScan:
    """What one streamed scan reads: the files kept by pruning, the checked ``where`` and the output columns."""

    name: str
    files: list[LiveFile]
    schema: pa.Schema  # the table's data columns
    field_ids: dict[str, int]
    where_sql: str
    exact_floats: bool
    columns: list[str]
    target: pa.Schema  # the output schema (data and lineage columns as the table declares them)
    column_ids: dict[str, int]  # Iceberg field id of each top-level data column (a file's column sizes are keyed by it)


def plan_scan(
    name: str,
    state: TableState,
    schema: pa.Schema,
    field_ids: dict[str, int],
    where: str | BooleanExpression | None,
    columns: Sequence[str] | None,
    with_lineage: bool,
) -> BatchedScan:
    """Check ``where`` and ``columns`` against the table's ``schema`` and keep the files ``where`` may match."""
    probe = pa.schema(list(schema) + LINEAGE_SCHEMA)
    pred = parse_predicate(where, probe, prunable_columns(schema))
    if columns is None:
        wanted = list(schema.names) + (list(LINEAGE_COLUMNS) if with_lineage else [])
    else:
        if isinstance(columns, str):
            raise InvalidArgumentError("columns must be a list of column names, not a string")
        unknown = [c for c in columns if c not in probe.names]
        if unknown:
            raise UnknownColumnError(f"columns {unknown} are not in the table (columns: {probe.names})")
        wanted = list(columns)
    return BatchedScan(
        name=name,
        files=state.live_files(pred.prune),
        schema=schema,
        field_ids=field_ids,
        where_sql=pred.sql,
        exact_floats=pred.reads_floats,
        columns=wanted,
        target=pa.schema([probe.field(c) for c in wanted]),
        column_ids={f.name: f.field_id for f in state.iceberg.schema().fields},
    )


# Decoded bytes per value of a lineage column; variable-width values are estimated from their compressed size.
_FIXED_WIDTH = 8
_VARIABLE_EXPANSION = 4  # decoded / compressed bytes assumed for strings and binaries (dictionary pages decode wide)
_VARIABLE_MIN = 16  # bytes per variable-width value when the file records no column size


def decoded_bytes(f: LiveFile, schema: pa.Schema, column_ids: dict[str, int]) -> int:
    """An estimate of the Arrow bytes ``f``'s rows take decoded (data and lineage columns), from its metadata alone.

    The Parquet size is no measure of memory: well-compressed data decodes to
    ten or more times its size on disk, so a group of 128 MiB of Parquet could
    hold 20M rows. Fixed-width columns count their width per row; strings and
    binaries four times their compressed size (``column_sizes``) plus 8 bytes a value, at least
    :data:`_VARIABLE_MIN` bytes per value without it. Never less than the file.
    """
    rows = int(f.data_file.record_count)
    sizes = f.data_file.column_sizes or {}
    total = rows * _FIXED_WIDTH * len(LINEAGE_COLUMNS)
    for field in schema:
        try:
            bits = field.type.bit_width  # fixed-width types (booleans: 1, decimals: 128); others raise ValueError
        except ValueError:
            bits = 0
        if bits:
            total += (rows * bits + 7) // 8
        else:
            compressed = sizes.get(column_ids.get(field.name, -1))
            total += compressed * _VARIABLE_EXPANSION + 8 * rows if compressed else rows * _VARIABLE_MIN
    return max(total, int(f.data_file.file_size_in_bytes))


# Bytes per lineage run of a file with several runs (the rows an update or upsert rewrote: up to one run per row):
# the run's five columns registered in Arrow, and again in DuckDB's ASOF join.
_RUN_BYTES = 80


def scan_weight(f: LiveFile, schema: pa.Schema, column_ids: dict[str, int]) -> int:
    """What a streamed scan holds for ``f`` in a group: its :func:`decoded_bytes`, and for a file with several
    lineage runs twice that plus its runs (the ASOF join that attaches them sorts the file's rows and its runs).

    Measured on a 100M-row table after a 1% update and a 1M-key upsert: the group of their files (2M rows,
    a run per row) peaked 380 MB above the scan's start when weighed by decoded bytes alone, against
    180 MB for a group of one 1M-row file of a single run.
    """
    size = decoded_bytes(f, schema, column_ids)
    lin = f.lineage
    runs = max(len(lin.row_ids.lengths), len(lin.created.lengths), len(lin.updated.lengths))
    return size if runs <= 1 else 2 * size + runs * _RUN_BYTES


def file_groups(files: Sequence[LiveFile], group_bytes: int, weight: Callable[[LiveFile], int] | None = None) -> list[list[LiveFile]]:
    """``files`` in their order, cut into runs whose weights add up to at most ``group_bytes``.

    ``weight`` is a file's size in memory (default: its Parquet size); a file
    heavier than ``group_bytes`` is a group of its own.
    """
    if group_bytes <= 0:
        raise InvalidArgumentError(f"group_bytes must be a positive number of bytes, got {group_bytes}")
    return pack_from_end(files, weight or (lambda f: int(f.data_file.file_size_in_bytes)), group_bytes)


def scan_batches(
    plan: BatchedScan, batch_rows: int = DEFAULT_BATCH_ROWS, group_bytes: int = DEFAULT_GROUP_BYTES
) -> pa.RecordBatchReader:
    """The rows ``plan`` selects as a record-batch reader of at most ``batch_rows`` rows per batch.

    Files are read lazily, a group at a time, as the reader is consumed; a
    file that disappears meanwhile (a vacuum after the snapshot expired)
    raises :class:`~lineage.errors.LineageMetadataError` from the reader.
    """
    if batch_rows <= 0:
        raise InvalidArgumentError(f"batch_rows must be a positive number of rows, got {batch_rows}")
    # validates group_bytes now, not at the first batch
    groups = file_groups(plan.files, group_bytes, lambda f: scan_weight(f, plan.schema, plan.column_ids))
    return pa.RecordBatchReader.from_batches(plan.target, _batches(plan, groups, batch_rows))


def read_all(plan: BatchedScan) -> pa.Table:
    """Every row ``plan`` selects as one Arrow table (all files in one DuckDB query, or two on an object store).

    On an object store, a table of large files and many small ones (the
    files of small commits) is read in two queries: the large files as soon
    as they and their delete files have arrived, while the small files are
    still being fetched, then the small ones (see :data:`PIPELINE_FILE_BYTES`).
    """
    plain = arrow_scan.read_plain(plan.files, plan.columns, plan.target, plan.field_ids, plan.where_sql)  # no where: pyarrow
    if plain is not None:
        return plain
    select = ", ".join(quote_ident(c) for c in plan.columns)
    large = [f for f in plan.files if f.data_file.file_size_in_bytes >= PIPELINE_FILE_BYTES]
    small = [f for f in plan.files if f.data_file.file_size_in_bytes < PIPELINE_FILE_BYTES]
    if not large or len(small) < PIPELINE_MIN_FILES or not all(is_remote(f.path) for f in small):
        parts = [_read_group(plan, plan.files, select)]
    else:
        ahead = [f.path for f in large] + [d.file_path for f in large for d in f.deletes]
        with prefetch.fetching(sized(plan.files), first=ahead) as fetch:
            parts = [_query_group(plan, group, select, fetch.copies(_sized_paths(group))) for group in (large, small)]
    parts = [cast_table(t, plan.target) for t in parts]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def _batches(plan: BatchedScan, groups: list[list[LiveFile]], batch_rows: int) -> Iterator[pa.RecordBatch]:
    select = ", ".join(quote_ident(c) for c in plan.columns)
    for group in groups:
        with contextlib.ExitStack() as stack:
            # the group's rows are materialised in DuckDB (see lineage.duck.fetch_arrow), then exported a batch
            # at a time: the group is held once, in DuckDB, instead of once there and once as an Arrow table
            with prefetch.local_copies(sized(group)) as copies:  # small files on an object store: fetched at once, one GET each
                con = stack.enter_context(duck.sealed(file_paths(group, copies), exact_floats=plan.exact_floats))
                _run(plan, group, select, con, copies, lambda query: con.execute(f"CREATE TEMP TABLE __group AS {query}"))
            for batch in con.execute("SELECT * FROM __group").to_arrow_reader(batch_rows):
                if batch.num_rows:
                    yield cast_table(batch, plan.target)


def _sized_paths(group: Sequence[LiveFile]) -> list[str]:
    return [location for location, _ in sized(group)]


def _read_group(plan: BatchedScan, group: list[LiveFile], select: str) -> pa.Table:
    with prefetch.local_copies(sized(group)) as copies:  # small files on an object store: fetched at once, one GET each
        return _query_group(plan, group, select, copies)


def _query_group(plan: BatchedScan, group: list[LiveFile], select: str, copies: dict[str, str]) -> pa.Table:
    with duck.sealed(file_paths(group, copies), exact_floats=plan.exact_floats) as con:
        return _run(plan, group, select, con, copies, lambda query: duck.fetch_arrow(con, query))


def _run(plan: BatchedScan, group: list[LiveFile], select: str, con: duckdb.DuckDBPyConnection, copies: dict[str, str],
         execute: Callable[[str], T]) -> T:
    """``execute`` of the query selecting ``plan``'s rows of ``group`` in ``con`` (of :func:`lineage.duck.sealed`, to the
    group's files); DuckDB's errors become the project's."""
    import duckdb  # loaded: the connection is open

    try:
        register_live_view(con, "live", group, plan.schema, plan.field_ids, copies=copies)
    except duckdb.Error as exc:  # gathering the delete positions can reach the memory limit too
        raise duck.out_of_memory(exc) or exc from None
    try:
        return execute(f"SELECT {select} FROM live WHERE {plan.where_sql}")
    except duckdb.IOException as exc:
        raise LineageMetadataError(f"a data or delete file of {plan.name} could not be read (run verify): {exc}") from None
    except duckdb.Error as exc:
        failed = BadPredicateError(f"evaluating where {plan.where_sql!r} failed on the table's data: {exc}")
        raise duck.out_of_memory(exc) or failed from None
