"""The column chunks a read of row groups needs, fetched from an object store at once before it decodes them.

A reader of row images by position (:mod:`lineage.read.values`) knows from
the files' footers which row groups and columns it will decode; pyarrow
would then read each column chunk with a request of its own, one after
another. :func:`prefetched` computes the byte range of every chunk needed
(the dictionary page through the last data page) and has
:mod:`lineage.storage.s3_ranges` fetch them all in parallel, nearby ones in
one request, before the decoding starts. Local files and bytes already held
(a small file read whole with its footer) are left out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager

import pyarrow.parquet as pq

import lineage.storage.files as store
import lineage.storage.s3_ranges as s3_ranges
import lineage.storage.s3_reader as s3_reader

MAX_HELD_BYTES = 256 << 20  # fetched ahead per read at most (compressed bytes held until it ends); the rest one GET per chunk


def chunk_ranges(metadata: pq.FileMetaData, row_group: int, columns: Collection[str]) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of the column chunks of ``row_group`` whose top-level column is in ``columns``."""
    rg = metadata.row_group(row_group)
    out = []
    for i in range(rg.num_columns):
        chunk = rg.column(i)
        if chunk.path_in_schema.split(".")[0] not in columns:
            continue
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset and 0 < chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        out.append((start, start + chunk.total_compressed_size))
    return out


@contextmanager
def prefetched(reads: Iterable[tuple[str, pq.FileMetaData, int, Collection[str]]]) -> Iterator[s3_ranges.Fetched]:
    """Fetch the chunks of each ``(location, footer, row group, top-level columns)`` on an object store, in parallel, and
    hold them while the block runs (see :func:`lineage.storage.s3_ranges.holding`). Reads past
    :data:`MAX_HELD_BYTES` in all are left to the reader (one GET per chunk, as they are decoded), so that a feed
    over many large row groups does not hold them all at once."""
    wanted: dict[str, list[tuple[int, int]]] = {}
    total = 0
    for location, metadata, row_group, columns in reads:
        if not columns or not store.is_remote(location):
            continue
        tail = s3_reader.held_from(location)
        ranges = [(s, e if tail is None else min(e, tail)) for s, e in chunk_ranges(metadata, row_group, columns)
                  if tail is None or s < tail]
        size = sum(e - s for s, e in ranges)
        if ranges and total + size <= MAX_HELD_BYTES:
            wanted.setdefault(location, []).extend(ranges)
            total += size
    with s3_ranges.holding(wanted, store.settings_for) as fetched:
        yield fetched
