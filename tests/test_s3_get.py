"""lineage.storage.s3_get: single-request reads of an S3-compatible store (signed HTTP GETs, no botocore client)."""

from __future__ import annotations

import pytest
from lakes import ACCESS_KEY, REGION, SECRET_KEY

import lineage.storage.s3_get as s3_get
from lineage.storage.settings import StoreSettings


def _settings(server) -> StoreSettings:  # noqa: ANN001
    return StoreSettings(endpoint=server.endpoint, region=REGION, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)


def test_whole_objects_ranges_sizes_and_missing_keys(moto_server):
    bucket = moto_server.new_bucket()
    client = moto_server.client()
    body = bytes(range(256)) * 40  # 10,240 bytes
    keys = ["wh/t/data/plain.parquet", "wh/t/data/a key+with=odd&chars ü.parquet", "wh/t/empty"]
    for key in keys[:2]:
        client.put_object(Bucket=bucket, Key=key, Body=body)
    client.put_object(Bucket=bucket, Key=keys[2], Body=b"")
    settings = _settings(moto_server)
    for key in keys[:2]:
        location = f"s3://{bucket}/{key}"
        assert s3_get.get(location, settings) == body
        assert s3_get.get_range(location, settings, "0-99") == (body[:100], len(body))
        assert s3_get.get_range(location, settings, "-64") == (body[-64:], len(body))
        assert s3_get.get_range(location, settings, "-65536") == (body, len(body))  # shorter than asked: all of it
        assert s3_get.get_range(location, settings, "10000-20000") == (body[10000:], len(body))
    assert s3_get.get(f"s3://{bucket}/{keys[2]}", settings) == b""
    with pytest.raises(FileNotFoundError):
        s3_get.get(f"s3://{bucket}/wh/t/data/missing.parquet", settings)
    with pytest.raises((FileNotFoundError, OSError)):
        s3_get.get(f"s3://no-such-bucket-{bucket}/x", settings)


def test_an_unreachable_endpoint_is_an_os_error():
    settings = StoreSettings(endpoint="http://127.0.0.1:9", region=REGION, access_key_id="k", secret_access_key="very-secret")
    with pytest.raises(OSError, match="reading s3://b/k failed") as info:
        s3_get.get("s3://b/k", settings)
    assert "very-secret" not in str(info.value)


def test_object_urls():
    aws = StoreSettings(region="eu-west-1")
    assert s3_get.object_url("s3://lake/wh/a b.parquet", aws) == "https://lake.s3.eu-west-1.amazonaws.com/wh/a%20b.parquet"
    assert s3_get.object_url("s3://my.lake/k", aws) == "https://s3.eu-west-1.amazonaws.com/my.lake/k"
    local = StoreSettings(endpoint="http://127.0.0.1:9000/")
    assert s3_get.object_url("s3://lake/wh/k=1/f.parquet", local) == "http://127.0.0.1:9000/lake/wh/k%3D1/f.parquet"
    virtual = StoreSettings(endpoint="https://store.example.com", virtual_addressing=True)
    assert s3_get.object_url("s3://lake/k", virtual) == "https://lake.store.example.com/k"


def test_a_range_past_the_end_reads_no_bytes(moto_server):
    bucket = moto_server.new_bucket()
    body = bytes(range(256)) * 4
    moto_server.client().put_object(Bucket=bucket, Key="k", Body=body)
    settings = _settings(moto_server)
    assert s3_get.get_range(f"s3://{bucket}/k", settings, "5000-5099") == (b"", len(body))
    assert files_read_range(f"s3://{bucket}/k", 1000, 100, settings) == body[1000:]
    assert files_read_range(f"s3://{bucket}/k", 2000, 100, settings) == b""


def files_read_range(location: str, offset: int, length: int, settings: StoreSettings) -> bytes:
    """lineage.storage.files.read_range with the bucket's settings given (what a catalog's properties would say)."""
    from unittest import mock

    import lineage.storage.files as files

    with mock.patch.object(files, "settings_for", lambda _: settings):
        return files.read_range(location, offset, length)


def test_a_store_that_ignores_range_still_gives_the_bytes_asked_for(fake_store) -> None:  # noqa: ANN001
    # Range support is optional in HTTP: a server may answer 200 with the whole object; the reader then keeps only
    # the bytes asked for, and the object's size is the body's
    body = bytes(range(256)) * 40
    _Store.body, _Store.ignore_range = body, True
    location = "s3://b/wh/t/data/f.parquet"
    assert s3_get.get_range(location, fake_store, "100-199") == (body[100:200], len(body))
    assert s3_get.get_range(location, fake_store, "10000-") == (body[10000:], len(body))
    assert s3_get.get_range(location, fake_store, "-64") == (body[-64:], len(body))
    assert s3_get.get_range(location, fake_store, "-65536") == (body, len(body))
    assert files_read_range(location, 5, 10, fake_store) == body[5:15]


class _Store:
    """A fake store serving one object: honouring Range as RFC 9110 says (206, or 416 with ``bytes */size`` when no
    byte of it exists: a range starting at or past the end, a zero suffix, any range of an empty object) or, set to
    ignore it, answering 200 with the whole object."""

    body = b""
    ignore_range = False

    @classmethod
    def answer(cls, header: str | None) -> tuple[int, bytes, str | None]:
        n = len(cls.body)
        if header is None or cls.ignore_range:
            return 200, cls.body, None
        start, _, end = header.removeprefix("bytes=").partition("-")
        if not start:
            first, last = max(n - int(end), 0), n - 1
            if int(end) == 0 or n == 0:
                return 416, b"", f"bytes */{n}"
        else:
            first, last = int(start), min(int(end), n - 1) if end else n - 1
            if first >= n:
                return 416, b"", f"bytes */{n}"
        return 206, cls.body[first:last + 1], f"bytes {first}-{last}/{n}"


@pytest.fixture(scope="module")
def fake_store():  # noqa: ANN201
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, data, content_range = _Store.answer(self.headers.get("Range"))
            self.send_response(status)
            if content_range:
                self.send_header("Content-Range", content_range)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield StoreSettings(endpoint=f"http://127.0.0.1:{server.server_port}", region=REGION, access_key_id="k", secret_access_key="s")
    server.shutdown()
    server.server_close()


def test_get_range_gives_the_bytes_of_the_range_and_the_size_whatever_the_store_answers(fake_store) -> None:  # noqa: ANN001
    """Every range of every small object (empty included, ranges ending exactly at the end or past it, suffixes longer
    than the object), from a store that honours Range (206, 416) and from one that ignores it (200): the bytes are
    the object's slice the range names, the size is the object's, and files.read_range gives body[offset:offset+length]."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=int(__import__("os").environ.get("LINEAGE_PROPERTY_EXAMPLES", "60")), deadline=None)
    @given(size=st.integers(0, 20), a=st.integers(0, 25), b=st.integers(0, 25), kind=st.sampled_from(["a-b", "a-", "-b"]),
           ignore=st.booleans())
    def check(size: int, a: int, b: int, kind: str, ignore: bool) -> None:
        _Store.body, _Store.ignore_range = bytes(range(size)), ignore
        body = _Store.body
        if kind == "a-b":
            a, b = min(a, b), max(a, b)
            byte_range, expected = f"{a}-{b}", body[a:b + 1]
        elif kind == "a-":
            byte_range, expected = f"{a}-", body[a:]
        else:
            byte_range, expected = f"-{b}", body[max(len(body) - b, 0):] if b else b""
        assert s3_get.get_range("s3://b/k", fake_store, byte_range) == (expected, size)
        assert files_read_range("s3://b/k", a, b, fake_store) == body[a:a + b]

    check()
