"""Materialized views over one lineage table, refreshed incrementally from its change feed.

A view is defined by a query over one source table (see :mod:`cdf.mv.query`
for the two supported shapes) and stored in a lineage table of its own, so it
has row lineage and a change feed too (views can be chained)::

    import cdf.mv
    v = cdf.mv.create("shop.totals", orders,
                      "SELECT region, SUM(amount) AS total, COUNT(*) AS n, MAX(amount) AS top FROM orders GROUP BY region")
    v.refresh()                     # applies the source's net change feed since the view's checkpoint
    v.scan()                        # the query's columns only

**Storage.** Projection views keep one row per qualifying source row, keyed by
``_src_row_id`` (the source ``_row_id``). Aggregate views keep one row per
group, keyed by ``_mv_key`` (canonical text of the group key values, so null
and floating-point keys work), with ``_mv_rows`` (the group's COUNT(*)) and
helper columns ``_mv_nn_<col>`` (non-null count of a SUM/AVG argument) and
``_mv_sum_<col>`` (AVG's running sum). The definition is stored in the view
table's properties (``mv.definition``, ``mv.query``, ``mv.source``, ...).

**Refresh.** The source's net feed ``(checkpoint, current]`` is read (DuckDB or
Spark), turned into a delta by the same engine (projection: upserts and
deletes by source row id; aggregates: per-group signed sums and counts, plus
the smallest/largest removed and added MIN/MAX arguments) and applied to the
view in ONE :meth:`lineage.Table.merge` whose commit carries
``mv.source-version``. Groups whose MIN/MAX became undecidable (the removed
value was the extreme and no added value beats it) are recomputed from the
source at the new version; groups whose COUNT(*) drops to 0 are deleted.

**Exactly once.** The checkpoint is the ``mv.source-version`` of the view's own
last commit, so data and checkpoint land together or not at all: a crash
anywhere before the commit leaves the old view and the old checkpoint, and
the next refresh redoes the work. A refresh plans against the view version it
read; its merge is guarded so that any attempt (including the merge's own
re-plan after a lost commit race) that finds the view at another version
aborts without writing. The loser of a race then reports ``status="concurrent"``.
A refresh whose delta is empty writes no snapshot; it records
``mv.idle-checkpoint`` (bound to the view's current snapshot id) in the view
table's properties, so the next refresh starts from the newer source version.

Layout: :mod:`~cdf.mv.query` (parsing and validating the view query),
:mod:`~cdf.mv.stored` (checking a stored definition whole when a view is opened),
:mod:`~cdf.mv.sql` (SQL builders), :mod:`~cdf.mv.engines` (DuckDB and Spark
evaluation), :mod:`~cdf.mv.view` (:class:`MaterializedView`, checkpoints,
refresh), :mod:`~cdf.mv.api` (``create``/``open_view``/``refresh``) and
:mod:`~cdf.mv.cli` (``python -m cdf.mv``). Tests inject faults through
``cdf.mv.view._FAULT_HOOK``.
"""

from cdf.mv.api import ViewNotFoundError, create, open_view, refresh, spark_refresh_job
from cdf.mv.cli import main
from cdf.mv.query import ViewQueryError
from cdf.mv.view import MaterializedView, RefreshResult

__all__ = [
    "MaterializedView",
    "RefreshResult",
    "ViewNotFoundError",
    "ViewQueryError",
    "create",
    "main",
    "open_view",
    "refresh",
    "spark_refresh_job",
]
