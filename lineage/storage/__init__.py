"""Where a table's files live: the local file system or an S3-compatible object store.

:mod:`lineage.storage.settings` resolves an object store's settings (the
catalog's ``s3.*`` properties, then the standard AWS environment and
profile); :mod:`lineage.storage.files` reads, lists and deletes files
through pyarrow's file systems; :mod:`lineage.storage.duckdb_s3` gives
DuckDB the same settings (``httpfs`` and an S3 secret);
:mod:`lineage.storage.spark_read` reads files on Spark's Python workers.
"""

from __future__ import annotations

from lineage.storage.files import is_remote, register, registered
from lineage.storage.settings import StoreSettings

__all__ = ["StoreSettings", "is_remote", "register", "registered"]
