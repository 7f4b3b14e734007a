"""Values derived from immutable objects (schemas, table metadata), kept by the object's identity.

A commit asks for the same derived value many times (a table schema's Arrow
form, its write schema with the row lineage fields, the write metadata
pyiceberg's file writer takes): pyiceberg schemas and metadata are immutable
pydantic models that validate on construction, so rebuilding the value each
time costs milliseconds per commit. An entry holds its key object, so the
object's ``id`` cannot be reused while the entry lives; the oldest entries
leave first once the cache is full.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

V = TypeVar("V")


@dataclass
class IdentityCache(Generic[V]):
    """``build()`` of an immutable object, computed once per object (by identity), for the last ``size`` objects."""

    size: int = 256
    _entries: OrderedDict[int, tuple[Any, V]] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, obj: Any, build: Callable[[], V]) -> V:
        """The value kept for ``obj``, else ``build()`` (kept for ``obj`` from now on)."""
        with self._lock:
            hit = self._entries.get(id(obj))
            if hit is not None and hit[0] is obj:
                self._entries.move_to_end(id(obj))
                return hit[1]
        value = build()
        with self._lock:
            self._entries[id(obj)] = (obj, value)
            self._entries.move_to_end(id(obj))
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()


def struct_of(schema: Any) -> Any:
    """``schema.as_struct()`` of a pyiceberg ``Schema``, built once per schema object (a key of writer and schema caches)."""
    return _STRUCTS.get(schema, schema.as_struct)


_STRUCTS: IdentityCache[Any] = IdentityCache()
