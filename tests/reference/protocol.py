"""The wire format between the tests (client.py) and the reference engine's server (server.py).

Standard library only: the server imports this module under the engine's own Python (pyspark 3.5, no
project code), the client under the project's.

One message per line, UTF-8 JSON, over the server's stdin (requests) and a private copy of its original
stdout (responses); the server points file descriptor 1 at its log before Spark starts, so nothing the JVM
or a library prints can corrupt the stream.

- ``{"event": "ready", "protocol": 1, "versions": {...}, "pid": ...}``: sent once, when Spark is up.
- request: ``{"id": 7, "op": "sql", "args": {...}}``
- response: ``{"id": 7, "ok": true, "result": {...}, "seconds": 0.31}`` or
  ``{"id": 7, "ok": false, "error": {"kind": ..., "type": ..., "message": ..., "detail": ...}, "seconds": ...}``

Tables travel as files in an exchange folder that the client owns: the client writes inputs as Parquet
(Spark reads them), the server writes results as Arrow IPC files and answers ``{"arrow": path, ...}``; the
client reads and deletes them.

Error kinds: ``spark`` (Spark or Iceberg refused the operation: the message is theirs), ``request`` (the
request itself is wrong: unknown op, bad argument), ``internal`` (a bug in the server).
"""

from __future__ import annotations

import json
from typing import Any

PROTOCOL_VERSION = 1
READY = "ready"
ERROR_SPARK = "spark"
ERROR_REQUEST = "request"
ERROR_INTERNAL = "internal"


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line of bytes (JSON has no raw newlines, so the line is the frame)."""
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode("utf-8")


def decode(line: bytes | str) -> dict[str, Any]:
    """The message in one line; raises ValueError if it is not a JSON object."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"expected a JSON object, got {type(message).__name__}")
    return message
