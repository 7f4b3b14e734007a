"""Where a table's files live and how they are laid out.

The on-disk format: lineage segments and lists, the commit log, delete and data files, run-length encoding,
file I/O (see docs/design.md, "On-disk formats"). And the object store: :mod:`lineage.storage.settings`
resolves an S3-compatible store's settings (the catalog's ``s3.*`` properties, then the standard AWS
environment and profile); :mod:`lineage.storage.files` reads, lists, writes and deletes files through
pyarrow's file systems, local or remote (an object's reads through :mod:`lineage.storage.s3_reader` and
:mod:`lineage.storage.s3_get`: no HEAD request); :mod:`lineage.storage.puts` sends a commit's new objects
at once and :mod:`lineage.storage.objects` keeps the small ones in memory; :mod:`lineage.storage.prefetch`
fetches a scan's small files at once; :mod:`lineage.storage.removals` removes expired metadata files in
batches after commits; :mod:`lineage.storage.store_fileio` is pyiceberg's FileIO with
those file systems; :mod:`lineage.storage.duckdb_s3` gives DuckDB the same settings (``httpfs`` and an S3
secret); :mod:`lineage.storage.spark_read` reads files on Spark's Python workers.
"""
