"""One workload, this product and its peers side by side, in one run (issue 6).

Every system runs the same workload on the same generated data (numpy, fixed
seed), each in its own child process, one after the other (ours first, then
``lineage-v3`` when named, so that v2 and v3 run back to back, then the peers):

1. create the table (key ``id``; columns id, customer_id, status, amount, ordered_at);
2. append the base rows (``--scale`` rows, one write);
3. 20 change commits, each updating 0.5% and deleting 0.1% of the base row
   count, rows chosen at random among the live rows (an update sets ``status``
   to 'updated' and ``amount`` to a new value; each commit is one transaction:
   update and delete together);
4. 5 upsert batches of 1% of the base row count, half matching live rows, half new;
5. read the change feed for (a) every commit after the base load (the 25
   change commits), (b) the last 5 commits (the upserts) and (c) net changes
   over range (a).

Systems and the calls they make:

* ``lineage``: this product. ``Table.merge(upserts=updated rows, deletes=keys)``
  (one merge-on-read commit), ``Table.upsert``, ``cdf.changes(t, a, b, net=...)``.
* ``lineage-capture``: the same with the table property
  ``lineage.cdf.capture-preimages=true`` (writes store removed images' values
  in the deleted-rows index; the feed reads pre-images from there).
* ``pyiceberg``: plain pyiceberg 0.12, no lineage, copy-on-write (the only mode it
  writes): ``overwrite(rows, overwrite_filter=In(id, updated + deleted))`` and
  ``upsert(batch, join_cols=["id"])``. It has no change feed.
* ``delta``: delta-rs (``deltalake``) with ``delta.enableChangeDataFeed=true``:
  ``merge`` (update + delete in one MERGE), ``merge`` for upserts, ``load_cdf``.
  No net mode.
* ``ducklake``: DuckLake through DuckDB's ``duckdb-extension-ducklake`` wheel,
  catalog in a local DuckDB file, data in a local folder: ``UPDATE ... FROM``
  and ``DELETE`` in one transaction, ``MERGE INTO`` for upserts,
  ``table_changes``. No net mode.
* ``lance``: Lance (``pylance``) with stable row ids: ``merge_insert`` (update
  matched rows, delete the chosen rows with ``when_not_matched_by_source_delete``:
  one version), ``merge_insert`` for upserts, ``delta()`` (inserted rows,
  updated rows, deleted row ids: the rows as they are at the end of the range,
  no pre-images, no per-version history).

Per step: wall time, peak resident memory of the child process during the step
(the kernel's high-water mark, reset before each step through
``/proc/self/clear_refs``), bytes written (files that appeared under the
system's folder plus growth of files modified in place, such as DuckLake's
catalog database), and the system load. Per change feed: rows returned, counts
and ``sum(id)`` per change type, compared with ours and with the counts the
workload implies. Each feed is called ``--feed-calls`` times in a row (default
5): the first call is the measured step (peak RSS, first-call time), every call's
wall and CPU time is recorded (``calls_wall_s``, ``calls_cpu_s``), and the
time reported for the feed is the median of all calls, since single calls on
a shared VM vary by 2-3x from run to run (our reader keeps decoded row groups
between calls within ``LINEAGE_ROW_GROUP_CACHE_MB``, recorded in the settings:
a chunk is kept the second time it is decoded, so from the third call on a
feed finds kept what the earlier ones decoded; the first calls are reported
too; ``benchmarks/run_consumer.py`` then reads feed (a) again in a fresh process, whole and streamed,
and records that process's import, open and peak RSS). After the feeds each system's final
table is checked against the expected row count, ``sum(id)`` and
``sum(amount)``. Last, the base append is repeated ``--append-calls`` - 1 more
times (default 5 in all), each into a fresh table in a folder of its own that
is removed afterwards; the append's time is the median of all its calls (the
first stays the measured step), for the same reason. They run after
everything else, so they cannot change what the other steps measure.

    .venv/bin/python benchmarks/run.py                    # 1,000,000 rows, every system
    .venv/bin/python benchmarks/run.py --scale 10000000
    .venv/bin/python benchmarks/run.py --systems lineage,delta --scale 100000
    .venv/bin/python benchmarks/run.py --publish --scale 30000000 --systems lineage,lineage-capture,ducklake,delta

Writes a record (``benchmarks/record.py``; ``--publish`` puts it in ``benchmarks/results/``, where
``benchmarks/report.py`` renders the READMEs from it) and prints the tables. ``--replace-from RECORD``
reruns only ``--systems`` and merges them with the other systems of an earlier record; the merged record
keeps each part's date, load and commit in ``merged_from``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import record  # noqa: E402
import run_consumer  # noqa: E402
from run_systems import CHANGE_TYPES, IMPLS, PEER_PACKAGES, PROBE_TIMEOUT, SCHEMA, ducklake_probe, probe_table_changes, type_counts  # noqa: E402

SEED = 42
CHANGE_COMMITS = 20
UPDATE_FRACTION = 0.005
DELETE_FRACTION = 0.001
UPSERT_BATCHES = 5
UPSERT_FRACTION = 0.01
SYSTEMS = ("lineage", "lineage-capture", "pyiceberg", "delta", "ducklake", "lance")
# Run only when named in --systems: ours on an Iceberg format version 3 table (native row lineage, deletion vectors).
OPTIONAL_SYSTEMS = ("lineage-v3",)
STATUSES = np.array(["new", "paid", "shipped", "cancelled", "updated", "upserted"])
UPDATED, UPSERTED = 4, 5

EPOCH = np.datetime64("2026-01-01T00:00:00", "us")


# --------------------------------------------------------------------------- the workload plan (parent)
class Mirror:
    """The table's state as numpy arrays indexed by id, to generate batches and expectations."""

    def __init__(self, scale: int, capacity: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.n = scale
        self.customer = np.zeros(capacity, np.int64)
        self.status = np.zeros(capacity, np.int8)
        self.amount = np.zeros(capacity, np.float64)
        self.ordered = np.zeros(capacity, np.int64)  # seconds after EPOCH
        self.alive = np.zeros(capacity, bool)
        self._fill(np.arange(scale))

    def _fill(self, ids: np.ndarray) -> None:
        k = len(ids)
        self.customer[ids] = self.rng.integers(0, 50_000, k)
        self.status[ids] = self.rng.integers(0, 4, k)
        self.amount[ids] = np.round(self.rng.uniform(1.0, 1000.0, k), 2)
        self.ordered[ids] = self.rng.integers(0, 300 * 86400, k)
        self.alive[ids] = True

    def rows(self, ids: np.ndarray) -> pa.Table:
        ids = np.sort(ids)
        return pa.table(
            {
                "id": ids.astype(np.int64),
                "customer_id": self.customer[ids],
                "status": STATUSES[self.status[ids]],
                "amount": self.amount[ids],
                "ordered_at": EPOCH + self.ordered[ids].astype("timedelta64[s]"),
            },
            schema=SCHEMA,
        )

    def pick_live(self, k: int) -> np.ndarray:
        live = np.flatnonzero(self.alive)
        return live[self.rng.choice(len(live), k, replace=False)]

    def new_amounts(self, k: int) -> np.ndarray:
        return np.round(self.rng.uniform(1.0, 1000.0, k), 2)


def make_plan(scale: int, plan_dir: str) -> dict[str, Any]:
    """Write every batch of the workload to ``plan_dir`` and return the expectations."""
    os.makedirs(plan_dir, exist_ok=True)
    n_upd = max(1, round(scale * UPDATE_FRACTION))
    n_del = max(1, round(scale * DELETE_FRACTION))
    n_ups = max(2, round(scale * UPSERT_FRACTION))
    n_match, n_new = n_ups // 2, n_ups - n_ups // 2
    rng = np.random.default_rng(SEED)
    m = Mirror(scale, scale + UPSERT_BATCHES * n_new, rng)
    pq.write_table(m.rows(np.arange(scale)), os.path.join(plan_dir, "base.parquet"))
    base_amount, base_status = m.amount[:scale].copy(), m.status[:scale].copy()
    changed = np.zeros(len(m.alive), bool)
    sums = {t: 0 for t in CHANGE_TYPES}  # per-version sum(id) per change type over range (a)
    last5 = {t: 0 for t in CHANGE_TYPES}
    for i in range(1, CHANGE_COMMITS + 1):
        chosen = m.pick_live(n_upd + n_del)
        upd, dele = np.sort(chosen[:n_upd]), np.sort(chosen[n_upd:])
        m.amount[upd] = m.new_amounts(n_upd)
        m.status[upd] = UPDATED
        changed[upd] = True
        m.alive[dele] = False
        pq.write_table(m.rows(upd), os.path.join(plan_dir, f"change_{i:02d}_update.parquet"))
        pq.write_table(pa.table({"id": pa.array(dele, pa.int64())}), os.path.join(plan_dir, f"change_{i:02d}_delete.parquet"))
        sums["update_preimage"] += int(upd.sum())
        sums["update_postimage"] += int(upd.sum())
        sums["delete"] += int(dele.sum())
    for k in range(1, UPSERT_BATCHES + 1):
        matched = np.sort(m.pick_live(n_match))
        new = np.arange(m.n, m.n + n_new)
        m.n += n_new
        m._fill(new)
        m.amount[matched] = m.new_amounts(n_match)
        m.status[matched] = UPSERTED
        changed[matched] = True
        pq.write_table(m.rows(np.concatenate([matched, new])), os.path.join(plan_dir, f"upsert_{k}.parquet"))
        for s in (sums, last5):
            s["update_preimage"] += int(matched.sum())
            s["update_postimage"] += int(matched.sum())
            s["insert"] += int(new.sum())
    ids = np.arange(m.n)
    base = ids < scale
    alive = m.alive[: m.n]
    differs = np.zeros(m.n, bool)
    differs[:scale] = (m.amount[:scale] != base_amount) | (m.status[:scale] != base_status)
    net_pair = base & alive & changed[: m.n] & differs
    net_delete = base & ~alive
    net_insert = ~base & alive
    n_changes = CHANGE_COMMITS
    expected = {
        "scale": scale,
        "rows_per_change_commit": {"updated": n_upd, "deleted": n_del},
        "rows_per_upsert": {"matched": n_match, "new": n_new},
        "feeds": {
            "all": {
                "counts": type_counts(
                    {"update_preimage": n_changes * n_upd + UPSERT_BATCHES * n_match, "update_postimage": n_changes * n_upd + UPSERT_BATCHES * n_match,
                     "delete": n_changes * n_del, "insert": UPSERT_BATCHES * n_new}
                ),
                "id_sums": sums,
            },
            "last5": {
                "counts": type_counts({"update_preimage": UPSERT_BATCHES * n_match, "update_postimage": UPSERT_BATCHES * n_match, "insert": UPSERT_BATCHES * n_new}),
                "id_sums": last5,
            },
            "net": {
                "counts": type_counts(
                    {"update_preimage": int(net_pair.sum()), "update_postimage": int(net_pair.sum()), "delete": int(net_delete.sum()), "insert": int(net_insert.sum())}
                ),
                "id_sums": {"insert": int(ids[net_insert].sum()), "update_preimage": int(ids[net_pair].sum()),
                            "update_postimage": int(ids[net_pair].sum()), "delete": int(ids[net_delete].sum())},
            },
        },
        "final": {"rows": int(alive.sum()), "id_sum": int(ids[alive].sum()), "amount_sum": float(m.amount[: m.n][alive].sum())},
    }
    with open(os.path.join(plan_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
    return expected




# --------------------------------------------------------------------------- the child
def run_child(system: str, plan_dir: str, root: str, out: str, feed_calls: int = 1, append_calls: int = 1) -> None:
    """Run the workload on one system, writing results to ``out`` after every step."""
    expected = json.load(open(os.path.join(plan_dir, "expected.json")))
    impl = IMPLS[system](root)
    os.makedirs(root, exist_ok=True)
    rss = record.PeakRss()
    result: dict[str, Any] = {"system": system, "steps": [], "feeds": {}, "notes": impl.notes, "memory_method": rss.method, "error": None}

    def save() -> None:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=2)
        os.replace(tmp, out)

    def step(name: str, fn: Callable[[], Any], kind: str) -> Any:
        measured, value = record.measure(fn, rss, root)
        wall, peak, load = measured["wall_s"], measured["peak_rss_mb"] * 1024, measured["load1"]
        rec = {"step": name, "kind": kind, **measured}
        if kind != "feed":
            rec["version"] = impl.version()
        result["steps"].append(rec)
        save()
        print(f"  {system:9s} {name:12s} {wall:8.3f}s  cpu {measured['cpu_s']:7.3f}s  peak {peak / 1024:7.0f} MB  wrote {rec['bytes_written']:>13,} B  load {load:.1f}", flush=True)
        return value

    try:
        result["versions"] = impl.versions()
        step("create", impl.create, "write")
        base = pq.read_table(os.path.join(plan_dir, "base.parquet"))
        step("append", lambda: impl.append(base), "write")
        del base
        v_base = impl.version()
        for i in range(1, CHANGE_COMMITS + 1):
            upd = pq.read_table(os.path.join(plan_dir, f"change_{i:02d}_update.parquet"))
            dele = pq.read_table(os.path.join(plan_dir, f"change_{i:02d}_delete.parquet"))
            step(f"change_{i:02d}", lambda: impl.change(upd, dele), "write")
        v_changes = impl.version()
        for k in range(1, UPSERT_BATCHES + 1):
            batch = pq.read_table(os.path.join(plan_dir, f"upsert_{k}.parquet"))
            step(f"upsert_{k}", lambda: impl.upsert(batch), "write")
        v_end = impl.version()
        result["ranges"] = {"all": [v_base, v_end], "last5": [v_changes, v_end], "net": [v_base, v_end]}
        for feed, (a, b), net in (("all", (v_base, v_end), False), ("last5", (v_changes, v_end), False), ("net", (v_base, v_end), True)):
            supported = impl.feeds_supported[feed]
            if supported is not True:
                result["feeds"][feed] = {"na": supported}
                continue
            value = step(f"cdf_{feed}", lambda: impl.feed(a, b, net), "feed")
            result["feeds"][feed] = impl.summarize(value)
            del value
            calls, cpu = [result["steps"][-1]["wall_s"]], [result["steps"][-1]["cpu_s"]]
            for _ in range(feed_calls - 1):  # the same feed again, in the same process: time only
                t0, c0 = time.perf_counter(), time.process_time()
                again = impl.feed(a, b, net)
                calls.append(round(time.perf_counter() - t0, 4))
                cpu.append(round(time.process_time() - c0, 4))
                del again
            result["steps"][-1]["calls_wall_s"] = calls
            result["steps"][-1]["calls_cpu_s"] = cpu  # CPU of all threads: varies far less with the load than the wall time
            save()
        if system.startswith("lineage"):  # untimed: our net answer over (b), to compare with Lance's net-like delta() there
            result["feeds_untimed"] = {"net_last5": impl.summarize(impl.feed(v_changes, v_end, True))}
            save()
        final = impl.final()
        got = {"rows": final.num_rows, "id_sum": int(pc.sum(final.column("id")).as_py() or 0), "amount_sum": float(pc.sum(final.column("amount")).as_py() or 0.0)}
        want = expected["final"]
        got["matches_expected"] = got["rows"] == want["rows"] and got["id_sum"] == want["id_sum"] and abs(got["amount_sum"] - want["amount_sum"]) <= 1e-6 * max(1.0, abs(want["amount_sum"]))
        result["final"] = got
        result["table_bytes"] = sum(record.files_under(root).values())
        result["table_files"] = len(record.files_under(root))
        if hasattr(impl, "live_bytes"):  # what the last snapshot reads, without the history a snapshot expiry would free
            result["live_bytes"] = impl.live_bytes()
        if hasattr(impl, "bytes_by_kind"):
            result["bytes_by_kind"] = impl.bytes_by_kind()
        if system == "ducklake":
            impl.close()  # the probe opens the catalog file itself
            result["table_changes_probe"] = {
                feed: probe_table_changes(root, a + 1, b, PROBE_TIMEOUT) for feed, (a, b) in (("all", (v_base, v_end)), ("last5", (v_changes, v_end)))
            }
            save()
        if append_calls > 1:
            _repeat_append(system, plan_dir, root, append_calls - 1, next(st for st in result["steps"] if st["step"] == "append"))
            save()
    except Exception as exc:  # record and stop this system; the others still run
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        print(f"  {system}: FAILED: {result['error']}", flush=True)
    save()


def _repeat_append(system: str, plan_dir: str, root: str, times: int, step: dict[str, Any]) -> None:
    """Append the base rows ``times`` more times, each into a fresh table beside ``root``; time only the append."""
    base = pq.read_table(os.path.join(plan_dir, "base.parquet"))
    calls = [step["wall_s"]]
    for k in range(times):
        scratch = f"{root}.append-{k + 1}"
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        try:
            again = IMPLS[system](scratch)
            again.create()
            try:
                t0 = time.perf_counter()
                again.append(base)
                calls.append(round(time.perf_counter() - t0, 4))
            finally:
                again.close()  # only once created: DuckLake's close detaches what create attached
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    step["calls_wall_s"] = calls


# --------------------------------------------------------------------------- the parent: run, compare, report
def run_system(system: str, plan_dir: str, root: str, out: str, timeout: float, feed_calls: int = 1, append_calls: int = 1) -> dict:
    """Run one system in a child process; its own peak RSS comes from wait4."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--plan", plan_dir, "--root", root, "--child-out", out,
           "--feed-calls", str(feed_calls), "--append-calls", str(append_calls)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)
    status, usage, timed_out = 0, None, False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > timeout:
            os.killpg(proc.pid, 9)  # the child's own process group (start_new_session)
            _, status, usage = os.wait4(proc.pid, 0)
            timed_out = True
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    try:
        result = json.load(open(out))
    except (OSError, ValueError):
        result = {"system": system, "steps": [], "feeds": {}, "error": "the child wrote no result"}
    result["process_wall_s"] = round(time.perf_counter() - start, 2)
    # wait4's ru_maxrss also counts the pages the child shared with this parent between fork and exec (the
    # parent holds the generated workload), so the child's own figure is the maximum of its per-step peaks.
    result["wait4_max_rss_mb_includes_fork"] = round(usage.ru_maxrss / 1024, 1) if usage else None
    peaks = [st["peak_rss_mb"] for st in result.get("steps", [])]
    result["process_max_rss_mb"] = max(peaks) if peaks else None
    result["exit_code"] = proc.returncode
    if timed_out:
        result["error"] = f"timed out after {timeout:.0f} s (--timeout); steps after the last recorded one did not run"
    elif proc.returncode != 0 and not result.get("error"):
        result["error"] = f"child exited with code {proc.returncode}"
    return result


def step_wall(step: dict) -> float:
    """A step's time: the median of its calls when it was called several times (feeds, the append), else its one call."""
    calls = step.get("calls_wall_s")
    return float(statistics.median(calls)) if calls else step["wall_s"]


def _sum_steps(res: dict, prefix: str, field: str = "wall_s") -> float | None:
    vals = [step_wall(s) if field == "wall_s" else s[field] for s in res.get("steps", []) if s["step"].startswith(prefix)]
    expected = {"change_": CHANGE_COMMITS, "upsert_": UPSERT_BATCHES}.get(prefix, 1)
    if len(vals) < expected:
        return None
    return sum(vals)


def _max_steps(res: dict, prefix: str, field: str) -> float | None:
    vals = [s[field] for s in res.get("steps", []) if s["step"].startswith(prefix)]
    return max(vals) if vals else None


GROUPS = [
    ("create", "create"),
    ("append base", "append"),
    ("20 change commits", "change_"),
    ("5 upserts", "upsert_"),
    ("all writes", None),
    ("cdf (a) all", "cdf_all"),
    ("cdf (b) last 5", "cdf_last5"),
    ("cdf (c) net", "cdf_net"),
]


def group_value(res: dict, prefix: str | None, field: str) -> float | None:
    if prefix is None:  # every write step
        parts = [group_value(res, p, field) for p in ("create", "append", "change_", "upsert_")]
        if any(p is None for p in parts):
            return None
        return max(parts) if field == "peak_rss_mb" else sum(parts)  # type: ignore[type-var,arg-type]
    if field == "peak_rss_mb":
        return _max_steps(res, prefix, field)
    return _sum_steps(res, prefix, field)


def na_reason(res: dict, prefix: str | None) -> str:
    if prefix and prefix.startswith("cdf_"):
        feed = res.get("feeds", {}).get(prefix[4:], {})
        if "na" in feed:
            return "n/a"
    return "failed" if res.get("error") else "n/a"


def compare_feeds(results: dict[str, dict], expected: dict) -> dict:
    """For each feed and system: counts by change type, agreement with ours and with the plan."""
    out: dict[str, dict] = {}
    ours = results.get("lineage", {}).get("feeds", {})
    for feed in ("all", "last5", "net"):
        out[feed] = {}
        exp = expected["feeds"][feed]
        for system, res in results.items():
            f = res.get("feeds", {}).get(feed)
            if f is None:
                out[feed][system] = {"na": "did not run" + (f" ({res['error']})" if res.get("error") else "")}
                continue
            if "na" in f:
                out[feed][system] = {"na": f["na"]}
                continue
            entry = dict(f)
            entry["matches_expected"] = f["counts"] == exp["counts"] and all(f["id_sums"][t] in (None, exp["id_sums"][t]) for t in CHANGE_TYPES)
            if system == "lance":
                # delta() is net-like: compare with our net answer over the same range too
                our_net = ours.get("net") if feed in ("all", "net") else results.get("lineage", {}).get("feeds_untimed", {}).get("net_last5")
                entry["matches_ours_net"] = _same(f, our_net)
                entry["matches_ours_net_except_preimages"] = _same(f, our_net, ignore=("update_preimage",))
            if system != "lineage":
                entry["matches_ours"] = _same(f, ours.get(feed))
            entry["differences_from_ours"] = _diff(f, ours.get(feed))
            out[feed][system] = entry
    return out


def _same(f: dict, ours: dict | None, ignore: tuple[str, ...] = ()) -> bool | None:
    if not ours or "counts" not in ours:
        return None
    types = [t for t in CHANGE_TYPES if t not in ignore]
    return all(f["counts"][t] == ours["counts"][t] and (f["id_sums"][t] is None or f["id_sums"][t] == ours["id_sums"][t]) for t in types)


def _diff(f: dict, ours: dict | None) -> dict:
    if not ours or "counts" not in ours:
        return {}
    return {t: f["counts"][t] - ours["counts"][t] for t in CHANGE_TYPES if f["counts"][t] != ours["counts"][t]}


def summarize(results: dict[str, dict]) -> dict:
    """Per step group and system: wall time (sum), bytes written (sum), peak RSS (max), and each system's load range."""
    systems = list(results)
    summary: dict[str, Any] = {"groups": [label for label, _ in GROUPS], "time_s": {}, "bytes_written": {}, "peak_rss_mb": {}, "na": {}}
    for label, prefix in GROUPS:
        summary["time_s"][label] = {s: group_value(results[s], prefix, "wall_s") for s in systems}
        summary["bytes_written"][label] = {s: group_value(results[s], prefix, "bytes_written") for s in systems}
        summary["peak_rss_mb"][label] = {s: group_value(results[s], prefix, "peak_rss_mb") for s in systems}
        summary["na"][label] = {s: na_reason(results[s], prefix) for s in systems}
    loads = {s: [st["load1"] for st in results[s].get("steps", [])] for s in systems}
    summary["load1_per_system"] = {s: [min(v), max(v)] if v else None for s, v in loads.items()}
    summary["table_bytes"] = {s: results[s].get("table_bytes") for s in systems}
    summary["live_bytes"] = {s: results[s].get("live_bytes") for s in systems}
    summary["bytes_by_kind"] = {s: results[s]["bytes_by_kind"] for s in systems if results[s].get("bytes_by_kind")}
    summary["process_peak_rss_mb"] = {s: results[s].get("process_max_rss_mb") for s in systems}
    summary["final"] = {s: results[s].get("final") for s in systems}
    summary["errors"] = {s: results[s].get("error") for s in systems if results[s].get("error")}
    summary["table_changes_probe"] = results.get("ducklake", {}).get("table_changes_probe")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=1_000_000, help="rows in the base table (default 1,000,000)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS + OPTIONAL_SYSTEMS)} (default all but {','.join(OPTIONAL_SYSTEMS)})")
    record.add_arguments(parser)
    parser.add_argument("--workdir", default=None, help="where tables are written (default: a temp dir, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the tables after the run")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per system before it is stopped (default 1800 + 0.003 s per row)")
    parser.add_argument("--feed-calls", type=int, default=5, help="calls of each change feed; its time is their median (default 5)")
    parser.add_argument("--append-calls", type=int, default=5,
                        help="appends of the base rows, the extra ones into fresh tables after the other steps; its time is their median (default 5)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--ducklake-probe", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--report", metavar="JSON", help="print the tables of an earlier run's JSON file instead of running")
    parser.add_argument("--replace-from", metavar="JSON", help="rerun only --systems and keep the other systems' results from this earlier run (same --scale)")
    args = parser.parse_args(argv)
    if args.report:
        import report_peers as report_md

        print(report_md.render_peers(record.read(args.report)))
        return 0
    if args.ducklake_probe:
        root, start, end = args.ducklake_probe
        ducklake_probe(root, int(start), int(end))
        return 0
    if args.child:
        run_child(args.child, args.plan, args.root, args.child_out, args.feed_calls, args.append_calls)
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS + OPTIONAL_SYSTEMS]
    if bad:
        parser.error(f"unknown system(s) {bad}; choose from {SYSTEMS + OPTIONAL_SYSTEMS}")
    previous = None
    if args.replace_from:
        previous = record.read(args.replace_from)
        if previous["scale"] != args.scale:
            parser.error(f"--replace-from holds a run at scale {previous['scale']:,}, not {args.scale:,}")
    else:
        if "lineage" in systems:
            systems.remove("lineage")
        systems.insert(0, "lineage")  # ours first: the peers are compared with it
        if "lineage-v3" in systems:  # right after v2, back to back: the v3/v2 ratios must not span the peers' runs
            systems.remove("lineage-v3")
            systems.insert(1, "lineage-v3")
    if args.scale < 1000:
        parser.error("--scale must be at least 1000")
    if args.feed_calls < 1 or args.append_calls < 1:
        parser.error("--feed-calls and --append-calls must be at least 1")
    timeout = args.timeout or 1800 + 0.003 * args.scale
    rec = record.Recorder("run", scale=args.scale, argv=argv, script="run.py", peers=PEER_PACKAGES,
                          settings={"systems": systems, "timeout": timeout, "feed_calls": args.feed_calls, "append_calls": args.append_calls,
                                    "row_group_cache_mb": os.environ.get("LINEAGE_ROW_GROUP_CACHE_MB", "256")})
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-run-")
    os.makedirs(workdir, exist_ok=True)
    print(f"benchmarks/run.py: scale {args.scale:,} rows, systems {', '.join(systems)}; work dir {workdir}")
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in rec.load_start)} on {os.cpu_count()} cores", flush=True)
    t0 = time.perf_counter()
    plan_dir = os.path.join(workdir, "plan")
    expected = make_plan(args.scale, plan_dir)
    plan_s = time.perf_counter() - t0
    print(f"generated the workload in {plan_s:.1f}s: {expected['rows_per_change_commit']} per change commit, {expected['rows_per_upsert']} per upsert", flush=True)
    results: dict[str, dict] = {}
    try:
        for s in systems:
            print(f"\n== {s}", flush=True)
            results[s] = run_system(s, plan_dir, os.path.join(workdir, s), os.path.join(workdir, f"{s}.json"), timeout, args.feed_calls,
                                    args.append_calls)
            print(f"  {s}: process {results[s]['process_wall_s']:.1f}s, max RSS {results[s]['process_max_rss_mb']} MB", flush=True)
            run_consumer.after_system(s, results[s], os.path.join(workdir, s))  # feed (a) in a fresh process (benchmarks/run_consumer.py)
            if not args.keep:
                shutil.rmtree(os.path.join(workdir, s), ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    workload = {
        "change_commits": CHANGE_COMMITS, "update_fraction": UPDATE_FRACTION, "delete_fraction": DELETE_FRACTION,
        "upsert_batches": UPSERT_BATCHES, "upsert_fraction": UPSERT_FRACTION, "seed": SEED,
        "rows_per_change_commit": expected["rows_per_change_commit"], "rows_per_upsert": expected["rows_per_upsert"],
        "feeds": {"all": "every commit after the base load (25 commits)", "last5": "the last 5 commits (the upserts)", "net": "net changes over 'all'"},
    }
    this = {**rec.envelope(), "steps": [], "results": {"workload": workload, "expected": expected, "systems": results, "plan_s": round(plan_s, 1)}}
    if previous is not None:
        kept = {s: r for s, r in previous["results"]["systems"].items() if s not in results}
        merged = {**kept, **results}
        results = {s: merged[s] for s in (["lineage"] if "lineage" in merged else []) + [s for s in merged if s != "lineage"]}
    feeds = compare_feeds(results, expected)
    body = {"workload": workload, "expected": expected, "systems": results, "feeds": feeds, "summary": summarize(results)}
    if previous is not None:
        doc = record.merge([(previous, sorted(kept)), (this, sorted(this["results"]["systems"]))], body)
    else:
        doc = {**this, "results": body}
    path = record.write(doc, publish=args.publish, out=args.out)
    if args.publish:  # the feed-growth figure is drawn from every published run
        import plot

        plot.main([])
    import report_peers as report_md

    print(report_md.render_peers(doc))
    during = doc["load"]["during"]
    print(f"\nload average (1 min) during the run: {during['min']} to {during['max']} on {os.cpu_count()} cores")
    print(f"total {doc['seconds']:.0f}s; wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
