"""The write machinery behind :class:`lineage.Table`'s write methods.

- :mod:`~lineage.writes.loop`: the plan/write/commit loop (retried after a lost
  commit race), :class:`~lineage.writes.loop.Plan` and :class:`~lineage.writes.loop.CommitInfo`;
- :mod:`~lineage.writes.rows`: removed images by file, kept rows of copy-on-write, new row images;
- :mod:`~lineage.writes.checks`: update expressions against column types, user commit properties;
- :mod:`~lineage.writes.keyed`: key lookups of keyed writes through the key index;
- (the table properties writes read are in :mod:`lineage.properties`);
- :mod:`~lineage.writes.spark`: appends and upserts of Spark DataFrames;
- :mod:`~lineage.writes.changelog`: change-stream ingest (Flink RowKind / Debezium batches), with the collapse
  of a batch into net effects (:mod:`~lineage.writes.changelog_sql`), the key lookup (:mod:`~lineage.writes.keys`)
  and exactly-once stream positions (:mod:`~lineage.writes.stream_position`).

New write paths (change streams, reconciliation of foreign commits) belong here.
Modules of this package never import :mod:`lineage.table` at run time: the
table is passed in, so imports go one way (``lineage.table`` -> ``lineage.writes``).
"""

from lineage.writes.loop import CommitInfo, Plan, run_write

__all__ = ["CommitInfo", "Plan", "run_write"]
