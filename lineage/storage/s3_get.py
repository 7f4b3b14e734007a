"""Reading a whole object of an S3-compatible store, or a byte range of it, in one request; writing and removing objects.

pyarrow's S3 file system (and DuckDB's ``httpfs``) asks for an object's size
with a HEAD request before every read, so reading a small file whole costs
two round trips. Where the whole object is wanted (lineage and index files,
the small files a scan fetches at once) :func:`get` sends a single
``GetObject``; :func:`get_range` reads a byte range (the tail of a file
with its footer, a row group's column chunks) and learns the object's size
from the same reply.

A request is a plain HTTP GET signed with AWS Signature Version 4
(botocore's signer) and sent through a pooled ``urllib3`` connection: no
botocore client, whose creation loads the whole S3 service model (a JSON
file of several MB: about 0.15 s of CPU on a quiet 2-core machine, paid by
the first read of every process) and whose event machinery costs
milliseconds per call. Credentials are the bucket's settings, or without
keys botocore's own credential chain (environment, profile, instance
role), resolved when a request is signed so that expiring credentials
refresh. One connection pool per set of settings, shared by threads.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from html import unescape
from urllib.parse import quote, urlparse
from xml.sax.saxutils import escape

from lineage.storage.settings import StoreSettings

MAX_CONNECTIONS = 64  # pooled connections per endpoint, at least (readers keep parallel_reads() requests in flight)
ENV_PARALLEL_READS = "LINEAGE_S3_PARALLEL_READS"
DEFAULT_PARALLEL_READS = 64
ATTEMPTS = 3  # a request that fails with a connection error or a 5xx/429/503 reply is sent again, up to this often
_RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})

_LOCK = threading.Lock()
_ISSUED = [0]  # requests this process issued (see issued())


def issued() -> int:
    """How many requests this process has issued to object stores so far: each request :func:`_send` makes (a PUT
    counted by :mod:`lineage.storage.puts` when it queues it, in the background or not: :func:`count_put`). A
    commit compares two readings to know how many it sent (:mod:`lineage.storage.removals`)."""
    return _ISSUED[0]


def count_put() -> None:
    """Count a PUT now, when it is queued, rather than when a background thread sends it."""
    with _LOCK:
        _ISSUED[0] += 1


@dataclass
class _Endpoint:
    """How to sign and send requests for one set of settings."""

    pool: Any  # urllib3.PoolManager
    credentials: Any  # botocore Credentials (refreshing ones for the credential chain), or None: unsigned
    region: str


_ENDPOINTS: dict[StoreSettings, _Endpoint] = {}


def _endpoint(settings: StoreSettings) -> _Endpoint:
    with _LOCK:
        found = _ENDPOINTS.get(settings)
        if found is None:
            import urllib3
            from botocore.httpsession import get_cert_path

            if settings.access_key_id:
                from botocore.credentials import Credentials

                credentials = Credentials(settings.access_key_id, settings.secret_access_key, settings.session_token)
            else:
                import botocore.session

                credentials = botocore.session.get_session().get_credentials()
            bundle = os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
            pool = urllib3.PoolManager(num_pools=16, maxsize=max(MAX_CONNECTIONS, parallel_reads()),
                                       cert_reqs="CERT_REQUIRED", ca_certs=bundle,
                                       retries=False, timeout=urllib3.Timeout(connect=10.0, read=60.0))
            found = _ENDPOINTS[settings] = _Endpoint(pool, credentials, settings.region)
        return found


def parallel_reads() -> int:
    """GET requests a reader keeps in flight at once (``LINEAGE_S3_PARALLEL_READS``, default 64).

    A scan of a table of many small files (the files of small commits) fetches
    them all, one GET each: at tens of milliseconds a request, the number in
    flight sets the scan's time. ``InvalidArgumentError`` for a value that is
    no whole number from 1 to 1024.
    """
    raw = os.environ.get(ENV_PARALLEL_READS, "").strip()
    if not raw:
        return DEFAULT_PARALLEL_READS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        from lineage.errors import InvalidArgumentError

        raise InvalidArgumentError(f"{ENV_PARALLEL_READS} must be a whole number of requests from 1 to 1024, got {raw!r}")
    return value


def object_url(location: str, settings: StoreSettings) -> str:
    """The HTTP URL of the object at ``s3://bucket/key`` under ``settings`` (path-style for a custom endpoint)."""
    parsed = urlparse(location)
    bucket, key = parsed.netloc, quote(parsed.path.lstrip("/"), safe="/~")
    if settings.endpoint is None:
        host = f"s3.{settings.region}.amazonaws.com"
        if "." in bucket or bucket.lower() != bucket:  # not a DNS-compatible name: path-style
            return f"https://{host}/{bucket}/{key}"
        return f"https://{bucket}.{host}/{key}"
    base = settings.endpoint if "://" in settings.endpoint else f"https://{settings.endpoint}"
    base = base.rstrip("/")
    if settings.virtual_addressing:
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{bucket}.{rest}/{key}"
    return f"{base}/{bucket}/{key}"


def get(location: str, settings: StoreSettings) -> bytes:
    """The whole object at ``s3://bucket/key`` (``FileNotFoundError`` when there is none, ``OSError`` when unreadable)."""
    return get_range(location, settings, None)[0]


def get_range(location: str, settings: StoreSettings, byte_range: str | None) -> tuple[bytes, int]:
    """Bytes of the object at ``location`` and its total size, in one request.

    ``byte_range`` is an HTTP range without the unit: ``"0-99"`` (the first
    100 bytes), ``"-65536"`` (the last 64 KiB, or the whole object when it
    is smaller), None (everything).
    """
    headers = {} if byte_range is None else {"Range": f"bytes={byte_range}"}
    reply = _send("GET", location, object_url(location, settings), settings, headers, f"reading {location}")
    whole = reply.headers.get("Content-Range")  # "bytes 0-99/1234" for a range, "bytes */1234" with 416
    if reply.status == 416:  # the range starts at or past the end
        return b"", _size_refused(reply, byte_range or "")
    data = reply.data
    if byte_range is not None and reply.status == 200:  # a store that ignores Range sends the whole object
        return data[_range_slice(byte_range, len(data))], len(data)
    return data, int(whole.rsplit("/", 1)[1]) if whole else len(data)


def _size_refused(reply: Any, byte_range: str) -> int:
    """The object's size from a reply refusing ``byte_range`` (416): its ``Content-Range`` or S3's ``ActualObjectSize``.

    A store that says neither refused a suffix range only for an empty object;
    for another range the size is unknown, an ``OSError``.
    """
    whole = reply.headers.get("Content-Range") or ""  # "bytes */1234"
    if whole.rsplit("/", 1)[-1].isdigit():
        return int(whole.rsplit("/", 1)[1])
    found = re.search(rb"<ActualObjectSize>(\d+)</ActualObjectSize>", reply.data)
    if found:
        return int(found.group(1))
    if byte_range.startswith("-"):
        return 0
    raise OSError(f"the store refused the range {byte_range} and did not say the object's size")


def _range_slice(byte_range: str, size: int) -> slice:
    """The part of a whole object of ``size`` bytes that the HTTP range ``byte_range`` ("a-b", "a-", "-n") names."""
    start, _, end = byte_range.partition("-")
    if not start:
        return slice(max(size - int(end), 0), size)
    return slice(int(start), int(end) + 1 if end else size)


def put(location: str, data: bytes, settings: StoreSettings) -> None:
    """Write ``data`` as the object at ``location`` with one ``PutObject`` request (``OSError`` when it fails).

    The caller names a fresh object (files are written once): sending the
    same request again after a connection error or a 5xx reply is safe.
    pyarrow's output stream costs more CPU per object (a stream, a
    background upload and its bookkeeping) for the same single request.
    """
    _send("PUT", location, object_url(location, settings), settings, {"Content-Type": "application/octet-stream"},
          f"writing {location}", bytes(data))


def delete(location: str, settings: StoreSettings) -> None:
    """Remove the object at ``location`` with one ``DeleteObject`` request (a missing object is no error).

    pyarrow's ``delete_file`` sends a HEAD first and, when the key's folder
    looks empty afterwards, a PUT of a folder marker: three requests for one.
    """
    _send("DELETE", location, object_url(location, settings), settings, {}, f"removing {location}")


def delete_objects(locations: list[str], settings: StoreSettings) -> list[str]:
    """Remove up to 1000 objects of one bucket with one ``DeleteObjects`` request; the locations it could not remove.

    Missing objects count as removed (S3's rule). ``OSError`` when the request itself fails.
    """
    if not locations:
        return []
    if len(locations) > 1000:
        raise ValueError(f"DeleteObjects takes at most 1000 keys, got {len(locations)}")
    parsed = [urlparse(loc) for loc in locations]
    bucket = parsed[0].netloc
    if any(p.netloc != bucket for p in parsed):
        raise ValueError("DeleteObjects removes objects of one bucket")
    keys = "".join(f"<Object><Key>{escape(p.path.lstrip('/'))}</Key></Object>" for p in parsed)
    body = f'<?xml version="1.0" encoding="UTF-8"?><Delete><Quiet>true</Quiet>{keys}</Delete>'.encode()
    url = object_url(f"s3://{bucket}/", settings) + "?delete"
    headers = {"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode(), "Content-Type": "application/xml"}
    reply = _send("POST", f"s3://{bucket}/", url, settings, headers, f"removing {len(locations)} objects of {bucket}", body)
    failed = set(re.findall(rb"<Error>\s*<Key>([^<]*)</Key>", reply.data))
    return [loc for loc, p in zip(locations, parsed) if unescape(p.path.lstrip("/")).encode() in failed]


def _send(method: str, location: str, url: str, settings: StoreSettings, headers: dict[str, str], what: str,
          body: bytes | None = None) -> Any:
    """One signed request, sent again on a connection error or a 5xx/429 reply; the reply (2xx) or the error raised."""
    endpoint = _endpoint(settings)
    if method != "PUT":  # PUTs are counted when queued (count_put)
        with _LOCK:
            _ISSUED[0] += 1
    for attempt in range(1, ATTEMPTS + 1):
        try:
            reply = endpoint.pool.request(method, url, body=body, headers=_signed(endpoint, method, url, headers, body),
                                          preload_content=True)
        except Exception as exc:  # noqa: BLE001 - urllib3's connection errors: sent again, then reported
            if attempt == ATTEMPTS:
                raise OSError(f"{what} failed: {type(exc).__name__}: {exc}") from None
        else:
            if 200 <= reply.status < 300 or (reply.status == 416 and method == "GET"):
                return reply  # 416: a range past the object's end, which get_range answers with no bytes
            if reply.status == 404 and method == "GET":
                raise FileNotFoundError(location)
            if reply.status == 404 and method == "DELETE":
                return reply  # some stores answer 404 for a missing key: removed either way
            if reply.status not in _RETRIED_STATUS or attempt == ATTEMPTS:
                raise OSError(f"{what} failed: HTTP {reply.status} {_error_code(reply.data)}".rstrip())
        time.sleep(0.05 * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _signed(endpoint: _Endpoint, method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> dict[str, str]:
    """``headers`` with the SigV4 signature of the request (unchanged without credentials: anonymous requests)."""
    if endpoint.credentials is None:
        return headers
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    S3SigV4Auth(endpoint.credentials.get_frozen_credentials(), "s3", endpoint.region).add_auth(request)
    return dict(request.headers.items())


def _error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 error reply, if it has one (never the message: it may quote a request's details)."""
    start = body.find(b"<Code>")
    end = body.find(b"</Code>", start)
    return body[start + 6:end].decode("utf-8", "replace") if start >= 0 and end > start else ""


def _forget_clients() -> None:  # a forked child opens its own connections
    _ENDPOINTS.clear()


os.register_at_fork(after_in_child=_forget_clients)
