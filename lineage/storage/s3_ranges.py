"""Byte ranges of object-store objects fetched at once, held while a reader decodes them.

pyarrow's Parquet reader asks for the column chunks of a row group one range
after another (through :class:`lineage.storage.s3_reader.ObjectReader`,
one GET each): a reader that knows from the footers which chunks of which
files it needs (the change feed reading row images by position) pays a
round trip per chunk, in sequence. :func:`holding` fetches all of those
ranges first, nearby ones coalesced into one request (gaps up to
:data:`GAP_BYTES`), large ones split into pieces of at most
:data:`PIECE_BYTES`, every request in parallel (up to
:func:`~lineage.storage.s3_get.parallel_reads` at once); while the block
runs, a read that falls within the ranges held (:func:`held`) is served from
memory. Holds are counted, so two readers holding the same object do not
drop each other's bytes; nothing is kept after the block.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import lineage.storage.s3_get as s3_get
from lineage.storage.settings import StoreSettings

GAP_BYTES = 64 << 10  # ranges this close are read by one request (a request costs more than reading this much)
PIECE_BYTES = 8 << 20  # a longer range is read in pieces of this size, in parallel

_LOCK = threading.Lock()
_HELD: dict[str, dict[int, tuple[int, bytes]]] = {}  # location -> {hold id: (offset, bytes)}
_ids = itertools.count()


@dataclass(frozen=True)
class Fetched:
    """What :func:`holding` fetched: requests sent and bytes read."""

    requests: int
    bytes: int


def coalesced(ranges: Sequence[tuple[int, int]], gap: int = GAP_BYTES, piece: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """``[start, end)`` ranges covering ``ranges``: sorted, those at most ``gap`` bytes apart merged, then each cut into
    pieces of at most ``piece`` bytes. Empty ranges are dropped."""
    merged: list[list[int]] = []
    for start, end in sorted((int(s), int(e)) for s, e in ranges if e > s):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out = []
    for start, end in merged:
        out.extend((s, min(end, s + piece)) for s in range(start, end, piece))
    return out


def held(location: str, start: int, end: int) -> bytes | None:
    """Bytes ``[start, end)`` of ``location`` if the ranges held cover them (adjacent pieces joined), else None."""
    with _LOCK:
        pieces = _HELD.get(location)
        if not pieces:
            return None
        parts = sorted(pieces.values(), key=lambda p: p[0])
    out, at = [], start
    for offset, data in parts:
        if offset <= at < offset + len(data):
            take = data[at - offset:min(len(data), end - offset)]
            out.append(take)
            at += len(take)
            if at >= end:
                return b"".join(out)
    return None


@contextmanager
def holding(wanted: Mapping[str, Sequence[tuple[int, int]]], settings_of: Callable[[str], StoreSettings]) -> Iterator[Fetched]:
    """Fetch the ``[start, end)`` ranges of each object in ``wanted`` (coalesced, in parallel) and hold them while the block
    runs (:func:`held` serves reads within them). A range that cannot be fetched is left out: the reader then reads it
    from the store itself and reports what is wrong."""
    jobs = [(loc, s, e) for loc, ranges in wanted.items() for s, e in coalesced(ranges)]
    ids: list[tuple[str, int]] = []
    got = [0, 0]

    def fetch(job: tuple[str, int, int]) -> None:
        location, start, end = job
        try:
            data, _ = s3_get.get_range(location, settings_of(location), f"{start}-{end - 1}")
        except OSError:
            return
        with _LOCK:
            hold = next(_ids)
            _HELD.setdefault(location, {})[hold] = (start, data)
            ids.append((location, hold))
            got[0] += 1
            got[1] += len(data)

    try:
        if len(jobs) == 1:
            fetch(jobs[0])
        elif jobs:
            with ThreadPoolExecutor(min(s3_get.parallel_reads(), len(jobs)), thread_name_prefix="lineage-ranges") as pool:
                list(pool.map(fetch, jobs))
        yield Fetched(got[0], got[1])
    finally:
        with _LOCK:
            for location, hold in ids:
                pieces = _HELD.get(location)
                if pieces is not None:
                    pieces.pop(hold, None)
                    if not pieces:
                        del _HELD[location]
