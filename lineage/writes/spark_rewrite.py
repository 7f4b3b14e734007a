"""Deletes and updates on Spark: executors find the rows a ``where`` matches and write their new images.

The driver checks the ``where`` and ``set`` expressions exactly as the
embedded path does (:func:`lineage.sql.predicate.parse_predicate`,
:func:`lineage.writes.checks.check_expression`), keeps the files the
``where`` may match, and hands those files to executor tasks that read each
file's predicate columns themselves (:mod:`lineage.spark_match`). Each task
evaluates the same checked DuckDB SQL in a sealed DuckDB database of its own,
then reads the other columns of the matched rows only, so a predicate means
on Spark exactly what it means embedded (NULLs, NaN, casts, LIKE escapes); no SQL is translated to another dialect. The
task that matched a file's rows also writes the file's position delete file,
its row of the index segment and, for an update, the new images as data
files, all in one Spark job (:mod:`lineage.writes.spark_onepass`): what
reaches the driver is one summary per data file touched and the written
files' descriptors (row ids and versions as runs), never a row per matched
image. The write loop commits, as for every other write.

Both are merge-on-read only (copy-on-write would rewrite the kept rows in
the driver), and an update may not set a key column of a table whose key is
enforced (the check of the new keys against the live ones is the embedded
path's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression

from index.key_index import KeyIndexChange, index_enabled
import lineage.spark as spark_io
import lineage.spark_match as spark_match
from lineage.iceberg.schema import projection_field_ids, relaxed_type
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, LINEAGE_SCHEMA
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError
from lineage.properties import MERGE_ON_READ, capture_preimages
from lineage.sql.predicate import parse_predicate, prunable_columns, quote_ident
from lineage.state import TableState
from lineage.writes.capture import old_values
from lineage.writes.loop import run_write
from lineage.writes.plan import CommitInfo, Plan
from lineage.writes.spark_onepass import remove_in_one_pass
from lineage.writes.spark_removed import KEY_PREFIX, RemovedOnSpark
from lineage.writes.update import checked_set

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

# What identifies a removed image in a Spark row of live_rows: its file's local path, position and lineage.
_POINTER = "__path, __pos, _row_id, _row_created_at_version, _row_last_updated_at_version"


def delete(table: TableContext, where: str | BooleanExpression, mode: str, spark: Any) -> CommitInfo:
    """Delete the live rows matching ``where`` with Spark executors (merge-on-read)."""
    _merge_on_read_only(mode, "delete")
    schema = table.arrow_schema
    pred = parse_predicate(where, pa.schema(list(schema) + LINEAGE_SCHEMA), prunable_columns(schema))

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        files = state.live_files(pred.prune)
        key = table.key if index_enabled(state.iceberg) else []
        capture = capture_preimages(state.iceberg.metadata.properties)
        select = f"{_POINTER}{_old_keys(key)}{old_values(schema) if capture else ''}"
        out = pa.schema(_pointer_fields() + _old_key_fields(schema, key) + _old_fields(schema, capture))
        removed, _ = remove_in_one_pass(spark, table, state, files, _match_pass(state, pred, select, out), key, capture)
        return _plan("delete", removed, key, deleted=removed.images)

    return run_write(table, plan, mode=MERGE_ON_READ)


def update(table: TableContext, where: str | BooleanExpression | None, set_: Mapping[str, str], mode: str, spark: Any, enforce_key: bool) -> CommitInfo:
    """Set columns of the rows matching ``where`` with Spark executors (merge-on-read)."""
    _merge_on_read_only(mode, "update")
    schema = table.arrow_schema
    pred, select = checked_set(schema, where, set_)
    if enforce_key and any(k in set_ for k in table.key):
        raise InvalidArgumentError(
            f"an update on Spark may not set a key column ({[k for k in table.key if k in set_]}) of {table.name}: "
            "run it without engine='spark' (the embedded engine checks the new keys)"
        )

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        files = state.live_files(pred.prune)
        key = table.key if index_enabled(state.iceberg) else []
        capture = capture_preimages(state.iceberg.metadata.properties)
        images_sql = f"{select}, _row_id AS {HIDDEN_ROW_ID}, _row_created_at_version AS {HIDDEN_CREATED}, {_POINTER}{_old_keys(key)}{old_values(schema) if capture else ''}"
        out_schema = pa.schema(
            # nullable at every depth: a null where the table requires a value is refused by conform, which names it
            [f.with_type(relaxed_type(f.type)).with_nullable(True) for f in schema]
            + [pa.field(HIDDEN_ROW_ID, pa.int64()), pa.field(HIDDEN_CREATED, pa.int64())]
            + _pointer_fields()
            + _old_key_fields(schema, key)
            + _old_fields(schema, capture)
        )
        removed, written = remove_in_one_pass(spark, table, state, files, _match_pass(state, pred, images_sql, out_schema), key, capture,
                                              images=[*schema.names, HIDDEN_ROW_ID, HIDDEN_CREATED])
        return _plan("update", removed, key, prewritten=written, updated=removed.images)

    return run_write(table, plan, mode=MERGE_ON_READ)


def _match_pass(state: TableState, pred: Any, select: str, out: pa.Schema) -> spark_match.MatchPass:
    """The predicate pass of ``pred`` selecting ``select`` (a schema of ``out``) over the table at ``state``."""
    return spark_match.match_pass(spark_io.arrow_schema_of(state), projection_field_ids(state.iceberg.metadata), pred, select, out)


def _plan(operation: str, removed: RemovedOnSpark, key: list[str], **counts: Any) -> Plan:
    """The write loop's plan for images executors removed (delete files and index segment already written)."""
    change = KeyIndexChange.of_removal(removed.removed_keys, rewritten=operation == "update") if key else None
    return Plan(operation, prewritten_deletes=removed.delete_files, prewritten_index=removed.index, prewritten_replaced=removed.replaced,
                key_index=change, **counts)


def _old_keys(key: list[str]) -> str:
    """The SELECT-list tail naming the removed images' key values as :func:`lineage.writes.spark_removed.write_removed` wants them."""
    return "".join(f", {quote_ident(k)} AS {quote_ident(f'{KEY_PREFIX}{i}')}" for i, k in enumerate(key))


def _old_key_fields(schema: pa.Schema, key: list[str]) -> list[pa.Field]:
    return [pa.field(f"{KEY_PREFIX}{i}", schema.field(k).type) for i, k in enumerate(key)]


def _merge_on_read_only(mode: str, what: str) -> None:
    if mode != MERGE_ON_READ:
        raise InvalidArgumentError(f"{what} on Spark is merge-on-read only; pass mode='merge-on-read' (or run it without engine='spark')")


def _pointer_fields() -> list[pa.Field]:
    return [pa.field("__path", pa.string()), pa.field("__pos", pa.int64())] + [pa.field(f.name, pa.int64()) for f in LINEAGE_SCHEMA]


def _old_fields(schema: pa.Schema, capture: bool) -> list[pa.Field]:
    return [pa.field(f"__old_{i}", f.type) for i, f in enumerate(schema)] if capture else []
