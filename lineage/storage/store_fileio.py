"""pyiceberg's FileIO with this project's S3 file systems: a small file is one PUT, not a multipart upload.

pyiceberg's ``PyArrowFileIO`` opens S3 output streams that always start a
multipart upload (three requests for a file of a few kilobytes: a manifest,
a manifest list, a metadata file, a small data file) and asks for a written
file's size with a HEAD request. :class:`StoreFileIO` reads and writes
through :func:`lineage.storage.files.filesystem`: a new file up to
:data:`BUFFERED_BYTES` is kept in memory and sent as one ``PutObject``
through :mod:`lineage.storage.puts` (in the background inside a commit's
:func:`~lineage.storage.puts.parallel_puts` block), its size is known
without asking, and reading it back is served from memory; everything else
is pyiceberg's.
"""

from __future__ import annotations

import copy
import io as _io
from types import TracebackType
from typing import Any

import pyarrow as pa
from pyarrow.fs import FileSystem
from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

import lineage.storage.files as files
import lineage.storage.puts as puts

BUFFERED_BYTES = 16 << 20  # a new file up to this size is one PutObject sent when it is complete; larger ones stream


class _NewObjectStream:
    """The output stream of a new object: buffered, then one PUT on close; past :data:`BUFFERED_BYTES` a streaming upload."""

    def __init__(self, owner: _NewObject) -> None:
        self._owner = owner
        self._buffer: _io.BytesIO | None = _io.BytesIO()
        self._stream: Any = None  # pyarrow's upload stream once the file outgrew the buffer
        self._size = 0
        self.closed = False

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        self._size += len(data)
        if self._buffer is not None and self._size > BUFFERED_BYTES:
            self._stream = self._owner._open_stream()
            self._stream.write(self._buffer.getvalue())
            self._buffer = None
        if self._stream is not None:
            self._stream.write(data)
        else:
            assert self._buffer is not None
            self._buffer.write(data)
        return len(data)

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._stream is not None:
            self._stream.close()
        else:
            assert self._buffer is not None
            puts.put(self._owner.location, self._buffer.getvalue(), self._owner._block)
            self._buffer = None
        self._owner._size = self._size

    def __enter__(self) -> _NewObjectStream:
        return self

    def __exit__(self, exctype: type[BaseException] | None, excinst: BaseException | None, exctb: TracebackType | None) -> None:
        if exctype is None:
            self.close()
        else:  # a failed write sends nothing
            self.closed = True
            if self._stream is not None:
                self._stream.close()


class _NewObject(PyArrowFile):
    """An output file on an object store written without asking first whether it exists.

    Every file a table writes has a fresh name (a UUID, or a metadata version
    the catalog's compare-and-swap guards), so the check would cost a HEAD
    and a LIST per file and decide nothing.
    """

    _size: int | None = None
    _block: puts.PutBlock | None = None

    def create(self, overwrite: bool = False) -> OutputStream:
        return _NewObjectStream(self)

    def _open_stream(self) -> Any:
        return self._filesystem.open_output_stream(self._path, buffer_size=self._buffer_size)

    def __len__(self) -> int:
        if self._size is not None:  # written through this object: no HEAD request
            return self._size
        return super().__len__()


class _KnownObject(InputFile):
    """An object this process wrote, read from memory (see :func:`lineage.storage.puts.known`)."""

    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return pa.BufferReader(self._data)


class _StoredObject(InputFile):
    """An object on the store, read without a HEAD request (:func:`lineage.storage.files.open_input`)."""

    def __len__(self) -> int:
        stream = files.open_input(self.location)
        try:
            return int(stream.size())  # type: ignore[attr-defined]
        finally:
            stream.close()  # type: ignore[attr-defined]

    def exists(self) -> bool:
        try:
            files.open_input(self.location).close()  # type: ignore[attr-defined]
        except FileNotFoundError:
            return False
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return files.open_input(self.location)  # type: ignore[return-value]


class StoreFileIO(PyArrowFileIO):
    """A ``PyArrowFileIO`` whose S3 buckets are reached through :mod:`lineage.storage.files` (same settings)."""

    _block: puts.PutBlock | None = None  # see :func:`bound`

    def new_output(self, location: str) -> PyArrowFile:
        if not files.is_remote(location):
            return super().new_output(location)
        scheme, netloc, path = self.parse_location(location, self.properties)
        out = _NewObject(fs=self.fs_by_scheme(scheme, netloc), location=location, path=path,
                         buffer_size=int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)))
        out._block = self._block
        return out

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        if files.is_remote(path):
            files.delete(path)  # and forget what this process holds of it
            return
        super().delete(location)

    def new_input(self, location: str) -> InputFile:
        if files.is_remote(location):
            data = puts.known(location)
            if data is not None:
                return _KnownObject(location, data)
            return _StoredObject(location)
        return super().new_input(location)

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> FileSystem:
        if scheme in files.REMOTE_SCHEMES and netloc:
            location = f"{scheme}://{netloc}/"
            files.register(location, self.properties)
            return files.filesystem(location)[0]
        return super()._initialize_fs(scheme, netloc)


def bound(io: Any) -> Any:
    """``io`` writing into the caller's :func:`~lineage.storage.puts.parallel_puts` block from any thread.

    pyiceberg writes data files on its own executor's threads, which do not
    see the caller's block; the copy returned carries it. ``io`` itself when
    it is no :class:`StoreFileIO` or no block is open.
    """
    block = puts.current_block()
    if block is None or not isinstance(io, StoreFileIO):
        return io
    out = copy.copy(io)
    out._block = block
    return out


def store_io(io: Any, location: str) -> Any:
    """``io`` as a :class:`StoreFileIO` when it is pyiceberg's plain ``PyArrowFileIO`` and ``location`` is on an object store."""
    if type(io) is PyArrowFileIO and files.is_remote(location):
        return StoreFileIO(dict(io.properties))
    return io
