"""Removing the objects landed commits left behind (old metadata files), off the writer's path and in batches.

Past ``write.metadata.previous-versions-max`` every commit pushes one
metadata file out of the table's metadata log. Removing it at once costs a
request per commit (and pyarrow's ``delete_file`` sends three: a HEAD, the
DELETE and a PUT of a folder marker). :func:`remove_later` queues such
objects by bucket and, once :data:`BATCH` of one bucket are queued, removes
them with one ``DeleteObjects`` request on a background thread (one
``DeleteObject`` each on a store that refuses it); what is still queued
goes when the interpreter exits (or at :func:`wait`, which ``maintain``
calls). A removal that fails (or a process killed before it exits
cleanly) leaves files no metadata log names, which ``vacuum`` removes; the
commit has landed either way.

A write's commit runs inside :func:`commit_budget`: a small commit sends at
most :data:`COMMIT_REQUESTS` requests, removals included. Full batches
queued then wait for a commit with room: :func:`send_with_room`, called
once the commit has queued every object it writes, sends as many as the
requests the commit issued leave room for, alongside its last PUTs (its
block waits for them: counted with the commit that sent them, never with
the next). The files they remove fell out of the log at earlier commits,
which have landed. A commit with no room leaves them queued for the next.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar

import lineage.storage.files as files
import lineage.storage.puts as puts
import lineage.storage.s3_get as s3_get

BATCH = 16  # objects of one bucket removed by one request
COMMIT_REQUESTS = 10  # requests a small commit may send, the removals it carries included

_MARK: ContextVar[int | None] = ContextVar("lineage_removals_mark", default=None)  # s3_get.issued() when the commit began

_LOCK = threading.Lock()
_PENDING: dict[str, list[str]] = {}  # bucket -> locations queued
_POOL: list[ThreadPoolExecutor] = []
_SENT: list[Future] = []


def remove_later(locations: Iterable[str]) -> None:
    """Queue the objects at ``locations`` for removal (local files are removed now); see the module's docstring."""
    full: list[list[str]] = []
    with _LOCK:
        for location in locations:
            if not files.is_remote(location):
                files.delete(location)
                continue
            _PENDING.setdefault(files.bucket_of(location), []).append(location)
        if _MARK.get() is None:  # not inside a commit's budget: full batches go now
            full = _full_batches(None)
        for batch in full:
            _submit(batch)


@contextmanager
def commit_budget() -> Iterator[None]:
    """Count the requests issued in this block as one commit's (see the module's docstring)."""
    token = _MARK.set(s3_get.issued())
    try:
        yield
    finally:
        _MARK.reset(token)


def send_with_room(still_to_come: int = 0) -> int:
    """Send the full batches queued that the calling commit has room for, in its :func:`~lineage.storage.puts` block
    (which then waits for them); ``still_to_come``: requests the commit will issue after this call. Outside
    :func:`commit_budget`: nothing. Returns the number of requests sent."""
    mark = _MARK.get()
    if mark is None:
        return 0
    room = COMMIT_REQUESTS - (s3_get.issued() - mark) - still_to_come
    if room <= 0:
        return 0
    with _LOCK:
        batches = _full_batches(room)
        futures = [_submit(batch) for batch in batches]
    block = puts.current_block()
    for future in futures:
        if block is not None:
            block.add(future)  # _remove raises nothing: a failed removal never fails the commit
    return len(futures)


def _full_batches(most: int | None) -> list[list[str]]:  # under _LOCK
    """Take up to ``most`` (None: all) full batches off the queues."""
    out: list[list[str]] = []
    for queued in _PENDING.values():
        while len(queued) >= BATCH and (most is None or len(out) < most):
            out.append(queued[:BATCH])
            del queued[:BATCH]
    return out


def pending() -> list[str]:
    """The locations queued and not yet sent for removal."""
    with _LOCK:
        return [loc for queued in _PENDING.values() for loc in queued]


def wait() -> None:
    """Send every queued removal now and wait until every removal sent so far has been made."""
    with _LOCK:
        batches = [list(queued) for queued in _PENDING.values() if queued]
        _PENDING.clear()
        sent, _SENT[:] = list(_SENT), []
    for future in sent:
        future.exception()  # failures leave files for vacuum (see _remove)
    for batch in batches:  # on the caller's thread: at exit no new work reaches a thread pool
        _remove(batch)


def _submit(batch: list[str]) -> Future:  # under _LOCK
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="lineage-removals"))
    _SENT[:] = [f for f in _SENT if not f.done()]
    future = _POOL[0].submit(_remove, batch)
    _SENT.append(future)
    return future


def _remove(batch: list[str]) -> None:
    # On the calling thread, no pool: at interpreter exit no new work reaches one.
    try:
        left = files.delete_batch(batch)  # one request (one each on a store without DeleteObjects)
    except Exception:  # noqa: BLE001 - left for vacuum: the files are named by no metadata log
        return
    for location in left:
        try:
            files.delete(location)
        except Exception:  # noqa: BLE001 - left for vacuum, as above
            pass


def _forget() -> None:  # a forked child starts its own thread and queue (the parent removes what it queued)
    _POOL.clear()
    _PENDING.clear()
    _SENT.clear()


atexit.register(wait)
os.register_at_fork(after_in_child=_forget)
