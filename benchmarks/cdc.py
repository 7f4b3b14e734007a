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

Writes ``benchmarks/results/cdc-<scale>-<commits>.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEED = 12
SYSTEMS = ("lineage", "delta", "ducklake", "pyiceberg", "paimon")
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("amount", pa.float64()), ("rev", pa.int64())])
DELTA_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in SCHEMA])
TARGET_P50_MS = 150

# ---------------------------------------------------------------- the stream


def images(ids: np.ndarray, revs: np.ndarray) -> dict[str, Any]:
    """The row image of each (key, revision): values are a function of both, so a feed row can be checked."""
    ids = np.asarray(ids, np.int64)
    revs = np.asarray(revs, np.int64)
    names = np.char.add("n", ((ids * 31 + revs) % 1000).astype(str))
    return {"id": ids, "name": pa.array(names.tolist() if len(names) else [], pa.string()), "amount": (ids % 1000) + revs * 0.125, "rev": revs}


def generate(scale: int, commits: int, events: int, out: str) -> None:
    """Write base.parquet, batch-NNNNN.parquet (``_op`` first) and expected.parquet (batch, kind, id, rev)."""
    if scale < 10 * events:
        raise SystemExit(f"--scale must be at least 10 x --events ({10 * events}) so that batches find untouched live keys")
    rng = np.random.default_rng(SEED)
    cap = scale + commits * events + 1
    live = np.zeros(cap, bool)
    live[:scale] = True
    rev = np.zeros(cap, np.int64)
    pool = list(range(scale))  # live keys, swap-remove
    where = np.full(cap, -1, np.int64)
    where[:scale] = np.arange(scale)
    next_id = scale

    def drop(k: int) -> None:
        i = where[k]
        last = pool[-1]
        pool[i] = last
        where[last] = i
        pool.pop()
        where[k] = -1

    def add(k: int) -> None:
        where[k] = len(pool)
        pool.append(k)

    pq.write_table(pa.table(images(np.arange(scale), np.zeros(scale, np.int64)), schema=SCHEMA), os.path.join(out, "base.parquet"))
    expected = []
    for b in range(commits):
        ops: list[str] = []
        ids: list[int] = []
        revs: list[int] = []
        start: dict[int, tuple[bool, int]] = {}
        once: list[int] = []  # keys touched once in this batch (candidates for a second touch)

        def emit(op: str, k: int, r: int) -> None:
            ops.append(op)
            ids.append(k)
            revs.append(r)

        def touch(k: int, kind: str) -> None:
            nonlocal next_id
            if k not in start:
                start[k] = (bool(live[k]), int(rev[k]))
            if kind == "update":
                emit("-U", k, int(rev[k]))
                rev[k] += 1
                emit("+U", k, int(rev[k]))
            elif kind == "delete":
                emit("-D", k, int(rev[k]))
                live[k] = False
                drop(k)
            else:
                emit("+I", k, int(rev[k]))
                live[k] = True
                add(k)

        while len(ops) < events - 1:
            if once and rng.random() < 0.1 / 1.1:
                k = once.pop(int(rng.integers(len(once))))
                if live[k]:
                    touch(k, "update" if rng.random() < 0.6 else "delete")
                else:
                    rev[k] += 1  # a re-inserted key comes back with a new image
                    touch(k, "insert")
                continue
            r = rng.random()
            if r < 2 / 7:
                k = next_id
                next_id += 1
                touch(k, "insert")
            else:
                while True:
                    k = pool[int(rng.integers(len(pool)))]
                    if k not in start:
                        break
                touch(k, "update" if r < 5 / 7 else "delete")
            once.append(k)
        batch = pa.table({"_op": ops, **images(np.array(ids), np.array(revs))})
        pq.write_table(batch, os.path.join(out, f"batch-{b:05d}.parquet"))
        for k, (was, r0) in start.items():
            now, r1 = bool(live[k]), int(rev[k])
            if was and now:
                expected += [(b, "update_preimage", k, r0), (b, "update_postimage", k, r1)]
            elif now:
                expected.append((b, "insert", k, r1))
            elif was:
                expected.append((b, "delete", k, r0))
    cols = list(zip(*expected)) if expected else [[], [], [], []]
    pq.write_table(
        pa.table({"batch": pa.array(cols[0], pa.int32()), "kind": pa.array(cols[1], pa.string()), "id": pa.array(cols[2], pa.int64()),
                  "rev": pa.array(cols[3], pa.int64())}),
        os.path.join(out, "expected.parquet"),
    )
    final_ids = np.flatnonzero(live)
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump({"rows": int(len(final_ids)), "sum_id": int(final_ids.sum()), "sum_rev": int(rev[final_ids].sum())}, f)


# ---------------------------------------------------------------- checks


def check_feed(feed: pa.Table, expected: pa.Table, done: int) -> dict[str, Any]:
    """Compare a feed (batch, kind, id, rev) with the generator's net effects of the first ``done`` batches."""
    want = {}
    for b, kind, k, r in zip(*(expected.column(c).to_pylist() for c in ("batch", "kind", "id", "rev")), strict=True):
        if b < done:
            want[(b, kind, k, r)] = want.get((b, kind, k, r), 0) + 1
    got: dict[tuple, int] = {}
    for row in zip(*(feed.column(c).to_pylist() for c in ("batch", "kind", "id", "rev")), strict=True):
        got[row] = got.get(row, 0) + 1
    missing = sum(max(0, n - got.get(r, 0)) for r, n in want.items())
    extra = sum(max(0, n - want.get(r, 0)) for r, n in got.items())
    bad_batches = {r[0] for r, n in want.items() if got.get(r, 0) != n} | {r[0] for r, n in got.items() if want.get(r, 0) != n}
    kinds: dict[str, int] = {}
    for (_, kind, _, _), n in got.items():
        kinds[kind] = kinds.get(kind, 0) + n
    return {"expected_rows": sum(want.values()), "rows": sum(got.values()), "missing": missing, "extra": extra,
            "commits_exact": done - len(bad_batches), "commits": done, "kinds": kinds}


def check_values(feed: pa.Table) -> int:
    """Feed rows whose name/amount are not the image of their (id, rev)."""
    if not feed.num_rows:
        return 0
    exp = images(feed.column("id").to_numpy(), feed.column("rev").to_numpy())
    bad_amount = ~np.isclose(feed.column("amount").to_numpy(zero_copy_only=False), exp["amount"])
    bad_name = np.array(feed.column("name").to_pylist(), dtype=object) != np.array(exp["name"].to_pylist(), dtype=object)
    return int((bad_amount | bad_name).sum())


def folder_bytes(root: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total


# ---------------------------------------------------------------- systems


def last_event_per_key(batch: pa.Table) -> pa.Table:
    """The batch collapsed to each key's last event (what a MERGE-based sink must do first)."""
    import duckdb

    con = duckdb.connect()
    try:
        con.register("b", batch.append_column("__seq", pa.array(np.arange(batch.num_rows))))
        return con.execute("SELECT * EXCLUDE (__seq) FROM b QUALIFY row_number() OVER (PARTITION BY id ORDER BY __seq DESC) = 1").to_arrow_table()
    finally:
        con.close()


class System:
    """One engine under test: load the base, apply a batch, read the feed over batches, read the final table."""

    name = ""
    has_feed = True
    notes: list[str] = []

    def __init__(self, root: str) -> None:
        self.root = root

    def load(self, base: pa.Table) -> None: ...
    def apply(self, batch: pa.Table) -> int | None: ...  # returns bytes written when the system reports them
    def feed(self, done: int) -> pa.Table: ...  # columns batch, kind, id, name, amount, rev
    def final(self) -> pa.Table: ...  # columns id, rev
    def versions(self) -> dict[str, str]:
        return {}


class Lineage(System):
    name = "lineage"
    notes = ["Table.apply_changelog (strict mode, merge-on-read), one commit per batch; bytes reported by CommitInfo are "
             "data, delete, lineage and index files (no Iceberg manifests)"]

    def load(self, base: pa.Table) -> None:
        sys.path.insert(0, ROOT)
        import lineage

        self.t = lineage.create_table("bench.cdc", SCHEMA, key=["id"], warehouse=self.root)
        self.t.append(base)
        self.v0 = self.t.version

    def apply(self, batch: pa.Table) -> int | None:
        info = self.t.apply_changelog(batch)
        return info.bytes_written

    def feed(self, done: int) -> pa.Table:
        import cdf

        f = cdf.changes(self.t, self.v0, self.v0 + done)
        rid_pairs = f.filter(pa.compute.is_in(f.column("_change_type"), pa.array(["update_preimage", "update_postimage"])))
        self.row_id_changes = _row_id_breaks(rid_pairs)
        return pa.table({"batch": pa.compute.subtract(f.column("_commit_version"), self.v0 + 1), "kind": f.column("_change_type"),
                         **{c: f.column(c) for c in ("id", "name", "amount", "rev")}})

    def final(self) -> pa.Table:
        return self.t.scan(columns=["id", "rev"])

    def versions(self) -> dict[str, str]:
        import duckdb
        import pyiceberg

        return {"pyiceberg": pyiceberg.__version__, "duckdb": duckdb.__version__}


def _row_id_breaks(pairs: pa.Table) -> int:
    """Update pairs whose pre- and post-image have different row ids (must be 0)."""
    by_key: dict[tuple[int, int], set[int]] = {}
    for v, k, rid in zip(pairs.column("_commit_version").to_pylist(), pairs.column("id").to_pylist(), pairs.column("_row_id").to_pylist(), strict=True):
        by_key.setdefault((v, k), set()).add(rid)
    return sum(1 for ids in by_key.values() if len(ids) != 1)


class Delta(System):
    name = "delta"
    notes = ["delta.enableChangeDataFeed=true; batch collapsed to each key's last event (DuckDB, timed), then one MERGE; "
             "delta-rs rewrites touched files (copy-on-write); id declared nullable (with NOT NULL, delta-rs 1.6.6's MERGE "
             "fails on source rows that the insert predicate leaves out)"]

    def load(self, base: pa.Table) -> None:
        from deltalake import DeltaTable, write_deltalake

        self.path = os.path.join(self.root, "cdc")
        # id nullable: delta-rs 1.6.6's MERGE checks NOT NULL on source rows that a predicated insert left out, and fails
        self.t = DeltaTable.create(self.path, DELTA_SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
        write_deltalake(self.t, base.cast(DELTA_SCHEMA), mode="append")
        self.t.update_incremental()
        self.v0 = self.t.version()

    def apply(self, batch: pa.Table) -> int | None:
        src = last_event_per_key(batch)
        sets = {c: f"s.{c}" for c in SCHEMA.names if c != "id"}
        (
            self.t.merge(src, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_delete(predicate="s._op IN ('-U', '-D')")
            .when_matched_update(updates=sets)
            .when_not_matched_insert(updates={c: f"s.{c}" for c in SCHEMA.names}, predicate="s._op IN ('+I', '+U')")
            .execute()
        )
        return None

    def feed(self, done: int) -> pa.Table:
        f = pa.table(self.t.load_cdf(starting_version=self.v0 + 1, ending_version=self.v0 + done).read_all())
        return pa.table({"batch": pa.compute.subtract(f.column("_commit_version"), self.v0 + 1), "kind": f.column("_change_type"),
                         **{c: f.column(c) for c in ("id", "name", "amount", "rev")}})

    def final(self) -> pa.Table:
        from deltalake import DeltaTable

        return pa.table(DeltaTable(self.path).to_pyarrow_table(columns=["id", "rev"]))

    def versions(self) -> dict[str, str]:
        import deltalake

        return {"deltalake": deltalake.__version__}


class DuckLake(System):
    name = "ducklake"
    notes = ["catalog in a local DuckDB file; batch collapsed to each key's last event, then one transaction: DELETE of "
             "the keys whose last event removes them, MERGE INTO (UPDATE / INSERT) of the others (DuckLake's MERGE takes "
             "a single UPDATE/DELETE action); feed "
             "table_changes materialised into a temp table first (a direct Arrow export of it hangs in DuckDB 1.5.5, "
             "see benchmarks/README.md)"]

    def load(self, base: pa.Table) -> None:
        sys.path.insert(0, ROOT)
        from lineage import duck

        os.makedirs(self.root, exist_ok=True)
        self.con = duck.connect("ducklake")
        self.con.execute(f"ATTACH 'ducklake:{os.path.join(self.root, 'catalog.ducklake')}' AS lake (DATA_PATH '{os.path.join(self.root, 'data')}/')")
        self.con.execute("CREATE TABLE lake.cdc (id BIGINT NOT NULL, name VARCHAR, amount DOUBLE, rev BIGINT)")
        self.con.register("base", base)
        self.con.execute("INSERT INTO lake.cdc SELECT * FROM base")
        self.con.unregister("base")
        self.v0 = self._snapshot()

    def _snapshot(self) -> int:
        return int(self.con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])

    def apply(self, batch: pa.Table) -> int | None:
        self.con.register("src", last_event_per_key(batch))
        sets = ", ".join(f"{c} = s.{c}" for c in SCHEMA.names if c != "id")
        cols = ", ".join(f"s.{c}" for c in SCHEMA.names)
        # DuckLake's MERGE takes one UPDATE/DELETE action: deletes go first, in the same transaction (one snapshot).
        self.con.execute("BEGIN TRANSACTION")
        self.con.execute("DELETE FROM lake.cdc WHERE id IN (SELECT id FROM src WHERE _op IN ('-U', '-D'))")
        self.con.execute(
            "MERGE INTO lake.cdc AS t USING (SELECT * FROM src WHERE _op IN ('+I', '+U')) AS s ON t.id = s.id "
            f"WHEN MATCHED THEN UPDATE SET {sets} WHEN NOT MATCHED THEN INSERT VALUES ({cols})"
        )
        self.con.execute("COMMIT")
        self.con.unregister("src")
        return None

    def feed(self, done: int) -> pa.Table:
        # Snapshot ids of DuckLake are consecutive here: one per MERGE.
        c = self.con
        c.execute(f"CREATE OR REPLACE TEMP TABLE __changes AS SELECT * FROM lake.table_changes('cdc', {self.v0 + 1}, {self.v0 + done})")
        f = c.execute(f"SELECT snapshot_id - {self.v0 + 1} AS batch, change_type AS kind, id, name, amount, rev FROM __changes").to_arrow_table()
        c.execute("DROP TABLE __changes")
        return f.cast(pa.schema([("batch", pa.int64()), ("kind", pa.string()), *SCHEMA]))

    def final(self) -> pa.Table:
        return self.con.execute("SELECT id, rev FROM lake.cdc").to_arrow_table()

    def versions(self) -> dict[str, str]:
        import duckdb

        return {"duckdb": duckdb.__version__, "duckdb-extension-ducklake": _dist_version("duckdb-extension-ducklake")}


class PyIceberg(System):
    name = "pyiceberg"
    has_feed = False
    notes = ["plain pyiceberg 0.12 (copy-on-write): batch collapsed to each key's last event, then one transaction: "
             "upsert(live keys) + delete(In(id, deleted keys)); no change feed"]

    def load(self, base: pa.Table) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        os.makedirs(self.root, exist_ok=True)
        self.catalog = SqlCatalog("plain", uri=f"sqlite:///{os.path.join(self.root, 'catalog.db')}", warehouse=self.root)
        self.catalog.create_namespace_if_not_exists("bench")
        self.t = self.catalog.create_table(("bench", "cdc"), schema=SCHEMA, properties={"format-version": "2"})
        self.t.append(base)

    def apply(self, batch: pa.Table) -> int | None:
        from pyiceberg.expressions import In

        src = last_event_per_key(batch)
        ops = src.column("_op").to_pylist()
        pos = src.filter(pa.array([o in ("+I", "+U") for o in ops])).drop_columns(["_op"]).cast(SCHEMA)
        neg = src.filter(pa.array([o in ("-U", "-D") for o in ops])).column("id").to_pylist()
        with self.t.transaction() as tx:
            if pos.num_rows:
                tx.upsert(pos, join_cols=["id"])
            if neg:
                tx.delete(In("id", neg))
        return None

    def final(self) -> pa.Table:
        return self.t.refresh().scan(selected_fields=("id", "rev")).to_arrow()

    def versions(self) -> dict[str, str]:
        import pyiceberg

        return {"pyiceberg": pyiceberg.__version__}


class Paimon(System):
    name = "paimon"
    notes = ["pypaimon primary-key table, bucket=4, rowkind.field=_op, changelog-producer=input; each batch written as "
             "it comes (no collapse needed), one commit; feed: each snapshot's changelog read with row kinds"]

    def load(self, base: pa.Table) -> None:
        from pypaimon import CatalogFactory, Schema

        os.makedirs(self.root, exist_ok=True)
        self.cat = CatalogFactory.create({"warehouse": "file://" + os.path.join(self.root, "wh")})
        self.cat.create_database("bench", True)
        self.schema = pa.schema([pa.field("_op", pa.string()), *SCHEMA])
        options = {"bucket": "4", "rowkind.field": "_op", "changelog-producer": "input"}
        self.cat.create_table("bench.cdc", Schema.from_pyarrow_schema(self.schema, primary_keys=["id"], options=options), False)
        self.t = self.cat.get_table("bench.cdc")
        self._write(pa.table({"_op": pa.array(["+I"] * base.num_rows), **{c: base.column(c) for c in SCHEMA.names}}))
        self.v0 = self.t.snapshot_manager().get_latest_snapshot().id

    def _write(self, data: pa.Table) -> None:
        wb = self.t.new_batch_write_builder()
        w, c = wb.new_write(), wb.new_commit()
        w.write_arrow(data.cast(self.schema))
        c.commit(w.prepare_commit())
        w.close()
        c.close()

    def apply(self, batch: pa.Table) -> int | None:
        self._write(batch)
        return None

    def feed(self, done: int) -> pa.Table:
        import asyncio

        sb = self.t.new_stream_read_builder().with_include_row_kind(True)
        scan, read = sb.new_streaming_scan(), sb.new_read()
        scan.next_snapshot_id = self.v0 + 1  # follow-up plans read each snapshot's changelog from there on
        scan._diff_threshold = 1 << 62  # else a gap of > 10 snapshots is read as one merged diff, not per snapshot
        kinds = {"+I": "insert", "-U": "update_preimage", "+U": "update_postimage", "-D": "delete"}
        parts = []

        async def collect() -> None:
            async for plan in scan.stream():
                sid = plan.snapshot_id
                if sid is None or sid > self.v0 + done:
                    break
                got = read.to_arrow(plan.splits())
                if got is not None and got.num_rows:
                    parts.append(pa.table({"batch": pa.array(np.full(got.num_rows, sid - self.v0 - 1), pa.int64()),
                                           "kind": pa.array([kinds[k] for k in got.column("_row_kind").to_pylist()]),
                                           **{c: got.column(c) for c in SCHEMA.names}}))
                if sid >= self.v0 + done:
                    break

        asyncio.run(collect())
        empty = pa.schema([("batch", pa.int64()), ("kind", pa.string()), *SCHEMA])
        return pa.concat_tables([p.cast(empty) for p in parts]) if parts else empty.empty_table()

    def final(self) -> pa.Table:
        rb = self.t.new_read_builder().with_projection(["id", "rev"])
        return rb.new_read().to_arrow(rb.new_scan().plan().splits())

    def versions(self) -> dict[str, str]:
        return {"pypaimon": _dist_version("pypaimon"), "pyarrow": pa.__version__}


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


CLASSES = {c.name: c for c in (Lineage, Delta, DuckLake, PyIceberg, Paimon)}


# ---------------------------------------------------------------- one system (child process)


def run_child(system: str, data: str, root: str, commits: int, cap: float, profile: int) -> dict[str, Any]:
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
    started = time.perf_counter()
    for b in range(commits):
        if time.perf_counter() - started > cap:
            break
        batch = pq.read_table(os.path.join(data, f"batch-{b:05d}.parquet"))
        if profiler is not None and b >= 5 and b < 5 + profile:
            profiler.enable()
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
                   cpu_p50_ms=float(np.percentile(np.array(cpu) * 1000, 50)),
                   first50_p50_ms=float(np.percentile(lat[:50], 50)), last50_p50_ms=float(np.percentile(lat[-50:], 50)),
                   bytes_per_commit=(folder_bytes(root) - size0) / done)
        if reported:
            out["reported_bytes_per_commit"] = float(np.mean(reported))
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
    ours = next((r for r in results if r["system"] == "lineage" and "p50_ms" in r), None)
    if ours:
        lines += ["", "p50 commit latency relative to lineage: " + ", ".join(
            f"{r['system']} {r['p50_ms'] / ours['p50_ms']:.2f}x" for r in results if "p50_ms" in r and r["system"] != "lineage")]
        verdict = "meets" if ours["p50_ms"] <= TARGET_P50_MS else "misses"
        lines.append(f"lineage p50 {ours['p50_ms']:.0f} ms {verdict} the {TARGET_P50_MS} ms target")
    lines += ["", "load average (1 min) at start/end of each system: " + ", ".join(
        f"{r['system']} {r.get('load_start', 0):.1f}/{r.get('load_end', 0):.1f}" for r in results if "error" not in r)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=int, default=1_000_000, help="rows of the keyed table before the stream")
    p.add_argument("--commits", type=int, default=500, help="batches (one commit each)")
    p.add_argument("--events", type=int, default=2000, help="events per batch")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma separated, from {','.join(SYSTEMS)}")
    p.add_argument("--time-cap", type=float, default=600.0, help="seconds of stream per system; later batches are skipped")
    p.add_argument("--workdir", help="where data and tables go (default: a temporary folder, removed at the end)")
    p.add_argument("--paimon-python", help="interpreter with pypaimon installed (default: .venv-paimon/bin/python)")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N of our commits (lineage) and print the top")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        res = run_child(args.child, args.data, args.workdir, args.commits, args.time_cap, args.profile)
        with open(os.path.join(args.workdir, "result.json"), "w") as f:
            json.dump(res, f)
        return 0

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {SYSTEMS}")
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
                   "--time-cap", str(args.time_cap), "--profile", str(args.profile if s == "lineage" else 0)]
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
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"cdc-{args.scale}-{args.commits}.json"), "w") as f:
        json.dump({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
