"""A Spark Structured Streaming sink that applies change streams exactly once.

Use an instance of :class:`ChangelogSink` as the ``foreachBatch`` function of
a streaming query whose micro-batches are change events::

    sink = ChangelogSink("shop.orders", warehouse="wh", order_by="offset")
    (spark.readStream...load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", "chk/orders")
        .start())

Each micro-batch becomes one ``Table.apply_changelog`` commit tagged with the
stream id and Spark's batch id. Spark calls the function again for a batch
whose completion it did not record (a crash after the commit, before Spark
wrote its commit log), and after a restart from the checkpoint it replays
that batch; the commit of a batch at or below the stream's last committed
batch id is skipped inside the write's own plan step, so a replay is a no-op
and no batch is applied twice. The check and the commit are atomic: the
Iceberg commit requires the snapshot the check read.

**The stream id.** By default it is the streaming query's id, which Spark
keeps in the checkpoint: stable across restarts from that checkpoint, new for
a new checkpoint (whose batch ids start again at 0). Pass ``stream_id`` to
name the stream yourself; then a query started from a new checkpoint must use
a new id, otherwise its first batches would be taken for replays.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from lineage.errors import InvalidArgumentError
from lineage.table import Table, open_table
from lineage.writes.plan import CommitInfo
from lineage.writes.stream_position import last_stream_batch

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's local property holding the running query's id

# Fault injection for tests: called with (stage, batch id) after each step of a micro-batch.
_FAULT_HOOK: Callable[[str, int], None] | None = None


def _fault(stage: str, batch_id: int) -> None:
    if _FAULT_HOOK is not None:
        _FAULT_HOOK(stage, batch_id)


class ChangelogSink:
    """A ``foreachBatch`` function: each micro-batch is applied with ``apply_changelog``, exactly once across restarts.

    ``table`` is a :class:`~lineage.Table` or a table name (opened with
    ``warehouse``/``catalog`` on each batch). ``order_by`` names the columns
    that order the events of a key (required: micro-batches have no row
    order); ``op_column``, ``upsert`` and ``mode`` are passed to
    :meth:`~lineage.Table.apply_changelog`. ``stream_id`` defaults to the
    streaming query's id (see the module docs).
    """

    def __init__(
        self,
        table: Table | str,
        *,
        order_by: str | Sequence[str],
        warehouse: str | os.PathLike[str] | None = None,
        catalog: Catalog | None = None,
        stream_id: str | None = None,
        op_column: str = "_op",
        upsert: bool = False,
        mode: str | None = None,
    ) -> None:
        if not order_by:
            raise InvalidArgumentError("order_by is required: micro-batches have no row order; name the column(s) that order each key's events")
        if stream_id is not None and (not isinstance(stream_id, str) or not stream_id.strip()):
            raise InvalidArgumentError(f"stream_id must be a non-empty string, got {stream_id!r}")
        self._table = table
        self._warehouse = warehouse
        self._catalog = catalog
        self.stream_id = stream_id
        self.order_by = order_by
        self.op_column = op_column
        self.upsert = upsert
        self.mode = mode
        self.last: CommitInfo | None = None  # the last micro-batch's result

    def table(self) -> Table:
        """The target table, opened (or refreshed) for this batch."""
        if isinstance(self._table, Table):
            return self._table.refresh()
        return open_table(self._table, warehouse=self._warehouse, catalog=self._catalog)

    def resolve_stream_id(self, df: Any) -> str:
        """The explicit stream id, or the running query's id (stable across restarts from its checkpoint)."""
        if self.stream_id is not None:
            return self.stream_id
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise InvalidArgumentError(
                "the streaming query's id is not visible to this foreachBatch call; pass stream_id= to ChangelogSink"
            )
        return f"spark-query-{query_id}"

    def __call__(self, df: Any, batch_id: int) -> None:
        """Apply micro-batch ``batch_id`` (a no-op when the stream committed it already)."""
        if df.isEmpty():  # nothing to apply; an empty batch leaves no trace, and a replay of it is empty again
            _fault("empty", batch_id)
            return
        table = self.table()
        sid = self.resolve_stream_id(df)
        done = last_stream_batch(table.iceberg, sid)
        if done is not None and batch_id <= done:
            # A replay found before any Spark job runs; apply_changelog would find it too, atomically.
            log.info("stream %s: batch %d is already in %s; skipped", sid, batch_id, table.name)
            _fault("skipped", batch_id)
            return
        info = table.apply_changelog(
            df, op_column=self.op_column, upsert=self.upsert, order_by=self.order_by, mode=self.mode, stream=(sid, int(batch_id))
        )
        self.last = info
        _fault("committed" if info.committed else "no-op", batch_id)
