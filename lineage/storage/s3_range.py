"""One ranged GET of an S3 object, signed with AWS Signature Version 4: a single request, no HEAD first.

pyarrow's S3 file system asks for an object's size (a HEAD request) before
any read, so a read of a few bytes at a known offset (a deletion vector a
manifest entry locates) costs two requests. :func:`get_range` sends just the
GET with a ``Range`` header, for stores reached with an access key (the
settings of :mod:`lineage.storage.settings`); :func:`supported` says when it
applies (other credentials, such as an instance role, go through pyarrow).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import http.client
import threading
from urllib.parse import quote

from lineage.storage.settings import StoreSettings

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_TIMEOUT = 60.0
_LOCAL = threading.local()


def supported(settings: StoreSettings) -> bool:
    """Whether :func:`get_range` can sign requests with these settings (an access key pair is known)."""
    return bool(settings.access_key_id and settings.secret_access_key)


def _address(settings: StoreSettings, bucket: str, key: str) -> tuple[str, str, str]:
    """(scheme, host, path) of the object: path-style unless virtual addressing is asked for."""
    host = settings.host or f"s3.{settings.region}.amazonaws.com"
    path = "/" + quote(key, safe="/-_.~")
    if settings.virtual_addressing:
        return settings.scheme, f"{bucket}.{host}", path
    return settings.scheme, host, f"/{quote(bucket, safe='-_.~')}{path}"


def _sign(settings: StoreSettings, host: str, path: str, headers: dict[str, str], now: _dt.datetime) -> None:
    """Add the SigV4 ``Authorization`` header (and its dated headers) to ``headers``."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    headers.update({"host": host, "x-amz-date": stamp, "x-amz-content-sha256": _EMPTY_SHA256})
    if settings.session_token:
        headers["x-amz-security-token"] = settings.session_token
    names = sorted(headers)
    canonical = "\n".join([
        "GET", path, "", *(f"{n}:{headers[n].strip()}" for n in names), "", ";".join(names), _EMPTY_SHA256,
    ])
    scope = f"{day}/{settings.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + (settings.secret_access_key or "")).encode()
    for part in (day, settings.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={settings.access_key_id}/{scope}, "
                                f"SignedHeaders={';'.join(names)}, Signature={signature}")


def _connection(scheme: str, host: str, fresh: bool) -> http.client.HTTPConnection:
    """This thread's kept-alive connection to ``host`` (a new one when ``fresh``)."""
    pool = getattr(_LOCAL, "pool", None)
    if pool is None:
        pool = _LOCAL.pool = {}
    conn = pool.get((scheme, host))
    if conn is None or fresh:
        if conn is not None:
            conn.close()
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = pool[(scheme, host)] = cls(host, timeout=_TIMEOUT)
    return conn


def get_range(settings: StoreSettings, bucket: str, key: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of ``s3://bucket/key`` (fewer at its end) in one signed GET.

    Raises ``FileNotFoundError`` for a missing object and ``OSError`` for any
    other failure (the store's status and message).
    """
    scheme, host, path = _address(settings, bucket, key)
    for attempt in range(2):  # a kept-alive connection the store closed meanwhile is opened again once
        headers = {"range": f"bytes={offset}-{offset + length - 1}"}
        _sign(settings, host, path, headers, _dt.datetime.now(_dt.timezone.utc))
        conn = _connection(scheme, host, fresh=attempt > 0)
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
        except (http.client.HTTPException, ConnectionError) as exc:
            conn.close()
            if attempt:
                raise OSError(f"GET s3://{bucket}/{key} failed: {exc}") from exc
            continue
        if response.status == 206:
            return body
        if response.status == 200:  # a store that ignores Range sends the whole object
            return body[offset:offset + length]
        if response.status == 416:  # the range starts at or past the end
            return b""
        if response.status == 404:
            raise FileNotFoundError(f"s3://{bucket}/{key}")
        raise OSError(f"GET s3://{bucket}/{key} (bytes {offset}-{offset + length - 1}) failed with HTTP "
                      f"{response.status}: {body[:300].decode(errors='replace')}")
    raise AssertionError("unreachable")
