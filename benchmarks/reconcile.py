"""Reconciling a foreign commit (issue 14): what does one Spark UPDATE cost us, against the same change by our writer?

Workload (fixed): a keyed table (``id`` int64 key, ``name`` string, ``amount``
float64) of ``--rows`` rows in ``--files`` data files (one append each). Then,
per write mode:

* Spark 3.5 + Iceberg 1.10 (the project's reference engine, tests/reference)
  runs ``UPDATE t SET amount = amount + 1 WHERE id % 100 = 0`` (1% of the rows,
  every file touched) with ``write.update.mode`` = ``merge-on-read`` (one
  position delete file per data file and one new data file) or
  ``copy-on-write`` (every data file rewritten);
* ``reconcile (warm)``: ``Table.reconcile()`` on the Table object that had
  planned the parent snapshot (a long-lived reader or writer);
* ``reconcile (cold)``: the same on a second, identical table, from a freshly
  opened Table in a process that had planned nothing;
* ``our upsert``: on a third identical table, ``Table.upsert`` of the same
  1% of keys with the same new values, in the same write mode.

Prints one line per mode with the three times (seconds, one run each: run it
on a quiet machine and read the ratios) and writes a record (``benchmarks/record.py``; ``--publish`` puts it
in ``benchmarks/results/``, where ``benchmarks/report.py`` renders it as the section ``reconcile``). Spark's
own time is not measured.

    .venv/bin/python benchmarks/reconcile.py --rows 1000000 --publish
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import lineage  # noqa: E402
import record  # noqa: E402
from lineage.state import forget_planned_files  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
NAME = "bench.t"


def _table(warehouse: str, rows: int, files: int) -> lineage.Table:
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
    per = rows // files
    for i in range(files):
        ids = np.arange(i * per, (i + 1) * per)
        t.append(pa.table({"id": ids, "name": [f"n{k}" for k in ids], "amount": ids.astype(float)}, schema=SCHEMA))
    return t


def _spark_update(ref, warehouse: str, mode: str) -> None:  # type: ignore[no-untyped-def]
    ref.sql(warehouse, f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.update.mode'='{mode}')")
    ref.sql(warehouse, f"UPDATE {NAME} SET amount = amount + 1 WHERE id % 100 = 0")


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run the workload, print the figures and write the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10)
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    from reference import ReferenceEngine

    rec = record.Recorder("reconcile", scale=args.rows, argv=argv, settings=vars(args))
    modes = []

    with ReferenceEngine() as ref, tempfile.TemporaryDirectory(prefix="bench-reconcile-") as tmp:
        print(f"rows={args.rows:,} files={args.files} load={os.getloadavg()[0]:.2f}")
        for mode in ("merge-on-read", "copy-on-write"):
            warm_wh, cold_wh, ours_wh = (os.path.join(tmp, f"{mode}-{k}") for k in ("warm", "cold", "ours"))
            warm = _table(warm_wh, args.rows, args.files)
            warm.scan(columns=["id"])  # the parent snapshot is planned, as in a long-lived Table
            _spark_update(ref, warm_wh, mode)
            t_warm = _timed(warm.reconcile)
            _table(cold_wh, args.rows, args.files)
            _spark_update(ref, cold_wh, mode)
            forget_planned_files()
            cold = lineage.open_table(NAME, warehouse=cold_wh)
            t_cold = _timed(cold.reconcile)
            ours = _table(ours_wh, args.rows, args.files)
            ids = np.arange(0, args.rows, 100)
            batch = pa.table({"id": ids, "name": [f"n{k}" for k in ids], "amount": ids.astype(float) + 1}, schema=SCHEMA)
            t_ours = _timed(lambda: ours.upsert(batch, mode=None if mode == "merge-on-read" else lineage.COPY_ON_WRITE))
            last = warm.history()[-1]
            assert (last.inserted, last.updated, last.deleted) == (0, len(ids), 0), last
            print(
                f"{mode}: reconcile (warm) {t_warm:.3f} s, reconcile (cold) {t_cold:.3f} s, our upsert {t_ours:.3f} s "
                f"(reconcile/ours {t_warm / t_ours:.2f}x)",
                flush=True,
            )
            modes.append({"mode": mode, "updated": len(ids), "reconcile_warm_s": t_warm, "reconcile_cold_s": t_cold, "upsert_s": t_ours})
            for wh in (warm_wh, cold_wh):
                ref.forget(wh)
    path = rec.finish({"rows": args.rows, "files": args.files, "modes": modes}, publish=args.publish, out=args.out)
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
