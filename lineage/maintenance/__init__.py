"""Table maintenance that keeps row lineage and the change feed intact."""

from lineage.maintenance._common import MaintenanceResult
from lineage.maintenance.compaction import compact, rewrite_deletes

__all__ = ["MaintenanceResult", "compact", "rewrite_deletes"]
