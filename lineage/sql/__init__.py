"""The SQL expression layer: user predicates and expressions, their checks and file pruning.

DuckDB connections come from :mod:`lineage.duck` (a documented module path).
"""
