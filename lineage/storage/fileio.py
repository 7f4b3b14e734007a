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
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

import lineage.storage.files as files
import lineage.storage.puts as puts
from lineage.storage.files import local_path  # noqa: F401 - re-exported: callers read paths through this module


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
    if files.is_remote(path):  # one PUT: no HEAD first (the name is new), no multipart upload
        puts.put(path, data)
        return len(data)
    with fileio.new_output(path).create(overwrite=_OVERWRITE.get()) as out:
        out.write(data)
    return len(data)


def read_bytes(fileio: FileIO, path: str) -> bytes:
    """Read the whole file at ``path`` (on an object store: one GET, or none when this process wrote it recently)."""
    if files.is_remote(path):
        return puts.read(path)
    with fileio.new_input(path).open() as f:
        return f.read()


def read_range(fileio: FileIO | None, path: str, offset: int, length: int) -> bytes:
    """Read ``length`` bytes at ``offset`` of the file at ``path``: one ranged request on an object store.

    ``fileio`` (the table's) reads local files; an object store's are read
    through :func:`lineage.storage.files.read_range` (no HEAD request first).
    """
    if files.is_remote(path) or fileio is None:
        return files.read_range(path, offset, length)
    with fileio.new_input(path).open() as f:
        f.seek(offset)
        return f.read(length)


def write_parquet(fileio: FileIO, path: str, table: pa.Table | Iterable[pa.Table], *, use_dictionary: bool = True) -> int:
    """Write an Arrow table as a zstd Parquet file (``use_dictionary``: dictionary-encode columns where it pays); return bytes written.

    ``table`` may also be an iterable of tables of one schema (at least one), each written as a row group
    of its own as it comes: only one part is encoded at a time.
    """
    sink = _io.BytesIO()
    if isinstance(table, pa.Table):
        pq.write_table(table, sink, compression="zstd", use_dictionary=use_dictionary)
    else:
        writer: pq.ParquetWriter | None = None
        for part in table:
            writer = writer or pq.ParquetWriter(sink, part.schema, compression="zstd", use_dictionary=use_dictionary)
            writer.write_table(part)
        if writer is None:
            raise ValueError(f"internal: no part to write to {path}")
        writer.close()
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


def file_stamp(path: str) -> str:
    """``"<size>/<mtime in ns>"`` of the local file ``path`` (raises ``OSError`` if it is missing); ``"object"`` on an object store.

    Caches of what was read from a data file key it by path and stamp: Iceberg
    never rewrites a data file, but one replaced by hand must not be served.
    """
    if files.is_remote(path):  # objects are written once under fresh names and never replaced: no HEAD request
        return "object"
    st = files.info(path)
    return f"{st.size}/{st.mtime_ns}"


T = TypeVar("T")


class ImmutableFileCache(Generic[T]):
    """A small thread-safe LRU cache of what was parsed from immutable files, keyed by path (or any hashable key).

    Paths of lineage and index files carry a UUID and are never rewritten, so a
    parsed copy stays valid for as long as the file exists. ``capacity``
    bounds the number of values kept, or their total weight when ``weigh``
    is given (entries of a manifest, bytes of a decoded row group); a value
    weighing more than ``max_share`` of the capacity is returned but not kept,
    so that one huge value does not evict everything else.
    """

    def __init__(self, capacity: int, weigh: Callable[[T], int] | None = None, max_share: float = 1.0) -> None:
        self.capacity = capacity
        self._weigh = weigh
        self._max_share = max_share
        self._items: OrderedDict[Hashable, tuple[T, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, path: Hashable, load: Callable[[], T]) -> T:
        """Return the cached value for ``path``, loading (and keeping) it on a miss."""
        hit = self.peek(path)
        if hit is not None:
            return hit
        value = load()
        self.put(path, value)
        return value

    def peek(self, path: Hashable) -> T | None:
        """The cached value for ``path``, or None."""
        with self._lock:
            hit = self._items.get(path)
            if hit is None:
                return None
            self._items.move_to_end(path)
            return hit[0]

    def put(self, path: Hashable, value: T) -> None:
        """Keep ``value`` for ``path``, evicting the least recently used values beyond the capacity."""
        weight = self._weigh(value) if self._weigh is not None else 1
        if weight > self.capacity * self._max_share:
            return
        with self._lock:
            old = self._items.pop(path, None)
            if old is not None:
                self._held -= old[1]
            self._items[path] = (value, weight)
            self._held += weight
            while self._held > self.capacity:
                _, (_, dropped) = self._items.popitem(last=False)
                self._held -= dropped

    def clear(self) -> None:
        """Drop every value."""
        with self._lock:
            self._items.clear()
            self._held = 0
