"""Requests an object store bills for a table's work, counted by a proxy in front of the moto server.

The proxy is the benchmark's (benchmarks/s3_proxy.py, no added latency here):
it counts requests by kind and logs each one. A long-lived writer's small
commit must stay within :data:`SMALL_COMMIT_BUDGET` requests, all writes:
what a commit reads of its own earlier files comes from memory.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pytest

import lineage
import lineage.storage.puts as puts
from conftest import SCHEMA
from lakes import Lake, s3_lake

# Data file, delete file, lineage list (the commit's segment inside it), deleted-rows index, key index, 2 manifests,
# manifest list, metadata file; a v2 commit whose rows sit in two data files writes a delete file for each: one more.
ONE_FILE_COMMIT = 9
SMALL_COMMIT_BUDGET = 10
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from s3_proxy import Running  # noqa: E402 - the benchmark's proxy


@pytest.fixture
def counted(moto_server, tmp_path):
    """A lake on a new bucket of the moto server, reached through a counting proxy: ``(lake, proxy)``."""
    yield from _proxied(moto_server, tmp_path, 0)


@pytest.fixture
def slow(moto_server, tmp_path):
    """As ``counted``, with 100 ms added to every request (requests sent one after another show)."""
    yield from _proxied(moto_server, tmp_path, 100)


def _proxied(moto_server, tmp_path, latency_ms: float):  # noqa: ANN001, ANN202
    proxy = Running(moto_server.endpoint, latency_ms=latency_ms)
    base = s3_lake(moto_server, str(tmp_path / "catalog"))
    lake = Lake("s3", base.root, base.warehouse, {**base.properties, "s3.endpoint": proxy.endpoint})
    try:
        yield lake, proxy
    finally:
        proxy.stop()


def _most_in_flight(log: list[list]) -> int:
    """The most requests of a proxy's log (entries ``[kind, path, bytes, arrived ms, answered ms]``) under way at once."""
    events = sorted([(e[3], 1) for e in log] + [(e[4], -1) for e in log])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _rows(ids: np.ndarray, tag: str) -> pa.Table:
    names = [f"{tag}{i}" for i in ids]
    return pa.table({"id": ids.astype(np.int64), "name": names, "amount": ids.astype(np.float64)}, schema=SCHEMA)


def _bucket(moto_server) -> str:  # noqa: ANN001
    """``s3://bucket`` of a new bucket of the moto server, registered with its settings."""
    import lineage.storage.files as files

    lake = s3_lake(moto_server, "unused")
    root = lake.warehouse.rsplit("/", 1)[0]
    files.register(root + "/", lake.properties)
    return root


def test_a_small_commit_of_a_long_lived_writer_is_nine_puts_or_ten_with_two_delete_files(counted) -> None:
    """From the first upsert on (which builds the key index a bulk append left to it) and past the commit log's chunk
    boundary: nine PUTs for a commit whose rows sit in one data file (its lineage segment inside its list), ten for
    one whose rows sit in two (a position delete file each, on v2); no GET, no HEAD; one key index file and no log
    chunk or segment file each."""
    from lineage.storage.commit_log import CHUNK_ENTRIES

    lake, proxy = counted
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **lake.where(), properties={"lineage.key-index.defer-rows": "100"})
    t.append(_rows(np.arange(1000), "a"))  # as a bulk load: the index is left to the first keyed write
    assert t.state().lineage.key_index is None
    updated = np.random.default_rng(3).permutation(1000)  # rows of the loaded file, each updated once
    next_id = 1000
    per_commit = []
    for i in range(CHUNK_ENTRIES + 4):
        batch = _rows(np.concatenate([updated[5 * i : 5 * i + 5], np.arange(next_id, next_id + 5)]), f"u{i}")
        next_id += 5
        proxy.reset()
        info = t.upsert(batch)
        got = proxy.counts(log=True)
        assert (info.inserted, info.updated) == (5, 5)
        per_commit.append(got)
    one_file = len(per_commit)
    for i in range(2):  # a row of the loaded file and one an earlier upsert inserted (in a small file of its own)
        batch = _rows(np.array([updated[5 * one_file + i], 1000 + 5 * i, next_id]), f"w{i}")
        next_id += 1
        proxy.reset()
        info = t.upsert(batch)
        got = proxy.counts(log=True)
        assert (info.inserted, info.updated) == (1, 2)
        assert sum(e[1].endswith("-deletes.parquet") for e in got["log"]) == 2, got["log"]  # one per data file
        per_commit.append(got)
    for i, got in enumerate(per_commit):
        paths = [e[1] for e in got["log"]]
        assert not [p for p in paths if p.endswith(("-log.json", "-segment.parquet"))], (i, paths)
        assert sum(p.endswith(".kix") for p in paths) == 1, (i, paths)
        assert got["total"] <= (ONE_FILE_COMMIT if i < one_file else SMALL_COMMIT_BUDGET), (i, paths)
        assert set(got["requests"]) == {"PUT"}, (i, got["requests"])  # no HEAD after a write, no GET of a file this writer wrote
    table = lineage.open_table("shop.orders", **lake.where()).scan()
    assert table.num_rows == 1000 + 5 * one_file + 2 and len(set(table.column("_row_id").to_pylist())) == table.num_rows


def test_updated_images_and_inserts_share_a_data_file(counted) -> None:
    lake, _ = counted
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **lake.where())
    t.append(_rows(np.arange(10), "a"))
    before = {r["id"]: r for r in t.scan().to_pylist()}
    info = t.upsert(_rows(np.array([2, 7, 10, 11]), "b"))
    assert (info.inserted, info.updated, info.data_files_added) == (2, 2, 1)
    after = {r["id"]: r for r in t.scan().to_pylist()}
    for k in (2, 7):  # updated: same row id, created version kept, updated now
        assert after[k]["_row_id"] == before[k]["_row_id"]
        assert after[k]["_row_created_at_version"] == before[k]["_row_created_at_version"]
        assert after[k]["_row_last_updated_at_version"] == t.version and after[k]["name"] == f"b{k}"
    fresh = sorted(after[k]["_row_id"] for k in (10, 11))
    assert fresh[0] > max(r["_row_id"] for r in before.values()) and fresh[1] == fresh[0] + 1
    assert all(after[k]["_row_created_at_version"] == t.version for k in (10, 11))


def test_a_failed_background_put_fails_the_block(moto_server) -> None:
    import lineage.storage.files as files

    ok = f"{_bucket(moto_server)}/x/file.bin"
    missing = f"s3://no-such-bucket-{os.getpid()}/x/file.bin"
    files.register(missing, s3_lake(moto_server, "unused").properties)
    with pytest.raises(OSError):
        with puts.parallel_puts():
            puts.put(ok, b"fine")
            puts.put(missing, b"lost")
    assert puts.known(missing) is None  # a failed request is not remembered
    assert files.exists(ok) and puts.read(ok) == b"fine"


def _small_commits(lake: Lake, commits: int, properties: dict[str, str] | None = None) -> tuple[lineage.Table, pa.Table, list[str]]:
    """A table of 1000 rows and ``commits`` small upserts; its rows by id, and the proxy paths of its data and delete files."""
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], properties=properties, **lake.where())
    t.append(_rows(np.arange(1000), "a"))
    for i in range(commits):
        t.upsert(_rows(np.array([10 * i + 1, 2000 + i]), f"u{i}"))
    live = t.state().live_files()
    paths = {f.path for f in live} | {d for f in live for d in f.delete_paths}
    return t, t.scan().sort_by("id"), sorted("/" + p.split("://", 1)[1] for p in paths)


def test_a_scan_and_a_feed_read_without_head_requests(counted) -> None:
    import cdf
    import lineage.storage.deletes as deletes

    lake, proxy = counted
    t, expected, data_and_deletes = _small_commits(lake, 4)
    reader = lineage.open_table("shop.orders", **lake.where())
    puts.forget()
    deletes.forget()  # the writer keeps the positions of the delete files it wrote; a reader elsewhere reads them
    proxy.reset()
    got = reader.scan().sort_by("id")
    counts = proxy.counts(log=True)
    assert got.equals(expected)
    assert set(counts["requests"]) == {"GET"}, counts["requests"]  # sizes come from the manifests: no HEAD
    read = [path for _, path, *_ in counts["log"] if "/data/" in path]
    assert sorted(read) == data_and_deletes, read  # one GET each
    puts.forget()
    proxy.reset()
    feed = cdf.changes(reader, t.version - 3)
    counts = proxy.counts()
    assert feed.num_rows == 9  # 3 commits: an update (pre- and post-image) and an insert each
    assert "HEAD" not in counts["requests"], counts["requests"]


def test_background_puts_keep_at_most_the_budget_in_memory(moto_server, monkeypatch) -> None:
    root = _bucket(moto_server)
    monkeypatch.setattr(puts, "MAX_IN_FLIGHT_BYTES", 3000)
    peak = []
    real = puts._put

    def counting(location: str, data: bytes) -> None:
        peak.append(puts._in_flight)
        real(location, data)

    monkeypatch.setattr(puts, "_put", counting)
    with puts.parallel_puts():
        for i in range(12):
            puts.put(f"{root}/p/{i}.bin", bytes([i]) * 1000)
    assert max(peak) <= 3000 and puts._in_flight == 0
    assert all(puts.read(f"{root}/p/{i}.bin") == bytes([i]) * 1000 for i in range(12))


def test_the_object_reader_reads_ranges_without_asking_the_size(moto_server) -> None:
    import io

    import pyarrow.parquet as pq

    import lineage.storage.files as files
    import lineage.storage.s3_reader as s3_reader

    root = _bucket(moto_server)
    big = pa.table({"a": np.arange(300_000), "s": [str(i) for i in range(300_000)]})
    sink = io.BytesIO()
    pq.write_table(big, sink, row_group_size=100_000)
    location = f"{root}/t/big.parquet"
    puts.put(location, sink.getvalue())
    puts.forget()
    pf = files.parquet_file(location)
    assert pf.metadata.num_row_groups == 3 and pf.read_row_group(1).equals(big.slice(100_000, 100_000))
    assert pf.read().equals(big)
    reader = s3_reader.ObjectReader(location, files.settings_for(location))
    assert reader.size() == len(sink.getvalue())
    reader.seek(10)
    assert reader.read(20) == sink.getvalue()[10:30] and reader.tell() == 30
    reader.seek(-5, io.SEEK_END)
    assert reader.read() == sink.getvalue()[-5:] and reader.read(3) == b""
    with pytest.raises(FileNotFoundError):
        files.open_input(f"{root}/t/missing.parquet")


def test_a_deleted_object_is_not_served_from_memory(moto_server) -> None:
    import lineage.storage.files as files

    location = f"{_bucket(moto_server)}/d/file.bin"
    puts.put(location, b"soon gone")
    assert puts.known(location) == b"soon gone"
    files.delete(location)
    assert puts.known(location) is None and not files.exists(location)
    with pytest.raises(FileNotFoundError):
        puts.read(location)


def test_old_metadata_files_are_removed_in_batches_off_the_writers_path(counted, monkeypatch) -> None:
    """Past ``write.metadata.previous-versions-max`` the oldest metadata files are queued and removed by one
    ``DeleteObjects`` request per batch (no HEAD, no DELETE each, no folder marker): the files still go."""
    import lineage.storage.removals as removals
    import pyarrow.fs as pafs

    monkeypatch.setattr(removals, "BATCH", 3)
    lake, proxy = counted
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], **lake.where(),
                             properties={"write.metadata.previous-versions-max": "1"})
    proxy.reset()
    for i in range(5):
        t.append(_rows(np.arange(i * 10, i * 10 + 10), "a"))
    assert len(removals.pending()) == 1  # 4 files past the limit: a batch of 3 sent, one queued
    removals.wait()
    logged = proxy.counts(log=True)["log"]
    assert not [p for kind, p, *_ in logged if kind == "PUT" and p.endswith("/")], "a folder marker was written"
    kinds = proxy.counts()["requests"]
    assert "HEAD" not in kinds and "DELETE" not in kinds, kinds
    assert kinds.get("POST") == 2, kinds  # the batch of 3, then the last one at wait()
    fs, root = lineage.storage.files.filesystem(t.iceberg.metadata.location + "/metadata")
    names = [f.path for f in fs.get_file_info(pafs.FileSelector(root)) if f.path.endswith(".metadata.json")]
    assert len(names) == 2, names  # the current file and one previous version
    assert t.scan().num_rows == 50


def test_delete_objects_removes_a_batch_in_one_request(counted) -> None:
    import lineage.storage.files as files
    import lineage.storage.s3_get as s3_get

    lake, proxy = counted
    files.register(lake.warehouse, lake.properties)
    root = lake.warehouse.rstrip("/")
    names = [f"{root}/batch/{i}&<x>.bin" for i in range(5)]  # keys that need escaping in the request's XML
    for name in names:
        puts.put(name, b"x")
    proxy.reset()
    settings = files.settings_for(root)
    assert s3_get.delete_objects(names[:4] + [f"{root}/batch/missing.bin"], settings) == []
    s3_get.delete(names[4], settings)
    s3_get.delete(names[4], settings)  # already gone: no error
    assert proxy.counts()["requests"] == {"POST": 1, "DELETE": 2}
    assert not any(files.exists(n) for n in names)


def test_a_scan_of_many_small_files_fetches_them_at_once_one_get_each(slow, monkeypatch) -> None:
    """A table of many small commits (a data and a delete file each): a fresh reader's scan sends one GET per
    file, many in flight together (not one after another), never more than ``LINEAGE_S3_PARALLEL_READS``."""
    from lineage.errors import InvalidArgumentError

    import lineage.storage.deletes as deletes

    lake, proxy = slow
    # neither small files folded nor delete files merged (the commits keep them few otherwise)
    t, expected, wanted = _small_commits(lake, 12, {"lineage.write.fold.max-rows": "0", "lineage.write.delete.merge": "false"})
    assert len(wanted) == 25  # 13 data files, 12 delete files

    def scan(parallel: str | None) -> list[list]:
        if parallel is None:
            monkeypatch.delenv("LINEAGE_S3_PARALLEL_READS", raising=False)
        else:
            monkeypatch.setenv("LINEAGE_S3_PARALLEL_READS", parallel)
        puts.forget()
        deletes.forget()
        proxy.reset()
        assert t.scan().sort_by("id").equals(expected)
        log = proxy.counts(log=True)["log"]
        assert sorted(e[1] for e in log) == wanted, [e[:2] for e in log]  # one GET per file, nothing else
        assert {e[0] for e in log} == {"GET"}
        return log

    log = scan(None)
    span = max(e[4] for e in log) - min(e[3] for e in log)
    # One after another the 25 GETs take at least 2.5 s; at once, one round trip plus the time a loaded machine
    # needs to start them (1.2 s seen at load 15 on 2 cores), so the span only has to stay well below serial.
    assert _most_in_flight(log) >= 12 and span < 25 * 100 * 0.7, (_most_in_flight(log), span)
    assert _most_in_flight(scan("4")) <= 4  # bounded by the setting

    # A scan with a where, read by DuckDB: the large file (here: the first one) is read while the small ones arrive,
    # two queries, same rows, same GETs (a scan without one is read with pyarrow, lineage.read.arrow_scan: no query).
    import lineage.read.batched_scan as batched_scan

    queries = []
    real_query = batched_scan._query_group
    monkeypatch.setattr(batched_scan, "PIPELINE_FILE_BYTES", max(f.data_file.file_size_in_bytes for f in t.state().live_files()))
    monkeypatch.setattr(batched_scan, "_query_group",
                        lambda plan, group, *a: queries.append(len(group)) or real_query(plan, group, *a))
    scan(None)
    assert queries == [], queries
    puts.forget()
    got = t.scan(where="id < 500", columns=["id", "name", "_row_id"]).sort_by("id")
    assert got.equals(expected.filter(pa.compute.less(expected["id"], 500)).select(["id", "name", "_row_id"]))
    assert queries == [1, 12], queries
    monkeypatch.setenv("LINEAGE_S3_PARALLEL_READS", "0")
    puts.forget()
    with pytest.raises(InvalidArgumentError, match="LINEAGE_S3_PARALLEL_READS"):
        t.scan()


def test_removals_fall_back_to_one_delete_each_where_the_store_refuses_a_batch(counted, monkeypatch) -> None:
    import lineage.storage.files as files
    import lineage.storage.removals as removals
    import lineage.storage.s3_get as s3_get

    lake, proxy = counted
    files.register(lake.warehouse, lake.properties)
    names = [f"{lake.warehouse.rstrip('/')}/old/{i}.metadata.json" for i in range(3)]
    for name in names:
        puts.put(name, b"{}")

    def refused(locations: list[str], settings: object) -> list[str]:
        raise OSError("removing objects failed: HTTP 501 NotImplemented")

    monkeypatch.setattr(s3_get, "delete_objects", refused)
    monkeypatch.setattr(removals, "BATCH", 2)
    proxy.reset()
    removals.remove_later(names)
    removals.wait()
    assert proxy.counts()["requests"] == {"DELETE": 3}
    assert not any(files.exists(n) for n in names) and removals.pending() == []


def test_many_files_are_removed_by_one_request_per_thousand(counted) -> None:
    import lineage.storage.files as files

    lake, proxy = counted
    files.register(lake.warehouse, lake.properties)
    names = [f"{lake.warehouse.rstrip('/')}/gone/{i}.parquet" for i in range(1003)]
    for name in names[:20] + names[-3:]:
        puts.put(name, b"x")
    proxy.reset()
    files.delete_many(names)
    assert proxy.counts()["requests"] == {"POST": 2}
    assert puts.known(names[0]) is None and not any(files.exists(n) for n in names[:20] + names[-3:])


def test_a_small_object_is_one_signed_put_and_a_large_one_goes_through_pyarrow(counted, monkeypatch) -> None:
    import lineage.storage.files as files
    import lineage.storage.s3_get as s3_get

    lake, proxy = counted
    root = lake.warehouse.rsplit("/", 1)[0]
    files.register(root + "/", lake.properties)
    signed = []
    real = s3_get.put
    monkeypatch.setattr(s3_get, "put", lambda location, data, settings: (signed.append(location), real(location, data, settings)))
    monkeypatch.setattr(puts, "SINGLE_REQUEST_BYTES", 1000)
    small, large, odd = f"{root}/o/small.bin", f"{root}/o/large.bin", f"{root}/o/a key+with=odd&chars ü.bin"
    proxy.reset()
    with puts.parallel_puts():
        puts.put(small, b"s" * 1000)
        puts.put(large, b"l" * 1001)
        puts.put(odd, b"o" * 10)
    assert sorted(signed) == sorted([small, odd])
    assert proxy.counts()["requests"] == {"PUT": 3}  # one request each, no HEAD, no multipart upload
    puts.forget()
    assert puts.read(small) == b"s" * 1000 and puts.read(large) == b"l" * 1001 and puts.read(odd) == b"o" * 10


def test_a_put_to_an_unreachable_store_is_an_os_error_and_names_no_secret() -> None:
    import lineage.storage.s3_get as s3_get
    from lineage.storage.settings import StoreSettings

    settings = StoreSettings(endpoint="http://127.0.0.1:9", region="us-east-1", access_key_id="k", secret_access_key="very-secret")
    with pytest.raises(OSError, match="writing s3://b/k failed") as info:
        s3_get.put("s3://b/k", b"x", settings)
    assert "very-secret" not in str(info.value)


def test_a_small_write_opens_duckdb_early_so_the_first_fold_does_not_wait(counted, monkeypatch) -> None:
    import threading

    import lineage.duck as duck
    import lineage.writes.small_files as small_files

    lake, _ = counted
    opened = []
    real = duck.connect
    monkeypatch.setattr(duck, "connect", lambda *a, **k: (opened.append(threading.current_thread().name), real(*a, **k))[1])
    monkeypatch.setattr(small_files, "_early", [])  # as in a fresh process
    t = lineage.create_table("s.t", SCHEMA, key=["id"], **lake.where(), properties={"lineage.write.fold.min-files": "3"})
    t.append(_rows(np.arange(1000), "a"))
    t.upsert(_rows(np.array([1, 2000]), "u"))
    small_files._early[0].join(60)
    assert opened[:1] == ["lineage-duckdb-open"]  # before any fold, off the writer's thread
    folded = [t.upsert(_rows(np.arange(start, start + 10), "i")).data_files_removed for start in range(3000, 3040, 10)]
    assert max(folded) >= 3, folded  # small files, then a fold of them
    assert len(small_files._early) == 1 and t.count() == 1041
    assert sorted(t.scan(columns=["id"])["id"].to_pylist()) == sorted([*range(1000), 2000, *range(3000, 3040)])
