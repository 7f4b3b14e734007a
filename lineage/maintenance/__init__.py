"""Table maintenance that keeps row lineage and the change feed intact."""

from lineage.maintenance._common import MaintenanceResult
from lineage.maintenance.compaction import compact, rewrite_deletes
from lineage.maintenance.key_index import merge_key_index, reindex
from lineage.maintenance.purge import purge
from lineage.maintenance.rehome import rehome
from lineage.maintenance.upgrade import upgrade
from lineage.maintenance.upkeep import MaintenanceReport, expire_log, maintain, rewrite_manifests
from lineage.maintenance.vacuum import expire_snapshots, referenced_files, vacuum
from lineage.maintenance.verify import VerifyReport, verify

__all__ = [
    "MaintenanceReport", "MaintenanceResult", "VerifyReport", "compact", "expire_log", "expire_snapshots", "maintain", "merge_key_index",
    "purge", "referenced_files", "rehome", "reindex", "rewrite_deletes", "rewrite_manifests", "upgrade", "vacuum", "verify",
]
