"""The commit protocol: one Iceberg snapshot carrying data, deletes and lineage, and merging small metadata on commit.

See docs/design.md ("Commit protocol"). The outcome of a catalog call is settled by :mod:`lineage.outcome`
(a documented module path).
"""
