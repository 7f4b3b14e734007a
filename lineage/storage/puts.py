"""Writing a commit's new objects to an object store: one request each, all in flight at once, remembered after.

Every object a commit writes (data and delete files, lineage files, manifests,
the manifest list) has a fresh name and depends on no other: only the catalog
commit needs them all to have landed. :func:`put` sends one ``PutObject``;
inside :func:`parallel_puts` the request goes out in the background and the
block (or an explicit :func:`wait`) is the barrier. Writers running on other
threads (pyiceberg writes data files on its own executor) join the caller's
block through :func:`current_block`.

A file this process wrote is served from memory while its request is in
flight (a commit may read back what it just wrote, e.g. the keys of its new
data files or a manifest it merges) and, when small, for a while after
(the next commit of a long-lived writer reads the key index segment the last
one wrote; of a larger one, its footer), through :mod:`lineage.storage.objects`: :func:`known` gives its
bytes, :func:`read` reads a whole object with one GET (no HEAD) when it is
not known. Objects are never rewritten under the same name, so a copy held
in memory cannot go stale.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import lineage.storage.files as files
import lineage.storage.objects as objects
import lineage.storage.s3_get as s3_get
import lineage.storage.s3_reader as s3_reader

SINGLE_REQUEST_BYTES = 16 << 20  # a remote object up to this size is one signed PutObject; larger ones a multipart upload

PARALLEL_REQUESTS = 16  # independent object-store requests in flight at once (each one costs a round trip)

MAX_IN_FLIGHT_BYTES = 256 << 20  # a writer sending more waits for earlier requests to land (memory stays bounded)

_LOCK = threading.Lock()
_FLIGHT = threading.Condition()
_in_flight = 0


@dataclass
class PutBlock:
    """The requests of one :func:`parallel_puts` block (thread-safe: writer threads add to it)."""

    futures: list[Future] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, future: Future) -> None:
        """Count ``future`` among the block's requests."""
        with self.lock:
            self.futures.append(future)

    def wait(self) -> list[BaseException]:
        """Wait for every request sent so far; their errors, in the order sent."""
        errors: list[BaseException] = []
        while True:
            with self.lock:
                batch, self.futures = self.futures, []
            if not batch:
                return errors
            for f in batch:
                try:
                    f.result()
                except Exception as exc:  # noqa: BLE001 - every request is waited for before any error is raised
                    errors.append(exc)


_BLOCK: ContextVar[PutBlock | None] = ContextVar("lineage_put_block", default=None)
_POOL: list[ThreadPoolExecutor] = []


def _pool() -> ThreadPoolExecutor:
    with _LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(PARALLEL_REQUESTS, thread_name_prefix="lineage-put"))
        return _POOL[0]


def current_block() -> PutBlock | None:
    """The :func:`parallel_puts` block of the calling context (hand it to writer threads), or None."""
    return _BLOCK.get()


def put(location: str, data: bytes, block: PutBlock | None = None) -> None:
    """Write ``data`` as the object at ``location`` in one request (immutable files have fresh names: no existence check).

    In a :func:`parallel_puts` block (the caller's, or ``block``) the request
    is sent in the background; its bytes are served by :func:`known` until
    it landed (and after, while they fit in memory).
    """
    data = bytes(data)
    if files.is_remote(location) and len(data) <= SINGLE_REQUEST_BYTES:
        s3_get.count_put()
    block = block if block is not None else _BLOCK.get()
    if block is None:
        _put(location, data)
        _remember(location, data)
        return
    _reserve(len(data))
    objects.pin(location, data)
    future = _pool().submit(_put, location, data)
    future.add_done_callback(lambda f: _landed(location, data, f))
    block.add(future)


def _reserve(size: int) -> None:
    """Count ``size`` bytes in flight, first waiting while others keep more than :data:`MAX_IN_FLIGHT_BYTES` in memory."""
    global _in_flight
    with _FLIGHT:
        while _in_flight > 0 and _in_flight + size > MAX_IN_FLIGHT_BYTES:
            _FLIGHT.wait()
        _in_flight += size


def _put(location: str, data: bytes) -> None:
    if files.is_remote(location) and len(data) <= SINGLE_REQUEST_BYTES:
        s3_get.put(location, data, files.settings_for(location))
        return
    fs, path = files.filesystem(location)
    with fs.open_output_stream(path) as out:
        out.write(data)


def _landed(location: str, data: bytes, future: Future) -> None:
    global _in_flight
    if future.exception() is None:
        _remember(location, data)
    objects.unpin(location)
    with _FLIGHT:
        _in_flight -= len(data)
        _FLIGHT.notify_all()


def _remember(location: str, data: bytes) -> None:
    """Hold a landed object: whole while small (:func:`objects.remember`), else its tail (its footer, for a reader)."""
    objects.remember(location, data)
    if len(data) > objects.RECENT_MAX_OBJECT and files.is_remote(location):
        s3_reader.remember_tail(location, data)


def known(location: str) -> bytes | None:
    """The bytes of the object at ``location`` when this process holds them (see :mod:`lineage.storage.objects`), else None."""
    return objects.known(location)


def forget() -> None:
    """Drop the landed objects and footers held in memory (a benchmark measuring a fresh reader calls it)."""
    objects.forget()
    s3_reader.forget_tails()


def read(location: str) -> bytes:
    """The whole object at ``location``: from memory when :func:`known`, else one GET (no HEAD first)."""
    data = objects.known(location)
    if data is not None:
        return data
    data = s3_get.get(location, files.settings_for(location))
    objects.remember(location, data)
    return data


@contextmanager
def parallel_puts() -> Iterator[PutBlock]:
    """Send the :func:`put` requests made in this block at once; the block ends when every one has landed.

    For files that do not depend on each other (a commit's data, delete and
    lineage files, manifests and manifest list): each request is a round trip
    to the store, so sending them one after the other costs a round trip
    each. Reading a file written in the block is served from memory
    (:func:`known`). The first failed request is raised at the end of the
    block (or by :func:`wait`). A block opened inside another joins it and,
    at its end, waits for every request of both so far.
    """
    outer = _BLOCK.get()
    block = outer if outer is not None else PutBlock()
    token = _BLOCK.set(block)
    failed = True
    try:
        yield block
        failed = False
    finally:
        _BLOCK.reset(token)
        errors = block.wait()
        if errors and not failed:
            raise errors[0]


@contextmanager
def suspended() -> Iterator[None]:
    """Write synchronously in this block even inside :func:`parallel_puts` (a catalog commit writes its metadata file
    and then points the catalog at it: that file must have landed first). The caller's requests keep flying."""
    token = _BLOCK.set(None)
    try:
        yield
    finally:
        _BLOCK.reset(token)


def wait() -> None:
    """Wait until every request of the caller's block sent so far has landed (raise the first failure); no block: nothing."""
    block = _BLOCK.get()
    if block is not None:
        errors = block.wait()
        if errors:
            raise errors[0]


def _forget_pool() -> None:  # a forked child must not use the parent's threads (nor wait for their requests)
    global _FLIGHT, _in_flight
    _POOL.clear()
    _FLIGHT, _in_flight = threading.Condition(), 0


os.register_at_fork(after_in_child=_forget_pool)
