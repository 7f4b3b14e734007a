"""The change feed read by a process of its own: what a feed consumer holds (benchmarks/run.py).

The feed steps of ``run.py`` run in the process that wrote the table, so
their peak RSS also holds what the writes left (caches, the allocator's free
pages, the write path's modules). A consumer that only reads the feed, a CDC
job, starts fresh: this runs the feed (a) of each system that has one in a new
process per mode, after that system's writes, on its finished table, and
records the resident size after importing the system's library, after
opening the table, and the process's peak (the kernel's ``VmHWM``, read
inside the process: ``wait4`` would also count pages shared with the parent
before ``exec``). Two modes:

* ``table``: the feed as one Arrow table, as the feed steps read it;
* ``stream``: the feed as a stream of record batches, each summarised (counts
  and ``sum(id)`` per change type) and dropped, as a consumer that forwards
  changes reads it: ours ``cdf.change_batches`` (default parts), delta-rs
  ``load_cdf`` (a RecordBatchReader), Lance the readers of ``delta()``.

Each consumer prints one JSON line; the answers' counts are compared with
the feed step's.

    .venv/bin/python benchmarks/run_consumer.py lineage ROOT 1 26 stream
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("table", "stream")
TIMEOUT = 1800.0


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _lineage(root: str, a: int, b: int, mode: str) -> Iterator[Any]:
    import cdf
    import lineage

    yield None  # imported
    t = lineage.open_table("bench.orders", warehouse=root)
    yield None  # opened
    if mode == "table":
        yield cdf.changes(t, a, b)
    else:
        yield from cdf.change_batches(t, a, b)


def _delta(root: str, a: int, b: int, mode: str) -> Iterator[Any]:
    import pyarrow as pa
    from deltalake import DeltaTable

    yield None
    t = DeltaTable(os.path.join(root, "orders"))
    yield None
    reader = t.load_cdf(starting_version=a + 1, ending_version=b)
    if mode == "table":
        yield pa.table(reader.read_all())
    else:
        yield from (pa.record_batch(batch) for batch in reader)


def _lance(root: str, a: int, b: int, mode: str) -> Iterator[Any]:
    import lance
    import pyarrow as pa

    yield None
    ds = lance.dataset(os.path.join(root, "orders.lance"))
    yield None
    d = ds.delta(begin_version=a, end_version=b)
    for kind, reader in (("insert", d.get_inserted_rows()), ("update_postimage", d.get_updated_rows()), ("delete", d.get_deleted_row_ids())):
        tables = [reader.read_all()] if mode == "table" else reader
        for batch in tables:
            n = batch.num_rows
            ids = batch.column("id") if "id" in batch.schema.names else pa.nulls(n, pa.int64())
            yield pa.table({"_change_type": pa.array([kind] * n, pa.string()), "id": ids})


READERS = {"lineage": _lineage, "lineage-capture": _lineage, "lineage-v3": _lineage, "delta": _delta, "lance": _lance}


def consume(system: str, root: str, a: int, b: int, mode: str) -> dict[str, Any]:
    """Read feed ``(a, b]`` of ``system``'s table at ``root`` in this process: sizes, rows, counts and id sums."""
    import pyarrow as pa

    steps = READERS[system](root, a, b, mode)
    before = _status_mb("VmRSS")
    next(steps)
    imported = _status_mb("VmRSS")
    next(steps)
    opened = _status_mb("VmRSS")
    counts: dict[str, int] = {}
    sums: dict[str, int] = {}
    rows = parts = 0
    for part in steps:
        parts += 1
        rows += part.num_rows
        t = pa.table({"t": part.column("_change_type"), "id": part.column("id")})
        for g in t.group_by("t").aggregate([("t", "count"), ("id", "sum")]).to_pylist():
            counts[g["t"]] = counts.get(g["t"], 0) + g["t_count"]
            sums[g["t"]] = sums.get(g["t"], 0) + (g["id_sum"] or 0)
        del part, t
    return {"mode": mode, "rss_start_mb": before, "rss_imported_mb": imported, "rss_opened_mb": opened,
            "peak_rss_mb": _status_mb("VmHWM"), "rows": rows, "parts": parts, "counts": counts, "id_sums": sums}


def measure(system: str, root: str, a: int, b: int, timeout: float = TIMEOUT) -> dict[str, Any]:
    """Run :func:`consume` in a fresh process per mode; an error or a timeout is recorded, not raised."""
    out: dict[str, Any] = {}
    for mode in MODES:
        cmd = [sys.executable, os.path.abspath(__file__), system, root, str(a), str(b), mode]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            out[mode] = {"error": f"timed out after {timeout:.0f}s"}
            continue
        if proc.returncode != 0:
            out[mode] = {"error": (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]}
            continue
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def after_system(system: str, result: dict[str, Any], root: str) -> None:
    """Measure the consumers of ``system``'s feed (a) into ``result["consumer"]`` once its child wrote ``root``, and print them.

    Nothing for a system without a stream reader here, a feed (a) that did not
    run, or a failed child. Each mode's counts are compared with the feed step's.
    """
    feed = result.get("feeds", {}).get("all") or {}
    rng = result.get("ranges", {}).get("all")
    if system not in READERS or result.get("error") or "counts" not in feed or not rng:
        return
    got = measure(system, root, int(rng[0]), int(rng[1]))
    for r in got.values():
        if "counts" in r:
            r["matches_feed_step"] = all(r["counts"].get(t, 0) == n for t, n in feed["counts"].items())
    result["consumer"] = got
    print(summary_line(system, got), flush=True)


def summary_line(system: str, got: dict[str, Any]) -> str:
    """One printed line per system: import, open and peak RSS of each mode."""
    parts = []
    for mode in MODES:
        r = got.get(mode, {})
        if "error" in r:
            parts.append(f"{mode}: {r['error']}")
        elif r:
            same = "" if r.get("matches_feed_step", True) else ", COUNTS DIFFER from the feed step"
            parts.append(f"{mode}: import {r['rss_imported_mb']:.0f}, open {r['rss_opened_mb']:.0f}, peak {r['peak_rss_mb']:.0f} MB "
                         f"({r['parts']} parts{same})")
    return f"  {system:9s} feed (a) in a process of its own: " + "; ".join(parts)


def main(argv: list[str]) -> int:
    system, root, a, b, mode = argv
    if system not in READERS or mode not in MODES:
        raise SystemExit(f"usage: run_consumer.py {{{','.join(READERS)}}} ROOT A B {{{','.join(MODES)}}}")
    sys.path.insert(0, os.path.dirname(HERE))  # this checkout's library, as run.py's children use
    print(json.dumps(consume(system, root, int(a), int(b), mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
