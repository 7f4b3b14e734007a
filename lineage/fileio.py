"""Small helpers to read and write whole files through a pyiceberg FileIO.

Lineage and index files go through the table's own FileIO so they live on
whatever storage the table lives on.
"""

from __future__ import annotations

import io as _io
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO


_OVERWRITE: ContextVar[bool] = ContextVar("lineage_overwrite", default=False)


@contextmanager
def overwriting() -> Iterator[None]:
    """Let :func:`write_bytes` replace existing files in this block.

    For writers whose file names are deterministic and whose content is the
    same whoever writes it (the reconciliation of a foreign snapshot), so a
    second writer, or one repairing a truncated file, writes the file again.
    """
    token = _OVERWRITE.set(True)
    try:
        yield
    finally:
        _OVERWRITE.reset(token)


def overwrite_allowed() -> bool:
    """Whether the caller is inside :func:`overwriting`."""
    return _OVERWRITE.get()


def write_bytes(fileio: FileIO, path: str, data: bytes) -> int:
    """Write ``data`` to a new file at ``path`` (it must not exist, except in :func:`overwriting`); return its size.

    A local file written again in :func:`overwriting` is replaced atomically
    (written aside, then renamed), so a concurrent reader sees the old or the
    new bytes, never a partial file.
    """
    if _OVERWRITE.get() and "://" not in path.removeprefix("file://"):
        local = local_path(path)
        if os.path.isdir(os.path.dirname(local) or "."):
            aside = f"{local}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(aside, "wb") as f:
                f.write(data)
            os.replace(aside, local)
            return len(data)
    with fileio.new_output(path).create(overwrite=_OVERWRITE.get()) as out:
        out.write(data)
    return len(data)


def read_bytes(fileio: FileIO, path: str) -> bytes:
    """Read the whole file at ``path``."""
    with fileio.new_input(path).open() as f:
        return f.read()


def write_parquet(fileio: FileIO, path: str, table: pa.Table) -> int:
    """Write an Arrow table as a zstd Parquet file; return bytes written."""
    sink = _io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return write_bytes(fileio, path, sink.getvalue())


def read_parquet(fileio: FileIO, path: str) -> pa.Table:
    """Read a Parquet file written by :func:`write_parquet`.

    Read synchronously on this thread: ``pq.read_table`` over an in-memory
    buffer hands the buffer to Arrow's async scanner, whose worker thread may
    drop the last reference (and need the GIL) while the interpreter shuts
    down, which aborts the process ("terminate called without an active
    exception").
    """
    return pq.ParquetFile(pa.BufferReader(read_bytes(fileio, path))).read(use_threads=False)


def write_json(fileio: FileIO, path: str, obj: Any) -> int:
    """Write ``obj`` as compact JSON; return bytes written."""
    return write_bytes(fileio, path, json.dumps(obj, separators=(",", ":")).encode())


def read_json(fileio: FileIO, path: str) -> Any:
    """Read a JSON file."""
    return json.loads(read_bytes(fileio, path))


def local_path(location: str) -> str:
    """Turn a ``file:`` URI or plain path into a local filesystem path for DuckDB."""
    if location.startswith("file:"):
        return urlparse(location).path
    return location


T = TypeVar("T")


class ImmutableFileCache(Generic[T]):
    """A small thread-safe LRU cache of parsed immutable files, keyed by path.

    Paths of lineage and index files carry a UUID and are never rewritten, so a
    parsed copy stays valid for as long as the file exists.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, load: Callable[[], T]) -> T:
        """Return the cached value for ``path``, loading it on a miss."""
        with self._lock:
            if path in self._items:
                self._items.move_to_end(path)
                return self._items[path]
        value = load()
        with self._lock:
            self._items[path] = value
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return value
