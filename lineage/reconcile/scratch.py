"""A process-private place for the lineage a reader derives for foreign snapshots.

Reads never write under the table's location (a reader may have no write
permission there): the files reconciling a foreign snapshot writes
(lineage segment, deleted-rows index, key-index change, commit log chunks,
resolved deletes, the list) go to a temporary directory of this process,
removed at exit. It mirrors the table's layout: the scratch copy of a file is
``<scratch root>/<table uuid>/<path under the table location>``, with the
same deterministic name the persisted file has, so a path is moved between
the two by swapping the prefix (:func:`persisted_path`). The files stay
readable for the life of the process, by DuckDB and by Spark's local workers.

A writer persists the lineage under the table's location before it commits
on top of a foreign snapshot (:func:`lineage.reconcile.foreign_list` with
``persist=True``), so a committed list never names a scratch path.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

from pyiceberg.table import Table as IcebergTable

_ROOTS: dict[int, str] = {}  # by process id: a forked child makes its own
_LOCK = threading.Lock()


def _remove(root: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child must not remove its parent's files
        shutil.rmtree(root, ignore_errors=True)


def scratch_root() -> str:
    """The process's scratch directory (created on first use, removed at exit)."""
    pid = os.getpid()
    with _LOCK:
        root = _ROOTS.get(pid)
        if root is None:
            root = tempfile.mkdtemp(prefix="lineage-reconciled-")
            atexit.register(_remove, root, pid)
            _ROOTS[pid] = root
        return root


def scratch_location(iceberg: IcebergTable) -> str:
    """Where this process keeps the reconciled lineage of ``iceberg`` (its stand-in table location)."""
    return f"{scratch_root()}/{iceberg.metadata.table_uuid.hex}"


def scratch_view(iceberg: IcebergTable) -> IcebergTable:
    """``iceberg`` with its location moved to the scratch directory: lineage derived through it lands there.

    Snapshots, manifests and data files are the table's own (absolute paths);
    only the folders lineage files are written to change.
    """
    metadata = iceberg.metadata.model_copy(update={"location": scratch_location(iceberg)})
    return IcebergTable(iceberg._identifier, metadata, iceberg.metadata_location, iceberg.io, iceberg.catalog)


def is_scratch(path: str) -> bool:
    """Whether ``path`` is a file of this process's scratch directory."""
    root = _ROOTS.get(os.getpid())
    return root is not None and path.startswith(root + "/")


def persisted_path(iceberg: IcebergTable, path: str) -> str:
    """The path under the table's location of the scratch file ``path`` (other paths unchanged)."""
    prefix = scratch_location(iceberg) + "/"
    if not path.startswith(prefix):
        return path
    return f"{iceberg.metadata.location.rstrip('/')}/{path[len(prefix):]}"
