"""Reading a whole object of an S3-compatible store in one request.

pyarrow's S3 file system (and DuckDB's ``httpfs``) asks for an object's size
with a HEAD request before every read, so reading a small file whole costs
two round trips. Where the whole object is wanted (lineage and index files,
the small files a scan fetches at once) :func:`get` sends a single
``GetObject`` through botocore, with the bucket's settings
(without keys, botocore's own credential chain: environment, profile,
instance role); :func:`get_range` reads a byte range (the tail of a file
with its footer, a row group's column chunks) and learns the object's size
from the same reply. One client per set of settings, shared by threads.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlparse

from lineage.storage.settings import StoreSettings

MAX_CONNECTIONS = 32  # pooled connections per client (readers fetch up to PARALLEL_REQUESTS objects at once)

_LOCK = threading.Lock()
_CLIENTS: dict[StoreSettings, Any] = {}


def _client(settings: StoreSettings) -> Any:
    with _LOCK:
        client = _CLIENTS.get(settings)
        if client is None:
            import botocore.config
            import botocore.session

            style = "virtual" if settings.virtual_addressing else ("path" if settings.endpoint is not None else "auto")
            config = botocore.config.Config(max_pool_connections=MAX_CONNECTIONS, s3={"addressing_style": style},
                                            retries={"max_attempts": 3, "mode": "standard"})
            kwargs: dict[str, Any] = {"region_name": settings.region, "config": config}
            if settings.endpoint is not None:
                kwargs["endpoint_url"] = settings.endpoint
            if settings.access_key_id:
                kwargs.update(aws_access_key_id=settings.access_key_id, aws_secret_access_key=settings.secret_access_key,
                              aws_session_token=settings.session_token)
            client = _CLIENTS[settings] = botocore.session.get_session().create_client("s3", **kwargs)
        return client


def get(location: str, settings: StoreSettings) -> bytes:
    """The whole object at ``s3://bucket/key`` (``FileNotFoundError`` when there is none, ``OSError`` when unreadable)."""
    return get_range(location, settings, None)[0]


def get_range(location: str, settings: StoreSettings, byte_range: str | None) -> tuple[bytes, int]:
    """Bytes of the object at ``location`` and its total size, in one request.

    ``byte_range`` is an HTTP range without the unit: ``"0-99"`` (the first
    100 bytes), ``"-65536"`` (the last 64 KiB, or the whole object when it
    is smaller), None (everything).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(location)
    kwargs = {"Bucket": parsed.netloc, "Key": parsed.path.lstrip("/")}
    if byte_range is not None:
        kwargs["Range"] = f"bytes={byte_range}"
    try:
        reply = _client(settings).get_object(**kwargs)
        data = reply["Body"].read()
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404", "NotFound"):
            raise FileNotFoundError(location) from None
        raise OSError(f"reading {location} failed: {code or exc}") from None
    except BotoCoreError as exc:
        raise OSError(f"reading {location} failed: {exc}") from None
    whole = reply.get("ContentRange")  # "bytes 0-99/1234" for a range
    return data, int(whole.rsplit("/", 1)[1]) if whole else len(data)


def _forget_clients() -> None:  # a forked child opens its own connections
    _CLIENTS.clear()


os.register_at_fork(after_in_child=_forget_clients)
