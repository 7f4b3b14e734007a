"""Every operation on a table whose warehouse is ``s3://`` (a real S3 HTTP server, moto, on 127.0.0.1).

The same steps run on a local warehouse too (the ``lake`` fixture), so a
difference between the two is a failure here.
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

import cdf
import cdf.mv
import lineage
from conftest import SCHEMA, assert_interop, rows
from lineage.maintenance.verify import verify


def _batch(ids, names=None, amounts=None) -> pa.Table:  # noqa: ANN001
    ids = list(ids)
    return pa.table({"id": ids, "name": names or [f"n{i}" for i in ids], "amount": amounts or [float(i) for i in ids]},
                    schema=SCHEMA)


@pytest.mark.parametrize("capture", ["false", "true"])
def test_writes_feed_and_maintenance(lake, capture) -> None:
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], properties={"lineage.cdf.capture-preimages": capture},
                             **lake.where())
    assert t.iceberg.metadata.location.startswith(lake.warehouse)
    t.append(_batch(range(1, 11)))
    t.update("id <= 2", {"amount": "amount + 100"})
    t.delete("id = 3")
    t.upsert(_batch([4, 11], ["four", "eleven"], [4.5, 11.0]))
    t.merge(_batch([5, 12], ["merged", "twelve"]), deletes=pa.table({"id": [8]}))
    t.update("id = 6", {"name": "'cow'"}, mode=lineage.COPY_ON_WRITE)
    t.apply_changelog(pa.table({"id": [7, 13], "name": ["seven", "thirteen"], "amount": [7.0, 13.0],
                                "op": ["+U", "+I"]}), op_column="op", upsert=True)
    again = lineage.open_table("shop.orders", **lake.where())
    live = {r[0]: r for r in rows(again.scan(), ["id", "name", "amount"])}
    assert sorted(live) == [1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13]
    assert live[1][2] == 101.0 and live[4][1] == "four" and live[5][1] == "merged" and live[6][1] == "cow"
    assert live[7][1] == "seven" and live[13][1] == "thirteen"
    assert again.count("id > 10") == 3

    feed = cdf.changes(again, 0)
    kinds = feed.column("_change_type").to_pylist()
    assert kinds.count("delete") == 2 and kinds.count("update_preimage") == kinds.count("update_postimage") == 6
    assert kinds.count("insert") == 13
    net = cdf.changes(again, 1, net=True)
    assert sorted(net.column("_change_type").to_pylist()).count("delete") == 2
    batches = pa.Table.from_batches(list(cdf.change_batches(again, 0, batch_rows=3)))
    assert rows(batches) == rows(feed)
    deleted = cdf.deleted_rows(again, 0)
    assert deleted.num_rows >= 1
    assert_interop(again)

    assert not verify(again).problems
    again.compact()
    again.rewrite_deletes()
    again.expire_snapshots(retain_last=2)
    report = again.vacuum(older_than=datetime.timedelta(0))
    assert report.files_removed > 0
    assert not verify(again).problems
    assert rows(again.scan(), ["id", "name", "amount"]) == sorted(live.values(), key=repr)
    # the feed of the versions retention kept still reads
    last = again.version
    assert cdf.changes(again, last - 1).num_rows >= 0


def test_key_index_views_adoption_and_purge(lake) -> None:
    cat = lake.catalog()
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], catalog=cat)
    t.append(_batch(range(1, 21)))
    with pytest.raises(lineage.KeyViolationError):
        t.append(_batch([5]))  # the key index finds the live key
    t.upsert(_batch([5, 21], ["five", "x"]))
    view = cdf.mv.create("shop.totals", t, "SELECT name, count(*) AS n, sum(amount) AS total FROM shop.orders GROUP BY name",
                         catalog=cat)
    view.refresh()
    t.delete("id <= 3")
    result = view.refresh()
    assert result is not None
    got = rows(lineage.open_table("shop.totals", catalog=cat).scan(with_lineage=False), ["name", "n", "total"])
    expected = {}
    for r in t.scan().to_pylist():
        n, s = expected.get(r["name"], (0, 0.0))
        expected[r["name"]] = (n + 1, s + r["amount"])
    assert got == sorted(((k, n, s) for k, (n, s) in expected.items()), key=repr)

    # a foreign writer (pyiceberg) appends: the next open reconciles it; then an adopted plain table
    t.iceberg.append(_batch([100, 101]).cast(t.iceberg.schema().as_arrow()))
    again = lineage.open_table("shop.orders", catalog=cat)
    assert {100, 101} <= set(again.scan().column("id").to_pylist())
    plain = cat.create_table("shop.plain", schema=SCHEMA)
    plain.append(_batch([1, 2, 3]))
    adopted = lineage.adopt("shop.plain", key=["id"], catalog=cat)
    assert adopted.version >= 1
    assert sorted(lineage.open_table("shop.plain", catalog=cat).scan().column("id").to_pylist()) == [1, 2, 3]

    again.purge("id = 4")
    again.rehome(max_live_fraction=1.0)
    assert 4 not in again.scan().column("id").to_pylist()
    assert not verify(again).problems


@pytest.mark.spark
def test_spark_reads_writes_and_feeds_an_s3_table(s3, spark) -> None:
    """Spark's executors read the table through pyarrow (this session has no hadoop-aws jar)."""
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], properties={"lineage.cdf.capture-preimages": "true"},
                             **s3.where())
    t.append(spark.createDataFrame(_batch(range(1, 7))))
    t.upsert(spark.createDataFrame(_batch([2, 7], ["B", "g"])))
    t.delete("id = 3")
    t.update("id = 4", {"amount": "amount * 2"})
    assert rows(t.to_spark(spark).toArrow()) == rows(t.scan())
    for net in (False, True):
        theirs = cdf.changes(t, 0, net=net, engine="spark", spark=spark).toArrow()
        assert rows(theirs) == rows(cdf.changes(t, 0, net=net))
    assert rows(cdf.deleted_rows(t, engine="spark", spark=spark).toArrow()) == rows(cdf.deleted_rows(t))


def test_cli_on_an_s3_warehouse(s3, tmp_path) -> None:
    import json
    import subprocess
    import sys

    from lakes import SECRET_KEY

    def run(*args: str) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, "-m", "lineage.cli", *s3.cli(), *args], capture_output=True, text=True, timeout=300)
        assert SECRET_KEY not in p.stdout + p.stderr  # never shown, not even with --debug
        assert p.returncode == 0, (args, p.returncode, p.stdout[-2000:], p.stderr[-4000:])
        return p

    created = run("--debug", "create", "shop.orders", "--schema", "id:long,name:string,amount:double", "--key", "id")
    assert created.returncode == 0, created.stderr
    (tmp_path / "a.csv").write_text("id,name,amount\n1,ann,10\n2,bob,20\n3,cy,30\n")
    assert run("append", "shop.orders", str(tmp_path / "a.csv")).returncode == 0
    assert run("update", "shop.orders", "--where", "id = 2", "--set", "amount=amount * 2").returncode == 0
    assert run("delete", "shop.orders", "--where", "id = 3").returncode == 0
    scan = json.loads(run("-f", "json", "scan", "shop.orders").stdout)
    assert sorted((r["id"], r["amount"]) for r in scan) == [(1, 10.0), (2, 40.0)]
    changes = json.loads(run("-f", "json", "changes", "shop.orders", "0").stdout)
    assert sorted(r["_change_type"] for r in changes).count("update_preimage") == 1
    info = json.loads(run("-f", "json", "info", "shop.orders").stdout)
    assert info["location"].startswith(s3.warehouse) and info["lineage"]["files_on_disk"] > 0
    for command in (("compact", "shop.orders"), ("vacuum", "shop.orders", "--older-than", "0s"), ("verify", "shop.orders"),
                    ("tables",)):
        p = run(*command)
        assert p.returncode == 0, (command, p.stdout, p.stderr)
    table = lineage.open_table("shop.orders", **s3.where())
    assert rows(table.scan(), ["id", "amount"]) == [(1, 10.0), (2, 40.0)]
    missing = subprocess.run([sys.executable, "-m", "lineage.cli", "--warehouse", s3.warehouse, "tables"], capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode == 2 and "needs a catalog" in missing.stderr


def test_settings_come_from_properties_then_environment_then_profile(tmp_path) -> None:
    import lineage.storage.duckdb_s3 as duckdb_s3
    from lineage.storage.settings import StoreSettings, resolve

    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = pk\naws_secret_access_key = ps\n"
                                          "[other]\naws_access_key_id = ok\naws_secret_access_key = os\n")
    (tmp_path / "config").write_text("[profile other]\nregion = eu-north-1\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"), "AWS_CONFIG_FILE": str(tmp_path / "config")}
    assert resolve({}, files) == StoreSettings(None, "us-east-1", "pk", "ps")
    assert resolve({}, {**files, "AWS_PROFILE": "other"}) == StoreSettings(None, "eu-north-1", "ok", "os")
    env = {**files, "AWS_ACCESS_KEY_ID": "ek", "AWS_SECRET_ACCESS_KEY": "es", "AWS_REGION": "ap-south-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    assert resolve({}, env) == StoreSettings("http://127.0.0.1:9000", "ap-south-1", "ek", "es")
    props = {"s3.endpoint": "minio:9000", "s3.access-key-id": "k", "s3.secret-access-key": "s", "s3.region": "r1"}
    got = resolve(props, env)
    assert got == StoreSettings("https://minio:9000", "r1", "k", "s") and got.host == "minio:9000"
    assert "secret" not in repr(resolve(props | {"s3.secret-access-key": "secret"}, {}))
    sql = duckdb_s3.secret_sql("b", got)
    assert "ENDPOINT 'minio:9000'" in sql and "USE_SSL true" in sql and "URL_STYLE 'path'" in sql and "SCOPE 's3://b'" in sql
    with pytest.raises(lineage.InvalidArgumentError):
        resolve({"s3.access-key-id": "k"}, {})  # a key without its secret
    with pytest.raises(lineage.InvalidArgumentError):
        resolve({"s3.endpoint": "ftp://host"}, {})


def test_a_missing_httpfs_wheel_names_the_package(s3, monkeypatch) -> None:
    import importlib.util

    from lineage import duck

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "duckdb_extension_httpfs" else real(name, *a))
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **s3.where())
    with pytest.raises(lineage.LineageError, match="pip install duckdb-extension-httpfs"):
        t.scan()  # a reader's own DuckDB database needs httpfs for the table's bucket
    with pytest.raises(lineage.LineageError, match="pip install duckdb-extension-httpfs"):
        duck.connect(isolated=True)
