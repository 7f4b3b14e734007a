"""Long histories (issue 15): does a small commit cost the same after 10,000 commits as after 10?

Workload, the same for every system (numpy, fixed seed):

1. a keyed table (``id`` int64 key, ``customer_id`` int64, ``status`` string,
   ``amount`` float64) loaded with ``--rows`` rows in one write;
2. ``--commits`` small upserts of 10 rows each: 5 update live rows (ids drawn
   at random among all ids so far), 5 insert new ids;
3. at commit ``--window`` and at the last commit, the change feed over the last
   10 commits is read (three times; the median is reported).

Per system: median and p99 commit time and bytes written for the first
``--window`` commits and the last ``--window`` commits, the feed times, the
table's size on disk at the end, and the machine's load. Bytes written per
commit are the sizes of files that appeared under the system's folder plus the
growth of files changed in place (catalog databases); they are measured only
inside the two windows (walking the folder costs time), never inside the
timed call.

Systems:

* ``lineage``: this product with default properties, as a new user would
  create it (no upkeep): ``Table.upsert``; ``cdf.changes(t, v - 10, v)``.
* ``lineage-maintain``: the same with ``Table.maintain()`` every
  ``--maintain-every`` commits (its time is reported apart, not in the commit
  times), and the properties recommended for a streaming table (README, "Long-lived
  tables"): snapshots expire by age (``history.expire.max-snapshot-age-ms``,
  here 1 s because the benchmark compresses hours of commits into minutes)
  keeping the newest 10 (``history.expire.min-snapshots-to-keep``), a
  change-feed retention of 1,000 versions, vacuum of files older than 1 s.
* ``delta``: delta-rs ``merge`` (matched: update all, not matched: insert
  all), change data feed enabled, default checkpoint interval;
  ``load_cdf`` for the feed.
* ``ducklake``: DuckLake (catalog in a local DuckDB file) ``MERGE INTO``;
  ``table_changes`` for the feed.
* ``pyiceberg``: plain pyiceberg 0.12 ``Table.upsert(batch, join_cols=["id"])``
  (copy-on-write); no change feed. It runs as far as it gets within ``--cap``.

Every system runs in a child process, one after the other, and stops after
``--cap`` seconds of commits (it then reports the commits it made). For
``lineage`` the commit time is also split into planning (the key lookup of the
upsert: probing every live file's key column, which the key index replaces)
and the rest (writing files, lineage and the Iceberg commit).

    .venv/bin/python benchmarks/history.py --publish                # 1M rows, 10,000 commits, every system
    .venv/bin/python benchmarks/history.py --rows 100000 --commits 1000 --window 100 --systems lineage,lineage-maintain

Writes a benchmark record (``benchmarks/record.py``: to ``results/scratch/``, or with ``--publish`` to
``benchmarks/results/history-<commits>-commits-<rows>-<date>-<machine>.json``, rendered into the READMEs by
``benchmarks/report.py``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402  (benchmarks/record.py)

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("customer_id", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)
SYSTEMS = ("lineage", "lineage-maintain", "delta", "ducklake", "pyiceberg")
SEED = 15
FEED_COMMITS = 10


# ---------------------------------------------------------------------- the workload
def base_rows(n: int) -> pa.Table:
    """The initial load: ids 0..n-1."""
    rng = np.random.default_rng(SEED)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "customer_id": rng.integers(0, 100_000, n),
            "status": pa.array(np.where(rng.random(n) < 0.5, "new", "paid")),
            "amount": np.round(rng.random(n) * 1000, 2),
        },
        schema=SCHEMA,
    )


def upsert_batch(rows: int, i: int) -> pa.Table:
    """Commit ``i`` (0-based): 5 updates of ids drawn among all ids so far, 5 new ids."""
    rng = np.random.default_rng(SEED * 1_000_003 + i)
    upto = rows + 5 * i
    updates = rng.choice(upto, 5, replace=False).astype(np.int64)
    inserts = np.arange(upto, upto + 5, dtype=np.int64)
    ids = np.concatenate([updates, inserts])
    return pa.table(
        {
            "id": ids,
            "customer_id": rng.integers(0, 100_000, 10),
            "status": pa.array([f"u{i}"] * 10),
            "amount": np.round(rng.random(10) * 1000, 2),
        },
        schema=SCHEMA,
    )


# ---------------------------------------------------------------------- bytes on disk
_IMMUTABLE = (".parquet", ".avro", ".json", ".crc", ".bin")


class Disk:
    """Bytes written under a folder between two calls: new files, plus growth of files changed in place."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.sizes: dict[str, int] = {}
        self.written()

    def written(self) -> int:
        total = 0
        seen: dict[str, int] = {}
        for folder, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(folder, name)
                old = self.sizes.get(path)
                if old is not None and name.endswith(_IMMUTABLE) and not name.startswith("_last_checkpoint"):
                    seen[path] = old
                    continue
                try:
                    size = os.stat(path).st_size
                except FileNotFoundError:
                    continue
                seen[path] = size
                total += size if old is None else max(0, size - old)
        self.sizes = seen
        return total


def file_system(path: str) -> str:
    """The type of the file system holding ``path`` (``ext4``, ``tmpfs``...; Linux's mount table), or ``unknown``.

    Recorded because the commit time of a table that creates and deletes files
    at a high rate depends on it (benchmarks/README.md, "history.py").
    """
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    except OSError:
        pass
    return kind


def du(root: str) -> int:
    """Bytes of every file under ``root``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(root) for f in names if os.path.exists(os.path.join(d, f)))


# ---------------------------------------------------------------------- systems
class System:
    """One system under test; ``root`` is its own folder."""

    def __init__(self, root: str, args: argparse.Namespace) -> None:
        self.root = root
        self.args = args

    def create(self, base: pa.Table) -> None: ...

    def upsert(self, batch: pa.Table) -> None: ...

    def feed(self, n: int) -> int | None:
        """Rows of the change feed over the last ``n`` commits (None: the system has none)."""
        return None

    def maintain(self) -> dict | None:
        return None

    def extra(self) -> dict:
        return {}

    def close(self) -> None: ...


class Lineage(System):
    maintained = False

    def properties(self) -> dict[str, str]:
        if not self.maintained:
            return {}
        return {
            "history.expire.max-snapshot-age-ms": "1000",
            "history.expire.min-snapshots-to-keep": "10",
            "lineage.cdf.retention.versions": "1000",
            "lineage.maintain.vacuum.min-age-ms": "1000",
        }

    def create(self, base: pa.Table) -> None:
        import lineage

        self.t = lineage.create_table("bench.orders", SCHEMA, key=["id"], warehouse=self.root, properties=self.properties())
        self.t.append(base)
        self.plan_s: list[float] = []
        self._instrument()

    def _instrument(self) -> None:
        """Time the planning step (the key lookup) of each write apart from the rest."""
        import lineage.table as table_module

        original = table_module.run_write
        spent = self.plan_s

        def timed(table, plan_fn, **kw):  # type: ignore[no-untyped-def]
            def plan(state, con):  # type: ignore[no-untyped-def]
                start = time.perf_counter()
                try:
                    return plan_fn(state, con)
                finally:
                    spent.append(time.perf_counter() - start)

            return original(table, plan, **kw)

        table_module.run_write = timed

    def upsert(self, batch: pa.Table) -> None:
        self.t.upsert(batch)

    def feed(self, n: int) -> int:
        import cdf

        v = self.t.version
        return cdf.changes(self.t, v - n, v).num_rows

    def maintain(self) -> dict | None:
        if not self.maintained:
            return None
        report = self.t.maintain()
        return {s.name: s.status for s in report.steps}

    def extra(self) -> dict:
        self.t.refresh()
        snap = self.t.iceberg.metadata.current_snapshot()
        manifests = snap.manifests(self.t.iceberg.io)
        st = self.t.state()
        return {
            "snapshots": len(self.t.iceberg.metadata.snapshots),
            "manifests": len(manifests),
            "live_data_files": len(st.live_files()),
            "lineage_segments": len(st.lineage.segments),
            "metadata_json_bytes": os.path.getsize(self.t.iceberg.metadata_location.removeprefix("file://")),
        }


class LineageMaintained(Lineage):
    maintained = True


class Delta(System):
    def create(self, base: pa.Table) -> None:
        from deltalake import DeltaTable, write_deltalake

        self.path = os.path.join(self.root, "orders")
        self.t = DeltaTable.create(self.path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
        write_deltalake(self.t, base, mode="append")
        self.t.update_incremental()

    def upsert(self, batch: pa.Table) -> None:
        (
            self.t.merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def feed(self, n: int) -> int:
        v = self.t.version()
        return pa.table(self.t.load_cdf(starting_version=v - n + 1, ending_version=v).read_all()).num_rows


class DuckLake(System):
    def create(self, base: pa.Table) -> None:
        from lineage import duck

        os.makedirs(self.root, exist_ok=True)
        self.con = duck.connect("ducklake")
        self.con.execute(f"ATTACH 'ducklake:{os.path.join(self.root, 'catalog.ducklake')}' AS lake (DATA_PATH '{os.path.join(self.root, 'data')}/')")
        self.con.execute("CREATE TABLE lake.orders (id BIGINT NOT NULL, customer_id BIGINT, status VARCHAR, amount DOUBLE)")
        self.con.register("base", base)
        self.con.execute("INSERT INTO lake.orders SELECT * FROM base")
        self.con.unregister("base")

    def upsert(self, batch: pa.Table) -> None:
        self.con.register("batch", batch)
        self.con.execute(
            "MERGE INTO lake.orders AS t USING batch AS s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET customer_id = s.customer_id, status = s.status, amount = s.amount "
            "WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.customer_id, s.status, s.amount)"
        )
        self.con.unregister("batch")

    def feed(self, n: int) -> int:
        v = int(self.con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])
        # materialised first: exporting table_changes straight to Arrow hangs in DuckDB 1.5.5 (benchmarks/README.md)
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE __changes AS SELECT * FROM lake.table_changes('orders', {v - n + 1}, {v})")
        rows = self.con.execute("SELECT count(*) FROM __changes").fetchone()[0]
        self.con.execute("DROP TABLE __changes")
        return int(rows)

    def close(self) -> None:
        self.con.close()


class PyIceberg(System):
    def create(self, base: pa.Table) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        from lineage.iceberg.schema import iceberg_schema

        os.makedirs(self.root, exist_ok=True)
        cat = SqlCatalog("bench", uri=f"sqlite:///{os.path.join(self.root, 'catalog.db')}", warehouse=self.root)
        cat.create_namespace("bench")
        self.t = cat.create_table(("bench", "orders"), schema=iceberg_schema(SCHEMA, ["id"]))
        self.t.append(base)

    def upsert(self, batch: pa.Table) -> None:
        self.t.upsert(batch, join_cols=["id"])


CLASSES = {"lineage": Lineage, "lineage-maintain": LineageMaintained, "delta": Delta, "ducklake": DuckLake, "pyiceberg": PyIceberg}


# ---------------------------------------------------------------------- one system, in a child process
def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p99": None, "mean": None, "n": 0}
    arr = np.asarray(values, float)
    return {"median": float(np.median(arr)), "p99": float(np.percentile(arr, 99)), "mean": float(arr.mean()), "n": len(values)}


def _timed_feed(system: System) -> dict | None:
    times, rows = [], None
    for _ in range(3):
        start = time.perf_counter()
        rows = system.feed(FEED_COMMITS)
        times.append(time.perf_counter() - start)
        if rows is None:
            return None
    return {"seconds": statistics.median(times), "rows": rows}


def run_child(name: str, args: argparse.Namespace) -> dict:
    root = os.path.join(args.workdir, name)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    system = CLASSES[name](root, args)
    out: dict[str, Any] = {"system": name, "load_start": os.getloadavg(), "file_system": file_system(os.path.realpath(root))}
    start = time.perf_counter()
    system.create(base_rows(args.rows))
    out["load_seconds"] = time.perf_counter() - start
    disk = Disk(root)
    times: list[float] = []
    cpu: list[float] = []  # CPU seconds of the process (all threads): the work, without waiting for a loaded machine
    kernel: list[float] = []  # of which system time: the kernel's work for the commit (file creation, fsync, page faults)
    bytes_: dict[int, int] = {}
    maintain_s: list[float] = []
    feeds: dict[str, Any] = {}
    first_end = min(args.window, args.commits)
    last_start = max(args.commits - args.window, first_end)
    began = time.perf_counter()
    done = 0
    for i in range(args.commits):
        if time.perf_counter() - began > args.cap:
            out["stopped"] = f"time cap of {args.cap:.0f} s reached after {done} commits"
            break
        batch = upsert_batch(args.rows, i)
        measured = i < first_end or i >= last_start
        if measured:
            disk.written()  # files written by upkeep or earlier commits are not this commit's
        t0, c0, k0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
        system.upsert(batch)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        kernel.append(resource.getrusage(resource.RUSAGE_SELF).ru_stime - k0)
        if measured:
            bytes_[i] = disk.written()
        done = i + 1
        if done == first_end or done == args.commits:
            feeds[str(done)] = _timed_feed(system)
        if args.maintain_every and done % args.maintain_every == 0:
            t0 = time.perf_counter()
            steps = system.maintain()
            if steps is not None:
                maintain_s.append(time.perf_counter() - t0)
                out["last_maintain"] = steps
        if done % max(1, args.commits // 20) == 0:
            print(f"  {name}: {done:,} commits, last {1000 * times[-1]:.0f} ms, median of the last 100 "
                  f"{1000 * statistics.median(times[-100:]):.0f} ms", flush=True)
    out["commits_done"] = done
    first = list(range(0, min(first_end, done)))
    last = list(range(max(last_start, first_end), done)) if done > first_end else []
    out["first"] = {"range": [1, len(first)], "time": _stats([times[i] for i in first]), "cpu": _stats([cpu[i] for i in first]),
                    "kernel": _stats([kernel[i] for i in first]),
                    "bytes": _stats([bytes_[i] for i in first if i in bytes_])}
    out["last"] = {"range": [last[0] + 1, last[-1] + 1] if last else None, "time": _stats([times[i] for i in last]),
                   "cpu": _stats([cpu[i] for i in last]), "kernel": _stats([kernel[i] for i in last]), "bytes": _stats([bytes_[i] for i in last if i in bytes_])}
    if isinstance(system, Lineage) and len(system.plan_s) == len(times) + 0 and system.plan_s:
        plan = system.plan_s
        out["plan_split"] = {
            "first": {"plan_median": float(np.median([plan[i] for i in first])), "rest_median": float(np.median([times[i] - plan[i] for i in first]))},
            "last": {"plan_median": float(np.median([plan[i] for i in last])), "rest_median": float(np.median([times[i] - plan[i] for i in last]))} if last else None,
        }
    elif isinstance(system, Lineage):
        out["plan_split"] = {"note": f"{len(system.plan_s)} plans for {len(times)} commits (retries?)"}
    out["feeds"] = feeds
    out["maintain"] = {"runs": len(maintain_s), "total_seconds": sum(maintain_s), **_stats(maintain_s)} if maintain_s else None
    out["size_on_disk"] = du(root)
    out["extra"] = system.extra()
    out["load_end"] = os.getloadavg()
    system.close()
    return out


# ---------------------------------------------------------------------- the parent
def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:,.0f}" if x >= 0.1 else f"{1000 * x:,.1f}"


def _kib(x: float | None) -> str:
    return "-" if x is None else f"{x / 1024:,.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or b is None else f"{b / a:.2f}x"


def report(results: dict[str, dict], args: argparse.Namespace) -> str:
    lines = [f"rows {args.rows:,}, commits {args.commits:,} of 10-row upserts (5 updates, 5 inserts), windows of {args.window}", ""]
    lines.append("| system | commits | median ms first | p99 first | median ms last | p99 last | last/first | KiB/commit first | KiB last | last/first "
                 f"| feed@{min(args.window, args.commits)} ms | feed@end ms | end/first | size on disk MiB |")
    lines.append("|" + "---|" * 14)
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} |" + " |" * 12)
            continue
        f, la = r["first"], r["last"]
        feeds = r.get("feeds", {})
        f1 = feeds.get(str(min(args.window, args.commits)))
        f2 = feeds.get(str(args.commits))
        lines.append(
            f"| {name} | {r['commits_done']:,} | {_ms(f['time']['median'])} | {_ms(f['time']['p99'])} | {_ms(la['time']['median'])} | "
            f"{_ms(la['time']['p99'])} | {_ratio(f['time']['median'], la['time']['median'])} | {_kib(f['bytes']['median'])} | "
            f"{_kib(la['bytes']['median'])} | {_ratio(f['bytes']['median'], la['bytes']['median'])} | "
            f"{_ms(f1['seconds']) if f1 else '-'} | {_ms(f2['seconds']) if f2 else '-'} | "
            f"{_ratio(f1['seconds'] if f1 else None, f2['seconds'] if f2 else None)} | {r['size_on_disk'] / 2**20:,.1f} |"
        )
    lines.append("")
    for name, r in results.items():
        bits = []
        if r.get("plan_split") and "first" in r["plan_split"]:
            ps = r["plan_split"]
            bits.append("plan (key lookup) / rest, median ms: first " + f"{_ms(ps['first']['plan_median'])} / {_ms(ps['first']['rest_median'])}"
                        + (f", last {_ms(ps['last']['plan_median'])} / {_ms(ps['last']['rest_median'])}" if ps.get("last") else ""))
        if r["first"].get("kernel") and r["last"]["kernel"]["median"] is not None:
            bits.append(f"CPU per commit, mean ms (of which kernel): first {_ms(r['first']['cpu']['mean'])} ({_ms(r['first']['kernel']['mean'])}), "
                        f"last {_ms(r['last']['cpu']['mean'])} ({_ms(r['last']['kernel']['mean'])})")
        if r.get("maintain"):
            m = r["maintain"]
            bits.append(f"maintain(): {m['runs']} runs, median {m['median']:.1f} s, total {m['total_seconds']:.0f} s")
        if r.get("extra"):
            bits.append("at the end: " + ", ".join(f"{k} {v:,}" for k, v in r["extra"].items()))
        if r.get("stopped"):
            bits.append(r["stopped"])
        if "load_start" in r:
            bits.append(f"load average {r['load_start'][0]:.1f} -> {r['load_end'][0]:.1f}")
        if bits:
            lines.append(f"- {name}: " + "; ".join(bits))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--maintain-every", type=int, default=100)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--cap", type=float, default=3 * 3600, help="seconds of commits per system before it stops")
    parser.add_argument("--cap-for", action="append", default=[], metavar="SYSTEM=SECONDS", help="another cap for one system (repeatable)")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a new folder under the system temp dir, removed after)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.child:
        with open(args.child_out, "w") as f:
            json.dump(run_child(args.child, args), f)
        return
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in CLASSES]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {list(CLASSES)}")
    caps = {}
    for item in args.cap_for:
        name, _, seconds = item.partition("=")
        if name not in CLASSES or not seconds:
            parser.error(f"--cap-for takes SYSTEM=SECONDS with a system of {list(CLASSES)}, got {item!r}")
        caps[name] = float(seconds)
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "child_out", "workdir")}
    rec = record.Recorder("history", scale=args.rows, argv=argv, settings=settings, variant=f"{record.scale_label(args.commits)}-commits",
                          peers=["deltalake", "duckdb-extension-ducklake"])
    own_root = args.workdir is None
    args.root = args.workdir or tempfile.mkdtemp(prefix="history-bench-")
    os.makedirs(args.root, exist_ok=True)
    results: dict[str, dict] = {}
    try:
        for name in systems:
            print(f"{name}: {args.rows:,} rows, {args.commits:,} commits", flush=True)
            child_out = os.path.join(args.root, f"{name}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--child-out", child_out, "--workdir", args.root,
                   "--rows", str(args.rows), "--commits", str(args.commits), "--window", str(args.window),
                   "--maintain-every", str(args.maintain_every), "--cap", str(caps.get(name, args.cap))]
            try:
                subprocess.run(cmd, check=True, timeout=caps.get(name, args.cap) + 3600)
                with open(child_out) as f:
                    results[name] = json.load(f)
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                results[name] = {"error": record.scrub_paths(f"{type(exc).__name__}: {exc}")}
            shutil.rmtree(os.path.join(args.root, name), ignore_errors=True)
    finally:
        if own_root:
            shutil.rmtree(args.root, ignore_errors=True)
    text = report(results, args)
    print(text)
    path = rec.finish({"rows": args.rows, "commits": args.commits, "window": args.window, "maintain_every": args.maintain_every,
                       "feed_commits": FEED_COMMITS, "systems": results}, publish=args.publish, out=args.out)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
