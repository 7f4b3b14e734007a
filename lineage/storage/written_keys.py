"""Key columns of the data files this process wrote, kept in memory (bounded) for the key index.

The key index takes its entries from the key columns of a commit's new data
files, and a build takes them from every live file. A bulk append that leaves
the index to its first keyed use (:func:`index.key_index.defers_build`) would
otherwise have that first write read the key column back from the store (on
an object store: a footer and a column chunk request of a large file). Data
files are written once under fresh names, so a column kept here cannot go
stale. Columns of at most :data:`MAX_FILE_BYTES` are kept, :data:`BUDGET`
bytes in all, least recently used dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

BUDGET = 64 << 20  # bytes of key columns kept (as Arrow buffers: a slice counts its whole buffer)
MAX_FILE_BYTES = 16 << 20  # a larger file's keys are not kept (read back when needed)

_LOCK = threading.Lock()
_KEPT: OrderedDict[str, pa.Table] = OrderedDict()
_held = 0


def remember(path: str, keys: pa.Table) -> None:
    """Keep ``keys`` (key columns, by name) of the data file this process just wrote at ``path``, if they fit."""
    global _held
    size = keys.get_total_buffer_size()
    if size > MAX_FILE_BYTES:
        return
    with _LOCK:
        old = _KEPT.pop(path, None)
        _held += size - (old.get_total_buffer_size() if old is not None else 0)
        _KEPT[path] = keys
        while _held > BUDGET:
            _, dropped = _KEPT.popitem(last=False)
            _held -= dropped.get_total_buffer_size()


def known(path: str, names: list[str]) -> pa.Table | None:
    """The key columns ``names`` of the data file at ``path`` when kept here, else None."""
    with _LOCK:
        keys = _KEPT.get(path)
        if keys is not None:
            _KEPT.move_to_end(path)
    if keys is None or not set(names) <= set(keys.column_names):
        return None
    return keys.select(names)


def forget() -> None:
    """Drop every kept column (a benchmark measuring a fresh process calls it)."""
    global _held
    with _LOCK:
        _KEPT.clear()
        _held = 0
