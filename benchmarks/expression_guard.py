"""What checking user expressions and sealing DuckDB connections cost (issue 11).

Every ``where`` and ``set`` value now goes through :func:`lineage.sql.expressions.check`
(DuckDB parses it, the tree is checked and rendered back), and the connections
that evaluate them are sealed (:func:`lineage.duck.seal`: ``allowed_paths`` set to
the live view's files, external access off, configuration locked). This script
measures both against the same calls without them, in one run:

* ``check``: one predicate validated cold (cache cleared) and warm (cached);
* ``scan``, ``delete``, ``update``: each on a table of ``--rows`` rows (ten data
  files), timed alternately with sealing on and with ``duck.seal`` replaced by a
  no-op, ``--repeat`` times each; the median of each arm and their ratio are
  printed. Deletes and updates run on one table in turn (each arm sees the
  same number of files; sealing cost does not depend on the data).

Writes a record (``benchmarks/record.py``; ``--publish`` puts it in ``benchmarks/results/``, where
``benchmarks/report.py`` renders the figures of ``benchmarks/README.md`` from it).

    .venv/bin/python benchmarks/expression_guard.py --publish       # 1,000,000 rows, 5 rounds
    .venv/bin/python benchmarks/expression_guard.py --rows 200000 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

import lineage
from lineage import duck
from lineage.sql import expressions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("amount", pa.float64())])


def _build(root: str, rows: int) -> lineage.Table:
    t = lineage.create_table("bench.guard", SCHEMA, key=["id"], warehouse=root)
    rng = np.random.default_rng(42)
    step = rows // 10
    for i in range(10):
        ids = np.arange(i * step, (i + 1) * step)
        t.append(pa.table({"id": ids, "grp": [f"g{v}" for v in ids % 17], "amount": rng.random(step) * 100}, schema=SCHEMA))
    return t


def _time(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    rec = record.Recorder("expression_guard", scale=args.rows, argv=argv, settings=vars(args))

    predicate = "grp IN ('g1', 'g2') AND amount BETWEEN 10 AND 20 OR lower(grp) LIKE 'g3%'"
    cold, warm = [], []
    for _ in range(50):
        expressions._check.cache_clear()
        cold.append(_time(lambda: expressions.check(predicate, SCHEMA.names)))
        warm.append(_time(lambda: expressions.check(predicate, SCHEMA.names)))
    results: dict[str, object] = {"check_cold_ms": round(statistics.median(cold) * 1e3, 3),
                                  "check_cached_us": round(statistics.median(warm) * 1e6, 1), "ops": {}}
    print(f"check: cold {results['check_cold_ms']} ms, cached {results['check_cached_us']} us (median of 50)")

    root = tempfile.mkdtemp(prefix="guard-")
    real_seal = duck.seal
    try:
        t = _build(root, args.rows)
        times: dict[str, dict[bool, list[float]]] = {op: {True: [], False: []} for op in ("scan", "delete", "update")}
        counter = iter(range(10**9))
        ops = {
            "scan": lambda: t.scan(where="amount < 50 AND grp <> 'g3'", columns=["id", "amount"]),
            "delete": lambda: t.delete(f"id = {next(counter) * 7}"),
            "update": lambda: t.update("grp = 'g5' AND amount < 1", {"amount": "amount + 1"}),
        }
        for _ in range(args.repeat):
            for sealed in (True, False):
                duck.seal = real_seal if sealed else (lambda con, paths=(): None)
                for op, fn in ops.items():
                    times[op][sealed].append(_time(fn))
        print(f"{args.rows:,} rows, {args.repeat} rounds, sealed and unsealed alternating (median seconds):")
        for op, arms in times.items():
            on, off = statistics.median(arms[True]), statistics.median(arms[False])
            results["ops"][op] = {"sealed_s": round(on, 4), "unsealed_s": round(off, 4), "ratio": round(on / off, 3),  # type: ignore[index]
                                  "sealed_all_s": [round(x, 4) for x in arms[True]], "unsealed_all_s": [round(x, 4) for x in arms[False]]}
            print(f"  {op:7s} sealed {on:.3f}  unsealed {off:.3f}  ratio {on / off:.2f}")
    finally:
        duck.seal = real_seal
        shutil.rmtree(root, ignore_errors=True)
    path = rec.finish(results, publish=args.publish, out=args.out)
    print(f"record written to {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
