"""Reading a table: live rows as a DuckDB view and values at (file, position).

Decoded row groups are cached by :mod:`lineage.decoded_cache` (a documented module path).
"""
