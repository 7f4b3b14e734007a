"""Removing the objects landed commits left behind (old metadata files), off the writer's path and in batches.

Past ``write.metadata.previous-versions-max`` every commit pushes one
metadata file out of the table's metadata log. Removing it at once costs a
request per commit (and pyarrow's ``delete_file`` sends three: a HEAD, the
DELETE and a PUT of a folder marker). :func:`remove_later` queues such
objects by bucket and, once :data:`BATCH` of one bucket are queued, removes
them with one ``DeleteObjects`` request on a background thread (one
``DeleteObject`` each on a store that refuses it); what is still queued
goes when the interpreter exits (or at :func:`wait`). So at
most ``BATCH - 1`` files beyond the limit stay while a writer lives. A
removal that fails (or a process killed before it exits cleanly) leaves
files no metadata log names, which ``vacuum`` removes; the commit has
landed either way.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import lineage.storage.files as files

BATCH = 16  # objects of one bucket removed by one request

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
            queued = _PENDING.setdefault(files.bucket_of(location), [])
            queued.append(location)
            if len(queued) >= BATCH:
                full.append(list(queued))
                queued.clear()
        for batch in full:
            _submit(batch)


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


def _submit(batch: list[str]) -> None:  # under _LOCK
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="lineage-removals"))
    _SENT[:] = [f for f in _SENT if not f.done()]
    _SENT.append(_POOL[0].submit(_remove, batch))


def _remove(batch: list[str]) -> None:
    # On the calling thread, no pool: at interpreter exit no new work reaches one.
    for location in files.delete_batch(batch):  # one request (one each on a store without DeleteObjects)
        try:
            files.delete(location)
        except OSError:
            pass  # left for vacuum: the file is named by no metadata log


def _forget() -> None:  # a forked child starts its own thread and queue (the parent removes what it queued)
    _POOL.clear()
    _PENDING.clear()
    _SENT.clear()


atexit.register(wait)
os.register_at_fork(after_in_child=_forget)
