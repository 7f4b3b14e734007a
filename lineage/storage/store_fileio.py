"""pyiceberg's FileIO with this project's S3 file systems: a small file is one PUT, not a multipart upload.

pyiceberg's ``PyArrowFileIO`` opens S3 output streams that always start a
multipart upload (three requests for a file of a few kilobytes: a manifest,
a manifest list, a metadata file, a small data file). :class:`StoreFileIO`
reads and writes through :func:`lineage.storage.files.filesystem`, whose
streams send a small file as one ``PutObject``; everything else is pyiceberg's.
"""

from __future__ import annotations

from typing import Any

from pyarrow.fs import FileSystem
from pyiceberg.io import OutputStream
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

import lineage.storage.files as files


class _NewObject(PyArrowFile):
    """An output file on an object store written without asking first whether it exists.

    Every file a table writes has a fresh name (a UUID, or a metadata version
    the catalog's compare-and-swap guards), so the check would cost a HEAD
    and a LIST per file and decide nothing.
    """

    def create(self, overwrite: bool = False) -> OutputStream:
        return self._filesystem.open_output_stream(self._path, buffer_size=self._buffer_size)


class StoreFileIO(PyArrowFileIO):
    """A ``PyArrowFileIO`` whose S3 buckets are reached through :mod:`lineage.storage.files` (same settings)."""

    def new_output(self, location: str) -> PyArrowFile:
        if not files.is_remote(location):
            return super().new_output(location)
        scheme, netloc, path = self.parse_location(location, self.properties)
        return _NewObject(fs=self.fs_by_scheme(scheme, netloc), location=location, path=path,
                          buffer_size=int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)))

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> FileSystem:
        if scheme in files.REMOTE_SCHEMES and netloc:
            location = f"{scheme}://{netloc}/"
            files.register(location, self.properties)
            return files.filesystem(location)[0]
        return super()._initialize_fs(scheme, netloc)


def store_io(io: Any, location: str) -> Any:
    """``io`` as a :class:`StoreFileIO` when it is pyiceberg's plain ``PyArrowFileIO`` and ``location`` is on an object store."""
    if type(io) is PyArrowFileIO and files.is_remote(location):
        return StoreFileIO(dict(io.properties))
    return io
