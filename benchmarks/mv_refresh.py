"""Incremental materialized-view refresh versus a full recompute, for 1% changes.

Builds a source table of ``--rows`` rows (default 5 million) and two views over
it, each twice (one refreshed incrementally, one fully):

* ``agg``: ``SELECT region, COUNT(*), SUM(amount), AVG(qty), MIN(amount), MAX(amount) ... GROUP BY region``
  (1,000 groups; a group whose MIN or MAX row changed is recomputed from the source);
* ``sums``: the same without MIN/MAX (pure deltas, never a recomputation);
* ``proj``: ``SELECT id, region, amount * 1.1 AS gross FROM orders WHERE qty > 2`` (about 70% of the rows).

Then, for each of ``--rounds`` rounds, changes ``--percent`` % of the source
rows in three commits (an update of every 250th row, a delete of every 1000th, an
upsert of ``percent/2`` % of the rows, half existing and half new keys) and times:

* ``refresh()`` of the incremental views (net change feed, delta, one merge);
* ``refresh(full=True)`` of the twins (the whole query over the source at the
  new version, diffed with the view, one merge);
* the query alone, evaluated from scratch in DuckDB over the source (no write):
  the floor of any full recompute.

Both views of a pair must hold the same rows afterwards (checked).

    .venv/bin/python benchmarks/mv_refresh.py                 # 5,000,000 rows, 2 rounds
    .venv/bin/python benchmarks/mv_refresh.py --rows 1000000 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cdf.mv  # noqa: E402
import cdf.mv.engines  # noqa: E402
import lineage  # noqa: E402
import record  # noqa: E402
from lineage.read.scan import register_live_view  # noqa: E402
from lineage.iceberg.schema import projection_field_ids  # noqa: E402

VIEWS = {
    "agg": "SELECT region, COUNT(*) AS n, SUM(amount) AS total, AVG(qty) AS avg_qty, MIN(amount) AS lo, MAX(amount) AS hi "
    "FROM orders GROUP BY region",
    "sums": "SELECT region, COUNT(*) AS n, SUM(amount) AS total, AVG(qty) AS avg_qty FROM orders GROUP BY region",
    "proj": "SELECT id, region, amount * 1.1 AS gross FROM orders WHERE qty > 2",
}
REGIONS = np.array([f"r{i:03d}" for i in range(1000)])


def rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array(REGIONS[rng.integers(0, len(REGIONS), len(ids))]),
            "amount": pa.array(np.round(rng.uniform(1, 1000, len(ids)), 2)),
            "qty": pa.array(rng.integers(0, 10, len(ids)), pa.int64()),
        }
    )


def query_from_scratch(source: lineage.Table, query: str) -> tuple[float, int]:
    """The view's query over the source's live rows in DuckDB, result materialised in Arrow."""
    start = time.perf_counter()
    con = cdf.mv.engines.duckdb_connection()  # the same DuckDB settings as the refresh
    try:
        state = source.state()
        register_live_view(con, "orders", state.live_files(), source.arrow_schema, projection_field_ids(source.iceberg.metadata))
        n = con.execute(query).to_arrow_table().num_rows
    finally:
        con.close()
    return time.perf_counter() - start, n


def same(a: cdf.mv.MaterializedView, b: cdf.mv.MaterializedView) -> bool:
    key = "_src_row_id" if a.shape == "projection" else "_mv_key"
    x = a.table.scan(with_lineage=False).sort_by(key)
    y = b.table.scan(with_lineage=False).sort_by(key)
    if x.num_rows != y.num_rows:
        return False
    for name in x.column_names:
        cx, cy = x.column(name), y.column(name)
        if pa.types.is_floating(cx.type):
            if not np.allclose(cx.to_numpy(zero_copy_only=False), cy.to_numpy(zero_copy_only=False), rtol=1e-9, atol=1e-6, equal_nan=True):
                return False
        elif not cx.equals(cy):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=5, help="initial appends (one data file each)")
    parser.add_argument("--percent", type=float, default=1.0, help="share of the source rows changed per round")
    parser.add_argument("--rounds", type=int, default=2)
    record.add_arguments(parser)
    parser.add_argument("--workdir", default=None, help="keep the warehouse there instead of a removed temp dir")
    parser.add_argument(
        "--asof-fix", action="store_true",
        help="also set asof_loop_join_threshold=0 on the library's own DuckDB connections (the proposed lineage fix)",
    )
    args = parser.parse_args(argv)
    rec = record.Recorder("mv_refresh", scale=args.rows, variant="asof-fix" if args.asof_fix else None, argv=argv, settings=vars(args))
    if args.asof_fix:
        from lineage import duck

        plain = duck.connect

        def connect(*extensions: str):  # type: ignore[no-untyped-def]
            con = plain(*extensions)
            con.execute("SET asof_loop_join_threshold = 0")
            return con

        duck.connect = connect

    rng = np.random.default_rng(42)
    wh = args.workdir or tempfile.mkdtemp(prefix="mv-refresh-")
    report: dict = {"rows": args.rows, "percent": args.percent, "asof_fix": args.asof_fix, "views": VIEWS, "rounds": []}
    try:
        schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.float64()), ("qty", pa.int64())])
        # Keys are unique by construction: skip the append-time key scan for the bulk load.
        source = lineage.create_table("bench.orders", schema, key=["id"], warehouse=wh, properties={"lineage.key.enforce": "false"})
        per = args.rows // args.files
        start = time.perf_counter()
        for i in range(args.files):
            source.append(rows(rng, np.arange(i * per, (i + 1) * per, dtype=np.int64)))
        report["load_s"] = time.perf_counter() - start
        print(f"loaded {args.rows:,} rows in {report['load_s']:.1f} s")

        views = {}
        for name, query in VIEWS.items():
            for mode in ("inc", "full"):
                view = cdf.mv.create(f"bench.{name}_{mode}", source, query)
                start = time.perf_counter()
                result = view.refresh()
                elapsed = time.perf_counter() - start
                views[(name, mode)] = view
                report[f"initial_build_{name}_{mode}_s"] = elapsed
                print(f"initial build {view.name}: {elapsed:.2f} s ({result.inserted:,} rows)")

        next_id = args.files * per
        for rnd in range(1, args.rounds + 1):
            # Update every 250th row (0.4%), delete every 1000th (0.1%), upsert 0.5%: half existing rows, half new.
            target = int(args.rows * args.percent / 100)
            live = source.scan(columns=["id"]).column("id").to_numpy()
            n_upsert = target // 2
            old = rng.choice(live, n_upsert // 2, replace=False)
            start = time.perf_counter()
            upd = source.update(f"id % 250 = {17 + rnd}", {"amount": "amount * 1.5", "qty": "(qty + 1) % 10"})
            dele = source.delete(f"id % 1000 = {503 + rnd}")
            new = np.arange(next_id, next_id + (n_upsert - len(old)), dtype=np.int64)
            next_id += len(new)
            ups = source.upsert(rows(rng, np.concatenate([old, new])))
            write_s = time.perf_counter() - start
            changed = upd.updated + dele.deleted + ups.updated + ups.inserted
            print(f"round {rnd}: changed {changed:,} rows ({upd.updated:,} updated, {dele.deleted:,} deleted, {ups.updated:,} upserted "
                  f"existing, {ups.inserted:,} inserted) in 3 commits, {write_s:.1f} s")
            entry: dict = {"round": rnd, "changed_rows": changed, "source_version": source.version, "source_writes_s": write_s,
                           "load1": round(os.getloadavg()[0], 2)}
            for name, query in VIEWS.items():
                inc, full = views[(name, "inc")], views[(name, "full")]
                start = time.perf_counter()
                r_inc = inc.refresh()
                inc_s = time.perf_counter() - start
                start = time.perf_counter()
                r_full = full.refresh(full=True)
                full_s = time.perf_counter() - start
                query_s, n = query_from_scratch(source, query)
                ok = same(inc, full)
                entry[name] = {
                    "incremental_s": inc_s,
                    "full_refresh_s": full_s,
                    "query_only_s": query_s,
                    "view_rows": n,
                    "incremental": {k: getattr(r_inc, k) for k in ("status", "inserted", "updated", "deleted", "groups_recomputed", "feed_rows")},
                    "full": {k: getattr(r_full, k) for k in ("status", "inserted", "updated", "deleted")},
                    "identical": ok,
                }
                print(f"  {name}: incremental {inc_s:.2f} s ({r_inc.inserted:,} ins / {r_inc.updated:,} upd / {r_inc.deleted:,} del, "
                      f"{r_inc.groups_recomputed} groups recomputed, feed {r_inc.feed_rows:,} rows); full refresh {full_s:.2f} s; "
                      f"query alone {query_s:.2f} s; {n:,} view rows; identical: {ok}")
                if not ok:
                    raise SystemExit(f"view {name}: incremental and full refresh differ")
            report["rounds"].append(entry)
    finally:
        if args.workdir is None:
            shutil.rmtree(wh, ignore_errors=True)
    path = rec.finish(report, publish=args.publish, out=args.out)
    print(f"record written to {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
