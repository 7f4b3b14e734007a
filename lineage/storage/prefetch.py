"""Small files of an object store fetched at once, one GET each, for a reader that reads them whole.

DuckDB's ``httpfs`` reads a Parquet file with a HEAD (its size) and then
GETs (footer, column chunks), a file or two at a time: on a store where
each request costs tens of milliseconds, a scan of many small files (the
files of small commits) costs a few round trips per file, one after another.
A scan reads every byte of a small file anyway, and Iceberg's manifests
already give every file's size: :func:`local_copies` fetches the small
remote files of a scan in parallel (one GET each, no HEAD, up to
:func:`~lineage.storage.s3_get.parallel_reads` at once, the largest first so
that its transfer overlaps the many small ones) into a temporary folder the
reader reads instead, removed when the block ends. Large files are left to
the reader's byte-range requests (projection and row-group pruning pay off
there), and the total fetched is bounded. What is fetched is not kept in
memory after the block (the writer's own recent files stay there instead).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import lineage.storage.files as files
import lineage.storage.puts as puts
import lineage.storage.s3_get as s3_get

MAX_FILE_BYTES = 8 << 20  # a remote file up to this size is fetched whole
MAX_TOTAL_BYTES = 512 << 20  # at most this much per block (the smallest files first)


def chosen(
    sized: Iterable[tuple[str, int | None]], max_file: int = MAX_FILE_BYTES, max_total: int = MAX_TOTAL_BYTES
) -> list[str]:
    """The remote locations among ``(location, size)`` worth fetching whole: known size up to ``max_file``, smallest first,
    at most ``max_total`` bytes in all (each location once)."""
    seen: dict[str, int] = {}
    for location, size in sized:
        if size is not None and 0 <= size <= max_file and files.is_remote(location):
            seen[location] = int(size)
    out, total = [], 0
    for location, size in sorted(seen.items(), key=lambda kv: (kv[1], kv[0])):
        if total + size > max_total:
            break
        out.append(location)
        total += size
    return out


@contextmanager
def local_copies(sized: Iterable[tuple[str, int | None]]) -> Iterator[dict[str, str]]:
    """Fetch the small remote files among ``(location, size)`` (see :func:`chosen`) in parallel into a temporary folder.

    Yields ``{location: local path}`` for the files fetched (empty when none
    is remote and small); the folder is removed when the block ends. A file
    that cannot be fetched is left out (the reader then reads it from the
    store and reports what is wrong with it).
    """
    wanted = chosen(sized)
    if not wanted:
        yield {}
        return
    folder = tempfile.mkdtemp(prefix="lineage-fetch-")
    try:
        def fetch(item: tuple[int, str]) -> tuple[str, str] | None:
            i, location = item
            try:
                data = puts.known(location)
                if data is None:
                    data = s3_get.get(location, files.settings_for(location))
            except OSError:
                return None
            local = os.path.join(folder, f"{i}-{os.path.basename(location.rstrip('/'))}")
            with open(local, "wb") as f:
                f.write(data)
            return location, local

        with ThreadPoolExecutor(min(s3_get.parallel_reads(), len(wanted)), thread_name_prefix="lineage-fetch") as pool:
            got = [x for x in pool.map(fetch, reversed(list(enumerate(wanted)))) if x is not None]  # the largest first
        yield dict(got)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
