"""The write machinery behind :class:`lineage.Table`'s write methods.

- :mod:`~lineage.writes.loop`: the plan/write/commit loop (retried after a lost commit race);
- :mod:`~lineage.writes.plan`: what a write plans (:class:`~lineage.writes.plan.Plan`) and returns
  (:class:`~lineage.writes.plan.CommitInfo`);
- :mod:`~lineage.writes.merge_plan` and :mod:`~lineage.writes.update`: the plans of ``merge``/``upsert`` and ``update``;
- :mod:`~lineage.writes.rows`: removed images by file, kept rows of copy-on-write, new row images;
- :mod:`~lineage.writes.checks`: update expressions against column types, user commit properties;
- :mod:`~lineage.writes.key_checks`: the key checks and upsert matching of keyed writes, through the key index;
- :mod:`~lineage.writes.spark`: appends and upserts of Spark DataFrames;
- :mod:`~lineage.writes.changelog`: change-stream ingest (Flink RowKind / Debezium batches), with the batch checks
  (:mod:`~lineage.writes.changelog_batch`), the collapse of a batch into net effects
  (:mod:`~lineage.writes.changelog_sql`), the live images of given keys (:mod:`~lineage.writes.live_images`)
  and exactly-once stream positions (:mod:`~lineage.writes.stream_position`).

Every function here takes a :class:`lineage.context.TableContext`, never :class:`lineage.Table`, so imports
go one way (``lineage.table`` -> ``lineage.writes``); the table properties writes read are defined in
:mod:`lineage.properties`.
"""

from lineage.writes.loop import run_write
from lineage.writes.plan import CommitInfo, Plan

__all__ = ["CommitInfo", "Plan", "run_write"]
