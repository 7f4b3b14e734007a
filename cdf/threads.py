"""The embedded change feed's second thread, started once, and the GIL handed over promptly while a feed runs.

The embedded engine reads the values of a feed's images in a second thread
while the calling thread plans the feed, then builds the change columns in
both (:mod:`cdf.engine_duckdb`). Most of their numpy and Arrow operations
release the GIL, but between them each thread runs Python code and short
numpy operations that hold it. A thread that wants the GIL back waits until
the holder releases it, or until CPython's switch interval has passed (5 ms
by default) and the holder is made to drop it: measured on the feed of the
last 5 commits of the 1M-row benchmark table (75,000 rows), the planning
thread waited 7 ms for the GIL right after handing the read to the other
thread, and the call took 20 ms for 15 ms of CPU. While a feed runs, the
switch interval is lowered to :data:`SWITCH_SECONDS` (the same call: 14 ms),
and set back when the last feed running in the process ends. Other threads
of the process see the lower interval meanwhile: threads that compete for
the GIL take turns more often, which costs them little.

The second thread is the process's (:func:`worker`), not one started per
call: starting a thread waits until the new thread runs, which on a busy
machine took several milliseconds of a feed of a few.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

SWITCH_SECONDS = 0.0002

_lock = threading.Lock()
_running = [0]  # feeds running in the process
_saved = [0.005]  # the switch interval before the first of them started
WORKERS = 2  # one per feed running at once; a third feed's reads wait for a free one
_pool: list[tuple[int, ThreadPoolExecutor]] = []  # (process id, the workers): a forked child starts its own


@contextmanager
def prompt_handover() -> Iterator[None]:
    """Run the block with CPython's switch interval at most :data:`SWITCH_SECONDS` (see the module docstring)."""
    with _lock:
        if _running[0] == 0:
            _saved[0] = sys.getswitchinterval()
            if _saved[0] > SWITCH_SECONDS:  # a lower interval is left alone (setting one rounds it)
                sys.setswitchinterval(SWITCH_SECONDS)
        _running[0] += 1
    try:
        yield
    finally:
        with _lock:
            _running[0] -= 1
            if _running[0] == 0 and _saved[0] > SWITCH_SECONDS:
                sys.setswitchinterval(_saved[0])


def worker() -> ThreadPoolExecutor:
    """The threads the embedded feed hands its reads to (started on first use, then kept by the process).

    Nothing run there waits for another task of this pool, so feeds running at once never wait for each other
    for more than a free thread.
    """
    with _lock:
        if not _pool or _pool[0][0] != os.getpid():
            _pool[:] = [(os.getpid(), ThreadPoolExecutor(WORKERS, thread_name_prefix="lineage-feed"))]
        return _pool[0][1]
