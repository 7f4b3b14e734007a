"""A change-stream batch: its validation and the shape every strategy reads (:mod:`lineage.writes.changelog`).

The checks here are shared by the position strategy
(:mod:`lineage.writes.changelog`), the Spark path
(:mod:`lineage.writes.changelog_spark`) and the equality strategy
(:mod:`lineage.writes.changelog_equality`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lineage.duck as duck
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError, KeyViolationError, SchemaMismatchError, UnknownColumnError
from lineage.sql.predicate import quote_ident
from lineage.properties import CHANGELOG_STRATEGY, registry
from lineage.iceberg.schema import conform
from lineage.writes.changelog_sql import OP_LABELS, OP_VERBS, OPS, POSITIVE, PROBLEMS, UPDATE_BEFORE, Relations, problems_sql

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

PROP_STRATEGY = CHANGELOG_STRATEGY
DEFAULT_STRATEGY = registry[CHANGELOG_STRATEGY].default
EQUALITY_STRATEGY = "equality"  # commits by itself, without the write loop: lineage.writes.changelog_equality
OPERATION = "changelog"
SEQ = "__seq"  # batch position when no order_by is given


@dataclass(frozen=True)
class ChangelogBatch:
    """A validated batch: data columns cast to the table's types, ``__op`` codes and the ordering columns."""

    events: pa.Table
    key: tuple[str, ...]
    columns: tuple[str, ...]  # the table's data columns
    order: tuple[str, ...]  # ascending = batch order
    explicit_order: bool  # order came from the caller (ties must be checked)

    @property
    def has_before_images(self) -> bool:
        """Whether any event is a ``-U`` (whose image strict mode checks)."""
        return bool(pc.any(pc.equal(self.events.column("__op"), UPDATE_BEFORE)).as_py())


# ---------------------------------------------------------------- batch preparation


def order_columns(order_by: str | Sequence[str] | None) -> tuple[str, ...]:
    """``order_by`` as a tuple of column names (empty when not given)."""
    if order_by is None:
        return ()
    names = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgumentError(f"order_by must be a column name or a list of column names, got {order_by!r}")
    reserved = [n for n in names if n.startswith("__")]
    if reserved:
        raise InvalidArgumentError(f"order_by column names starting with '__' are reserved: {reserved}")
    return names


def check_batch_columns(table: TableContext, names: Sequence[str], op_column: str, order: Sequence[str]) -> None:
    """The batch must have the op column and order columns, and nothing the table does not know."""
    if not isinstance(op_column, str) or not op_column:
        raise InvalidArgumentError(f"op_column must be a column name, got {op_column!r}")
    table_cols = table.arrow_schema.names
    if op_column in table_cols:
        raise InvalidArgumentError(f"op_column {op_column!r} is a column of the table; the operation needs a column of its own")
    if op_column not in names:
        raise UnknownColumnError(
            f"the batch has no operation column {op_column!r} (its columns: {list(names)}); name it with op_column="
        )
    missing = [c for c in order if c not in names]
    if missing:
        raise UnknownColumnError(f"order_by column(s) {missing} are not in the batch (its columns: {list(names)})")
    unknown = [c for c in names if c not in table_cols and c != op_column and c not in order]
    if unknown:
        raise UnknownColumnError(
            f"the batch has column(s) {unknown} that the table does not have (table columns: {table_cols}); "
            "drop them, or name an ordering column with order_by="
        )


def op_codes(ops: pa.ChunkedArray | pa.Array, op_column: str) -> pa.Array:
    """Canonical operation codes (int8) of an op column, or InvalidArgumentError naming bad values."""
    if pa.types.is_dictionary(ops.type):
        ops = ops.cast(ops.type.value_type)
    if not (pa.types.is_string(ops.type) or pa.types.is_large_string(ops.type)):
        raise SchemaMismatchError(f"operation column {op_column!r} must hold strings like '+I' or 'c', got type {ops.type}")
    idx = pc.index_in(ops, value_set=pa.array(list(OPS), ops.type))
    bad = pc.is_null(idx)
    if pc.any(bad).as_py():
        rows = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
        values = sorted({repr(v) for v in pc.filter(ops, bad).to_pylist()})[:5]
        raise InvalidArgumentError(
            f"operation column {op_column!r} has {len(rows)} value(s) that are no change operation, e.g. {', '.join(values)} "
            f"(first at row {int(rows[0])}); allowed: +I, -U, +U, -D (or INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE) "
            "and Debezium's c, u, d, r"
        )
    codes = pa.array(list(OPS.values()), pa.int8())
    out = pc.take(codes, idx)
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def relaxed_schema(table: TableContext) -> Any:
    """The table's Iceberg schema with every non-key column optional (delete events may carry only the key)."""
    from pyiceberg.schema import Schema

    schema = table.iceberg.schema()
    key_ids = set(schema.identifier_field_ids)
    fields = [f if f.field_id in key_ids else f.model_copy(update={"required": False}) for f in schema.fields]
    return Schema(*fields, schema_id=schema.schema_id, identifier_field_ids=list(key_ids))


def check_required(table: TableContext, data: pa.Table, positive: pa.Array) -> None:
    """Events that make a key live must fill the table's required columns."""
    for field in table.arrow_schema:
        if field.nullable or field.name in table.key:
            continue
        nulls = pc.sum(pc.and_(positive, pc.is_null(data.column(field.name)))).as_py() or 0
        if nulls:
            raise SchemaMismatchError(
                f"column {field.name!r} is required but {nulls} insert or update event(s) leave it null"
            )


def prepare_batch(table: TableContext, raw: pa.Table, op_column: str, order_by: str | Sequence[str] | None) -> ChangelogBatch:
    """Validate a batch and bring it to the shape the collapse SQL reads."""
    order = order_columns(order_by)
    check_batch_columns(table, raw.column_names, op_column, order)
    codes = op_codes(raw.column(op_column), op_column)
    schema = table.arrow_schema
    data = conform(raw.select([c for c in raw.column_names if c in schema.names]), relaxed_schema(table), table.key)
    check_required(table, data, pc.is_in(codes, value_set=pa.array(POSITIVE, pa.int8())))
    events = data.append_column("__op", codes)
    if order:
        for c in order:
            col = raw.column(c)
            if col.null_count:
                raise InvalidArgumentError(f"order_by column {c!r} is null in {col.null_count} event(s); every event needs a position")
            if c not in schema.names:
                events = events.append_column(c, col)
    else:
        events = events.append_column(SEQ, pa.array(np.arange(raw.num_rows, dtype=np.int64)))
    return ChangelogBatch(events, tuple(table.key), tuple(schema.names), order or (SEQ,), bool(order))


def _describe(problem: dict[str, Any], key: Sequence[str], order: Sequence[str], explicit: bool) -> str:
    where = f"row {problem[SEQ]}" if not explicit else "the event at " + ", ".join(f"{c}={problem[c]!r}" for c in order)
    label = OP_LABELS[problem["__op"]]
    text = PROBLEMS[problem["__problem"]].format(key={k: problem[k] for k in key}, verb=OP_VERBS[problem["__op"]])
    return f"{where} ({label}) {text}"


def raise_problems(
    counts: Mapping[str, int], sample: Callable[[str], list[dict[str, Any]]], key: Sequence[str], order: Sequence[str], explicit: bool
) -> int:
    """Turn problem counts into the batch's error (nothing is written) or return the ignored count.

    ``sample(condition)`` returns up to three problem rows matching a SQL
    condition on ``__problem``, first in batch order (any engine).
    """
    if counts.get("tie"):
        raise InvalidArgumentError(
            f"changelog batch rejected, nothing was written: {counts['tie']} event(s) share their key and order_by values, e.g. "
            + "; ".join(_describe(p, key, order, explicit) for p in sample("__problem = 'tie'"))
            + "; order_by must put the events of each key in a strict order"
        )
    errors = {p: n for p, n in counts.items() if p != "ignored" and n}
    if errors:
        raise KeyViolationError(
            f"changelog batch rejected, nothing was written: {sum(errors.values())} event(s) do not fit the table "
            f"({', '.join(f'{n} {p}' for p, n in sorted(errors.items()))}), e.g. "
            + "; ".join(_describe(p, key, order, explicit) for p in sample("__problem <> 'ignored'"))
            + "; if the stream is an upsert stream (replays, no -U before +U), pass upsert=True"
        )
    return int(counts.get("ignored", 0))


def check_problems(con: duckdb.DuckDBPyConnection, rel: Relations, batch: ChangelogBatch, upsert: bool, check_images: bool) -> int:
    """Raise for a batch that does not fit the table (strict mode) or has ambiguous order; return the ignored count."""
    sql = problems_sql(rel, upsert=upsert, check_images=check_images, check_ties=batch.explicit_order)
    con.execute(f"CREATE OR REPLACE TEMP TABLE __problems AS SELECT * FROM ({sql}) WHERE __problem IS NOT NULL")
    counts = dict(con.execute("SELECT __problem, count(*) FROM __problems GROUP BY ALL").fetchall())
    order = ", ".join(quote_ident(c) for c in batch.order)

    def sample(condition: str) -> list[dict[str, Any]]:
        return duck.fetch_arrow(con, f"SELECT * FROM __problems WHERE {condition} ORDER BY {order} LIMIT 3").to_pylist()

    return raise_problems(counts, sample, batch.key, batch.order, batch.explicit_order)
