"""What the key index buys: a 1,000-key upsert on 1M and 10M-row keyed tables, before and after.

For each table size, one keyed table (``order_id``) is built from the rows
``write_cost.py`` generates, in ten appends (ten data files), with the key
index switched off
(``lineage.key-index.enabled=false``, the key-scan path). Then:

1. **before**: ``--repeat`` upserts of ``--keys`` rows each (half update
   random live keys, half insert new keys), finding the live rows by a scan
   of the key column;
2. the index is switched on and built by ``Table.reindex()`` (timed: one
   scan of the key column, hashing, sorting, writing, one commit), and the
   in-memory build alone (``KeyIndex.build``) is timed separately; its size
   on disk is reported;
3. **after**: the same number of upserts through the index;
4. a bare lookup of ``--keys`` keys (``KeyIndex.open`` + ``lookup`` on a
   state already read), ``--repeat`` times, on segments opened afresh;
   then the index's *resident* bytes per key: the pages of the
   memory-mapped segment files the lookups touched (``Rss`` of their
   mappings in ``/proc/self/smaps``), and the process's RSS growth over the
   lookups (mappings and anything decoded), both over the live keys.

Bytes per key *live* are the sizes of the segments the current version
names over the live keys (the target is at most 16 for both figures).

Times are wall-clock per call (the builds also in CPU seconds); the median and the fastest of the repeats
are printed, with the 10M/1M ratio, and written to a record
(``benchmarks/record.py``, with the machine's load: the figures are noisy on
a shared machine; ``--publish`` puts it in ``benchmarks/results/`` for
``benchmarks/report.py``). Tables live under ``--workdir`` (default: a
temporary folder, removed at the end).

    .venv/bin/python benchmarks/key_index.py --publish             # 1M and 10M rows
    .venv/bin/python benchmarks/key_index.py --rows 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lineage  # noqa: E402
import record  # noqa: E402
import write_cost  # noqa: E402  (the same generated orders as the write-cost benchmark)
from index import key_segment  # noqa: E402
from index.key_index import KeyIndex  # noqa: E402
from lineage.storage.fileio import ImmutableFileCache  # noqa: E402

SEED = 7


def upsert_batch(data: pa.Table, rng: np.random.Generator, live_max: int, next_key: int, keys: int) -> pa.Table:
    """Half updates of random live keys, half inserts of new keys (values taken from generated rows)."""
    updates = rng.choice(live_max, keys // 2, replace=False)
    ids = np.concatenate([updates, np.arange(next_key, next_key + keys - keys // 2)])
    batch = data.slice(int(rng.integers(0, max(1, data.num_rows - keys))), keys)
    return batch.set_column(0, batch.schema.field("order_id"), pa.array(ids, pa.int64()))


def size_of(paths: tuple[str, ...] | None) -> int:
    return sum(os.path.getsize(p.removeprefix("file://")) for p in paths or ())


def mapped_bytes(suffixes: tuple[str, ...] = ("-keys.kix", "-keys.arrow")) -> int:
    """Resident bytes of this process's mappings of key index segment files (Linux; 0 elsewhere)."""
    total, counting = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    counting = head[-1].endswith(suffixes)
                elif counting and head and head[0] == "Rss:":
                    total += int(head[1]) * 1024
    except OSError:
        return 0
    return total


def rss_bytes() -> int:
    """This process's resident set (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def timed(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_size(root: str, rows: int, keys: int, repeat: int) -> dict[str, object]:
    rng = np.random.default_rng(SEED)
    data = write_cost.generate(rows)
    t = lineage.create_table(
        f"bench.orders_{rows}", data.schema, key=["order_id"], warehouse=root, properties={"lineage.key-index.enabled": "false"}
    )
    load_time = sum(timed(lambda b=b: t.append(b))[0] for b in write_cost.batches(data))
    next_key = rows

    def upserts() -> list[float]:
        nonlocal next_key
        out = []
        for _ in range(repeat):
            batch = upsert_batch(data, rng, rows, next_key, keys)
            next_key += keys
            took, info = timed(lambda: t.upsert(batch))
            assert info.updated == keys // 2 and info.inserted == keys - keys // 2, info
            out.append(took)
        return out

    before = upserts()
    assert t.state().lineage.key_index is None
    with t.iceberg.transaction() as tx:
        tx.set_properties({"lineage.key-index.enabled": "true"})
    t.refresh()
    cpu0 = time.process_time()
    build_mem, built = timed(lambda: KeyIndex.build(t.state()))
    build_cpu = time.process_time() - cpu0
    del built
    cpu0 = time.process_time()
    reindex_time, _ = timed(t.reindex)
    reindex_cpu = time.process_time() - cpu0
    index_bytes = size_of(t.state().lineage.key_index)
    after = upserts()
    probes = [pa.table({"order_id": rng.choice(rows, keys, replace=False)}) for _ in range(repeat)]
    live = t.count()
    lookups = []
    state = t.state()
    key_segment._CACHE = ImmutableFileCache(256)  # the lookups map the segments afresh: only their pages count
    rss0 = rss_bytes()
    for probe in probes:
        dt_, found = timed(lambda probe=probe: KeyIndex.open(state).lookup(probe))
        assert found.num_rows == keys
        lookups.append(dt_)
    resident = mapped_bytes()
    rss_growth = rss_bytes() - rss0
    return {
        "rows": rows,
        "load_s": round(load_time, 2),
        "before_s": before,
        "after_s": after,
        "build_in_memory_s": round(build_mem, 3),
        "reindex_commit_s": round(reindex_time, 3),
        "build_in_memory_cpu_s": round(build_cpu, 3),  # CPU time of the process: what a loaded machine inflates least
        "reindex_commit_cpu_s": round(reindex_cpu, 3),
        "index_bytes": index_bytes,
        "index_bytes_per_key": round(index_bytes / max(1, live), 2),
        "index_format": sorted({key_segment.read_key_segment(t.iceberg.io, p).format_version for p in state.lineage.key_index or ()}),
        "resident_bytes_per_key": round(resident / max(1, live), 2),
        "rss_growth_bytes_per_key": round(rss_growth / max(1, live), 2),
        "index_segments_at_end": len(state.lineage.key_index or ()),
        "index_bytes_per_key_at_end": round(size_of(state.lineage.key_index) / max(1, live), 2),
        "lookup_s": lookups,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000], help="table sizes (default 1M and 10M)")
    ap.add_argument("--keys", type=int, default=1000, help="rows per upsert: half updates, half inserts (default 1,000)")
    ap.add_argument("--repeat", type=int, default=5, help="upserts (and lookups) timed per table and mode (default 5)")
    ap.add_argument("--workdir", default=None, help="where the tables go (default: a temporary folder, removed at the end)")
    record.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.keys < 2 or args.repeat < 1 or min(args.rows) <= args.keys:
        ap.error("need --keys >= 2, --repeat >= 1 and every --rows above --keys")
    rec = record.Recorder("key_index", scale=max(args.rows), argv=argv, settings=vars(args))
    root = args.workdir or tempfile.mkdtemp(prefix="lineage-key-index-")
    sizes = []
    try:
        for rows in sorted(args.rows):
            r = run_size(root, rows, args.keys, args.repeat)
            sizes.append(r)
            print(
                f"{rows:>11,} rows: upsert of {args.keys:,} keys before {statistics.median(r['before_s']) * 1000:7.0f} ms "
                f"(min {min(r['before_s']) * 1000:.0f}), after {statistics.median(r['after_s']) * 1000:7.0f} ms "
                f"(min {min(r['after_s']) * 1000:.0f}); lookup {statistics.median(r['lookup_s']) * 1000:.1f} ms; "
                f"build {r['build_in_memory_s']:.2f} s in memory (CPU {r['build_in_memory_cpu_s']:.2f} s), reindex commit {r['reindex_commit_s']:.2f} s "
                f"(CPU {r['reindex_commit_cpu_s']:.2f} s); "
                f"index {r['index_bytes'] / 1e6:.1f} MB ({r['index_bytes_per_key']} B/key live, {r['resident_bytes_per_key']} B/key "
                f"resident after the lookups, RSS +{r['rss_growth_bytes_per_key']} B/key)",
                flush=True,
            )
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    for what in ("before_s", "after_s", "lookup_s"):
        if len(sizes) >= 2:
            ratio = statistics.median(sizes[-1][what]) / statistics.median(sizes[0][what])
            print(f"{what[:-2]}: {sizes[-1]['rows']:,} / {sizes[0]['rows']:,} rows = {ratio:.2f}x (medians)")
    path = rec.finish({"keys": args.keys, "repeat": args.repeat, "sizes": sizes}, publish=args.publish, out=args.out)
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
