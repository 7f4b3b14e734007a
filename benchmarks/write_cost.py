"""What a 1% update costs: bytes written, files, wall time, against table size.

Builds identical tables of ``--rows`` generated rows (fixed seed, written in
ten appends like ten daily batches, so each table has ten data files), then
updates 1% of the rows (``amount = amount + 1``) in four ways, each on its own
fresh table so every write starts from the same state:

* lineage, merge-on-read (the default): position deletes + new row images;
* lineage, copy-on-write (``mode="copy-on-write"``): every affected data file rewritten;
* plain pyiceberg ``Table.overwrite(rows, overwrite_filter=...)`` (copy-on-write);
* plain pyiceberg ``Table.upsert(rows, join_cols=["order_id"])`` (copy-on-write).

Bytes written are measured on disk: the sizes of the files that appear under
the table's folder during the write (data, delete, lineage, index and Iceberg
metadata files). Table size is every file under the table's folder before the
write. Wall time is the write call alone (for the lineage updates it includes
finding the rows and computing their new values; pyiceberg is handed the new
rows). With ``--repeat N`` every scenario runs N times on fresh tables and the
fastest time is reported. Prints a table and writes a record (``benchmarks/record.py``;
``--publish`` puts it in ``benchmarks/results/`` for ``benchmarks/report.py``).

    .venv/bin/python benchmarks/write_cost.py                  # 1,000,000 rows, 1% scattered
    .venv/bin/python benchmarks/write_cost.py --repeat 3 --pattern clustered
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lineage  # noqa: E402
import record  # noqa: E402
from lineage.catalog import default_catalog  # noqa: E402
from record import files_under  # noqa: E402

SEED = 42
APPENDS = 10
SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer_id", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("ordered_at", pa.timestamp("us")),
    ]
)


def generate(rows: int) -> pa.Table:
    """``rows`` orders with order_id 0..rows-1 (deterministic)."""
    rng = np.random.default_rng(SEED)
    return pa.table(
        {
            "order_id": np.arange(rows, dtype=np.int64),
            "customer_id": rng.integers(0, 50_000, rows),
            "status": np.array(["new", "paid", "shipped", "cancelled"])[rng.integers(0, 4, rows)],
            "amount": np.round(rng.uniform(1.0, 1000.0, rows), 2),
            "ordered_at": np.datetime64("2026-01-01T00:00:00", "us") + rng.integers(0, 300 * 86400, rows).astype("timedelta64[s]"),
        },
        schema=SCHEMA,
    )


def batches(data: pa.Table) -> list[pa.Table]:
    step = -(-data.num_rows // APPENDS)
    return [data.slice(i, step) for i in range(0, data.num_rows, step)]


def kind(path: str) -> str:
    parts = path.replace(os.sep, "/")
    if "/metadata/lineage/" in parts or "/metadata/index/" in parts:
        return "lineage"
    if "/metadata/" in parts:
        return "iceberg_metadata"
    if parts.endswith("-deletes.parquet"):
        return "delete"
    return "data"


def measure(name: str, root: str, write: Callable[[], object]) -> dict:
    """Run ``write`` and diff the files under ``root``."""
    before = files_under(root)
    start = time.perf_counter()
    result = write()
    wall = time.perf_counter() - start
    after = files_under(root)
    new = {p: s for p, s in after.items() if p not in before}
    changed = [p for p in before if p in after and after[p] != before[p]]
    by_kind: dict[str, dict[str, int]] = {}
    for p, s in new.items():
        k = by_kind.setdefault(kind(p), {"files": 0, "bytes": 0})
        k["files"] += 1
        k["bytes"] += s
    table_bytes = sum(before.values())
    written = sum(new.values())
    return {
        "scenario": name,
        "table_bytes": table_bytes,
        "table_files": len(before),
        "bytes_written": written,
        "files_written": len(new),
        "files_changed_in_place": len(changed),
        "by_kind": by_kind,
        "wall_seconds": round(wall, 3),
        "ratio_written_to_table": round(written / table_bytes, 4),
        "result": result,
    }


def table_root(iceberg_table) -> str:  # type: ignore[no-untyped-def]
    loc = iceberg_table.metadata.location
    return loc[len("file://") :] if loc.startswith("file://") else loc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table (default 1,000,000)")
    parser.add_argument("--percent", type=float, default=1.0, help="percent of rows to update (default 1)")
    parser.add_argument(
        "--pattern",
        choices=("scattered", "clustered"),
        default="scattered",
        help="scattered: every Nth order_id, so every data file is touched (default); clustered: one contiguous order_id range",
    )
    record.add_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each scenario, each on a fresh table; wall time is the fastest (default 1)")
    parser.add_argument("--workdir", default=None, help="where to build the tables (default: a temp dir, removed afterwards)")
    args = parser.parse_args(argv)
    if args.rows < 1000:
        parser.error("--rows must be at least 1000")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not 0 < args.percent <= 100:
        parser.error("--percent must be in (0, 100]")
    rec = record.Recorder("write_cost", scale=args.rows, variant=args.pattern, argv=argv, settings=vars(args))

    workdir = args.workdir or tempfile.mkdtemp(prefix="write-cost-")
    os.makedirs(workdir, exist_ok=True)
    data = generate(args.rows)
    n_update = max(1, int(round(args.rows * args.percent / 100)))
    if args.pattern == "scattered":
        stride = args.rows // n_update
        ids = np.arange(0, stride * n_update, stride, dtype=np.int64)
        where = f"order_id % {stride} = 0 AND order_id < {stride * n_update}"
    else:
        lo = (args.rows - n_update) // 2
        ids = np.arange(lo, lo + n_update, dtype=np.int64)
        where = f"order_id >= {lo} AND order_id < {lo + n_update}"
    new_rows = data.take(pa.array(ids))
    new_rows = new_rows.set_column(3, "amount", pc.add(new_rows.column("amount"), 1.0))
    expected_sum = pc.sum(data.column("amount")).as_py() + n_update

    from pyiceberg.expressions import And, GreaterThanOrEqual, In, LessThan

    if args.pattern == "scattered":
        ice_filter = In("order_id", ids.tolist())
    else:
        ice_filter = And(GreaterThanOrEqual("order_id", int(ids[0])), LessThan("order_id", int(ids[-1]) + 1))

    catalog = default_catalog(os.path.join(workdir, "wh"))
    def lineage_table(name: str) -> lineage.Table:
        t = lineage.create_table(f"bench.{name}", SCHEMA, key=["order_id"], catalog=catalog)
        for b in batches(data):
            t.append(b)
        return t

    def plain_table(name: str):  # type: ignore[no-untyped-def]
        catalog.create_namespace_if_not_exists("bench")
        t = catalog.create_table(("bench", name), schema=SCHEMA, properties={"format-version": "2"})
        for b in batches(data):
            t.append(b)
        return t

    def check(rows: int, amount_sum: float, what: str) -> None:
        if rows != args.rows or abs(amount_sum - expected_sum) > 1e-6 * max(1.0, abs(expected_sum)):
            raise SystemExit(f"{what}: wrong result after the write ({rows} rows, sum(amount) {amount_sum}, expected {args.rows}, {expected_sum})")

    def lineage_update(mode: str, run: int) -> dict:
        t = lineage_table(f"{'mor' if mode == lineage.MERGE_ON_READ else 'cow'}_{run}")

        def write() -> dict:
            info = t.update(where, {"amount": "amount + 1"}, mode=mode)
            return {"updated": info.updated, "commit_info_bytes_written": info.bytes_written, "version": info.version}

        r = measure(f"lineage update, {mode}", table_root(t.iceberg), write)
        if r["result"]["updated"] != n_update:
            raise SystemExit(f"{r['scenario']}: updated {r['result']['updated']} rows, expected {n_update}")
        out = t.scan(columns=["amount"])
        check(out.num_rows, pc.sum(out.column("amount")).as_py(), r["scenario"])
        return r

    def pyiceberg_overwrite(run: int) -> dict:
        p = plain_table(f"pyiceberg_overwrite_{run}")
        r = measure("pyiceberg overwrite(filter), copy-on-write", table_root(p), lambda: p.overwrite(new_rows, overwrite_filter=ice_filter) or {})
        out = p.refresh().scan(selected_fields=("amount",)).to_arrow()
        check(out.num_rows, pc.sum(out.column("amount")).as_py(), r["scenario"])
        return r

    def pyiceberg_upsert(run: int) -> dict:
        p = plain_table(f"pyiceberg_upsert_{run}")

        def upsert() -> dict:
            res = p.upsert(new_rows, join_cols=["order_id"])
            return {"updated": res.rows_updated, "inserted": res.rows_inserted}

        r = measure("pyiceberg upsert(join_cols), copy-on-write", table_root(p), upsert)
        out = p.refresh().scan(selected_fields=("amount",)).to_arrow()
        check(out.num_rows, pc.sum(out.column("amount")).as_py(), r["scenario"])
        return r

    scenarios = [
        lambda run: lineage_update(lineage.MERGE_ON_READ, run),
        lambda run: lineage_update(lineage.COPY_ON_WRITE, run),
        pyiceberg_overwrite,
        pyiceberg_upsert,
    ]
    runs: list[list[dict]] = [[] for _ in scenarios]
    for run in range(args.repeat):  # interleaved, so background load hits every scenario alike
        for i, scenario in enumerate(scenarios):
            runs[i].append(scenario(run))
    results = []
    for rs in runs:
        r = dict(rs[0])  # bytes and files are the same in every run (file names differ, sizes by a few bytes at most)
        r["wall_seconds_all"] = [x["wall_seconds"] for x in rs]
        r["wall_seconds"] = min(r["wall_seconds_all"])
        results.append(r)

    report = {
        "rows_updated": n_update, "percent": args.percent, "pattern": args.pattern, "where": where,
        "data_files_per_table": APPENDS, "repeat": args.repeat, "scenarios": results,
    }
    path = rec.finish(report, publish=args.publish, out=args.out)

    print(f"write cost of updating {n_update:,} of {args.rows:,} rows ({args.pattern}: {where}); {APPENDS} data files per table")
    headers = ("scenario", "table size", "bytes written", "files", "data", "deletes", "lineage", "ice meta", "wall s" if args.repeat == 1 else f"wall s (min of {args.repeat})", "written/table")
    rows = []
    for r in results:
        k = r["by_kind"]
        rows.append(
            (
                r["scenario"],
                f"{r['table_bytes']:,}",
                f"{r['bytes_written']:,}",
                str(r["files_written"]),
                str(k.get("data", {}).get("files", 0)),
                str(k.get("delete", {}).get("files", 0)),
                str(k.get("lineage", {}).get("files", 0)),
                str(k.get("iceberg_metadata", {}).get("files", 0)),
                f"{r['wall_seconds']:.2f}",
                f"{r['ratio_written_to_table']:.2%}",
            )
        )
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
    for i, row in enumerate([headers, *rows]):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("(files = all new files; data/deletes/lineage/ice meta = new data files, position delete files, lineage+index files, Iceberg metadata files)")
    print(f"record written to {os.path.relpath(path)}")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
