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
