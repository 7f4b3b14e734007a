"""The systems benchmarks/run.py compares (ours, ours with pre-image capture, pyiceberg, delta-rs, DuckLake, Lance).

Each runs in a child process of run.py; a system implements create, append,
update, delete, upsert, the change feeds and its version, on the plan's data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import record  # noqa: E402

CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")


SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("customer_id", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("ordered_at", pa.timestamp("us")),
    ]
)

def type_counts(counts: dict[str, int]) -> dict[str, int]:
    """Counts of every change type (zero where absent)."""
    return {t: int(counts.get(t, 0)) for t in CHANGE_TYPES}


# --------------------------------------------------------------------------- measurement helpers (child)
def feed_summary(change_type: pa.ChunkedArray | pa.Array, ids: pa.ChunkedArray | pa.Array | None, rename: dict[str, str] | None = None) -> dict:
    """Counts and sum(id) per change type (peer names mapped to ours with ``rename``)."""
    t = pa.table({"t": change_type.cast(pa.string()), "id": ids if ids is not None else pa.nulls(len(change_type), pa.int64())})
    g = t.group_by("t").aggregate([("t", "count"), ("id", "sum")]).to_pylist()
    counts: dict[str, int] = {}
    sums: dict[str, int | None] = {}
    for row in g:
        name = (rename or {}).get(row["t"], row["t"])
        counts[name] = counts.get(name, 0) + row["t_count"]
        sums[name] = None if ids is None else (sums.get(name) or 0) + (row["id_sum"] or 0)
    return {"rows": len(change_type), "counts": type_counts(counts), "id_sums": {k: sums.get(k, 0 if ids is not None else None) for k in CHANGE_TYPES}}


# --------------------------------------------------------------------------- the systems (child)
class System:
    name = ""
    feeds_supported = {"all": True, "last5": True, "net": True}
    notes: list[str] = []

    def __init__(self, root: str) -> None:
        self.root = root

    def create(self) -> None: ...
    def append(self, data: pa.Table) -> None: ...
    def change(self, updated: pa.Table, deleted: pa.Table) -> None: ...
    def upsert(self, batch: pa.Table) -> None: ...
    def version(self) -> int: ...
    def feed(self, a: int, b: int, net: bool) -> Any: ...
    def summarize(self, result: Any) -> dict: ...
    def final(self) -> pa.Table: ...
    def close(self) -> None: ...
    def versions(self) -> dict[str, str]:
        return {}


class Lineage(System):
    name = "lineage"
    notes = ["merge-on-read (the default); each change commit is one Table.merge(upserts=..., deletes=...)"]
    properties: dict[str, str] = {}

    def create(self) -> None:
        import cdf  # imported with the table, as the peers import their libraries in create: the feed's time is the feed's
        import lineage

        self.cdf = cdf
        self.t = lineage.create_table("bench.orders", SCHEMA, key=["id"], warehouse=self.root, properties=self.properties)

    def append(self, data: pa.Table) -> None:
        self.t.append(data)

    def change(self, updated: pa.Table, deleted: pa.Table) -> None:
        self.t.merge(upserts=updated, deletes=deleted)

    def upsert(self, batch: pa.Table) -> None:
        self.t.upsert(batch)

    def version(self) -> int:
        return self.t.version

    def feed(self, a: int, b: int, net: bool) -> Any:
        return self.cdf.changes(self.t, a, b, net=net)

    def summarize(self, result: Any) -> dict:
        return feed_summary(result.column("_change_type"), result.column("id"))

    def final(self) -> pa.Table:
        return self.t.scan(columns=["id", "amount"])

    def live_bytes(self) -> int:
        """Bytes of the data and delete files the current snapshot reads (a deletion vector counts its blob only)."""
        from lineage.storage.manifests_v3 import content_range

        data, deletes = 0, {}
        for f in self.t.state().live_files():
            data += f.data_file.file_size_in_bytes
            for d in f.deletes:
                blob = content_range(d)
                deletes[(d.file_path, blob)] = blob[1] if blob else d.file_size_in_bytes
        return data + sum(deletes.values())

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes on disk under this system's folder per kind of object (:func:`large_measure.file_kind`), history
        included; position deletes are position delete files on v2, Puffin files of deletion vectors on v3."""
        import large_measure

        return {kind: n["bytes"] for kind, n in large_measure.table_sizes(record.files_under(self.root)).items() if n["files"]}

    def versions(self) -> dict[str, str]:
        import duckdb
        import pyiceberg

        return {"pyiceberg": pyiceberg.__version__, "duckdb": duckdb.__version__}


class LineageCapture(Lineage):
    name = "lineage-capture"
    notes = ["ours with the table property lineage.cdf.capture-preimages=true: writes also store the removed images' "
             "values in the deleted-rows index, so the feed reads pre-images from the index instead of the data files"]
    properties = {"lineage.cdf.capture-preimages": "true"}


class LineageV3(Lineage):
    name = "lineage-v3"
    notes = ["ours (merge-on-read, as lineage) on an Iceberg format version 3 table: native row lineage, deletes as "
             "deletion vectors (one per touched data file, replacing its old one)"]
    properties = {"format-version": "3"}


class PyIceberg(System):
    name = "pyiceberg"
    feeds_supported = {k: "pyiceberg 0.12 has no change feed (no changelog or incremental scan)" for k in ("all", "last5", "net")}
    notes = ["copy-on-write (pyiceberg 0.12 writes no delete files); no lineage columns"]

    def create(self) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        os.makedirs(self.root, exist_ok=True)
        self.catalog = SqlCatalog("plain", uri=f"sqlite:///{os.path.join(self.root, 'catalog.db')}", warehouse=self.root)
        self.catalog.create_namespace_if_not_exists("bench")
        self.t = self.catalog.create_table(("bench", "orders"), schema=SCHEMA, properties={"format-version": "2"})

    def append(self, data: pa.Table) -> None:
        self.t.append(data)

    def change(self, updated: pa.Table, deleted: pa.Table) -> None:
        from pyiceberg.expressions import In

        ids = pc.unique(pa.concat_arrays([updated.column("id").combine_chunks(), deleted.column("id").combine_chunks()])).to_pylist()
        self.t.overwrite(updated, overwrite_filter=In("id", ids))

    def upsert(self, batch: pa.Table) -> None:
        self.t.upsert(batch, join_cols=["id"])

    def version(self) -> int:
        return self.t.metadata.last_sequence_number

    def final(self) -> pa.Table:
        return self.t.refresh().scan(selected_fields=("id", "amount")).to_arrow()

    def versions(self) -> dict[str, str]:
        import pyiceberg

        return {"pyiceberg": pyiceberg.__version__}


class Delta(System):
    name = "delta"
    feeds_supported = {"all": True, "last5": True, "net": "delta-rs load_cdf has no net mode (per-version changes only)"}
    notes = ["delta.enableChangeDataFeed=true; delta-rs writes copy-on-write (no deletion vectors); each change commit is one MERGE",
             "feeds: load_cdf(...).read_all(), one Arrow table of the same rows as ours with 8 columns (the data columns, "
             "_change_type, _commit_version, _commit_timestamp); ours has 12 (also _row_id, _row_created_at_version, "
             "_row_last_updated_at_version and _changed_columns, a list of strings per update row)"]

    def create(self) -> None:
        from deltalake import DeltaTable

        self.path = os.path.join(self.root, "orders")
        self.t = DeltaTable.create(self.path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})

    def append(self, data: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.t, data, mode="append")
        self.t.update_incremental()

    def change(self, updated: pa.Table, deleted: pa.Table) -> None:
        src = pa.concat_tables(
            [
                updated.append_column("op", pa.array(["U"] * updated.num_rows)),
                pa.table({c.name: (deleted.column("id") if c.name == "id" else pa.nulls(deleted.num_rows, c.type)) for c in SCHEMA}, schema=SCHEMA).append_column(
                    "op", pa.array(["D"] * deleted.num_rows)
                ),
            ]
        )
        sets = {c: f"s.{c}" for c in SCHEMA.names if c != "id"}
        (
            self.t.merge(src, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update(updates=sets, predicate="s.op = 'U'")
            .when_matched_delete(predicate="s.op = 'D'")
            .execute()
        )

    def upsert(self, batch: pa.Table) -> None:
        (
            self.t.merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def version(self) -> int:
        return self.t.version()

    def feed(self, a: int, b: int, net: bool) -> Any:
        return pa.table(self.t.load_cdf(starting_version=a + 1, ending_version=b).read_all())

    def summarize(self, result: Any) -> dict:
        return feed_summary(result.column("_change_type"), result.column("id"))

    def final(self) -> pa.Table:
        from deltalake import DeltaTable

        return pa.table(DeltaTable(self.path).to_pyarrow_table(columns=["id", "amount"]))

    def versions(self) -> dict[str, str]:
        import deltalake

        return {"deltalake": deltalake.__version__}


class DuckLake(System):
    name = "ducklake"
    feeds_supported = {"all": True, "last5": True, "net": "DuckLake table_changes has no net mode (per-snapshot changes only)"}
    notes = ["catalog: a local DuckDB file; data: a local folder; defaults otherwise (merge-on-read position deletes); "
             "each change commit is one transaction (UPDATE ... FROM, DELETE)",
             "feeds: CREATE TEMP TABLE AS SELECT * FROM table_changes(...), then read that table; a direct "
             "SELECT * FROM table_changes(...) to Arrow is probed separately in a child process with a time "
             "limit (table_changes_probe): it hangs on this workload from 1M rows on"]

    def create(self) -> None:
        from lineage import duck

        os.makedirs(self.root, exist_ok=True)
        self.con = duck.connect("ducklake")
        self.con.execute(f"ATTACH 'ducklake:{os.path.join(self.root, 'catalog.ducklake')}' AS lake (DATA_PATH '{os.path.join(self.root, 'data')}/')")
        self.con.execute("CREATE TABLE lake.orders (id BIGINT NOT NULL, customer_id BIGINT, status VARCHAR, amount DOUBLE, ordered_at TIMESTAMP)")

    def append(self, data: pa.Table) -> None:
        self.con.register("batch", data)
        self.con.execute("INSERT INTO lake.orders SELECT * FROM batch")
        self.con.unregister("batch")

    def change(self, updated: pa.Table, deleted: pa.Table) -> None:
        self.con.register("upd", updated)
        self.con.register("dels", deleted)
        sets = ", ".join(f"{c} = s.{c}" for c in SCHEMA.names if c != "id")
        self.con.execute("BEGIN TRANSACTION")
        self.con.execute(f"UPDATE lake.orders AS t SET {sets} FROM upd AS s WHERE t.id = s.id")
        self.con.execute("DELETE FROM lake.orders WHERE id IN (SELECT id FROM dels)")
        self.con.execute("COMMIT")
        self.con.unregister("upd")
        self.con.unregister("dels")

    def upsert(self, batch: pa.Table) -> None:
        self.con.register("batch", batch)
        sets = ", ".join(f"{c} = s.{c}" for c in SCHEMA.names if c != "id")
        cols = ", ".join(f"s.{c}" for c in SCHEMA.names)
        self.con.execute(
            f"MERGE INTO lake.orders AS t USING batch AS s ON t.id = s.id "
            f"WHEN MATCHED THEN UPDATE SET {sets} WHEN NOT MATCHED THEN INSERT VALUES ({cols})"
        )
        self.con.unregister("batch")

    def version(self) -> int:
        return int(self.con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])

    def feed(self, a: int, b: int, net: bool) -> Any:
        # table_changes materialised into a temp table, then read: fetching its result directly (Arrow or
        # fetchall) never returns on this workload from 1M rows on, a DuckDB 1.5.5 hang with UNION ALL of two
        # LEFT JOINs, which is what the table_changes macro is (see probe_table_changes and benchmarks/README.md).
        c = self.con
        c.execute(f"CREATE OR REPLACE TEMP TABLE __changes AS SELECT * FROM lake.table_changes('orders', {a + 1}, {b})")
        out = c.execute("SELECT * FROM __changes").to_arrow_table()
        c.execute("DROP TABLE __changes")
        return out

    def close(self) -> None:
        # The connection is a cursor of the process's shared DuckDB database, where ATTACH lives: detach, or
        # the catalog file stays locked and the table_changes probe (another process) cannot open it.
        self.con.execute("DETACH lake")
        self.con.close()

    def summarize(self, result: Any) -> dict:
        return feed_summary(result.column("change_type"), result.column("id"))

    def final(self) -> pa.Table:
        return self.con.execute("SELECT id, amount FROM lake.orders").to_arrow_table()

    def versions(self) -> dict[str, str]:
        import duckdb

        from lineage import duck

        ext = duck.extension_path("ducklake")
        return {"duckdb": duckdb.__version__, "ducklake_extension": ext.split(os.sep)[-2] if ext else "?",
                "duckdb-extension-ducklake": record.packages(["duckdb-extension-ducklake"])["duckdb-extension-ducklake"]}


class Lance(System):
    name = "lance"
    feeds_supported = {"all": True, "last5": True, "net": True}
    notes = ["enable_stable_row_ids=True; each change commit is one merge_insert (when_matched_update_all + "
             "when_not_matched_by_source_delete for the deleted ids); delta() answers with the rows as they are at the "
             "end of the range (inserted, updated) and deleted row ids: no pre-images, no per-version history, so "
             "(a) and (b) are its only answer and (c) is the same call"]

    def create(self) -> None:
        import lance

        self.path = os.path.join(self.root, "orders.lance")
        self.ds = lance.write_dataset(SCHEMA.empty_table(), self.path, enable_stable_row_ids=True)

    def append(self, data: pa.Table) -> None:
        import lance

        self.ds = lance.write_dataset(data, self.path, mode="append")

    def change(self, updated: pa.Table, deleted: pa.Table) -> None:
        import lance

        ids = ", ".join(str(i) for i in deleted.column("id").to_pylist())
        self.ds.merge_insert("id").when_matched_update_all().when_not_matched_by_source_delete(f"id IN ({ids})").execute(updated)
        self.ds = lance.dataset(self.path)

    def upsert(self, batch: pa.Table) -> None:
        import lance

        self.ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(batch)
        self.ds = lance.dataset(self.path)

    def version(self) -> int:
        return self.ds.version

    def feed(self, a: int, b: int, net: bool) -> Any:
        d = self.ds.delta(begin_version=a, end_version=b)
        return {"inserted": d.get_inserted_rows().read_all(), "updated": d.get_updated_rows().read_all(), "deleted": d.get_deleted_row_ids().read_all()}

    def summarize(self, result: Any) -> dict:
        ins, upd, dele = result["inserted"], result["updated"], result["deleted"]
        out = {
            "rows": ins.num_rows + upd.num_rows + dele.num_rows,
            "counts": type_counts({"insert": ins.num_rows, "update_postimage": upd.num_rows, "delete": dele.num_rows}),
            "id_sums": {
                "insert": int(pc.sum(ins.column("id")).as_py() or 0),
                "update_preimage": 0,
                "update_postimage": int(pc.sum(upd.column("id")).as_py() or 0),
                "delete": None,  # delta() gives only _rowid for deleted rows, not the key
            },
        }
        return out

    def final(self) -> pa.Table:
        return self.ds.to_table(columns=["id", "amount"])

    def versions(self) -> dict[str, str]:
        import lance

        return {"pylance": lance.__version__}


PEER_PACKAGES = ("deltalake", "pylance", "duckdb-extension-ducklake")
IMPLS: dict[str, type[System]] = {c.name: c for c in (Lineage, LineageCapture, LineageV3, PyIceberg, Delta, DuckLake, Lance)}


PROBE_TIMEOUT = 60.0  # seconds; through a temp table the same range answers in about 1.5 s at 1M rows


def probe_table_changes(root: str, start: int, end: int, timeout: float) -> dict[str, Any]:
    """Run DuckLake's own ``table_changes`` over snapshots ``[start, end]`` in a child process with a time limit."""
    cmd = [sys.executable, os.path.join(HERE, "run.py"), "--ducklake-probe", root, str(start), str(end)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cpu = _process_cpu_seconds(proc.pid)
        os.killpg(proc.pid, 9)  # its own process group (start_new_session)
        proc.communicate()
        return {"ok": False, "query": f"SELECT * FROM lake.table_changes('orders', {start}, {end})",
                "error": f"no answer after {timeout:.0f} s (process CPU time {cpu} s): stopped"}
    if proc.returncode != 0:
        return {"ok": False, "error": f"probe exited with code {proc.returncode}"}
    return {"ok": True, **json.loads(out.strip().splitlines()[-1])}


def _process_cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)
    except (OSError, IndexError, ValueError):
        return None


def ducklake_probe(root: str, start: int, end: int) -> None:
    from lineage import duck

    con = duck.connect("ducklake")
    con.execute(f"ATTACH 'ducklake:{os.path.join(root, 'catalog.ducklake')}' AS lake (DATA_PATH '{os.path.join(root, 'data')}/')")
    t0 = time.perf_counter()
    result = con.execute(f"SELECT * FROM lake.table_changes('orders', {start}, {end})").to_arrow_table()
    seconds = time.perf_counter() - t0
    counts = feed_summary(result.column("change_type"), result.column("id"))
    print(json.dumps({"seconds": round(seconds, 4), "rows": result.num_rows, "counts": counts["counts"]}))
