"""Tables on an object store, measured as the store bills them: requests by kind, bytes read, latency per request.

A moto S3 server on 127.0.0.1 sits behind benchmarks/s3_proxy.py, which counts requests (GET with bytes, PUT,
LIST, HEAD, DELETE, POST) and adds a fixed latency to each (default 20 ms, like a same-region store). Every
system runs on the same proxy, each in a bucket of its own, in this process one after the other:

- ``lineage`` and ``lineage-capture`` (pre-image capture): this project, a SQLite catalog (write-ahead log, synced at
  every commit), data on the store;
  ``lineage-v3`` (not run by default): the same on an Iceberg v3 table (deletion vectors);
- ``delta``: delta-rs with the change data feed on;
- ``ducklake``: DuckLake (catalog in a local DuckDB file, data on the store through httpfs);
- ``pyiceberg``: pyiceberg's own upsert (no change feed).

Per system: a table of ``--rows`` rows loaded in one commit; ``--commits`` small upserts (5 updates, 5 inserts)
by one long-lived writer, each timed (p50, p99) with its requests counted, also by object (``requests_per_commit``:
requests by method and object kind over all commits, how many commits sent each number of requests, and each commit
above the median with the objects it sent, so an outlier names what it wrote or read); the change feed of the last 5 and the
last 25 of those commits (time, bytes read, rows returned, and the bytes of the rows returned); a full scan.
The reads are measured as a reader in another process would make them: ours drops the objects and footers the
writer holds in memory, DuckLake's connection turns DuckDB's external file cache off.

    python benchmarks/object_store.py [--rows 1000000] [--commits 200] [--latency-ms 20] [--systems ...] [--steps ...] [--publish]

``--steps upsert`` measures the small upserts only (no feeds, no scan), to iterate on the commit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import record  # noqa: E402
import s3_proxy  # noqa: E402
from lakes import ACCESS_KEY, REGION, SECRET_KEY, MotoServer  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("customer_id", pa.int64()),
                    pa.field("status", pa.string()), pa.field("amount", pa.float64())])
SYSTEMS = ("lineage", "lineage-capture", "delta", "ducklake", "pyiceberg")
FEEDS = (5, 25)
STEPS = ("upsert", "feed", "scan")
# pyiceberg's upsert reads the whole table (13-16 s per 10-row upsert at 100k rows): it makes this many, not --commits.
SLOW_PEER_COMMITS = {"pyiceberg": 3}


Proxy = s3_proxy.Running  # benchmarks/s3_proxy.py in a child process


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    return pa.table({"id": ids.astype(np.int64), "customer_id": rng.integers(0, 50_000, n),
                     "status": np.array(["new", "paid", "shipped"])[rng.integers(0, 3, n)],
                     "amount": np.round(rng.uniform(1, 1000, n), 2)}, schema=SCHEMA)


# --------------------------------------------------------------------------- systems
def write_ahead_log(catalog: Any) -> None:
    """The SQLite catalog commits through its write-ahead log, each commit synced (durable when it returns), as
    DuckDB's catalog file of DuckLake commits: one sync per commit, not the rollback journal's two or more."""
    import lineage.catalog

    lineage.catalog.write_ahead_log(catalog, durable=True)


class Lineage:
    def __init__(self, endpoint: str, bucket: str, work: str, capture: bool, format_version: int = 2) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        import lineage

        props = {"s3.endpoint": endpoint, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY, "s3.region": REGION}
        cat = SqlCatalog("lineage", uri=f"sqlite:///{work}/catalog.db", warehouse=f"s3://{bucket}/wh", **props)
        write_ahead_log(cat)
        self.t = lineage.create_table("shop.orders", SCHEMA, key=["id"], catalog=cat, format_version=format_version,
                                      properties={"lineage.cdf.capture-preimages": str(capture).lower()})

    def load(self, data: pa.Table) -> None:
        self.t.append(data)

    def upsert(self, batch: pa.Table) -> None:
        self.t.upsert(batch)

    def feed(self, last: int) -> pa.Table:
        import cdf
        import lineage.storage.puts as puts

        puts.forget()  # measured as a reader in another process would read: not from the files this writer remembers
        return cdf.changes(self.t, self.t.version - last)

    def scan(self) -> int:
        import lineage.storage.deletes as deletes
        import lineage.storage.puts as puts

        puts.forget()
        deletes.forget()  # and the delete files it parsed (the writer keeps those it wrote)
        return self.t.scan(with_lineage=False).num_rows


class Delta:
    def __init__(self, endpoint: str, bucket: str, work: str) -> None:
        from deltalake import DeltaTable

        self.opts = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                     "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
        self.uri = f"s3://{bucket}/orders"
        self.t = DeltaTable.create(self.uri, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"}, storage_options=self.opts)

    def load(self, data: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.t, data, mode="append")
        self.t.update_incremental()

    def upsert(self, batch: pa.Table) -> None:
        (self.t.merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())

    def feed(self, last: int) -> pa.Table:
        v = self.t.version()
        return pa.table(self.t.load_cdf(starting_version=v - last + 1, ending_version=v).read_all())

    def scan(self) -> int:
        from deltalake import DeltaTable

        return DeltaTable(self.uri, storage_options=self.opts).to_pyarrow_table().num_rows


class DuckLake:
    def __init__(self, endpoint: str, bucket: str, work: str) -> None:
        from lineage import duck

        self.con = duck.connect("ducklake", "httpfs", isolated=True)
        host = endpoint.split("://", 1)[1]
        self.con.execute(f"CREATE SECRET s (TYPE s3, KEY_ID '{ACCESS_KEY}', SECRET '{SECRET_KEY}', REGION '{REGION}', "
                         f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)")
        self.con.execute(f"ATTACH 'ducklake:{work}/lake.ducklake' AS lake (DATA_PATH 's3://{bucket}/dl/')")
        self.con.execute("CREATE TABLE lake.orders (id BIGINT, customer_id BIGINT, status VARCHAR, amount DOUBLE)")

    def load(self, data: pa.Table) -> None:
        self.con.register("src", data)
        self.con.execute("INSERT INTO lake.orders SELECT * FROM src")
        self.con.unregister("src")

    def upsert(self, batch: pa.Table) -> None:
        self.con.register("src", batch)
        self.con.execute("BEGIN")
        self.con.execute("UPDATE lake.orders t SET customer_id = s.customer_id, status = s.status, amount = s.amount FROM src s "
                         "WHERE t.id = s.id")
        self.con.execute("INSERT INTO lake.orders SELECT * FROM src WHERE id NOT IN (SELECT id FROM lake.orders)")
        self.con.execute("COMMIT")
        self.con.unregister("src")

    def cold(self) -> None:
        """Reads from here on go to the store, as a reader in another process reads: DuckDB's in-memory cache of
        the files this connection read or wrote is turned off (ours drops its footers and objects the same way)."""
        self.con.execute("SET enable_external_file_cache = false")

    def feed(self, last: int) -> pa.Table:
        self.cold()
        v = self.con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
        return self.con.execute(f"SELECT * FROM lake.table_changes('orders', {v - last + 1}, {v})").to_arrow_table()

    def scan(self) -> int:
        self.cold()
        return self.con.execute("SELECT * FROM lake.orders").to_arrow_table().num_rows


class PyIceberg:
    def __init__(self, endpoint: str, bucket: str, work: str) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        props = {"s3.endpoint": endpoint, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY, "s3.region": REGION}
        cat = SqlCatalog("pyiceberg", uri=f"sqlite:///{work}/catalog.db", warehouse=f"s3://{bucket}/wh", **props)
        write_ahead_log(cat)
        cat.create_namespace("shop")
        self.t = cat.create_table("shop.orders", schema=SCHEMA, properties={"format-version": "2"})

    def load(self, data: pa.Table) -> None:
        self.t.append(data)

    def upsert(self, batch: pa.Table) -> None:
        self.t.upsert(batch, join_cols=["id"])

    def feed(self, last: int) -> pa.Table:
        raise NotImplementedError("pyiceberg has no change feed")

    def scan(self) -> int:
        return self.t.scan().to_arrow().num_rows


def make(system: str, endpoint: str, bucket: str, work: str) -> Any:
    if system.startswith("lineage"):
        version = 3 if system == "lineage-v3" else 2
        return Lineage(endpoint, bucket, work, capture=system == "lineage-capture", format_version=version)
    return {"delta": Delta, "ducklake": DuckLake, "pyiceberg": PyIceberg}[system](endpoint, bucket, work)


# --------------------------------------------------------------------------- measurement
# What a request's object is, from its path: Iceberg's files, this project's lineage and index files, the peers'.
OBJECT_KINDS = (
    ("-deletes.parquet", "position-deletes"), ("-dv.puffin", "deletion-vectors"), (".puffin", "deletion-vectors"),
    (".metadata.json", "table-metadata"), ("/snap-", "manifest-list"), ("-merged-segment.parquet", "lineage-merged-segment"),
    ("-segment.parquet", "lineage-segment"), ("-list.json", "lineage-list"), ("-log.json", "lineage-log-chunk"),
    ("-deleted-rows.parquet", "deleted-rows-index"), ("-keys.kix", "key-index"), ("-keys.arrow", "key-index"),
    (".avro", "manifest"), ("/_delta_log/", "delta-log"), (".parquet", "data"),
)


BACKGROUND = "POST delete-objects"  # expired metadata files, removed in batches off the writer's path (lineage.storage.removals)


def object_kind(kind: str, path: str) -> str:
    """``METHOD object-kind`` of one logged request (``LIST`` and bucket-level requests have no object)."""
    if kind == "LIST":
        return "LIST"
    name, _, query = path.partition("?")
    if kind == "POST" and query.startswith("delete"):
        return BACKGROUND
    return f"{kind} " + next((label for suffix, label in OBJECT_KINDS if suffix in name), "other")


def commit_breakdown(logs: list[list[list]]) -> dict[str, Any]:
    """Requests per commit by object kind: the total over all commits, how many commits sent each number of
    requests, the most one commit sent without the batched removals of expired metadata files (a background
    thread's request, one per 16 commits, that lands in whichever commit's window it falls), and each commit
    above the median with what it sent (so an outlier names its extra objects)."""
    per_commit = []
    for log in logs:
        kinds: dict[str, int] = {}
        for entry in log:
            k = object_kind(entry[0], entry[1])
            kinds[k] = kinds.get(k, 0) + 1
        per_commit.append(kinds)
    totals: dict[str, int] = {}
    histogram: dict[str, int] = {}
    for kinds in per_commit:
        for k, n in kinds.items():
            totals[k] = totals.get(k, 0) + n
        n = str(sum(kinds.values()))
        histogram[n] = histogram.get(n, 0) + 1
    median = statistics.median(sum(k.values()) for k in per_commit) if per_commit else 0
    above = [{"commit": i + 1, "requests": sum(k.values()), "objects": dict(sorted(k.items()))}
             for i, k in enumerate(per_commit) if sum(k.values()) > median]
    own = max((sum(n for k, n in kinds.items() if k != BACKGROUND) for kinds in per_commit), default=0)
    return {"by_object": dict(sorted(totals.items())), "max_without_background_removals": own, "commits_by_requests": dict(sorted(histogram.items(), key=lambda x: int(x[0]))),
            "typical": dict(sorted(per_commit[-1].items())) if per_commit else {}, "above_median": above[:40]}


def run_system(system: str, proxy: Proxy, server: MotoServer, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    bucket = server.new_bucket()
    work = tempfile.mkdtemp(prefix=f"objstore-{system}-")
    try:
        t = make(system, proxy.endpoint, bucket, work)
        proxy.reset()
        t0 = time.perf_counter()
        t.load(rows(np.arange(args.rows), rng))
        out: dict[str, Any] = {"load": {"seconds": round(time.perf_counter() - t0, 3), **proxy.counts()}}
        times, requests, logs = [], [], []
        next_id = args.rows
        for _ in range(min(args.commits, SLOW_PEER_COMMITS.get(system, args.commits))):
            updated = rng.choice(args.rows, 5, replace=False)
            batch = rows(np.concatenate([updated, np.arange(next_id, next_id + 5)]), rng)
            next_id += 5
            proxy.reset()
            t0 = time.perf_counter()
            t.upsert(batch)
            times.append(time.perf_counter() - t0)
            counts = proxy.counts(log=True)
            logs.append(counts.pop("log"))
            requests.append(counts)
        ms = sorted(x * 1000 for x in times)
        out["small_upsert"] = {
            "commits": len(ms), "p50_ms": round(statistics.median(ms), 1), "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
            "requests_per_commit_median": statistics.median(r["total"] for r in requests),
            "requests_per_commit_max": max(r["total"] for r in requests),
            "requests_by_kind_last": requests[-1]["requests"],
            "requests_per_commit": commit_breakdown(logs),
        }
        for last in FEEDS if "feed" in args.steps else ():
            proxy.reset()
            t0 = time.perf_counter()
            try:
                got = t.feed(min(last, args.commits))
            except NotImplementedError as exc:
                out[f"feed_last_{last}"] = {"na": str(exc)}
                continue
            seconds = time.perf_counter() - t0
            counts = proxy.counts()
            out[f"feed_last_{last}"] = {"seconds": round(seconds, 3), "rows": got.num_rows, "result_bytes": got.nbytes,
                                        "get_bytes": counts["get_bytes"], "requests": counts["requests"],
                                        "bytes_read_per_result_byte": round(counts["get_bytes"] / max(got.nbytes, 1), 2)}
        if "scan" in args.steps:
            proxy.reset()
            t0 = time.perf_counter()
            n = t.scan()
            out["full_scan"] = {"seconds": round(time.perf_counter() - t0, 3), "rows": n, **proxy.counts()}
        return out
    except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, the others still run
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--steps", default=",".join(STEPS), help="what to measure after the upserts: feed, scan (comma-separated)")
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    args.steps = [s for s in args.steps.split(",") if s]
    if unknown := set(args.steps) - set(STEPS):
        parser.error(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(STEPS)}")
    systems = [s for s in args.systems.split(",") if s]
    rec = record.Recorder("object_store", scale=args.rows, argv=argv, settings=vars(args),
                          peers=["deltalake", "duckdb-extension-ducklake", "pyiceberg", "moto"])
    work = tempfile.mkdtemp(prefix="objstore-")
    server = MotoServer(os.path.join(work, "moto.log"))
    proxy = Proxy(server.endpoint, args.latency_ms)
    results: dict[str, Any] = {"latency_ms": args.latency_ms, "systems": {}}
    try:
        for system in systems:
            print(f"{system} ...", flush=True)
            results["systems"][system] = rec.step(system, lambda s=system: run_system(s, proxy, server, args))
            print(json.dumps(results["systems"][system], indent=1), flush=True)
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(rec.finish(results, publish=args.publish, out=args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
