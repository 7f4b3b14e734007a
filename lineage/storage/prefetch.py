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
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

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


@dataclass
class Fetch:
    """Downloads under way into a temporary folder (see :func:`fetching`)."""

    futures: dict[str, Future]  # location -> future of its local path (None: it could not be fetched)

    def copies(self, locations: Iterable[str] | None = None) -> dict[str, str]:
        """``{location: local path}`` of ``locations`` (every file of the block when None) that were fetched, once
        they have arrived (waits for them; the others may still be under way)."""
        wanted = self.futures if locations is None else [loc for loc in dict.fromkeys(locations) if loc in self.futures]
        out = {}
        for location in wanted:
            local = self.futures[location].result()
            if local is not None:
                out[location] = local
        return out


@contextmanager
def fetching(sized: Iterable[tuple[str, int | None]], first: Iterable[str] = ()) -> Iterator[Fetch]:
    """Start fetching the small remote files among ``(location, size)`` (see :func:`chosen`) into a temporary folder.

    Those named in ``first`` are sent first, in that order, then the others,
    the largest first; :meth:`Fetch.copies` waits for the ones a reader
    needs, so that it can read some while the rest arrive. A file that
    cannot be fetched is left out (the reader then reads it from the store
    and reports what is wrong with it). When the block ends, what is still
    under way is dropped and the folder removed.
    """
    wanted = chosen(sized)
    if not wanted:
        yield Fetch({})
        return
    known = set(wanted)
    ahead = [loc for loc in dict.fromkeys(first) if loc in known]
    order = ahead + [loc for loc in reversed(wanted) if loc not in set(ahead)]
    folder = tempfile.mkdtemp(prefix="lineage-fetch-")
    pool = ThreadPoolExecutor(min(s3_get.parallel_reads(), len(order)), thread_name_prefix="lineage-fetch")
    try:
        def fetch(i: int, location: str) -> str | None:
            try:
                data = puts.known(location)
                if data is None:
                    data = s3_get.get(location, files.settings_for(location))
            except OSError:
                return None
            local = os.path.join(folder, f"{i}-{os.path.basename(location.rstrip('/'))}")
            with open(local, "wb") as f:
                f.write(data)
            return local

        yield Fetch({location: pool.submit(fetch, i, location) for i, location in enumerate(order)})
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def local_copies(sized: Iterable[tuple[str, int | None]]) -> Iterator[dict[str, str]]:
    """Fetch the small remote files among ``(location, size)`` (see :func:`chosen`) in parallel into a temporary folder.

    Yields ``{location: local path}`` for the files fetched (empty when none
    is remote and small); the folder is removed when the block ends. A file
    that cannot be fetched is left out (the reader then reads it from the
    store and reports what is wrong with it).
    """
    with fetching(sized) as fetch:
        yield fetch.copies()
