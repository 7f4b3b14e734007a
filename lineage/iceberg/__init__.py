"""Iceberg glue: Arrow/Iceberg schemas, planning a snapshot from its manifests, resolving equality deletes.

(Catalogs are :mod:`lineage.catalog`, a documented module path.)
"""
