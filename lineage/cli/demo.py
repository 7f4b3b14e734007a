"""A guided tour of row lineage on a generated table of about a million rows.

Run with ``make demo`` or ``python -m lineage.cli.demo``. It (re)creates the local
warehouse ``demo-warehouse/`` in the current directory (embedded SQLite
catalog), writes to a keyed table partitioned by ``bucket(8, customer_id)``,
and prints every commit, the commit history, some rows with their lineage
columns, and a check that readers which know nothing of lineage (pyiceberg's
scan, DuckDB's ``iceberg_scan``) see exactly as many rows as ours.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lineage
import lineage.duck as duck

WAREHOUSE = "demo-warehouse"
TABLE = "shop.orders"
SEED = 20261122
STATUSES = np.array(["new", "paid", "shipped", "cancelled"])
SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer_id", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("ordered_at", pa.timestamp("us")),
    ]
)
EPOCH = np.datetime64("2026-01-01T00:00:00", "us")


def orders(rng: np.random.Generator, order_ids: np.ndarray) -> pa.Table:
    """Generated orders with the given ids (customers, statuses, amounts, times are random)."""
    n = len(order_ids)
    seconds = rng.integers(0, 300 * 86400, n)
    return pa.table(
        {
            "order_id": order_ids.astype(np.int64),
            "customer_id": rng.integers(0, 50_000, n),
            "status": STATUSES[rng.integers(0, len(STATUSES), n)],
            "amount": np.round(rng.uniform(1.0, 1000.0, n), 2),
            "ordered_at": EPOCH + seconds.astype("timedelta64[s]"),
        },
        schema=SCHEMA,
    )


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[bool] | None = None) -> None:
    """Print rows as aligned columns (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = right or [False] * len(headers)
    for j, r in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip())
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths))


COMMIT_HEADERS = ("version", "operation", "mode", "inserted", "updated", "deleted", "data+", "deletes+", "data-", "written", "time", "what")
COMMIT_RIGHT = (True, False, False, True, True, True, True, True, True, True, True, False)


class Tour:
    """Runs writes, printing one aligned line per commit as it happens."""

    def __init__(self, table: lineage.Table) -> None:
        self.table = table
        self.widths = [7, 9, 13, 9, 8, 8, 5, 8, 5, 10, 6, 0]

    def header(self) -> None:
        print(self._line(COMMIT_HEADERS))
        print(self._line(["-" * w if w else "-" * 40 for w in self.widths]))

    def _line(self, values: Sequence[object]) -> str:
        parts = []
        for v, w, r in zip(values, self.widths, COMMIT_RIGHT, strict=True):
            s = str(v)
            parts.append(s.rjust(w) if r else s.ljust(w))
        return "  " + "  ".join(parts).rstrip()

    def run(self, what: str, mode: str, write: Callable[[], lineage.CommitInfo]) -> lineage.CommitInfo:
        start = time.perf_counter()
        info = write()
        elapsed = time.perf_counter() - start
        version = info.version if info.committed else f"({info.version})"
        print(
            self._line(
                [
                    version,
                    info.operation,
                    mode,
                    f"{info.inserted:,}",
                    f"{info.updated:,}",
                    f"{info.deleted:,}",
                    info.data_files_added,
                    info.delete_files_added,
                    info.data_files_removed,
                    human_bytes(info.bytes_written),
                    f"{elapsed:.2f}s",
                    what if info.committed else f"{what} -> matched nothing, committed=False",
                ]
            )
        )
        return info


def upsert_batch(table: lineage.Table, rng: np.random.Generator, next_id: int, n: int) -> pa.Table:
    """``n`` rows: half re-use live keys (with new status/amount), half are new orders."""
    live = table.scan(with_lineage=False).sort_by("order_id")  # scan order is not deterministic
    pick = np.sort(rng.choice(live.num_rows, n // 2, replace=False))
    matched = live.take(pa.array(pick)).cast(SCHEMA)
    matched = matched.set_column(2, "status", pa.array(STATUSES[rng.integers(1, 3, matched.num_rows)]))
    matched = matched.set_column(3, "amount", pc.round(pc.multiply(matched.column("amount"), 1.05), 2))
    fresh = orders(rng, np.arange(next_id, next_id + (n - n // 2)))
    return pa.concat_tables([matched, fresh])


def _drop_table(catalog: Any, name: str) -> None:
    """Drop ``name`` from ``catalog`` if it is there (its files stay: a vacuum before, or the store's lifecycle rules, remove them)."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError

    try:
        catalog.drop_table(name)
    except NoSuchTableError:
        pass
    try:
        catalog.create_namespace(name.rsplit(".", 1)[0])
    except NamespaceAlreadyExistsError:
        pass


def main(argv: Sequence[str] | None = None, catalog: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lineage.cli.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the generated dataset (default 1,000,000)")
    args = parser.parse_args(argv)
    if args.rows < 1000:
        parser.error("--rows must be at least 1000")
    t_start = time.perf_counter()
    rng = np.random.default_rng(SEED)

    if catalog is None and os.path.exists(WAREHOUSE):
        shutil.rmtree(WAREHOUSE)
    if catalog is not None:  # a catalog of the user's (--catalog-uri): the demo's table is replaced there
        _drop_table(catalog, TABLE)
    table = lineage.create_table(
        TABLE,
        SCHEMA,
        key=["order_id"],
        partition_by=["bucket(8, customer_id)"],
        **({"warehouse": WAREHOUSE} if catalog is None else {"catalog": catalog}),
    )
    print("Row lineage demo")
    if catalog is None:
        print(f"  warehouse  {os.path.abspath(WAREHOUSE)}  (embedded SQLite catalog: {WAREHOUSE}/catalog.db)")
    else:
        print(f"  location   {table.iceberg.metadata.location}  (catalog {type(catalog).__name__} {getattr(catalog, 'name', '')})")
    print(f"  table      {table.name}  key {table.key}  partitioned by bucket(8, customer_id)")
    print(f"  columns    {', '.join(f'{f.name} {f.type}' for f in SCHEMA)}")
    print("  default write mode: merge-on-read (table properties write.delete.mode / write.update.mode / write.merge.mode)")
    print()

    rows = args.rows
    first = int(rows * 0.7)
    batch = (rows - first) // 3
    upsert_n = max(2, rows // 50)
    tour = Tour(table)
    mor, cow = lineage.MERGE_ON_READ, lineage.COPY_ON_WRITE
    print("Commits, as they happen (data+/deletes+ = data/position-delete files added, data- = data files removed;")
    print("written = bytes of Parquet data and delete files plus lineage segment, lineage list and index files):")
    tour.header()

    load = orders(rng, np.arange(0, first))  # data is generated outside the timed writes
    tour.run(f"initial load of {first:,} orders", "-", lambda: table.append(load))
    next_id = first
    for day in range(3):
        daily = orders(rng, np.arange(next_id, next_id + batch))
        tour.run(f"daily batch {day + 1} of {batch:,} orders", "-", lambda daily=daily: table.append(daily))
        next_id += batch

    first_update = tour.run(
        "status='new' AND ordered_at < 2026-02-01 -> 'paid'",
        mor,
        lambda: table.update("status = 'new' AND ordered_at < TIMESTAMP '2026-02-01'", {"status": "'paid'"}),
    )
    tour.run(
        "customer_id = 4242: amount * 1.1",
        mor,
        lambda: table.update("customer_id = 4242", {"amount": "round(amount * 1.1, 2)"}),
    )
    tour.run(
        "status='shipped' AND amount > 990 -> 'delivered'",
        mor,
        lambda: table.update("status = 'shipped' AND amount > 990", {"status": "'delivered'"}),
    )
    tour.run("status='cancelled' AND amount < 50", mor, lambda: table.delete("status = 'cancelled' AND amount < 50"))
    lo = first // 7
    tour.run(f"order_id BETWEEN {lo} AND {lo + 999}", mor, lambda: table.delete(f"order_id BETWEEN {lo} AND {lo + 999}"))
    upserts = []
    for _ in range(2):
        up = upsert_batch(table, rng, next_id, upsert_n)
        next_id += upsert_n - upsert_n // 2
        upserts.append(tour.run(f"{up.num_rows:,} rows by key: half match, half new", mor, lambda up=up: table.upsert(up)))
    tour.run("GDPR erase customer 7 (rewrites its files)", cow, lambda: table.delete("customer_id = 7", mode=cow))
    tour.run("order_id < 0", mor, lambda: table.delete("order_id < 0"))
    print()

    print("history() - the lineage commit log (copied into every lineage list, so it does not need old snapshots):")
    hist = table.history()
    print_table(
        ("version", "snapshot id", "committed at (UTC)", "operation", "inserted", "updated", "deleted"),
        [
            (c.version, c.snapshot_id, c.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], c.operation, f"{c.inserted:,}", f"{c.updated:,}", f"{c.deleted:,}")
            for c in hist
        ],
        right=(True, True, False, False, True, True, True),
    )
    print()

    v_update, v_upsert1, v_upsert2 = first_update.version, upserts[0].version, upserts[1].version
    lineage_cols = ["order_id", "customer_id", "status", "amount", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
    samples = []
    by_update = table.scan(f"_row_created_at_version = 1 AND _row_last_updated_at_version = {v_update}", columns=lineage_cols)
    by_upsert = table.scan(
        f"_row_created_at_version < _row_last_updated_at_version AND _row_last_updated_at_version = {v_upsert1}", columns=lineage_cols
    )
    untouched = table.scan("_row_created_at_version = 2 AND _row_last_updated_at_version = 2", columns=lineage_cols)
    inserted = table.scan(f"_row_created_at_version = {v_upsert2}", columns=lineage_cols)
    for label, t in (("never changed", untouched), (f"updated (v{v_update})", by_update), ("updated by upsert", by_upsert), ("inserted by upsert", inserted)):
        if t.num_rows:
            row = t.sort_by("order_id").slice(0, 1).to_pylist()[0]
            samples.append((label, row))
    print("Sample rows with their lineage columns (updated rows keep _row_id and created version):")
    print_table(
        ["row"] + lineage_cols,
        [[label] + [f"{r[c]:.2f}" if c == "amount" else r[c] for c in lineage_cols] for label, r in samples],
        right=[False, True, True, False, True, True, True, True],
    )
    if by_update.num_rows:
        oid = by_update.sort_by("order_id").column("order_id")[0].as_py()
        before = table.scan(f"order_id = {oid}", columns=lineage_cols, as_of=v_update - 1).to_pylist()[0]
        after = table.scan(f"order_id = {oid}", columns=lineage_cols).to_pylist()[0]
        print(
            f"  time travel: order {oid} at version {v_update - 1} had status {before['status']!r}, _row_id {before['_row_id']}; "
            f"now {after['status']!r}, _row_id {after['_row_id']} (same row, "
            f"created v{after['_row_created_at_version']} < updated v{after['_row_last_updated_at_version']})"
        )
    print()

    table.refresh()
    ours = table.count()
    theirs = table.iceberg.scan(selected_fields=("order_id",)).to_arrow().num_rows
    con = duck.connect("iceberg")
    try:
        ddb = con.execute(f"SELECT count(*) FROM iceberg_scan('{table.iceberg.metadata_location}')").fetchone()[0]
    finally:
        con.close()
    ok = ours == theirs == ddb
    print(
        f"Interop at version {table.version}: lineage scan {ours:,} rows, pyiceberg scan {theirs:,} rows, "
        f"DuckDB iceberg_scan {ddb:,} rows -> {'MATCH' if ok else 'MISMATCH'}"
    )
    total = time.perf_counter() - t_start
    print(f"Total time {total:.1f}s ({dt.datetime.now().strftime('%Y-%m-%d %H:%M:%S')})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
