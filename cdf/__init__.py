"""The change data feed of lineage tables: ``changes``, ``deleted_rows`` and views."""

from cdf.api import changes, deleted_rows
from cdf.views import register

__all__ = ["changes", "deleted_rows", "register"]
