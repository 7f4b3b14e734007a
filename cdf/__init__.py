"""The change data feed of lineage tables: ``changes``, ``change_batches``, ``deleted_rows`` and views."""

from cdf.api import change_batches, changes, deleted_rows
from cdf.views import register

__all__ = ["change_batches", "changes", "deleted_rows", "register"]
