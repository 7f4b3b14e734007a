"""A deleted-rows index segment read a few data files at a time: its entries of one range of row ids, or all in pieces.

:func:`index.deleted_rows.read_index` holds a whole segment (about 40 bytes a
removed image, and its captured values): what a change feed of the whole
range reads. A feed planned one group of row ids at a time (:mod:`cdf.groups`)
reads with :func:`read_rows` instead: the segment's rows (one per data file)
are decoded :data:`FILES_PER_PIECE` at a time and only the entries of the
group's row ids are kept, so memory holds one piece and the group's entries,
not the segment. Nothing read here is cached.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO

from index.deleted_rows import INDEX_FORMAT, INDEX_FORMAT_VERSION, VALUE_PREFIX, IndexSegment, decode_index
from lineage.errors import LineageMetadataError
from lineage.storage.metadata import open_tagged_parquet

FILES_PER_PIECE = 4  # data files decoded at a time (a data file's entries are at most its rows)


def pieces(fileio: FileIO, path: str, with_values: bool = False) -> Iterator[IndexSegment]:
    """The segment at ``path`` as consecutive pieces of at most :data:`FILES_PER_PIECE` data files each."""
    pf = open_tagged_parquet(fileio, path, INDEX_FORMAT, "deleted-rows index segment", INDEX_FORMAT_VERSION)
    names = pf.schema_arrow.names
    captured = any(n.startswith(VALUE_PREFIX) for n in names)
    columns = None if with_values else [n for n in names if not n.startswith(VALUE_PREFIX)]
    try:
        batches = pf.iter_batches(batch_size=FILES_PER_PIECE, columns=columns, use_threads=False)
        for batch in batches:
            yield decode_index(path, pa.Table.from_batches([batch]), with_values, captured)
    except LineageMetadataError:
        raise
    except Exception as exc:  # a corrupt file
        raise LineageMetadataError(f"deleted-rows index segment {path} has damaged content: {exc!r}") from None


def read_rows(fileio: FileIO, path: str, rows: tuple[int, int], with_values: bool = False) -> IndexSegment:
    """The entries of the segment at ``path`` whose row ids are in ``rows`` (first inclusive, second exclusive)."""
    kept: list[IndexSegment] = []
    captured = False
    for piece in pieces(fileio, path, with_values):
        captured = piece.captured
        keep = np.flatnonzero((piece.row_ids >= rows[0]) & (piece.row_ids < rows[1]))
        if len(keep):
            kept.append(_take(piece, keep))
    return _joined(path, kept, captured, with_values)


def _take(seg: IndexSegment, keep: np.ndarray) -> IndexSegment:
    values = None if seg.values is None else seg.values.take(pa.array(keep))
    return IndexSegment(seg.path, seg.files, seg.file_index[keep], seg.positions[keep], seg.row_ids[keep], seg.created[keep],
                        seg.valid_from[keep], seg.valid_to[keep], values, seg.captured)


def _joined(path: str, parts: list[IndexSegment], captured: bool, with_values: bool) -> IndexSegment:
    """One segment of ``parts`` (each with its own files): file numbers shifted past the earlier parts' files."""
    if not parts:
        empty = np.zeros(0, np.int64)
        return IndexSegment(path, (), np.zeros(0, np.int32), empty, empty, empty, empty, empty, None, captured)
    files: list[str] = []
    file_index = []
    for p in parts:
        file_index.append(p.file_index + len(files))
        files.extend(p.files)
    values = None
    if with_values and parts[0].values is not None:
        values = pa.concat_tables([p.values for p in parts], promote_options="permissive")

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    return IndexSegment(path, tuple(files), np.concatenate(file_index).astype(np.int32), cat("positions"), cat("row_ids"),
                        cat("created"), cat("valid_from"), cat("valid_to"), values, captured)
