"""The change data feed of lineage tables: ``changes``, ``change_batches``, ``follow``, ``deleted_rows``, ``decode_change_columns`` and views."""

from cdf.api import change_batches, changes, deleted_rows
from cdf.follow import ChangeRange, follow
from cdf.output import decode_change_columns
from cdf.views import register

__all__ = ["ChangeRange", "change_batches", "changes", "decode_change_columns", "deleted_rows", "follow", "register"]
