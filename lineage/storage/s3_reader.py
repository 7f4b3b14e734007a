"""A random-access reader of an object-store object that never asks for its size with a HEAD request.

pyarrow's S3 files send a HEAD before the first read (the size, for the
Parquet footer's position), then a GET per range: a footer costs two round
trips and a small file read whole four (HEAD + tail, HEAD + columns, when
footer and columns are read by separate opens). :class:`ObjectReader`
starts with one GET of the object's last :data:`TAIL_BYTES` (a suffix range:
the reply also gives the size), which holds the footer of any Parquet file
and all of a small one; a small object read whole is offered to
:mod:`lineage.storage.objects` and a larger one's tail kept in a small cache,
so the next open reads nothing; a writer keeps the tail of a large object it
wrote (:func:`remember_tail`), so its first read of that file (pre-images of
the file a bulk load wrote) skips the footer request. Other ranges are one GET each, unless a
reader fetched them ahead (:mod:`lineage.storage.s3_ranges`). Wrap it in
``pyarrow.PythonFile`` for pyarrow's readers. :func:`warm` fetches the tails
of many objects at once, for a reader about to open them one by one.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import lineage.storage.objects as objects
import lineage.storage.s3_get as s3_get
import lineage.storage.s3_ranges as s3_ranges
from lineage.storage.settings import StoreSettings

TAIL_BYTES = 64 << 10  # what pyarrow reads first for a Parquet footer
TAILS_KEPT = 256  # tails of larger objects kept (a file's footer is read again by each open of it)

_TAILS_LOCK = threading.Lock()
_TAILS: OrderedDict[str, tuple[int, int, bytes]] = OrderedDict()  # location -> (size, offset of the tail, tail)


def _held_tail(location: str) -> tuple[int, int, bytes] | None:
    data = objects.known(location)
    if data is not None:
        return len(data), 0, data
    with _TAILS_LOCK:
        hit = _TAILS.get(location)
        if hit is not None:
            _TAILS.move_to_end(location)
        return hit


def _fetch_tail(location: str, settings: StoreSettings) -> tuple[int, int, bytes]:
    data, size = s3_get.get_range(location, settings, f"-{TAIL_BYTES}")
    if len(data) == size:
        objects.remember(location, data)  # all of a small object
    else:
        _keep_tail(location, size, data)
    return size, size - len(data), data


def _keep_tail(location: str, size: int, tail: bytes) -> None:
    with _TAILS_LOCK:
        _TAILS[location] = (size, size - len(tail), tail)
        while len(_TAILS) > TAILS_KEPT:
            _TAILS.popitem(last=False)


def remember_tail(location: str, data: bytes) -> None:
    """Keep the tail of ``data``, an object this process just wrote at ``location`` too large to be held whole: the
    next open of it (a pre-image read of the file a bulk load wrote) then reads its footer from memory, not with a GET."""
    if len(data) > TAIL_BYTES:
        _keep_tail(location, len(data), bytes(data[-TAIL_BYTES:]))


def held_from(location: str) -> int | None:
    """The offset from which this process holds the object at ``location`` to its end (its tail, or 0 for all of a
    small object), or None when nothing of it is held."""
    hit = _held_tail(location)
    return None if hit is None else hit[1]


def discard(location: str) -> None:
    """Forget what is held of the object at ``location`` (it was deleted): its bytes and its tail."""
    objects.discard(location)
    with _TAILS_LOCK:
        _TAILS.pop(location, None)


def forget_tails() -> None:
    """Drop the tails kept (a benchmark measuring a fresh reader calls it)."""
    with _TAILS_LOCK:
        _TAILS.clear()


def warm(locations: Iterable[str], settings_of: Callable[[str], StoreSettings]) -> None:
    """Fetch the tails of ``locations`` not held yet, :func:`~lineage.storage.s3_get.parallel_reads` at once (a reader
    about to open each of them one after another: its opens then read from memory). A failure is left for the reader
    to meet."""
    wanted = [loc for loc in dict.fromkeys(locations) if _held_tail(loc) is None]
    if len(wanted) < 2:
        return

    def fetch(location: str) -> None:
        try:
            _fetch_tail(location, settings_of(location))
        except OSError:
            pass

    with ThreadPoolExecutor(min(s3_get.parallel_reads(), len(wanted)), thread_name_prefix="lineage-warm") as pool:
        list(pool.map(fetch, wanted))


class ObjectReader(io.RawIOBase):
    """A seekable, readable view of the object at ``location`` (``s3://bucket/key``), read by byte ranges."""

    def __init__(self, location: str, settings: StoreSettings) -> None:
        super().__init__()
        self.location = location
        self._settings = settings
        self._lock = threading.Lock()
        self._pos = 0
        self._size: int | None = None
        self._tail_at = 0  # the bytes held are [_tail_at, _size)
        self._tail = b""
        held = _held_tail(location)
        if held is not None:
            self._size, self._tail_at, self._tail = held

    def _load_tail(self) -> int:
        if self._size is None:
            self._size, self._tail_at, self._tail = _fetch_tail(self.location, self._settings)
        return self._size

    def size(self) -> int:
        """The object's size in bytes (the first call reads the object's tail)."""
        with self._lock:
            return self._load_tail()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._lock:
            if whence == io.SEEK_SET:
                self._pos = offset
            elif whence == io.SEEK_CUR:
                self._pos += offset
            elif whence == io.SEEK_END:
                self._pos = self._load_tail() + offset
            else:
                raise ValueError(f"invalid whence {whence}")
            if self._pos < 0:
                raise ValueError("negative seek position")
            return self._pos

    def read(self, size: int = -1) -> bytes:
        with self._lock:
            total = self._load_tail()
            start = min(self._pos, total)
            end = total if size is None or size < 0 else min(total, start + size)
            if end <= start:
                return b""
            if start >= self._tail_at:
                data = self._tail[start - self._tail_at:end - self._tail_at]
            elif (hit := s3_ranges.held(self.location, start, min(end, self._tail_at))) is not None:
                data = hit + self._tail[:max(0, end - self._tail_at)]  # fetched ahead, up to the tail held
            else:
                data, _ = s3_get.get_range(self.location, self._settings, f"{start}-{end - 1}")
            self._pos = start + len(data)
            return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)
