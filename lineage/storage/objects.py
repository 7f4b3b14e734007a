"""Bytes of object-store objects this process holds in memory: written and still in flight, or small and recent.

Objects are written once under fresh names and never rewritten, so a copy
held here cannot go stale. :mod:`lineage.storage.puts` pins an object while
its PUT is in flight (a commit may read back what it just wrote) and offers
it to the recent ones when it landed; readers offer small objects they
fetched whole (:mod:`lineage.storage.files`). :func:`known` serves both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

RECENT_BYTES = 64 << 20  # landed objects kept (least recently used dropped first)
RECENT_MAX_OBJECT = 4 << 20  # larger objects are not kept once they landed

_LOCK = threading.Lock()
_PINNED: dict[str, bytes] = {}
_RECENT: OrderedDict[str, bytes] = OrderedDict()
_held = 0


def pin(location: str, data: bytes) -> None:
    """Hold ``data`` for ``location`` until :func:`unpin` (an object whose PUT is in flight)."""
    with _LOCK:
        _PINNED[location] = data


def unpin(location: str) -> None:
    """Stop holding the pinned bytes of ``location``."""
    with _LOCK:
        _PINNED.pop(location, None)


def remember(location: str, data: bytes) -> None:
    """Keep ``data`` for ``location`` while it fits (nothing when larger than :data:`RECENT_MAX_OBJECT`)."""
    global _held
    if len(data) > RECENT_MAX_OBJECT:
        return
    with _LOCK:
        old = _RECENT.pop(location, None)
        _held += len(data) - (len(old) if old is not None else 0)
        _RECENT[location] = data
        while _held > RECENT_BYTES:
            _, dropped = _RECENT.popitem(last=False)
            _held -= len(dropped)


def known(location: str) -> bytes | None:
    """The bytes of the object at ``location`` when held here, else None."""
    with _LOCK:
        data = _PINNED.get(location)
        if data is None:
            data = _RECENT.get(location)
            if data is not None:
                _RECENT.move_to_end(location)
        return data


def discard(location: str) -> None:
    """Stop holding ``location``'s bytes (the object was deleted)."""
    global _held
    with _LOCK:
        old = _RECENT.pop(location, None)
        if old is not None:
            _held -= len(old)


def forget() -> None:
    """Drop every landed object held (a benchmark measuring a fresh reader calls it); pinned ones stay."""
    global _held
    with _LOCK:
        _RECENT.clear()
        _held = 0
