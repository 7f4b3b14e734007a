"""Where a change feed call spends its time: run.py's workload built once, its feeds timed and profiled.

Builds the tables of ``benchmarks/run.py`` (ours, ours with pre-image capture,
delta-rs) once under ``--workdir`` (kept: a second run reuses them), then
calls each feed ``--calls`` times and prints the median, the output's shape
and, with ``--profile``, the top functions of a cProfile of the calls. The
work compared is the same: every system's feed is materialised as one Arrow
table of the same rows (delta-rs ``load_cdf(...).read_all()``, as run.py).

    .venv/bin/python benchmarks/feed_profile.py --scale 1000000 --workdir /some/dir
    .venv/bin/python benchmarks/feed_profile.py --scale 1000000 --workdir /some/dir --systems lineage --profile
    .venv/bin/python benchmarks/feed_profile.py --scale 1000000 --workdir /some/dir --systems lineage-capture --trace

``--trace`` prints, for the last call of each feed, when each phase of the
embedded engine ran, in which thread, and its wall and CPU time: gaps and
phases whose wall time exceeds their CPU time show a thread waiting (for
the GIL, for the other thread, or for a core on a busy machine).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import functools
import statistics
import sys
import threading
import time

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from run import CHANGE_COMMITS, UPSERT_BATCHES, make_plan  # noqa: E402
from run_systems import IMPLS  # noqa: E402

SYSTEMS = ("lineage", "lineage-capture", "delta")


def build(system: str, plan_dir: str, root: str) -> dict[str, int]:
    """Run the workload's writes on ``system`` under ``root``; its versions (base, after the changes, end)."""
    impl = IMPLS[system](root)
    os.makedirs(root, exist_ok=True)
    impl.create()
    impl.append(pq.read_table(os.path.join(plan_dir, "base.parquet")))
    v_base = impl.version()
    for i in range(1, CHANGE_COMMITS + 1):
        impl.change(pq.read_table(os.path.join(plan_dir, f"change_{i:02d}_update.parquet")),
                    pq.read_table(os.path.join(plan_dir, f"change_{i:02d}_delete.parquet")))
    v_changes = impl.version()
    for k in range(1, UPSERT_BATCHES + 1):
        impl.upsert(pq.read_table(os.path.join(plan_dir, f"upsert_{k}.parquet")))
    return {"base": v_base, "changes": v_changes, "end": impl.version()}


def reopen(system: str, root: str) -> object:
    """The system's table under ``root``, opened again (as a fresh process finds it)."""
    impl = IMPLS[system](root)
    if system.startswith("lineage"):
        import cdf
        import lineage

        impl.cdf = cdf
        impl.t = lineage.open_table("bench.orders", warehouse=root)
    else:
        from deltalake import DeltaTable

        impl.path = os.path.join(root, "orders")
        impl.t = DeltaTable(impl.path)
    return impl


PHASES = ("cdf.engine_duckdb:change_pointers", "cdf.engine_duckdb:_read_images", "cdf.plan:per_version", "cdf.engine_duckdb:_meta",
          "cdf.engine_duckdb:take_rows", "cdf.engine_duckdb:changed_matrix", "cdf.engine_duckdb:_list_elements",
          "cdf.engine_duckdb:_list_layout", "cdf.engine_duckdb:decoded", "cdf.engine_duckdb:_ordered_halves")


def traced(events: list[tuple[str, int, float, float, float]]) -> None:
    """Wrap the feed's phases (:data:`PHASES`, ``module:function``) so that each call appends
    ``(name, thread id, start, end, thread CPU seconds)`` to ``events``."""
    import importlib

    for spec in PHASES:
        module_name, name = spec.split(":")
        module = importlib.import_module(module_name)
        f = getattr(module, name)

        def wrapper(*args: object, _f=f, _name=name, **kwargs: object) -> object:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return _f(*args, **kwargs)
            finally:
                events.append((_name, threading.get_ident(), t0, time.perf_counter(), time.thread_time() - c0))

        setattr(module, name, functools.wraps(f)(wrapper))


def print_trace(events: list[tuple[str, int, float, float, float]], t0: float) -> None:
    """The phases of one call, in start order: thread, start and end (ms from the call's start), wall and CPU."""
    main_thread = threading.get_ident()
    for name, tid, start, end, cpu in sorted(events, key=lambda e: e[2]):
        who = "main" if tid == main_thread else "work"
        print(f"    {who} {name:16s} {(start - t0) * 1e3:7.2f} -> {(end - t0) * 1e3:7.2f} ms  wall {(end - start) * 1e3:6.2f}  cpu {cpu * 1e3:6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1_000_000)
    parser.add_argument("--workdir", required=True, help="where the plan and tables are kept (reused when present)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--feeds", default="all,last5")
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the calls")
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--trace", action="store_true", help="print when each phase of the last call ran, in which thread")
    args = parser.parse_args(argv)
    events: list[tuple[str, int, float, float, float]] = []
    if args.trace:
        traced(events)
    work = os.path.join(args.workdir, f"scale-{args.scale}")
    plan_dir = os.path.join(work, "plan")
    if not os.path.exists(os.path.join(plan_dir, "expected.json")):
        make_plan(args.scale, plan_dir)
    print(f"load average: {os.getloadavg()}")
    for system in args.systems.split(","):
        root = os.path.join(work, system)
        vfile = os.path.join(work, f"{system}.versions.json")
        if not os.path.exists(vfile):
            t0 = time.perf_counter()
            versions = build(system, plan_dir, root)
            json.dump(versions, open(vfile, "w"))
            print(f"built {system} in {time.perf_counter() - t0:.1f}s")
        versions = json.load(open(vfile))
        impl = reopen(system, root)
        for feed in args.feeds.split(","):
            a = versions["base"] if feed in ("all", "net") else versions["changes"]
            net = feed == "net"
            times, cpu = [], []
            prof = cProfile.Profile() if args.profile else None
            out = None
            for _ in range(args.calls):
                del out
                events.clear()
                if prof:
                    prof.enable()
                t0, c0 = time.perf_counter(), time.process_time()
                out = impl.feed(a, versions["end"], net)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                if prof:
                    prof.disable()
            print(f"{system:16s} {feed:6s} median {statistics.median(times):.4f}s  min {min(times):.4f}s  first {times[0]:.4f}s  "
                  f"cpu median {statistics.median(cpu):.4f}s  rows {out.num_rows:,} cols {out.num_columns} bytes {out.nbytes:,}", flush=True)
            if args.trace and system.startswith("lineage"):
                print_trace(events, t0)
            if prof:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)
            del out
            out = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
