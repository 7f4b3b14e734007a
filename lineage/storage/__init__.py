"""The on-disk format: lineage segments and lists, the commit log, delete and data files, run-length encoding, file I/O.

See docs/design.md ("On-disk formats").
"""
