"""Following the change feed while the table is written: latency from a commit to its rows at the consumer, and memory.

A 1M-row table (10 files) gets a commit every ``--interval`` seconds for ``--seconds`` seconds (one in each
interval, at a random moment within it, so that commits fall anywhere in the consumer's cycle): an upsert of 100 rows (90 updates of existing ids in a random window of 1,000 consecutive ids, 10 new ids). A consumer
follows the change feed all along, in a process of its own:

* ``lineage-spark``: our Structured Streaming source (``lineage_changes``, ``startingVersion=latest``) with a
  ``--trigger``-second processing-time trigger into Spark's memory sink (local[2]); a row arrives when its
  micro-batch ends (the batch's trigger time plus its duration, from the query's progress events);
* ``lineage-follow``: ``cdf.follow(t, poll_interval=--trigger)``, a range arrives when its rows are read;
* ``delta``: the same commits as delta-rs MERGEs on a Delta table with the change data feed on, polled every
  ``--trigger`` seconds with ``DeltaTable.update_incremental()`` and read with ``load_cdf``. Delta's own
  streaming source (``readChangeFeed`` in delta-spark) needs Delta's jars from Maven, which this machine
  cannot reach (see benchmarks/README.md).

Latency of a commit = arrival of the batch or range holding it minus the moment the writer's commit call
returned (same clock); percentiles leave out the commits of the first ``--warmup`` seconds (Spark's Python
workers start then), the maximum over all commits is kept too. The consumer process samples the resident
memory of itself and its children (Spark's JVM and Python workers) every 2 s while it follows; memory is
compared from two minutes in (Spark's pool of Python workers settles by then) to the end. At the end it checks what it
received: the memory sink's rows equal ``cdf.changes`` over the run; the followers' rows per version equal
the feed's. The followers then read the run's versions once more, one at a time, on the finished table
(whose metadata no longer grows): their memory before and after that replay says whether following itself
holds on to memory, apart from the table's growing metadata.

    .venv/bin/python benchmarks/feed_stream.py --seconds 300 --publish
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import record  # noqa: E402

SYSTEMS = ("lineage-spark", "lineage-follow", "delta")
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("customer", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())])
FILES = 10
UPDATES, INSERTS, WINDOW = 90, 10, 1000
SETTLED = 120  # seconds: memory is compared from here on (Spark's pool of Python workers takes a minute or two to settle)
TABLE = "bench.stream"


# --------------------------------------------------------------------------- tables and commits
def _rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    return pa.table({"id": ids, "customer": pa.array(np.char.add("c", (ids % 100_000).astype(str))),
                     "amount": rng.random(len(ids)) * 100, "qty": rng.integers(1, 10, len(ids)).astype(np.int32)}, schema=SCHEMA)


def build(system: str, location: str, rows: int) -> None:
    """The base table: ``rows`` rows in ``FILES`` appends."""
    rng = np.random.default_rng(42)
    per = rows // FILES
    if system == "delta":
        from deltalake import DeltaTable, write_deltalake

        dt = DeltaTable.create(location, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
        for i in range(FILES):
            write_deltalake(dt, _rows(np.arange(i * per, (i + 1) * per, dtype=np.int64), rng), mode="append")
            dt.update_incremental()
        return
    import lineage

    t = lineage.create_table(TABLE, SCHEMA, key=["id"], warehouse=location)
    for i in range(FILES):
        t.append(_rows(np.arange(i * per, (i + 1) * per, dtype=np.int64), rng))


def writer(system: str, location: str, rows: int, seconds: float, interval: float, log_path: str) -> None:
    """Commit an upsert in every ``interval``-second slot for ``seconds`` s, at a random moment within the slot (so a
    commit falls anywhere in the consumer's polling or trigger cycle); one JSON line per commit (version, when it returned)."""
    rng = np.random.default_rng(7)
    next_id = rows
    if system == "delta":
        from deltalake import DeltaTable

        dt = DeltaTable(location)

        def commit(batch: pa.Table) -> int:
            dt.merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t").when_matched_update_all() \
                .when_not_matched_insert_all().execute()
            return dt.version()
    else:
        import lineage

        t = lineage.open_table(TABLE, warehouse=location)

        def commit(batch: pa.Table) -> int:
            return t.upsert(batch).version

    start = time.time()
    k = 0
    with open(log_path, "w") as log:
        while time.time() - start < seconds:
            due = start + (k + rng.uniform(0, 1)) * interval  # one commit per interval, at a random moment within it
            time.sleep(max(0.0, due - time.time()))
            lo = int(rng.integers(0, rows - WINDOW))
            ids = np.concatenate([np.sort(rng.choice(np.arange(lo, lo + WINDOW), UPDATES, replace=False)),
                                  np.arange(next_id, next_id + INSERTS)]).astype(np.int64)
            next_id += INSERTS
            began = time.time()
            version = commit(_rows(ids, rng))
            log.write(json.dumps({"version": version, "began": began, "done": time.time()}) + "\n")
            log.flush()
            k += 1


# --------------------------------------------------------------------------- consumers (each in its own process)
def _tree_rss_mb(root: int) -> tuple[float, float]:
    """Resident memory of process ``root`` and all its descendants, and of the Python ones among them (not Spark's JVM)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    total, python, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read().splitlines()
        except OSError:
            continue
        kb = next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
        total += kb
        python += kb if status[0].split()[-1].startswith("python") else 0
    return round(total / 1024, 1), round(python / 1024, 1)


class Sampler:
    """RSS of this process tree every 2 s, in a daemon thread: [seconds, MB of the tree, MB of its Python processes]."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.samples.append([round(time.time() - self.t0, 1), *_tree_rss_mb(os.getpid())])
            if self._stop.wait(2.0):
                return

    def stop(self) -> None:
        self._stop.set()


def _wait(path: str) -> Any:
    """The JSON the orchestrator writes to ``path`` once the writer is done (the last version), polled."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def consume(system: str, location: str, trigger: float, control: str) -> None:
    """Follow the feed until the writer's last version arrived; write arrivals, memory and the check to ``control/result.json``."""
    sampler = Sampler()  # stopped by the consumer once the last version arrived, before its checks
    arrivals: list[dict[str, Any]] = []  # {"start": exclusive version, "end": inclusive version, "at": wall time, "rows": n}
    ready, done_path = os.path.join(control, "ready"), os.path.join(control, "done.json")
    consumer = {"lineage-spark": _consume_spark, "lineage-follow": _consume_follow, "delta": _consume_delta}[system]
    check = consumer(location, trigger, arrivals, ready, done_path, sampler)
    with open(os.path.join(control, "result.json"), "w") as f:
        json.dump({"arrivals": arrivals, "rss": sampler.samples, "check": check}, f)


def _consume_spark(location: str, trigger: float, arrivals: list, ready: str, done_path: str, sampler: Sampler) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import datetime as dt

    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    import cdf
    import cdf.spark
    import lineage

    spark = (SparkSession.builder.master("local[2]").appName("feed-stream").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = json.loads(event.progress.json)
            src = p["sources"][0]
            start, end = (json.loads(src[k]) if isinstance(src[k], str) else src[k] for k in ("startOffset", "endOffset"))
            began = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            if start is not None and start["version"] >= 0 and end["version"] > start["version"]:
                arrivals.append({"start": start["version"], "end": end["version"], "rows": p["numInputRows"],
                                 "at": began + p["durationMs"]["triggerExecution"] / 1000})

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Progress())
    t = lineage.open_table(TABLE, warehouse=location)
    first = t.version
    query = (spark.readStream.format(cdf.spark.register_source(spark)).option("table", TABLE).option("warehouse", location)
             .option("startingVersion", "latest").load()
             .writeStream.format("memory").queryName("feed").trigger(processingTime=f"{trigger} seconds").start())
    while not query.recentProgress:  # the first (empty) batch pinned the start
        time.sleep(0.2)
    open(ready, "w").close()
    while (last := _wait(done_path)) is None or not arrivals or arrivals[-1]["end"] < last:
        time.sleep(0.2)
    sampler.stop()
    query.stop()
    got = spark.sql("SELECT * FROM feed").toArrow()
    want = cdf.decode_change_columns(cdf.changes(t, first, last))  # a table sorts by strings, not dictionaries
    order = ["_commit_version", "_row_id", "_change_type"]
    same = got.select(want.column_names).sort_by([(c, "ascending") for c in order]).to_pylist() == \
        want.sort_by([(c, "ascending") for c in order]).to_pylist()
    spark.stop()
    return {"rows": got.num_rows, "expected_rows": want.num_rows, "exact": same, "how": "every row and column of the memory sink"}


def _consume_follow(location: str, trigger: float, arrivals: list, ready: str, done_path: str, sampler: Sampler) -> dict:
    import cdf
    import lineage

    t = lineage.open_table(TABLE, warehouse=location)
    first = t.version
    stop = threading.Event()
    counts: Counter[int] = Counter()
    open(ready, "w").close()

    def watch() -> None:  # stop once the writer's last version arrived
        while (last := _wait(done_path)) is None or not arrivals or arrivals[-1]["end"] < last:
            time.sleep(0.2)
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    for r in cdf.follow(t, first, poll_interval=trigger, stop=stop):
        rows = r.changes.read_all()
        arrivals.append({"start": r.from_version, "end": r.to_version, "rows": rows.num_rows, "at": time.time()})
        counts.update(rows.column("_commit_version").to_pylist())
    sampler.stop()
    last = _wait(done_path)
    want = Counter(cdf.changes(t, first, last).column("_commit_version").to_pylist())
    replay = _replay(lambda: [r.changes.read_all() for r in cdf.follow(t, first, last, max_versions=1, poll_interval=0.01)])
    return {"rows": sum(counts.values()), "expected_rows": sum(want.values()), "exact": counts == want, "how": "rows per version",
            "replay": replay}


def _replay(read_all: Any) -> dict[str, Any]:
    """The run's versions read again one at a time on the finished table (its metadata no longer grows): RSS before and after."""
    before, _ = _tree_rss_mb(os.getpid())
    began = time.time()
    n = len(read_all())
    return {"versions": n, "rss_mb_before": before, "rss_mb_after": _tree_rss_mb(os.getpid())[0], "seconds": round(time.time() - began, 1)}


def _consume_delta(location: str, trigger: float, arrivals: list, ready: str, done_path: str, sampler: Sampler) -> dict:
    from deltalake import DeltaTable

    dt = DeltaTable(location)
    first = last_seen = dt.version()
    counts: Counter[int] = Counter()
    open(ready, "w").close()
    while (last := _wait(done_path)) is None or last_seen < last:
        dt.update_incremental()
        v = dt.version()
        if v == last_seen:
            time.sleep(trigger)
            continue
        rows = pa.table(dt.load_cdf(starting_version=last_seen + 1, ending_version=v).read_all())
        arrivals.append({"start": last_seen, "end": v, "rows": rows.num_rows, "at": time.time()})
        counts.update(rows.column("_commit_version").to_pylist())
        last_seen = v
    sampler.stop()
    want = Counter(pa.table(dt.load_cdf(starting_version=first + 1, ending_version=last).read_all()).column("_commit_version").to_pylist())
    replay = _replay(lambda: [pa.table(dt.load_cdf(starting_version=v, ending_version=v).read_all()) for v in range(first + 1, last + 1)])
    return {"rows": sum(counts.values()), "expected_rows": sum(want.values()), "exact": counts == want, "how": "rows per version",
            "replay": replay}


# --------------------------------------------------------------------------- the run
def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3)


def summarize(commits: list[dict], result: dict, seconds: float, warmup: float) -> dict:
    """Latency per commit (percentiles after the first ``warmup`` seconds, and over all commits), memory over the run, the check."""
    ends = sorted((a["end"], a["start"], a["at"]) for a in result["arrivals"])
    first = commits[0]["done"]
    latencies, steady = [], []
    for c in commits:
        at = next((when for end, start, when in ends if start < c["version"] <= end), None)
        if at is not None:
            latencies.append(round(at - c["done"], 4))
            if c["done"] - first >= warmup:
                steady.append(latencies[-1])
    rss = result["rss"]
    late = [s for s in rss if s[0] >= SETTLED] or rss
    commit_s = [c["done"] - c["began"] for c in commits]
    return {
        "commits": len(commits), "commits_per_s": round(len(commits) / seconds, 3), "commit_s_p50": _pct(commit_s, 50),
        "commit_s_p99": _pct(commit_s, 99), "arrived": len(latencies), "ranges": len(result["arrivals"]),
        "latency_s": {"p50": _pct(steady, 50), "p99": _pct(steady, 99), "mean": round(float(np.mean(steady)), 3), "max": round(max(steady), 3),
                      "commits": len(steady), "all_p50": _pct(latencies, 50), "all_p99": _pct(latencies, 99), "all_max": round(max(latencies), 3)},
        "latencies": latencies,
        "rss_mb": {"settled_at_s": SETTLED, "settled": late[0][1], "end": rss[-1][1], "max": max(s[1] for s in rss),
                   "python_settled": late[0][2], "python_end": rss[-1][2], "samples": rss},
        "check": result["check"],
    }


def run_system(system: str, args: argparse.Namespace, work: str) -> dict:
    location = os.path.join(work, system)
    build(system, location, args.rows)
    control = os.path.join(work, f"{system}-control")
    os.makedirs(control)
    me = [sys.executable, os.path.abspath(__file__)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    consumer = subprocess.Popen([*me, "--consume", system, location, str(args.trigger), control], env=env)
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(control, "ready")):
        if consumer.poll() is not None or time.time() > deadline:
            raise SystemExit(f"{system}: the consumer did not start (exit {consumer.returncode})")
        time.sleep(0.2)
    log = os.path.join(control, "commits.jsonl")
    subprocess.run([*me, "--write", system, location, str(args.rows), str(args.seconds), str(args.interval), log], check=True, env=env)
    with open(log) as f:
        commits = [json.loads(line) for line in f]
    with open(os.path.join(control, "done.json"), "w") as f:
        json.dump(commits[-1]["version"], f)
    if consumer.wait(timeout=600) != 0:
        raise SystemExit(f"{system}: the consumer failed (exit {consumer.returncode})")
    with open(os.path.join(control, "result.json")) as f:
        result = json.load(f)
    out = summarize(commits, result, args.seconds, args.warmup)
    lat, mem = out["latency_s"], out["rss_mb"]
    print(f"{system:15s} commits {out['commits']} (p50 {out['commit_s_p50']:.3f} s)  latency p50 {lat['p50']:.3f} s  p99 {lat['p99']:.3f} s  "
          f"max {lat['max']:.3f} s (all commits: p99 {lat['all_p99']:.3f} s, max {lat['all_max']:.3f} s)  RSS {mem['settled']} -> {mem['end']} MB "
          f"(Python {mem['python_settled']} -> {mem['python_end']} MB)  replay {out['check'].get('replay')}  exact={out['check']['exact']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write"]:
        writer(argv[1], argv[2], int(argv[3]), float(argv[4]), float(argv[5]), argv[6])
        return 0
    if argv[:1] == ["--consume"]:
        consume(argv[1], argv[2], float(argv[3]), argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=300, help="how long the writer commits")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between commits")
    parser.add_argument("--trigger", type=float, default=1.0, help="Spark's trigger interval and the followers' poll interval")
    parser.add_argument("--warmup", type=float, default=30, help="commits of the first seconds are left out of the percentiles (Spark's Python workers start)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"a subset of {','.join(SYSTEMS)}")
    parser.add_argument("--workdir", default=None, help="keep the tables there")
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    rec = record.Recorder("feed_stream", scale=args.rows, argv=argv, settings=vars(args), peers=["pyspark", "deltalake"])
    work = args.workdir or tempfile.mkdtemp(prefix="feed-stream-")
    results: dict[str, Any] = {
        "rows": args.rows, "seconds": args.seconds, "interval": args.interval, "trigger": args.trigger, "warmup": args.warmup,
        "commit": {"updates": UPDATES, "inserts": INSERTS, "window": WINDOW, "files": FILES},
        "delta_spark": "not run: delta-spark's Python package carries no jars; Spark fetches them from Maven Central, "
                       "which this machine cannot reach, and no PyPI package ships them",
        "systems": {},
    }
    try:
        for system in systems:
            results["systems"][system] = run_system(system, args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    path = rec.finish(results, publish=args.publish, out=args.out)
    print(f"record written to {os.path.relpath(path)}")
    return 0 if all(s["check"]["exact"] for s in results["systems"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
