"""Change-stream ingest: one CDC stream into this product and its peers, in one run (issue 12).

The stream (numpy, fixed seed) starts from a keyed table of ``--scale`` rows
(default 1,000,000; columns id, name, amount, rev) and brings ``--commits``
batches (default 500) of ``--events`` change events each (default 2,000) in
Flink RowKind form: about 60% of the events are updates as ``-U``/``+U`` pairs,
20% inserts (``+I``), 20% deletes (``-D``), and 10% of the keys of a batch are
touched twice in it (update twice, update then delete, delete then re-insert,
insert then update or delete). ``rev`` counts a key's changes, so every image
in a feed can be checked: the generator records each batch's net effect per
key (insert, update pair, delete), which is what a correct change feed of the
batch's commit shows.

Each system runs in a child process, one after the other, and stops taking
batches after ``--time-cap`` seconds:

* ``lineage``: ``Table.apply_changelog(batch)`` (strict mode: every ``-U``
  image is checked against the live row), one merge-on-read commit per batch;
  feed ``cdf.changes(t, v0, v1)``.
* ``lineage-v3``: the same as ``lineage`` on an Iceberg format version 3 table
  (native row lineage; deletes are deletion vectors).
* ``lineage-equality``: the same stream with ``write.changelog.strategy=equality``
  (``apply_changelog(batch, upsert=True)``: data file, equality deletes and
  own-file position deletes, no key lookup). Its feed time includes reconciling
  every changelog commit on the first read (also reported apart); afterwards
  the run CONVERTs the table and reports scan time before/after, CONVERT
  throughput, feed time after and whether the feed is unchanged, beside the
  position strategy's scan time (issue 13 item 5).
* ``delta``: delta-rs with ``delta.enableChangeDataFeed=true``. MERGE refuses
  several source rows per target row, so the batch is first collapsed to each
  key's last event (DuckDB, timed with the commit), then one ``merge``
  (matched + delete event: delete; matched: update; not matched + insert or
  update event: insert); feed ``load_cdf``.
* ``ducklake``: DuckLake (catalog in a local DuckDB file): the same collapse,
  then one ``MERGE INTO`` with the same three branches; feed ``table_changes``.
* ``pyiceberg``: plain pyiceberg 0.12 (copy-on-write): the same collapse, then
  one transaction with ``upsert`` of the live keys and ``delete`` of the
  deleted ones. It has no change feed.
* ``paimon``: Apache Paimon's Python API (``pypaimon``), a primary-key table
  with ``rowkind.field=_op`` and ``changelog-producer=input``: each batch is
  written as it comes (Paimon merges by key), one commit; feed: each
  snapshot's changelog read with row kinds. pypaimon 2.1 pins pyarrow < 20 and
  pandas < 3, so it cannot share this project's environment: it runs in a
  virtual environment of its own (``make bench-cdc`` creates
  ``.venv-paimon``; or pass ``--paimon-python``).

Per system: commit latency p50/p99/mean of the commit call (reading the batch
file is not timed), bytes per commit (growth of the system's folder, metadata
and catalog included, divided by the commits), the change feed over the whole
stream compared per commit with the generator's net effects (rows expected,
returned, missing, extra; commits exact), and the final table checked against
the generator (rows, sum of id, sum of rev).

    .venv/bin/python benchmarks/cdc.py --scale 100000 --commits 50       # quick
    make bench-cdc                                                        # full scale, every system
    .venv/bin/python benchmarks/cdc.py --systems lineage --profile 20    # where our commit time goes
    .venv/bin/python benchmarks/cdc.py --systems lineage,lineage-v3 --commits 150 --phases  # time per phase of a commit

Writes a record (``benchmarks/record.py``; ``--publish`` puts it in ``benchmarks/results/``) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from cdc_stream import check_feed, check_values, folder_bytes, generate
from cdc_systems import CLASSES

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYSTEMS = ("lineage", "lineage-v3", "lineage-equality", "delta", "ducklake", "pyiceberg", "paimon")
TARGET_P50_MS = 150

# ---------------------------------------------------------------- one system (child process)


def run_child(system: str, data: str, root: str, commits: int, cap: float, profile: int, phases: bool = False) -> dict[str, Any]:
    sysobj = CLASSES[system](root)
    out: dict[str, Any] = {"system": system, "notes": sysobj.notes, "load_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    sysobj.load(pq.read_table(os.path.join(data, "base.parquet")))
    out["load_s"] = time.perf_counter() - t0
    size0 = folder_bytes(root)
    latencies: list[float] = []
    cpu: list[float] = []  # CPU seconds of the process (all its threads) per commit: less sensitive to a loaded machine
    reported: list[int] = []
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    timer = None
    if phases:
        from cdc_phases import PhaseTimer

        timer = PhaseTimer().install()
    started = time.perf_counter()
    for b in range(commits):
        if time.perf_counter() - started > cap:
            break
        batch = pq.read_table(os.path.join(data, f"batch-{b:05d}.parquet"))
        if profiler is not None and b >= commits - profile:  # the last commits: where a long stream spends its time
            profiler.enable()
        if timer is not None:
            timer.next_commit()
        t, c = time.perf_counter(), time.process_time()
        n = sysobj.apply(batch)
        latencies.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        if profiler is not None:
            profiler.disable()
        if n is not None:
            reported.append(n)
    done = len(latencies)
    out.update(commits=done, stream_s=time.perf_counter() - started, load_end=os.getloadavg()[0])
    lat = np.array(latencies) * 1000
    if done:
        out.update(p50_ms=float(np.percentile(lat, 50)), p99_ms=float(np.percentile(lat, 99)), mean_ms=float(lat.mean()),
                   cpu_p50_ms=float(np.percentile(np.array(cpu) * 1000, 50)), cpu_p99_ms=float(np.percentile(np.array(cpu) * 1000, 99)),
                   cpu_first50_p50_ms=float(np.percentile(np.array(cpu[:50]) * 1000, 50)),
                   cpu_last50_p50_ms=float(np.percentile(np.array(cpu[-50:]) * 1000, 50)),
                   first50_p50_ms=float(np.percentile(lat[:50], 50)), last50_p50_ms=float(np.percentile(lat[-50:], 50)),
                   bytes_per_commit=(folder_bytes(root) - size0) / done)
        if reported:
            out["reported_bytes_per_commit"] = float(np.mean(reported))
    if timer is not None:
        out["phases"] = timer.summary(list(lat))
        out["phases"]["cpu_ms"] = [round(c * 1000, 1) for c in cpu]  # per commit, to tell periodic work from the machine's load
    if profiler is not None:
        import io
        import pstats

        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(40)
        out["profile"] = buf.getvalue()
    if sysobj.has_feed and done:
        t = time.perf_counter()
        try:
            feed = sysobj.feed(done)
            out["feed_s"] = time.perf_counter() - t
            out["feed"] = check_feed(feed, pq.read_table(os.path.join(data, "expected.parquet")), done)
            out["feed"]["wrong_values"] = check_values(feed)
            if hasattr(sysobj, "row_id_changes"):
                out["feed"]["update_pairs_with_two_row_ids"] = sysobj.row_id_changes
        except Exception as exc:  # a peer's feed failing is a finding, not a crash of the run
            out["feed_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if hasattr(sysobj, "extras") and "feed_error" not in out:
            out["extras"] = sysobj.extras()
    if done == commits:
        fin = sysobj.final()
        with open(os.path.join(data, "final.json")) as f:
            want = json.load(f)
        ids, revs = fin.column("id").to_numpy(), fin.column("rev").to_numpy()
        got = {"rows": int(len(ids)), "sum_id": int(ids.sum()), "sum_rev": int(revs.sum())}
        out["final_ok"] = got == want
        out["final"] = got
    out["versions"] = sysobj.versions()
    return out


# ---------------------------------------------------------------- driver


def _python_for(system: str, args: argparse.Namespace) -> str | None:
    if system != "paimon":
        return sys.executable
    candidate = args.paimon_python or os.path.join(ROOT, ".venv-paimon", "bin", "python")
    return candidate if os.path.exists(candidate) else None


def _fmt(v: Any, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"CDC stream: {args.scale:,} base rows, {args.commits} commits x {args.events} events; time cap {args.time_cap:.0f} s per system",
        "",
        "| system | commits | p50 ms | p99 ms | mean ms | p50 first/last 50 | CPU p50 ms | bytes/commit | feed rows (expected) | missing | extra | commits exact | final |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['system']} | {r['error']} |")
            continue
        feed = r.get("feed")
        if feed:
            fcols = f"{feed['rows']:,} ({feed['expected_rows']:,}) | {feed['missing']:,} | {feed['extra']:,} | {feed['commits_exact']}/{feed['commits']}"
        else:
            fcols = f"{r.get('feed_error', 'no feed')} | - | - | -"
        final = {True: "ok", False: "WRONG"}.get(r.get("final_ok"), "-")
        lines.append(
            f"| {r['system']} | {r['commits']} | {_fmt(r.get('p50_ms'))} | {_fmt(r.get('p99_ms'))} | {_fmt(r.get('mean_ms'))} | "
            f"{_fmt(r.get('first50_p50_ms'))}/{_fmt(r.get('last50_p50_ms'))} | {_fmt(r.get('cpu_p50_ms'))} | "
            f"{_fmt(r.get('bytes_per_commit'), ',.0f')} | {fcols} | {final} |"
        )
    cpu = [r for r in results if "cpu_first50_p50_ms" in r]
    if cpu:  # CPU time of the process per commit: what a loaded machine disturbs least
        lines += ["", "CPU ms per commit, p50 / p99 / p50 of the first and last 50: " + ", ".join(
            f"{r['system']} {r['cpu_p50_ms']:.0f} / {r['cpu_p99_ms']:.0f} / {r['cpu_first50_p50_ms']:.0f}, {r['cpu_last50_p50_ms']:.0f}"
            for r in cpu)]
    ours = next((r for r in results if r["system"] == "lineage" and "p50_ms" in r), None)
    if ours:
        lines += ["", "p50 commit latency relative to lineage: " + ", ".join(
            f"{r['system']} {r['p50_ms'] / ours['p50_ms']:.2f}x" for r in results if "p50_ms" in r and r["system"] != "lineage")]
        verdict = "meets" if ours["p50_ms"] <= TARGET_P50_MS else "misses"
        lines.append(f"lineage p50 {ours['p50_ms']:.0f} ms {verdict} the {TARGET_P50_MS} ms target")
    lines += _strategies(results)
    lines += ["", "load average (1 min) at start/end of each system: " + ", ".join(
        f"{r['system']} {r.get('load_start', 0):.1f}/{r.get('load_end', 0):.1f}" for r in results if "error" not in r)]
    return "\n".join(lines)


def _strategies(results: list[dict[str, Any]]) -> list[str]:
    """Issue 13 item 5: the position and equality strategies side by side (when both ran)."""
    by = {r["system"]: r for r in results if "p50_ms" in r}
    pos, eq = by.get("lineage"), by.get("lineage-equality")
    if not pos or not eq:
        return []
    x = eq.get("extras", {})
    px = pos.get("extras", {})
    lines = ["", "| strategy | p50 ms | p99 ms | bytes/commit | feed s | scan s | after CONVERT: scan s | feed s | feed unchanged |", "|---|---|---|---|---|---|---|---|---|"]
    lines.append(f"| position | {_fmt(pos['p50_ms'])} | {_fmt(pos['p99_ms'])} | {_fmt(pos['bytes_per_commit'], ',.0f')} | "
                 f"{_fmt(pos.get('feed_s'), '.2f')} | {_fmt(px.get('scan_s'), '.3f')} | - | - | - |")
    lines.append(f"| equality | {_fmt(eq['p50_ms'])} | {_fmt(eq['p99_ms'])} | {_fmt(eq['bytes_per_commit'], ',.0f')} | "
                 f"{_fmt(eq.get('feed_s'), '.2f')} (reconcile {_fmt(x.get('reconcile_s'), '.2f')}) | {_fmt(x.get('scan_before_s'), '.3f')} | "
                 f"{_fmt(x.get('scan_after_s'), '.3f')} | {_fmt(x.get('feed_after_s'), '.2f')} | {x.get('feed_unchanged', '-')} |")
    lines.append(f"equality commit p50 {pos['p50_ms'] / eq['p50_ms']:.2f}x cheaper than position (target 3x)")
    if x.get("convert_s"):
        lines.append(f"CONVERT: {x['converted_equality_rows']:,} equality delete rows -> {x['converted_positions']:,} positions in "
                     f"{x['convert_s']:.2f} s ({x['converted_equality_rows'] / x['convert_s']:,.0f} deletes/s)")
    if x.get("scan_after_s") and px.get("scan_s"):
        lines.append(f"scan after CONVERT {x['scan_after_s'] / px['scan_s']:.2f}x the position-strategy table's (target <= 1.1x)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=int, default=1_000_000, help="rows of the keyed table before the stream")
    p.add_argument("--commits", type=int, default=500, help="batches (one commit each)")
    p.add_argument("--events", type=int, default=2000, help="events per batch")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma separated, from {','.join(SYSTEMS)}")
    p.add_argument("--time-cap", type=float, default=600.0, help="seconds of stream per system; later batches are skipped")
    p.add_argument("--workdir", help="where data and tables go (default: a temporary folder, removed at the end)")
    p.add_argument("--paimon-python", help="interpreter with pypaimon installed (default: .venv-paimon/bin/python)")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the last N of our commits (lineage) and print the top")
    p.add_argument("--phases", action="store_true", help="time each phase of our commits (lineage, lineage-v3) and print where it goes")
    p.add_argument("--child", help=argparse.SUPPRESS)
    if "--child" not in (argv if argv is not None else sys.argv[1:]):
        import record  # the driver only: Paimon's child runs in an environment without this project

        record.add_arguments(p)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        res = run_child(args.child, args.data, args.workdir, args.commits, args.time_cap, args.profile, args.phases)
        with open(os.path.join(args.workdir, "result.json"), "w") as f:
            json.dump(res, f)
        return 0

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {SYSTEMS}")
    import record

    rec = record.Recorder("cdc", scale=args.scale, argv=argv, script="cdc.py", settings=vars(args),
                          peers=["deltalake", "duckdb-extension-ducklake"])
    work = args.workdir or tempfile.mkdtemp(prefix="cdc-bench-")
    data = os.path.join(work, "stream")
    os.makedirs(data, exist_ok=True)
    t = time.perf_counter()
    generate(args.scale, args.commits, args.events, data)
    print(f"generated the stream in {time.perf_counter() - t:.1f} s", flush=True)
    results = []
    try:
        for s in systems:
            python = _python_for(s, args)
            if python is None:
                results.append({"system": s, "error": "no interpreter with pypaimon: run `make bench-cdc` (creates .venv-paimon) or pass --paimon-python"})
                continue
            root = os.path.join(work, s)
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            cmd = [python, os.path.abspath(__file__), "--child", s, "--data", data, "--workdir", root, "--commits", str(args.commits),
                   "--time-cap", str(args.time_cap), "--profile", str(args.profile if s in ("lineage", "lineage-v3") else 0)]
            if args.phases and s in ("lineage", "lineage-v3"):
                cmd.append("--phases")
            print(f"running {s} ...", flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            result_path = os.path.join(root, "result.json")
            if proc.returncode != 0 or not os.path.exists(result_path):
                results.append({"system": s, "error": f"failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}"[:300]})
                print(proc.stderr[-3000:], file=sys.stderr)
            else:
                with open(result_path) as f:
                    results.append(json.load(f))
                if "profile" in results[-1]:
                    print(results[-1]["profile"])
            shutil.rmtree(root, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    text = report(results, args)
    if args.phases:
        from cdc_phases import report as phase_report

        text += "\n".join(line for r in results if "phases" in r for line in phase_report(r["system"], r["phases"]))
    print(text)
    path = rec.finish({"commits": args.commits, "events": args.events, "time_cap_s": args.time_cap, "systems": results},
                      publish=args.publish, out=args.out)
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
