"""The reference engine: Spark 3.5 with Apache Iceberg 1.10, a foreign Iceberg engine for interop tests.

- build.py: builds the engine from PyPI and Debian packages, cached per machine (``make reference-engine``);
- server.py (+ javawrites.py, protocol.py): runs under the engine's own Python, one Spark session;
- client.py: ``ReferenceEngine``, what tests use (through the ``reference`` fixture of tests/conftest.py).
"""

from __future__ import annotations

from .client import (
    FlinkCommit,
    ReferenceEngine,
    ReferenceEngineError,
    ReferenceRequestError,
    ReferenceServerError,
    SparkError,
)

__all__ = [
    "FlinkCommit",
    "ReferenceEngine",
    "ReferenceEngineError",
    "ReferenceRequestError",
    "ReferenceServerError",
    "SparkError",
]
