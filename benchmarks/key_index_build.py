"""Peak memory and time of a key index rebuild and of a full key index merge, each in a fresh process.

For each ``--rows`` size, a keyed table (``order_id``, the rows ``write_cost.py``
generates, one 1M-row data file per million rows) is built once in
``--workdir`` (kept between runs: the tables are large) with the key index
switched off while it loads. Then, each in a new Python process:

1. **rebuild**: ``Table.reindex()`` (``large_measure.reindex_memory``: its time
   and the process's peak resident memory, ``VmHWM``, beyond the interpreter,
   its imports and the opened table);
2. **full merge**: an upsert of ``--keys`` existing keys (a delta segment
   beside the base), then ``Table.merge_key_index(full=True)``, whose time and
   peak memory are measured the same way.

Both steps commit (the table's index changes, its rows do not), so the
script can run again on the same tables. ``--budget`` sets the tables'
``lineage.key-index.build-memory-bytes`` first (default: leave it as it is).
``--repo`` measures another checkout of the library with the same tables
(the before/after comparison of a change). Figures are noisy on a shared
machine; the record carries the load.

    .venv/bin/python benchmarks/key_index_build.py --rows 1000000 10000000 --workdir ~/key-index-build
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import large_measure  # noqa: E402
import record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = 1_000_000

_MAKE = r"""
import sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import numpy as np, pyarrow as pa
import lineage, write_cost
rows, warehouse, name = int(sys.argv[2]), sys.argv[3], sys.argv[4]
t = lineage.create_table(name, write_cost.SCHEMA, key=["order_id"], warehouse=warehouse,
                         properties={"lineage.key-index.enabled": "false"})
for start in range(0, rows, %d):
    n = min(%d, rows - start)
    t.append(write_cost.generate(n).set_column(0, "order_id", pa.array(np.arange(start, start + n, dtype=np.int64))))
with t.iceberg.transaction() as tx:
    tx.set_properties({"lineage.key-index.enabled": "true"})
print("{}")
""" % (STEP, STEP)

_SET = r"""
import sys
sys.path.insert(0, sys.argv[1])
import lineage
t = lineage.open_table(sys.argv[3], warehouse=sys.argv[2])
with t.iceberg.transaction() as tx:
    tx.set_properties({"lineage.key-index.build-memory-bytes": sys.argv[4]})
print("{}")
"""

_MERGE = large_measure._PRELUDE + r"""
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import numpy as np, pyarrow as pa
import write_cost
t = lineage.open_table(sys.argv[3], warehouse=sys.argv[2])
rows, keys = int(sys.argv[4]), int(sys.argv[5])
batch = write_cost.generate(keys)
batch = batch.set_column(0, "order_id", pa.array(np.random.default_rng(rows % 9973).choice(rows, keys, replace=False), pa.int64()))
t.upsert(batch)
segments = len(t.state().lineage.key_index or ())
base = rss("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
start, cpu = time.perf_counter(), time.process_time()
t.merge_key_index(full=True)
print(json.dumps({"segments_merged": segments, "seconds": round(time.perf_counter() - start, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
                  "baseline_mb": round(base / 1024, 1), "peak_mb": round(rss("VmHWM") / 1024, 1),
                  "grew_mb": round((rss("VmHWM") - base) / 1024, 1)}))
"""


def run_size(repo: str, warehouse: str, rows: int, keys: int, budget: int | None) -> dict[str, Any]:
    """The rebuild and the full merge of the table of ``rows`` rows (built first when missing)."""
    name = f"bench.keys_{rows}"
    if not os.path.isdir(os.path.join(warehouse, "bench", f"keys_{rows}")):
        made = large_measure.in_fresh_process(_MAKE, repo, str(rows), warehouse, name)
        if "error" in made:
            raise SystemExit(f"building the {rows:,}-row table failed: {made['error']}")
    if budget is not None:
        large_measure.in_fresh_process(_SET, repo, warehouse, name, str(budget))
    rebuild = large_measure.reindex_memory(repo, warehouse, name)
    merge = large_measure.in_fresh_process(_MERGE, repo, warehouse, name, str(rows), str(keys))
    return {"rows": rows, "rebuild": rebuild, "full_merge": merge}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000], help="table sizes (default 1M and 10M)")
    ap.add_argument("--keys", type=int, default=100_000, help="keys the upsert before the full merge rewrites (default 100,000)")
    ap.add_argument("--workdir", required=True, help="where the tables are built and kept (outside the repository)")
    ap.add_argument("--budget", type=int, default=None, help="set lineage.key-index.build-memory-bytes on the tables first")
    ap.add_argument("--repo", default=ROOT, help="the checkout of the library to measure (default: this one)")
    record.add_arguments(ap)
    args = ap.parse_args(argv)
    if min(args.rows) <= args.keys:
        ap.error("every --rows must be above --keys")
    rec = record.Recorder("key_index_build", scale=max(args.rows), argv=argv, settings=vars(args))
    warehouse = os.path.abspath(os.path.expanduser(args.workdir))
    sizes = []
    for rows in sorted(args.rows):
        r = run_size(os.path.abspath(args.repo), warehouse, rows, args.keys, args.budget)
        sizes.append(r)
        b, m = r["rebuild"], r["full_merge"]
        print(f"{rows:>13,} rows: rebuild {b.get('seconds')} s, peak {b.get('peak_mb')} MB (+{b.get('grew_mb')} MB); "
              f"full merge {m.get('seconds')} s, peak {m.get('peak_mb')} MB (+{m.get('grew_mb')} MB)", flush=True)
    path = rec.finish({"keys": args.keys, "budget": args.budget, "sizes": sizes}, publish=args.publish, out=args.out)
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
