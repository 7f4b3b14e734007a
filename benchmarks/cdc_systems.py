"""The systems of benchmarks/cdc.py: how each loads the base table, applies a batch and reads its change feed.

Each runs in a child process of its own; Paimon's in its own virtual environment
(only numpy, pyarrow and pypaimon are imported there).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from cdc_stream import SCHEMA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DELTA_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in SCHEMA])

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
    properties: dict[str, str] = {}
    upsert = False
    notes = ["Table.apply_changelog (strict mode, merge-on-read), one commit per batch; bytes reported by CommitInfo are "
             "data, delete, lineage and index files (no Iceberg manifests)"]

    def load(self, base: pa.Table) -> None:
        sys.path.insert(0, ROOT)
        import lineage

        self.t = lineage.create_table("bench.cdc", SCHEMA, key=["id"], warehouse=self.root, properties=self.properties)
        self.t.append(base)
        self.v0 = self.t.version

    def apply(self, batch: pa.Table) -> int | None:
        info = self.t.apply_changelog(batch, upsert=self.upsert)
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

    def extras(self) -> dict[str, float | int | bool]:
        """Scan time of the table after the stream (the equality strategy compares it before and after CONVERT)."""
        import time

        t = time.perf_counter()
        self.t.scan(columns=["id", "rev"])
        return {"scan_s": time.perf_counter() - t}

    def versions(self) -> dict[str, str]:
        import duckdb
        import pyiceberg

        return {"pyiceberg": pyiceberg.__version__, "duckdb": duckdb.__version__}


class LineageV3(Lineage):
    name = "lineage-v3"
    notes = ["Table.apply_changelog (strict mode, merge-on-read) on an Iceberg format version 3 table: native row lineage, "
             "deletes as deletion vectors (one per touched data file, replacing its old one; a commit's vectors share a "
             "Puffin file)"]
    properties = {"format-version": "3"}


class LineageEquality(Lineage):
    name = "lineage-equality"
    notes = ["Table.apply_changelog(batch, upsert=True) on a table with write.changelog.strategy=equality: data file + "
             "equality deletes + own-file position deletes per batch, no key lookup; the feed's time includes reconciling "
             "every changelog commit on first read (reported apart); then CONVERT, scan and feed again"]
    properties = {"write.changelog.strategy": "equality"}
    upsert = True

    def feed(self, done: int) -> pa.Table:
        import time

        t = time.perf_counter()
        self.t.reconcile()
        self.reconcile_s = time.perf_counter() - t
        self.done = done
        return super().feed(done)

    def extras(self) -> dict[str, float | int | bool]:
        """Scan time before and after CONVERT, CONVERT throughput, feed time after CONVERT and whether it is unchanged."""
        import time

        import cdf

        out: dict[str, float | int | bool] = {"reconcile_s": self.reconcile_s}
        t = time.perf_counter()
        self.t.scan(columns=["id", "rev"])
        out["scan_before_s"] = time.perf_counter() - t
        before = cdf.changes(self.t, self.v0, self.v0 + self.done)
        t = time.perf_counter()
        res = self.t.convert_equality_deletes()
        out["convert_s"] = time.perf_counter() - t
        out["converted_equality_rows"] = res.equality_rows
        out["converted_positions"] = res.positions
        t = time.perf_counter()
        self.t.scan(columns=["id", "rev"])
        out["scan_after_s"] = time.perf_counter() - t
        t = time.perf_counter()
        after = cdf.changes(self.t, self.v0, self.t.version)
        out["feed_after_s"] = time.perf_counter() - t
        key = [("_commit_version", "ascending"), ("_row_id", "ascending"), ("_change_type", "ascending")]
        before, after = cdf.decode_change_columns(before), cdf.decode_change_columns(after)  # a table sorts by strings, not dictionaries
        out["feed_unchanged"] = after.sort_by(key).equals(before.sort_by(key))
        return out


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


CLASSES = {c.name: c for c in (Lineage, LineageV3, LineageEquality, Delta, DuckLake, PyIceberg, Paimon)}
