"""The ``lineage`` argument parser: global options and one subcommand per ``cmd_*`` function."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lineage.cli.context import DEFAULT_WAREHOUSE, EXIT_USAGE, PROG, Context
from lineage.cli.format import FORMATS
from lineage.cli.maintenance import (
    cmd_compact,
    cmd_convert_deletes,
    cmd_expire,
    cmd_maintain,
    cmd_purge,
    cmd_reconcile,
    cmd_rehome,
    cmd_reindex,
    cmd_rewrite_deletes,
    cmd_rewrite_manifests,
    cmd_upgrade,
    cmd_vacuum,
    cmd_verify,
)
from lineage.cli.mv import cmd_mv_create, cmd_mv_list, cmd_mv_refresh
from lineage.cli.reads import cmd_changes, cmd_deleted_rows, cmd_scan
from lineage.cli.tables import cmd_adopt, cmd_create, cmd_demo, cmd_info, cmd_log, cmd_tables
from lineage.cli.writes import cmd_append, cmd_apply_changelog, cmd_delete, cmd_update, cmd_upsert


def _version(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a version number (0, 1, 2, ...), got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a version number (0, 1, 2, ...), got {text!r}")
    return v


def _add_globals(p: argparse.ArgumentParser, sub: bool) -> None:
    """Global options; subcommands accept them too (hidden from their help)."""

    def h(text: str) -> str:
        return argparse.SUPPRESS if sub else text

    d = argparse.SUPPRESS if sub else None
    p.add_argument(
        "--warehouse",
        metavar="PATH",
        default=d,
        help=h(f"local warehouse folder with the embedded SQLite catalog (default: $LINEAGE_WAREHOUSE or ./{DEFAULT_WAREHOUSE})"),
    )
    p.add_argument(
        "--catalog",
        metavar="NAME|KEY=VALUE",
        action="append",
        default=d,
        help=h(
            "use a pyiceberg catalog instead: a catalog NAME from ~/.pyiceberg.yaml and/or properties "
            "(repeat: --catalog type=rest --catalog uri=http://...)"
        ),
    )
    p.add_argument(
        "--catalog-uri",
        metavar="URI",
        default=d,
        help=h("shorthand for --catalog uri=URI (sqlite:///..., postgresql://..., http://...: type inferred)"),
    )
    p.add_argument(
        "--format", "-f", choices=FORMATS, default=argparse.SUPPRESS if sub else "table", help=h("output format (default: table)")
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", default=d, help=h("write results to FILE instead of stdout (required for parquet)")
    )
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        default=argparse.SUPPRESS if sub else False,
        help=h("no progress bars or notes on stderr"),
    )
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS if sub else False, help=h("show tracebacks and debug logs")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate row-lineage Iceberg tables: inspect, read the change feed, maintain, verify.",
        epilog="Exit codes: 0 ok, 1 failure, 2 bad usage. Global options may also follow the subcommand.",
        allow_abbrev=False,  # `--from 0` must not be taken for `--from-timestamp 0`
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_package_version()}")
    _add_globals(parser, sub=False)
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def sub(name: str, func: Callable[[Context], int], help: str, parent: Any = subs) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help, description=help, allow_abbrev=False)
        _add_globals(p, sub=True)
        p.set_defaults(func=func)
        return p

    def table_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("table", metavar="TABLE", help="namespace.table (or table, in namespace default)")

    def limit_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--limit", type=int, metavar="N", help="print at most N rows")

    p = sub("create", cmd_create, "create a lineage table")
    table_arg(p)
    p.add_argument(
        "--schema",
        required=True,
        metavar="SPEC|FILE",
        help="columns as name:type,... (id:int64,name:string,amount:float64; 'type!' = not null) "
        "or a JSON, Arrow or Parquet file holding a schema",
    )
    p.add_argument("--key", metavar="COLS", help="key columns, comma separated (needed by upsert)")
    p.add_argument("--format-version", type=int, choices=(2, 3), default=None,
                   help="Iceberg format version (default 2; 3: native row lineage, deletes as deletion vectors)")
    p.add_argument(
        "--partition-by",
        action="append",
        metavar="TRANSFORM",
        help="partition transform, repeatable or comma separated: region, day(ts), bucket(16, id), truncate(4, name)",
    )
    p.add_argument("--property", action="append", metavar="KEY=VALUE", help="table property, repeatable")

    p = sub("adopt", cmd_adopt, "make an existing Iceberg v2 table a lineage table (no data rewritten; the feed starts there)")
    table_arg(p)
    p.add_argument("--key", metavar="COLS", help="key columns, comma separated (default: the table's identifier fields, if any)")

    p = sub("info", cmd_info, "schema, key, partitioning, versions, files, lineage and index sizes, retention")
    table_arg(p)

    p = sub("tables", cmd_tables, "list the lineage tables of the catalog")
    p.add_argument("--namespace", metavar="NS", help="only this namespace")

    p = sub("log", cmd_log, "commit history: operation and inserted/updated/deleted per version")
    table_arg(p)
    p.add_argument("--limit", type=int, metavar="N", help="only the last N commits")
    p.add_argument(
        "--plot", metavar="FILE", help="also draw the history: FILE.html or FILE.svg (no dependency) or FILE.png (matplotlib)"
    )
    p.add_argument("--plot-scale", choices=("log", "linear"), default="log", help="y axis of the plot (default: log)")

    p = sub("scan", cmd_scan, "read live rows with their lineage columns")
    table_arg(p)
    p.add_argument("--where", metavar="SQL", help="DuckDB SQL predicate over data and lineage columns")
    p.add_argument("--columns", metavar="COLS", help="columns to return, comma separated (data or lineage columns)")
    p.add_argument("--as-of", type=_version, metavar="VERSION", help="time travel to this version")
    p.add_argument("--no-lineage", action="store_true", help="data columns only")
    p.add_argument("--order-by", metavar="COLS", help="sort by these columns (default: the key, else _row_id)")
    limit_arg(p)

    p = sub("changes", cmd_changes, "change data feed: changes after version FROM up to and including TO (default: current)")
    table_arg(p)
    p.add_argument("from_version", nargs="?", type=_version, metavar="FROM", help="start version (exclusive)")
    p.add_argument("to_version", nargs="?", type=_version, metavar="TO", help="end version (inclusive; default: current)")
    p.add_argument("--net", action="store_true", help="one result per row: its overall effect over the range")
    p.add_argument("--columns", metavar="COLS", help="data columns to return, comma separated")
    p.add_argument(
        "--from-timestamp",
        metavar="TIME",
        help="start at the version current at TIME (ISO-8601, epoch ms, or 2h = two hours ago)",
    )
    p.add_argument("--to-timestamp", metavar="TIME", help="end at the version current at TIME")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep reading: write the changes of each new commit as JSON lines as it lands (until TO, if given, or Ctrl-C)",
    )
    p.add_argument(
        "--poll-interval", type=float, default=1.0, metavar="SECONDS", help="with --follow: how often to look for new commits (default 1)"
    )
    limit_arg(p)

    p = sub("deleted-rows", cmd_deleted_rows, "rows deleted after --since up to --until, with their last values")
    table_arg(p)
    p.add_argument(
        "--since", type=_version, metavar="VERSION", help="exclusive start (default: the oldest version of the retention window)"
    )
    p.add_argument("--until", type=_version, metavar="VERSION", help="inclusive end (default: current)")
    p.add_argument("--columns", metavar="COLS", help="data columns to return, comma separated")
    limit_arg(p)

    for name, func, help_text in (
        ("append", cmd_append, "append rows from Parquet, CSV or JSON-lines files (one commit)"),
        ("upsert", cmd_upsert, "insert-or-update rows by key from Parquet, CSV or JSON-lines files"),
        ("apply-changelog", cmd_apply_changelog, "apply change events (Flink +I/-U/+U/-D or Debezium c/u/d/r) in one commit"),
    ):
        p = sub(name, func, help_text)
        table_arg(p)
        p.add_argument("files", nargs="+", metavar="FILE", help="input files (.parquet, .csv, .tsv, .json/.jsonl)")
        p.add_argument(
            "--input-format", choices=("parquet", "csv", "json"), help="format of the files (default: from their names)"
        )
        if name == "upsert":
            p.add_argument("--skip-unchanged", action="store_true", help="leave rows equal in every column alone")
            p.add_argument("--mode", choices=("merge-on-read", "copy-on-write"), help="override write.merge.mode")
        if name == "apply-changelog":
            p.add_argument("--op-column", default="_op", metavar="NAME", help="column holding the operation (default: _op)")
            p.add_argument(
                "--upsert", action="store_true", help="+I/+U of a live key update it; -U/-D of an absent key are ignored"
            )
            p.add_argument(
                "--order-by", metavar="COLS", help="columns that order the events (default: the files' row order, file by file)"
            )
            p.add_argument("--mode", choices=("merge-on-read", "copy-on-write"), help="override write.merge.mode")

    p = sub("delete", cmd_delete, "delete the live rows matching --where")
    table_arg(p)
    p.add_argument("--where", required=True, metavar="SQL", help="rows to delete ('TRUE' for all)")
    p.add_argument("--mode", choices=("merge-on-read", "copy-on-write"), help="override write.delete.mode")

    p = sub("update", cmd_update, "update the live rows matching --where")
    table_arg(p)
    p.add_argument(
        "--set",
        action="append",
        required=True,
        metavar="COL=EXPR",
        help="new value as a SQL expression on the old row, repeatable",
    )
    p.add_argument("--where", metavar="SQL", help="rows to update (default: all)")
    p.add_argument("--mode", choices=("merge-on-read", "copy-on-write"), help="override write.update.mode")

    p = sub("compact", cmd_compact, "rewrite data files with deletes or small files (lineage kept, no change events)")
    table_arg(p)
    p.add_argument(
        "--target-file-size",
        metavar="SIZE",
        help="target size of the new files (e.g. 128MB; default: write.target-file-size-bytes)",
    )
    p.add_argument("--min-file-size", metavar="SIZE", help="files under this size are rewritten (default: 3/4 of the target)")

    p = sub("upgrade", cmd_upgrade, "make a v2 table an Iceberg v3 table: every v3 reader returns its row ids (no change events)")
    table_arg(p)
    p.add_argument("--format-version", type=int, default=3, metavar="N", help="the format version to upgrade to (3)")

    p = sub("rewrite-deletes", cmd_rewrite_deletes, "merge position delete files (one per data file or partition)")
    table_arg(p)
    p.add_argument("--granularity", choices=("file", "partition"), help="default: write.delete.granularity")

    p = sub(
        "convert-deletes", cmd_convert_deletes,
        "turn every equality delete file into position deletes (deletion vectors on v3; no reader's answer changes)",
    )
    table_arg(p)

    p = sub("rewrite-manifests", cmd_rewrite_manifests, "merge the current snapshot's manifests (tables that have many)")
    table_arg(p)
    p.add_argument("--dry-run", action="store_true", help="say how many manifests would be merged, change nothing")

    p = sub("maintain", cmd_maintain, "run the upkeep a long-lived table needs, as its table properties say")
    table_arg(p)
    p.add_argument("--dry-run", action="store_true", help="say what each step would do, change nothing")

    p = sub("expire", cmd_expire, "expire old snapshots (the change feed does not need them)")
    table_arg(p)
    p.add_argument("--retain-last", type=int, default=1, metavar="N", help="keep the last N snapshots (default 1)")
    p.add_argument("--older-than", metavar="AGE", help="only expire snapshots older than AGE (7d, 12h, 30m)")

    p = sub("vacuum", cmd_vacuum, "delete files nothing references (files the change feed needs are kept)")
    table_arg(p)
    p.add_argument(
        "--older-than",
        default="1h",
        metavar="AGE",
        help="only files older than AGE (default 1h: younger files may belong to a commit in flight)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the files, delete nothing")

    p = sub("rehome", cmd_rehome, "copy still-needed deleted images out of sparse pinned files so vacuum can release them")
    table_arg(p)
    p.add_argument(
        "--max-live-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="re-home files whose needed images are at most F of their rows (default 0.1)",
    )

    p = sub("reindex", cmd_reindex, "rebuild the key index of a keyed table from its key columns (or merge its segments)")
    table_arg(p)
    p.add_argument("--merge", action="store_true", help="merge the index's segments per its merge policy instead of rebuilding")
    p.add_argument("--full", action="store_true", help="with --merge: merge every segment into one")

    p = sub("purge", cmd_purge, "erase rows for good, with every earlier image of them (GDPR)")
    table_arg(p)
    p.add_argument("--where", required=True, metavar="SQL", help="the live rows to erase")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation on a terminal")

    p = sub("reconcile", cmd_reconcile, "derive and store the lineage of commits other engines (Spark, Flink, ...) made")
    table_arg(p)

    p = sub("verify", cmd_verify, "check that lineage, the deleted-rows and key indexes and the snapshot agree and every file exists")
    table_arg(p)
    p.add_argument("--skip-row-ids", action="store_true", help="skip the row-id uniqueness check (it reads every delete file)")

    p = sub("mv", lambda ctx: EXIT_USAGE, "materialized views: create, refresh, list")
    mvs = p.add_subparsers(dest="mv_command", metavar="MV_COMMAND", required=True)
    q = sub("create", cmd_mv_create, "define a view over a table (SELECT ... FROM source [WHERE] [GROUP BY])", mvs)
    q.add_argument("view", metavar="VIEW", help="namespace.table of the view")
    q.add_argument("query", metavar="QUERY", help="the view's SQL")
    q.add_argument(
        "--source", metavar="TABLE", help="the source table (default: the FROM of the query, if it names namespace.table)"
    )
    q.add_argument("--refresh", action="store_true", help="fill the view right away")
    q = sub("refresh", cmd_mv_refresh, "apply the source's change feed since each view's checkpoint (exactly once)", mvs)
    q.add_argument("views", nargs="*", metavar="VIEW")
    q.add_argument("--all", action="store_true", help="refresh every view of the catalog")
    q.add_argument("--full", action="store_true", help="recompute the whole query")
    q.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb")
    q = sub("list", cmd_mv_list, "views with their source and how far behind they are", mvs)
    q.add_argument("--namespace", metavar="NS", help="only this namespace")

    p = sub("demo", cmd_demo, "run the demo (writes ./demo-warehouse, wiped first; ignores --warehouse)")
    p.add_argument("--rows", type=int, metavar="N", help="rows in the generated dataset (default 1,000,000)")
    return parser


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("iceberg-row-lineage")
    except Exception:
        return "unknown"
