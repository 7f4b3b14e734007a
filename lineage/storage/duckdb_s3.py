"""DuckDB reads tables on an object store through ``httpfs``, with the same settings as every other reader.

``httpfs`` comes from the PyPI package ``duckdb-extension-httpfs`` (loaded
from its wheel like every extension of this project; nothing is downloaded).
Each bucket this process knows (:func:`lineage.storage.files.registered`)
becomes a DuckDB S3 secret scoped to ``s3://bucket``; DuckDB keeps secrets
per database and shows their values redacted.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import lineage.storage.files as files
from lineage.storage.settings import StoreSettings

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

_LOCK = threading.Lock()
_DONE: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, int] = weakref.WeakKeyDictionary()


def attach(db: duckdb.DuckDBPyConnection, load_extension: Callable[[duckdb.DuckDBPyConnection, str], None]) -> None:
    """Give the database ``db`` (not yet sealed) ``httpfs`` and a secret per known bucket; nothing when no bucket is known.

    ``load_extension(db, name)`` loads an extension from its wheel
    (:mod:`lineage.duck`); it raises an error naming the missing package.
    Called again after a bucket's settings changed, it replaces the secrets.
    """
    buckets = files.registered()
    if not buckets:
        return
    generation = files.generation()
    with _LOCK:
        done = _DONE.get(db)
        if done == generation:
            return
        if done is None:
            load_extension(db, "httpfs")
        for bucket, settings in sorted(buckets.items()):
            db.execute(secret_sql(bucket, settings))
        _DONE[db] = generation


def secret_sql(bucket: str, settings: StoreSettings) -> str:
    """The ``CREATE OR REPLACE SECRET`` statement for ``bucket`` (it holds the secret key: never log it)."""
    name = "lineage_s3_" + hashlib.sha1(bucket.encode()).hexdigest()[:16]
    parts = ["TYPE s3", f"REGION {_literal(settings.region)}", f"SCOPE {_literal('s3://' + bucket)}"]
    if settings.access_key_id:
        parts += [f"KEY_ID {_literal(settings.access_key_id)}", f"SECRET {_literal(settings.secret_access_key or '')}"]
        if settings.session_token:
            parts.append(f"SESSION_TOKEN {_literal(settings.session_token)}")
    if settings.endpoint is not None:
        parts += [f"ENDPOINT {_literal(settings.host or '')}", f"USE_SSL {'true' if settings.scheme == 'https' else 'false'}"]
    parts.append(f"URL_STYLE {_literal('vhost' if settings.virtual_addressing or settings.endpoint is None else 'path')}")
    return f"CREATE OR REPLACE SECRET {name} ({', '.join(parts)})"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
