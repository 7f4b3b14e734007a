"""The change feed in a Spark session: the views ``<table>$changes`` and ``<table>$deleted_rows``, and the streaming source.

``register(spark, table)`` creates two temporary views, planned from the
table's metadata at registration time and evaluated by executors when queried:

* ```orders$changes``` — the per-version change feed over the whole retention
  window. Per-version changes of a sub-range are exactly its rows with
  ``_commit_version`` in the sub-range, so SQL users filter on it::

      SELECT * FROM `orders$changes` WHERE _commit_version > 3 AND _commit_version <= 7

* ```orders$deleted_rows``` — rows deleted within the retention window.

Net changes (not decomposable by version) come from the Python call
``cdf.changes(table, a, b, net=True, engine="spark", spark=spark)``.
Re-register after new commits to see them.

``register_source(spark)`` registers the Structured Streaming source
``lineage_changes`` (:mod:`cdf.spark_source`), which follows the feed as
commits land.
"""

from __future__ import annotations

import uuid
from typing import Any

import cdf.api as api
from cdf.retention import window
from lineage.errors import InvalidArgumentError
from lineage.table import Table


def register(spark: Any, table: Table, name: str | None = None) -> str:
    """Create the temp views ``<name>$changes`` and ``<name>$deleted_rows``; returns ``name``."""
    if not isinstance(table, Table):
        raise InvalidArgumentError(f"table must be a lineage.Table, got {type(table).__name__}")
    name = name or table.name.split(".")[-1]
    if not name or "`" in name:
        raise InvalidArgumentError(f"view name {name!r} must be non-empty and contain no backtick")
    oldest = window(table.state()).oldest
    views = {
        "changes": api.changes(table, oldest, engine="spark", spark=spark),
        "deleted_rows": api.deleted_rows(table, oldest, engine="spark", spark=spark),
    }
    for suffix, df in views.items():
        # DataFrame.createOrReplaceTempView rejects '$' in names; SQL accepts it quoted.
        hidden = f"__lineage_{suffix}_{uuid.uuid4().hex[:12]}"
        df.createOrReplaceTempView(hidden)
        spark.sql(f"CREATE OR REPLACE TEMP VIEW `{name}${suffix}` AS SELECT * FROM {hidden}")
    return name


def register_source(spark: Any) -> str:
    """Register the Structured Streaming source of the change feed in ``spark``; returns its format, ``lineage_changes``.

    Then ``spark.readStream.format("lineage_changes").option("table", ...)``
    (:mod:`cdf.spark_source` has the options and the delivery contract).
    Spark's Python workers must import this package, as for Spark feeds.
    """
    from cdf.spark_source import ChangeFeedSource

    spark.dataSource.register(ChangeFeedSource)
    return ChangeFeedSource.name()
