"""A deleted-rows index segment written part by part, for a commit whose removed images come a group of data files at a time.

:func:`index.deleted_rows.write_index_segment` writes a segment from every
removed image of a commit at once. A delete or update matching millions of
rows handles them a group of data files at a time
(:mod:`lineage.writes.grouped`); :class:`IndexSegmentWriter` appends each
group's rows (:func:`index.deleted_rows.index_rows`, one per data file) to
the same Parquet file as a row group of its own, so the segment is the same
file format, and its writer holds one group at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from index.deleted_rows import INDEX_FORMAT, INDEX_FORMAT_VERSION, RemovedImages, WrittenIndex, index_rows


@dataclass
class IndexSegmentWriter:
    """The index segment of one commit at ``path``, written as groups of removed images arrive (:meth:`add`).

    The file is created at the first non-empty group; :meth:`close` returns
    what was written (None when no image was added). ``valid_to`` is the
    version of the commit the images are removed by.
    """

    fileio: FileIO
    path: str
    valid_to: int
    images: int = 0
    _out: Any = None
    _writer: pq.ParquetWriter | None = None
    _schema: pa.Schema | None = field(default=None, repr=False)

    @property
    def started(self) -> bool:
        """Whether the file exists (a group was written): the caller removes it if the commit is abandoned."""
        return self._out is not None

    def add(self, removed: list[RemovedImages]) -> None:
        """Append the rows of ``removed`` (each data file in one call only; all with captured values or none)."""
        removed = [r for r in removed if len(r)]
        if not removed:
            return
        if any(r.valid_to != self.valid_to for r in removed):
            raise ValueError(f"internal: images removed by another version than {self.valid_to}")
        rows = index_rows(removed)
        if self._writer is None:
            self._schema = rows.schema.with_metadata({"lineage.format": INDEX_FORMAT, "lineage.format-version": str(INDEX_FORMAT_VERSION)})
            self._out = self.fileio.new_output(self.path).create()
            # no dictionaries: a million removed images' row ids made one of ~170 MB, for no smaller file
            self._writer = pq.ParquetWriter(self._out, self._schema, compression="zstd", use_dictionary=False)
        self._writer.write_table(rows.cast(self._schema))
        self.images += sum(len(r) for r in removed)

    def close(self) -> WrittenIndex | None:
        """Finish the file; what was written, or None if nothing was."""
        if self._writer is None:
            return None
        self._writer.close()
        self._out.close()
        self._writer = None
        size = len(self.fileio.new_input(self.path))
        return WrittenIndex(self.path, size, self.images, self.valid_to)

    def abort(self) -> None:
        """Close and remove a file left unfinished (the commit will not use it)."""
        if self._writer is not None:
            try:
                self._writer.close()
                self._out.close()
            finally:
                self._writer = None
        if self._out is not None:
            self.fileio.delete(self.path)
