"""Change-stream ingest: apply a batch of Flink RowKind or Debezium events in one commit.

A batch holds one event per row: the row's image plus an operation code in
``op_column`` (Flink ``+I``, ``-U``, ``+U``, ``-D`` or their ``RowKind`` names;
Debezium ``c``, ``u``, ``d``, ``r``). Events apply in batch order; the commit
holds each key's **net** effect (docs/design.md, "Change streams"):

* live before and after the batch: an update that keeps ``_row_id`` and
  created version (also ``-U`` then an equal ``+U``, or ``-D`` then ``+I``);
* absent before, live after: an insert with a fresh row id;
* live before, absent after: a delete;
* absent before and after (``+I`` then ``-D``): nothing.

Strict mode (default) refuses, with :class:`KeyViolationError` and nothing
written, a batch in which ``+I`` or ``+U`` adds a live key, ``-U``, ``-D`` or
``u`` touches an absent key, or ``-U`` carries an image other than the key's
live row (the table's row for the key's first event, the batch's afterwards).
Upsert mode lets ``+I``/``+U`` of a live key update it and ignores ``-U``/``-D``
of an absent key (counted in ``CommitInfo.ignored``).

How the net effects become files is a *strategy*, chosen per table with the
property ``write.changelog.strategy``: ``position`` (default) resolves keys
to live images at write time (through the key index, see
:mod:`lineage.writes.live_images`) and writes position deletes plus new images; the
commit keeps the key index (a delta segment with the batch's removed keys and
new images), as :meth:`lineage.Table.upsert` does. ``equality`` commits like
Flink's Iceberg sink, with equality deletes and no key lookup (upsert mode
only; see :mod:`lineage.writes.changelog_equality`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from index.key_index import KeyIndex, KeyIndexChange
import lineage.duck as duck
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError, KeyViolationError
from lineage.sql.predicate import quote_ident
from lineage.iceberg.schema import to_arrow_table
from lineage.spark import is_spark_dataframe
from lineage.state import LiveFile, TableState
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID
from lineage.writes.checks import check_user_properties
from lineage.writes.loop import run_write
from lineage.writes.plan import CommitInfo, Plan
from lineage.writes.key_checks import select_list
from lineage.writes.rows import REMOVED_COLS, conform_images
from lineage.writes.changelog_batch import (  # noqa: F401  (prepare_batch: re-exported for callers of this module)
    DEFAULT_STRATEGY,
    EQUALITY_STRATEGY,
    OPERATION,
    PROP_STRATEGY,
    ChangelogBatch,
    check_problems,
    order_columns,
    prepare_batch,
)
import lineage.writes.changelog_arrow as changelog_arrow
from lineage.writes.changelog_equality import apply_equality_changelog
from lineage.writes.changelog_spark import apply_spark_changelog
from lineage.writes.changelog_sql import Relations, net_effects_sql
from lineage.writes.live_images import live_images_for_keys
from lineage.writes.stream_position import StreamPosition, position_properties

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


class ChangelogStrategy(Protocol):
    """Turns a batch's events into a write plan against one table state."""

    name: str

    def plan(self, table: TableContext, batch: ChangelogBatch, upsert: bool, state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        """The plan of the batch's net effects (raises KeyViolationError in strict mode)."""
        ...


STRATEGIES: dict[str, ChangelogStrategy] = {}


def register_strategy(strategy: ChangelogStrategy) -> None:
    """Make a strategy selectable with the table property ``write.changelog.strategy``."""
    STRATEGIES[strategy.name] = strategy


def strategy_of(table: TableContext) -> ChangelogStrategy:
    """The table's changelog strategy (property ``write.changelog.strategy``, default ``position``)."""
    name = table.properties.get(PROP_STRATEGY, DEFAULT_STRATEGY)
    try:
        return STRATEGIES[name]
    except KeyError:
        raise InvalidArgumentError(
            f"table property {PROP_STRATEGY} must be one of {sorted([*STRATEGIES, EQUALITY_STRATEGY])}, got {name!r}"
        ) from None


def uses_equality_strategy(table: TableContext) -> bool:
    """Whether the table's change streams commit with equality deletes (``write.changelog.strategy = equality``)."""
    return table.properties.get(PROP_STRATEGY, DEFAULT_STRATEGY) == EQUALITY_STRATEGY


# ---------------------------------------------------------------- entry point


def apply_changelog(
    table: TableContext,
    data: object,
    *,
    op_column: str = "_op",
    upsert: bool = False,
    order_by: str | Sequence[str] | None = None,
    mode: str,
    properties: Mapping[str, str] | None = None,
    expected_version: int | None = None,
    stream: tuple[str, int] | None = None,
) -> CommitInfo:
    """Apply a batch of change events in one commit; see :meth:`lineage.Table.apply_changelog`.

    ``mode`` is the resolved write mode (merge-on-read or copy-on-write).
    """
    key = table.key
    if not key:
        raise KeyViolationError(f"table {table.name} has no key; change streams apply by key: create the table with key=[...]")
    if not isinstance(upsert, bool):
        raise InvalidArgumentError(f"upsert must be True or False, got {upsert!r}")
    extra = check_user_properties(properties)
    position = StreamPosition.parse(stream) if stream is not None else None
    if position is not None:
        clash = sorted(set(extra) & set(position_properties(position)))
        if clash:
            raise InvalidArgumentError(f"properties {clash} are set by stream=; do not pass them yourself")
        extra.update(position_properties(position))
    equality = uses_equality_strategy(table)
    strategy = None if equality else strategy_of(table)
    if is_spark_dataframe(data) and equality:
        if not order_columns(order_by):
            raise InvalidArgumentError(
                "a Spark DataFrame has no row order: pass order_by= with the column(s) that order each key's events "
                "(e.g. a Kafka offset, a Debezium LSN or a sequence number)"
            )
        data = data.toArrow()  # the equality strategy writes from the driver: the batch is collected once
    if is_spark_dataframe(data):
        return apply_spark_changelog(
            table, data, op_column=op_column, upsert=upsert, order_by=order_by, mode=mode, properties=extra,
            expected_version=expected_version, position=position,
        )
    batch = prepare_batch(table, to_arrow_table(data), op_column, order_by)
    if equality:
        return apply_equality_changelog(table, batch, upsert=upsert, properties=extra, expected_version=expected_version, position=position)
    assert strategy is not None

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        if position is not None and position.applied_in(state):
            return Plan(OPERATION)  # a replayed batch: nothing to do
        out = strategy.plan(table, batch, upsert, state, con)
        out.properties = dict(extra)
        return out

    return run_write(table, plan, mode=mode, expected_version=expected_version)


# ---------------------------------------------------------------- the position strategy


@dataclass(frozen=True)
class PositionDeletes:
    """Resolve keys to live images at write time; removed images become position deletes (or rewrites)."""

    name: str = "position"

    def plan(self, table: TableContext, batch: ChangelogBatch, upsert: bool, state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        """Validate the batch against ``state`` and plan its net effects."""
        key = list(batch.key)
        check_images = not upsert and batch.has_before_images
        index = KeyIndex.open(state)
        if changelog_arrow.applies(batch):  # the common batch: planned in Arrow (a batch with problems is reported below)
            groups = changelog_arrow.EventGroups.of(batch)
            live = live_images_for_keys(state, con, groups.keys_table(batch), key, values=check_images, index=index)
            net = changelog_arrow.collapse(batch, groups, live.images, upsert, check_images)
            if net is not None:
                return self._planned(table, live.files, net.removed, net.images, net.inserts, net.ignored, key, index)
        con.register("events", batch.events)
        keys = ", ".join(quote_ident(k) for k in key)
        con.execute(f"CREATE OR REPLACE TEMP TABLE __keys AS SELECT DISTINCT {keys} FROM events")
        live = live_images_for_keys(state, con, "__keys", key, values=check_images, index=index)
        con.register("start", live.images)
        rel = Relations(key, batch.columns, batch.order, ("__file_id", "__pos"), quote_ident)
        ignored = check_problems(con, rel, batch, upsert, check_images)
        con.execute(f"CREATE OR REPLACE TEMP TABLE __net AS {net_effects_sql(rel)}")
        cols = ", ".join(quote_ident(c) for c in batch.columns)
        removed = duck.fetch_arrow(con, f"SELECT {REMOVED_COLS}{select_list(key)} FROM __net WHERE __start_live")
        images = duck.fetch_arrow(
            con, f"SELECT {cols}, _row_id AS {HIDDEN_ROW_ID}, _row_created_at_version AS {HIDDEN_CREATED} FROM __net WHERE __start_live AND __end_live"
        )
        inserts = duck.fetch_arrow(con, f"SELECT {cols} FROM __net WHERE NOT __start_live AND __end_live")
        return self._planned(table, live.files, removed, images, inserts, ignored, key, index)

    @staticmethod
    def _planned(table: TableContext, files: list[LiveFile], removed: pa.Table, images: pa.Table, inserts: pa.Table, ignored: int,
                 key: list[str], index: KeyIndex | None) -> Plan:
        """The plan of a batch's net effects: removed images (with their keys), new images, inserts."""
        change = KeyIndexChange(removed_keys=removed.select(key), index=index) if index is not None else None
        removed = removed.select(REMOVED_COLS.split(", "))
        images = conform_images(images, table.iceberg.schema(), key, "upsert")
        inserts = inserts.cast(table.arrow_schema)
        updated = images.num_rows
        return Plan(
            OPERATION, files=files, removed=removed, new_images=images, inserts=inserts,
            inserted=inserts.num_rows, updated=updated, deleted=removed.num_rows - updated, ignored=ignored, key_index=change,
        )


register_strategy(PositionDeletes())
