"""``lineage``: the operator CLI for row-lineage Iceberg tables.

Run ``lineage --help`` (or ``python -m lineage.cli --help``). Global options
(``--warehouse``, ``--catalog``, ``--format``, ``--output``, ``--quiet``,
``--debug``) go before the subcommand (they are also accepted after it).

Exit codes: 0 success; 1 failure (missing table, lost commit race, corrupt
metadata, ``verify`` found problems, ...); 2 bad usage (unknown option,
invalid argument value, bad version range, retention window, bad ``--where``).
Expected errors print one short line on stderr; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lineage.cli_format import FORMATS, Output, Progress, human_bytes, progress_enabled, render_record
from lineage.cli_parse import (
    parse_columns,
    parse_duration,
    parse_pairs,
    parse_schema,
    parse_size,
    parse_timestamp,
    split_top_level,
)
from lineage.errors import InvalidArgumentError, LineageError, TableNotFoundError

PROG = "lineage"
DEFAULT_WAREHOUSE = "warehouse"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("lineage.cli")


class VerifyFailed(LineageError):
    """``lineage verify`` found inconsistencies (exit code 1)."""


class CatalogUnavailableError(LineageError):
    """The catalog named by --catalog/--catalog-uri could not be opened (exit code 1)."""


# ---------------------------------------------------------------- context


@dataclass
class Context:
    """What every command gets: its arguments, the output, the progress bars and the catalog."""

    args: argparse.Namespace
    out: Output
    progress: Progress
    _catalog: Any = field(default=None, repr=False)

    @property
    def quiet(self) -> bool:
        return bool(self.args.quiet)

    def note(self, text: str) -> None:
        """A human remark on stderr (suppressed by --quiet)."""
        if not self.quiet:
            print(text, file=sys.stderr)

    def catalog(self, create: bool = False) -> Any:
        """The catalog from --catalog/--catalog-uri, or the embedded one in --warehouse."""
        if self._catalog is None:
            self._catalog = resolve_cli_catalog(self.args, create)
        return self._catalog

    def open(self, name: str) -> Any:
        import lineage

        return lineage.open_table(name, catalog=self.catalog())


def warehouse_path(args: argparse.Namespace) -> str:
    return args.warehouse or os.environ.get("LINEAGE_WAREHOUSE") or DEFAULT_WAREHOUSE


def resolve_cli_catalog(args: argparse.Namespace, create: bool) -> Any:
    """``--catalog NAME|KEY=VALUE``/``--catalog-uri`` -> pyiceberg ``load_catalog``; else the warehouse's SQLite catalog."""
    from lineage.catalog import CATALOG_FILE, default_catalog

    entries = list(args.catalog or [])
    names = [e for e in entries if "=" not in e]
    props = parse_pairs([e for e in entries if "=" in e], "--catalog")
    if args.catalog_uri:
        props["uri"] = args.catalog_uri
    warehouse = warehouse_path(args)
    if not names and not props:
        if not create and not os.path.exists(os.path.join(warehouse, CATALOG_FILE)):
            raise TableNotFoundError(
                f"no warehouse at {os.path.abspath(warehouse)} (it has no {CATALOG_FILE}); "
                "pass --warehouse PATH, set LINEAGE_WAREHOUSE, or create a table first"
            )
        return default_catalog(warehouse)
    if len(names) > 1:
        raise InvalidArgumentError(f"--catalog names more than one catalog: {names}")
    from pyiceberg.catalog import infer_catalog_type, load_catalog

    name = names[0] if names else "lineage"
    try:
        kind = props.get("type") or (str(infer_catalog_type(name, props).value) if props.get("uri") else None)
    except Exception:  # pyiceberg raises ValueError for a URI scheme it cannot place
        kind = None
    if (kind or "").lower() == "sql" and "warehouse" not in props:
        path = os.path.abspath(warehouse)
        os.makedirs(path, exist_ok=True)
        props["warehouse"] = path
    try:
        return load_catalog(name, **props)
    except ValueError as exc:
        raise InvalidArgumentError(f"--catalog: {str(exc).replace('using --uri', 'using --catalog-uri')}") from None
    except Exception as exc:  # unreachable server, unopenable database, bad credentials...
        raise CatalogUnavailableError(f"cannot open the catalog {name!r}: {type(exc).__name__}: {first_line(exc)}") from exc


# ---------------------------------------------------------------- rendering helpers


def _commit_record(info: Any) -> dict[str, Any]:
    return {
        "committed": info.committed,
        "version": info.version,
        "operation": info.operation,
        "inserted": info.inserted,
        "updated": info.updated,
        "deleted": info.deleted,
        "data_files_added": info.data_files_added,
        "delete_files_added": info.delete_files_added,
        "data_files_removed": info.data_files_removed,
        "bytes_written": info.bytes_written,
        "attempts": info.attempts,
    }


def _commit_text(table: str, info: Any) -> str:
    if not info.committed:
        return f"{table}: {info.operation} matched nothing; no commit (version stays {info.version})\n"
    counts = [
        f"{n:,} {what}" for n, what in ((info.inserted, "inserted"), (info.updated, "updated"), (info.deleted, "deleted")) if n
    ]
    files = [
        f"{n} {what}"
        for n, what in (
            (info.data_files_added, "data file(s) added"),
            (info.delete_files_added, "delete file(s) added"),
            (info.data_files_removed, "data file(s) removed"),
        )
        if n
    ]
    return (
        f"{table}: version {info.version} ({info.operation}): {', '.join(counts) or 'no rows changed'}; "
        f"{', '.join(files + [human_bytes(info.bytes_written) + ' written'])}\n"
    )


def type_name(t: Any) -> str:
    """Arrow type as a person writes it (``string``, not ``large_string``)."""
    return str(t).replace("large_string", "string").replace("large_binary", "binary").replace("large_list", "list")


def _maintenance_record(table: str, result: Any, **extra: Any) -> dict[str, Any]:
    rec = {
        "table": table,
        "operation": result.operation,
        "committed": result.version is not None,
        "version": result.version,
        "files_added": result.files_added,
        "files_removed": result.files_removed,
        "bytes_added": result.bytes_added,
        "bytes_removed": result.bytes_removed,
        "detail": result.detail,
    }
    rec.update(extra)
    return rec


def _maintenance_text(rec: dict[str, Any]) -> str:
    parts = []
    if rec["committed"]:
        parts.append(f"committed version {rec['version']}")
    if rec["files_added"] or rec["bytes_added"]:
        size = f" ({human_bytes(rec['bytes_added'])})" if rec["bytes_added"] else ""
        parts.append(f"{rec['files_added']} file(s) added{size}")
    if rec["files_removed"] or rec["bytes_removed"]:
        size = f" ({human_bytes(rec['bytes_removed'])})" if rec["bytes_removed"] else ""
        parts.append(f"{rec['files_removed']} file(s) {'to delete' if rec.get('dry_run') else 'removed'}{size}")
    if rec.get("files") is None and rec.get("detail"):
        parts.append(rec["detail"])
    head = (
        f"{rec['table']}: {rec['operation']}{' (dry run)' if rec.get('dry_run') else ''}: {'; '.join(parts) or 'nothing to do'}"
    )
    if rec.get("files") is not None:  # vacuum --dry-run: one path a line
        return "\n".join([head] + [f"  {p}" for p in rec["files"]]) + "\n"
    return head + "\n"


def _partition_fields(ice: Any) -> list[str]:
    """The partition spec in create's syntax: ``bucket(4, id)``, ``day(ts)``, ``region``."""
    schema = ice.schema()
    out = []
    for f in ice.spec().fields:
        src = schema.find_field(f.source_id).name
        t = str(f.transform)
        if t == "identity":
            out.append(src)
        elif "[" in t:
            kind, arg = t.rstrip("]").split("[", 1)
            out.append(f"{kind}({arg}, {src})")
        else:
            out.append(f"{t}({src})")
    return out


def _retention_text(props: dict[str, str]) -> str:
    from cdf.retention import PROP_RETENTION_DAYS, PROP_RETENTION_VERSIONS

    parts = [f"{p}={props[p]}" for p in (PROP_RETENTION_VERSIONS, PROP_RETENTION_DAYS) if props.get(p)]
    return ", ".join(parts) if parts else "unset (all history is available)"


def _size_of(io: Any, path: str) -> int:
    try:
        return len(io.new_input(path))
    except Exception:
        return 0


def _dir_bytes(folder: str) -> tuple[int, int]:
    n = total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
                n += 1
            except OSError:
                pass
    return n, total


# ---------------------------------------------------------------- commands: tables


def cmd_create(ctx: Context) -> int:
    import lineage

    a = ctx.args
    schema = parse_schema(a.schema)
    key = parse_columns(a.key) if a.key else None
    partition_by = [p for spec in a.partition_by or [] for p in split_top_level(spec)]
    props = parse_pairs(a.property, "--property")
    t = lineage.create_table(
        a.table, schema, key=key, partition_by=partition_by or None, catalog=ctx.catalog(create=True), properties=props
    )
    rec = {
        "table": t.name,
        "location": t.iceberg.metadata.location,
        "columns": [
            {"name": f.name, "type": type_name(f.type), "nullable": f.nullable and f.name not in t.key} for f in t.arrow_schema
        ],
        "key": t.key,
        "partition_by": _partition_fields(t.iceberg),
        "properties": props,
    }
    text = f"created {t.name} at {rec['location']}\n" + render_record(
        {
            "columns": _columns_text(rec["columns"], t.key),
            "partitioned by": ", ".join(rec["partition_by"]) or "unpartitioned",
            "properties": ", ".join(f"{k}={v}" for k, v in props.items()) or "-",
        },
        indent=2,
    )
    ctx.out.record(rec, text=text)
    return EXIT_OK


def table_info(t: Any, progress: Progress) -> dict[str, Any]:
    """Everything ``lineage info`` reports about a table, as a JSON-able dict."""
    from cdf.retention import PROP_RETENTION_DAYS, PROP_RETENTION_VERSIONS, window
    from lineage.fileio import local_path
    from lineage.maintenance.vacuum import pinned_files
    from lineage.metadata import SUMMARY_LIST
    from lineage.state import main_branch_snapshots

    with progress.task(f"reading {t.name}") as task:
        state = t.state()
        ice = t.iceberg
        io = ice.io
        props = t.properties
        lst = state.lineage
        snap = state.snapshot
        task.update(description="listing files")
        data_n = data_b = data_rows = del_n = del_b = del_rows = 0
        live_paths: set[str] = set()
        if snap is not None:
            files = ice.inspect.files(snapshot_id=snap.snapshot_id).select(
                ["content", "file_path", "file_size_in_bytes", "record_count"]
            )
            for r in files.to_pylist():
                if r["content"] == 0:
                    data_n, data_b, data_rows = data_n + 1, data_b + r["file_size_in_bytes"], data_rows + r["record_count"]
                    live_paths.add(local_path(r["file_path"]))
                else:
                    del_n, del_b, del_rows = del_n + 1, del_b + r["file_size_in_bytes"], del_rows + r["record_count"]
        task.update(description="counting rows")
        rows: int | None
        try:
            rows = t.count() if snap is not None else 0
            rows_error = None
        except Exception as exc:  # a broken table still gets an info page
            rows, rows_error = None, first_line(f"{type(exc).__name__}: {exc}")
        task.update(description="reading the deleted-rows index")
        list_path = (snap.summary.additional_properties if snap and snap.summary else {}).get(SUMMARY_LIST)
        win = window(state)
        in_window = [c.index for c in lst.commits if c.index and c.version > win.oldest]
        try:
            _, pinned = pinned_files(state)
            pinned_only = sorted(pinned - live_paths)
        except Exception:
            pinned_only = []
        snapshots = [s.sequence_number for s in main_branch_snapshots(ice)]
        root = local_path(ice.metadata.location)
        lineage_disk = _dir_bytes(os.path.join(root, "metadata", "lineage"))
        index_disk = _dir_bytes(os.path.join(root, "metadata", "index"))

    rec: dict[str, Any] = {
        "table": t.name,
        "location": ice.metadata.location,
        "uuid": str(ice.metadata.table_uuid),
        "columns": [
            {"name": f.name, "type": type_name(f.type), "nullable": f.nullable, "key": f.name in t.key} for f in t.arrow_schema
        ],
        "key": t.key,
        "partition_by": _partition_fields(ice),
        "version": state.version,
        "versions": len(lst.commits),
        "snapshots": {
            "count": len(snapshots),
            "oldest": snapshots[0] if snapshots else None,
            "newest": snapshots[-1] if snapshots else None,
        },
        "rows": rows,
        "data_files": {"count": data_n, "bytes": data_b, "records": data_rows},
        "delete_files": {"count": del_n, "bytes": del_b, "deleted_positions": del_rows},
        "lineage": {
            "segments": len(lst.segments),
            "segment_bytes": sum(_size_of(io, s) for s in lst.segments),
            "list_bytes": _size_of(io, list_path) if list_path else 0,
            "next_row_id": lst.next_row_id,
            "files_on_disk": lineage_disk[0],
            "bytes_on_disk": lineage_disk[1],
        },
        "index": {
            "segments_in_window": len(in_window),
            "segment_bytes_in_window": sum(_size_of(io, p) for p in in_window),
            "pinned_files": len(pinned_only),
            "pinned_bytes": sum(os.path.getsize(p) for p in pinned_only if os.path.exists(p)),
            "files_on_disk": index_disk[0],
            "bytes_on_disk": index_disk[1],
        },
        "retention": {
            "versions": props.get(PROP_RETENTION_VERSIONS),
            "days": props.get(PROP_RETENTION_DAYS),
            "oldest_cdf_version": win.oldest,
        },
        "properties": {k: v for k, v in sorted(props.items()) if k not in ("mv.definition",)},
    }
    if rows_error:
        rec["rows_error"] = rows_error
    if "mv.definition" in props:
        rec["materialized_view"] = {
            "source": props.get("mv.source"),
            "shape": props.get("mv.shape"),
            "query": props.get("mv.query"),
        }
        try:
            from cdf.mv import open_view

            rec["materialized_view"]["checkpoint"] = open_view(t.name, catalog=t.catalog).checkpoint
        except Exception as exc:
            rec["materialized_view"]["checkpoint_error"] = str(exc)
    return rec


def _columns_text(columns: list[dict[str, Any]], key: list[str]) -> str:
    return ", ".join(
        f"{c['name']} {c['type']}{' (key)' if c['name'] in key else (' not null' if not c['nullable'] else '')}" for c in columns
    )


def info_text(rec: dict[str, Any]) -> str:
    """``lineage info`` for a person."""
    cols = _columns_text(rec["columns"], rec["key"])
    d, x, li, ix, r, s = rec["data_files"], rec["delete_files"], rec["lineage"], rec["index"], rec["retention"], rec["snapshots"]
    rows = f"{rec['rows']:,}" if rec["rows"] is not None else f"unavailable ({rec.get('rows_error')})"
    retention = _retention_text(
        {k: v for k, v in (("lineage.cdf.retention.versions", r["versions"]), ("lineage.cdf.retention.days", r["days"])) if v}
    )
    snaps = f"{s['count']} (scan --as-of works for versions {s['oldest']}..{s['newest']})" if s["count"] else "none"
    lines = [
        ("table", rec["table"]),
        ("location", rec["location"]),
        ("columns", cols),
        ("key", ", ".join(rec["key"]) or "none"),
        ("partitioned by", ", ".join(rec["partition_by"]) or "unpartitioned"),
        ("version", f"{rec['version']}  ({rec['versions']} commits in the log)"),
        ("snapshots", snaps),
        ("live rows", rows),
        ("data files", f"{d['count']:,}  ({human_bytes(d['bytes'])}, {d['records']:,} records)"),
        ("delete files", f"{x['count']:,}  ({human_bytes(x['bytes'])}, {x['deleted_positions']:,} deleted positions)"),
        (
            "lineage",
            f"{li['segments']} segment(s), {human_bytes(li['segment_bytes'])} + list {human_bytes(li['list_bytes'])}; "
            f"next row id {li['next_row_id']:,}; on disk {li['files_on_disk']} file(s), {human_bytes(li['bytes_on_disk'])}",
        ),
        (
            "deleted-rows index",
            f"{ix['segments_in_window']} segment(s) in the window, {human_bytes(ix['segment_bytes_in_window'])}; "
            f"on disk {ix['files_on_disk']} file(s), {human_bytes(ix['bytes_on_disk'])}",
        ),
        ("pinned files", f"{ix['pinned_files']} ({human_bytes(ix['pinned_bytes'])}) kept only for the change feed"),
        ("CDF retention", retention),
        (
            "oldest CDF start",
            f"version {r['oldest_cdf_version']}  "
            f"(lineage changes {rec['table']} FROM [TO] accepts FROM >= {r['oldest_cdf_version']})",
        ),
    ]
    mv = rec.get("materialized_view")
    if mv:
        cp = mv.get("checkpoint")
        lines.append(
            ("materialized view", f"{mv['shape']} over {mv['source']}, reflects source version {'-' if cp is None else cp}")
        )
        lines.append(("view query", mv["query"]))
    write_props = {
        k: v for k, v in rec["properties"].items() if k.startswith(("write.", "commit.", "lineage.")) and k != "lineage.enabled"
    }
    lines.append(("properties", ", ".join(f"{k}={v}" for k, v in write_props.items()) or "-"))
    width = max(len(k) for k, _ in lines)
    return "".join(f"{k.ljust(width)}  {v}\n" for k, v in lines)


def cmd_info(ctx: Context) -> int:
    t = ctx.open(ctx.args.table)
    rec = table_info(t, ctx.progress)
    ctx.out.record(rec, text=info_text(rec))
    return EXIT_OK


def cmd_tables(ctx: Context) -> int:
    import pyarrow as pa

    rows = []
    for ident, ice in _iter_tables(ctx, ctx.args.namespace):
        props = ice.metadata.properties
        if props.get("lineage.enabled") != "true":
            continue
        snap = ice.metadata.current_snapshot()
        summary = snap.summary.additional_properties if snap and snap.summary else {}
        rows.append(
            {
                "table": ".".join(ident),
                "kind": "view" if "mv.definition" in props else "table",
                "version": snap.sequence_number if snap else 0,
                "last_commit": _dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, _dt.timezone.utc) if snap else None,
                "key": ",".join(ice.schema().identifier_field_names()),
                "data_files": int(summary.get("total-data-files", 0)),
                "delete_files": int(summary.get("total-delete-files", 0)),
                "records": int(summary.get("total-records", 0)),
            }
        )
    schema = pa.schema(
        [
            ("table", pa.string()),
            ("kind", pa.string()),
            ("version", pa.int64()),
            ("last_commit", pa.timestamp("ms", "UTC")),
            ("key", pa.string()),
            ("data_files", pa.int64()),
            ("delete_files", pa.int64()),
            ("records", pa.int64()),
        ]
    )
    ctx.out.table(pa.Table.from_pylist(rows, schema=schema), empty_note="no lineage tables")
    return EXIT_OK


def _iter_tables(ctx: Context, namespace: str | None):  # type: ignore[no-untyped-def]
    """(identifier, pyiceberg table) of every table in the catalog (or one namespace), with a progress bar."""
    cat = ctx.catalog()
    if namespace:
        namespaces = [tuple(namespace.split("."))]
    else:
        namespaces, todo = [], list(cat.list_namespaces())
        while todo:
            ns = todo.pop(0)
            namespaces.append(ns)
            try:
                todo.extend(n for n in cat.list_namespaces(ns) if n != ns and n not in namespaces)
            except Exception:
                pass
    idents = []
    for ns in sorted(set(namespaces)):
        try:
            idents.extend(cat.list_tables(ns))
        except Exception as exc:
            if namespace:
                raise TableNotFoundError(f"namespace {namespace} does not exist in this catalog ({type(exc).__name__})") from None
    with ctx.progress.task("loading tables", total=len(idents)) as task:
        for ident in sorted(idents):
            try:
                ice = cat.load_table(ident)
            except Exception as exc:
                log.warning("skipping %s: %s", ".".join(ident), exc)
                task.advance()
                continue
            task.advance()
            yield tuple(ident), ice


# ---------------------------------------------------------------- commands: history and reads


def history_of(t: Any) -> tuple[Any, Any]:
    """(commits, report.History) of a table."""
    from cdf.retention import window
    from lineage.report import Commit, History
    from lineage.state import main_branch_snapshots

    state = t.state()
    win = window(state)
    commits = [
        Commit(
            c.version,
            _dt.datetime.fromtimestamp(c.timestamp_ms / 1000, _dt.timezone.utc),
            c.operation,
            c.inserted,
            c.updated,
            c.deleted,
        )
        for c in state.lineage.commits
    ]
    snapshots = [s.sequence_number for s in main_branch_snapshots(t.iceberg)]
    return commits, History(t.name, commits, win.oldest, state.version, snapshots, _retention_text(t.properties))


def cmd_log(ctx: Context) -> int:
    import pyarrow as pa

    from lineage.report import check_plot_path, write_plot

    a = ctx.args
    if a.plot:
        check_plot_path(a.plot)
    if a.limit is not None and a.limit < 1:
        raise InvalidArgumentError(f"--limit must be at least 1, got {a.limit}")
    t = ctx.open(a.table)
    with ctx.progress.task(f"reading the commit log of {t.name}"):
        commits, hist = history_of(t)
    kept = set(hist.snapshots)
    shown = commits[-a.limit :] if a.limit else commits
    data = pa.table(
        {
            "version": pa.array([c.version for c in shown], pa.int64()),
            "committed_at": pa.array([c.timestamp for c in shown], pa.timestamp("ms", "UTC")),
            "operation": pa.array([c.operation for c in shown], pa.string()),
            "inserted": pa.array([c.inserted for c in shown], pa.int64()),
            "updated": pa.array([c.updated for c in shown], pa.int64()),
            "deleted": pa.array([c.deleted for c in shown], pa.int64()),
            "snapshot": pa.array(["kept" if c.version in kept else "expired" for c in shown], pa.string()),
            "in_cdf_window": pa.array([c.version > hist.oldest for c in shown], pa.bool_()),
        }
    )
    ctx.out.table(data, empty_note="no commits yet")
    if ctx.out.fmt == "table" and ctx.out.path is None and commits:
        print(f"\nCDF retention: {hist.retention}; changes are available after version {hist.oldest} (FROM >= {hist.oldest})")
    if a.plot:
        with ctx.progress.task(f"drawing {a.plot}"):
            write_plot(hist, a.plot, a.plot_scale)
        ctx.note(f"wrote {a.plot}")
    return EXIT_OK


def _limit(data: Any, limit: int | None) -> Any:
    if limit is None:
        return data
    if limit < 0:
        raise InvalidArgumentError(f"--limit must be >= 0, got {limit}")
    return data.slice(0, limit)


def cmd_scan(ctx: Context) -> int:
    a = ctx.args
    if a.limit is not None and a.limit < 0:
        raise InvalidArgumentError(f"--limit must be >= 0, got {a.limit}")
    t = ctx.open(a.table)
    order = parse_columns(a.order_by) if a.order_by else None
    with ctx.progress.task(f"scanning {t.name}" + (f" at version {a.as_of}" if a.as_of is not None else "")) as task:
        data = t.scan(a.where, columns=parse_columns(a.columns), as_of=a.as_of, with_lineage=not a.no_lineage)
        if order:
            missing = [c for c in order if c not in data.column_names]
            if missing:
                raise InvalidArgumentError(
                    f"--order-by names columns {missing} that the scan does not return ({data.column_names})"
                )
        else:  # a stable order by default: the key, else the row id
            order = [c for c in t.key if c in data.column_names] if t.key else []
            if not order or len(order) != len(t.key):
                order = ["_row_id"] if "_row_id" in data.column_names else []
        if order and data.num_rows:
            task.update(description=f"sorting {data.num_rows:,} rows")
            data = data.sort_by([(c, "ascending") for c in order])
    ctx.out.table(_limit(data, a.limit), empty_note="no rows")
    return EXIT_OK


def cmd_changes(ctx: Context) -> int:
    import cdf

    a = ctx.args
    if a.limit is not None and a.limit < 0:
        raise InvalidArgumentError(f"--limit must be >= 0, got {a.limit}")
    if a.from_version is None and a.from_timestamp is None:
        raise InvalidArgumentError("changes needs a FROM version (the range starts after it) or --from-timestamp")
    t = ctx.open(a.table)
    from_ts = parse_timestamp(a.from_timestamp, "--from-timestamp") if a.from_timestamp else None
    to_ts = parse_timestamp(a.to_timestamp, "--to-timestamp") if a.to_timestamp else None
    what = "net changes" if a.net else "changes"
    with ctx.progress.task(f"computing the {what} of {t.name}"):
        feed = cdf.changes(
            t,
            a.from_version,
            a.to_version,
            net=a.net,
            columns=parse_columns(a.columns),
            from_timestamp=from_ts,
            to_timestamp=to_ts,
        )
    ctx.out.table(_limit(feed, a.limit), empty_note="no changes in this range")
    return EXIT_OK


def cmd_deleted_rows(ctx: Context) -> int:
    import cdf

    a = ctx.args
    t = ctx.open(a.table)
    with ctx.progress.task(f"reading the rows deleted from {t.name}"):
        rows = cdf.deleted_rows(t, a.since, a.until, columns=parse_columns(a.columns))
    ctx.out.table(_limit(rows, a.limit), empty_note="no deleted rows in this range")
    return EXIT_OK


# ---------------------------------------------------------------- commands: writes


def _read_input(path: str, schema: Any, fmt: str | None) -> Any:
    import pyarrow as pa

    kind = fmt or next(
        (
            k
            for k, exts in (("parquet", (".parquet", ".pq")), ("csv", (".csv", ".tsv")), ("json", (".json", ".jsonl", ".ndjson")))
            if path.lower().endswith(exts)
        ),
        None,
    )
    if kind is None:
        raise InvalidArgumentError(f"cannot tell the format of {path!r} from its name; pass --input-format parquet|csv|json")
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"input file {path!r} does not exist")
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if kind == "csv":
            import pyarrow.csv as pacsv

            delimiter = "\t" if path.lower().endswith(".tsv") else ","
            types = {f.name: f.type for f in schema}
            return pacsv.read_csv(
                path,
                parse_options=pacsv.ParseOptions(delimiter=delimiter),
                convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
            )
        import pyarrow.json as pajson

        return pajson.read_json(
            path, parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise InvalidArgumentError(f"cannot read {path} as {kind}: {exc}") from None


def _load_inputs(ctx: Context, t: Any) -> Any:
    import pyarrow as pa

    tables = [_read_input(p, t.arrow_schema, ctx.args.input_format) for p in ctx.args.files]
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgumentError(f"the input files do not share one schema: {exc}") from None


def cmd_append(ctx: Context) -> int:
    t = ctx.open(ctx.args.table)
    data = _load_inputs(ctx, t)
    with ctx.progress.task(f"appending {data.num_rows:,} rows to {t.name}"):
        info = t.append(data)
    ctx.out.record(_commit_record(info), text=_commit_text(t.name, info))
    return EXIT_OK


def cmd_upsert(ctx: Context) -> int:
    t = ctx.open(ctx.args.table)
    data = _load_inputs(ctx, t)
    with ctx.progress.task(f"upserting {data.num_rows:,} rows into {t.name}"):
        info = t.upsert(data, skip_unchanged=ctx.args.skip_unchanged, mode=ctx.args.mode)
    ctx.out.record(_commit_record(info), text=_commit_text(t.name, info))
    return EXIT_OK


def cmd_delete(ctx: Context) -> int:
    t = ctx.open(ctx.args.table)
    with ctx.progress.task(f"deleting from {t.name}"):
        info = t.delete(ctx.args.where, mode=ctx.args.mode)
    ctx.out.record(_commit_record(info), text=_commit_text(t.name, info))
    return EXIT_OK


def cmd_update(ctx: Context) -> int:
    t = ctx.open(ctx.args.table)
    sets = parse_pairs(ctx.args.set, "--set")
    if not sets:
        raise InvalidArgumentError("update needs at least one --set COLUMN=EXPRESSION")
    with ctx.progress.task(f"updating {t.name}"):
        info = t.update(ctx.args.where, sets, mode=ctx.args.mode)
    ctx.out.record(_commit_record(info), text=_commit_text(t.name, info))
    return EXIT_OK


# ---------------------------------------------------------------- commands: maintenance


def _run_maintenance(ctx: Context, label: str, work: Callable[[Any], Any], **extra: Any) -> int:
    t = ctx.open(ctx.args.table)
    with ctx.progress.task(f"{label} {t.name}"):
        result = work(t)
    rec = _maintenance_record(t.name, result, **extra)
    if extra.get("dry_run"):
        rec["files"] = [p for p in (result.detail or "").splitlines() if p]
        rec["detail"] = f"{len(rec['files'])} file(s) would be deleted"
    ctx.out.record(rec, text=_maintenance_text(rec))
    return EXIT_OK


def cmd_compact(ctx: Context) -> int:
    a = ctx.args
    target = parse_size(a.target_file_size, "--target-file-size") if a.target_file_size else None
    minimum = parse_size(a.min_file_size, "--min-file-size") if a.min_file_size else None
    return _run_maintenance(ctx, "compacting", lambda t: t.compact(target, minimum))


def cmd_rewrite_deletes(ctx: Context) -> int:
    return _run_maintenance(ctx, "rewriting the delete files of", lambda t: t.rewrite_deletes(ctx.args.granularity))


def cmd_expire(ctx: Context) -> int:
    a = ctx.args
    older = parse_duration(a.older_than, "--older-than") if a.older_than else None
    if a.retain_last < 1:
        raise InvalidArgumentError(f"--retain-last must be at least 1, got {a.retain_last}")
    return _run_maintenance(
        ctx, "expiring snapshots of", lambda t: t.expire_snapshots(older_than=older, retain_last=a.retain_last)
    )


def cmd_vacuum(ctx: Context) -> int:
    a = ctx.args
    older = parse_duration(a.older_than, "--older-than")
    return _run_maintenance(ctx, "vacuuming", lambda t: t.vacuum(older_than=older, dry_run=a.dry_run), dry_run=a.dry_run)


def cmd_rehome(ctx: Context) -> int:
    fraction = ctx.args.max_live_fraction
    if not 0 < fraction <= 1:
        raise InvalidArgumentError(f"--max-live-fraction must be in (0, 1], got {fraction}")
    return _run_maintenance(ctx, "re-homing pinned files of", lambda t: t.rehome(fraction))


def cmd_purge(ctx: Context) -> int:
    a = ctx.args
    if not a.where.strip():
        raise InvalidArgumentError("purge needs a non-empty --where")
    if sys.stdin.isatty() and not a.yes:
        t = ctx.open(a.table)
        n = t.scan(a.where, columns=["_row_id"]).num_rows
        answer = input(
            f"Erase {n:,} live row(s) of {t.name} matching {a.where!r} and every earlier image of them, for good? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            ctx.note("purge cancelled; nothing was changed")
            return EXIT_FAILURE
    return _run_maintenance(ctx, "purging rows of", lambda t: t.purge(a.where))


def cmd_verify(ctx: Context) -> int:
    from lineage.maintenance import verify

    t = ctx.open(ctx.args.table)
    with ctx.progress.task(f"verifying {t.name}"):
        report = verify(t, check_row_ids=not ctx.args.skip_row_ids)
    checked = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in report.checked.items())
    rec = {"table": t.name, "ok": report.ok, "problems": list(report.problems), "checked": dict(report.checked)}
    if report.ok:
        text = f"OK: {t.name} is consistent (checked {checked or 'an empty table'})\n"
    else:
        text = f"FAILED: {t.name} has {len(report.problems)} problem(s):\n" + "".join(f"  - {p}\n" for p in report.problems)
        if checked:
            text += f"(checked {checked})\n"
    ctx.out.record(rec, text=text)
    if not report.ok:
        raise VerifyFailed(f"verify found {len(report.problems)} problem(s) in {t.name}")
    return EXIT_OK


# ---------------------------------------------------------------- commands: materialized views


def _mv_module() -> Any:
    try:
        import cdf.mv as mv
    except ImportError as exc:  # pragma: no cover - the views are still being built
        raise LineageError(f"materialized views are not available in this installation: {exc}") from None
    return mv


def _source_from_query(query: str) -> str | None:
    """The table a view query reads, if its FROM names one with a namespace (``FROM shop.orders``)."""
    try:
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(query, read="duckdb")
        from_ = tree.args.get("from_") or tree.args.get("from")
        table = from_.this if from_ is not None else None
        if isinstance(table, exp.Table) and table.args.get("db") is not None:
            return f"{table.args['db'].name}.{table.name}"
    except Exception:
        return None
    return None


def cmd_mv_create(ctx: Context) -> int:
    mv = _mv_module()
    a = ctx.args
    source_name = a.source or _source_from_query(a.query)
    if not source_name:
        raise InvalidArgumentError("pass --source TABLE (the view query's FROM does not name a namespace.table)")
    source = ctx.open(source_name)
    view = mv.create(a.view, source, a.query, catalog=ctx.catalog())
    rec: dict[str, Any] = {
        "view": view.name,
        "source": source.name,
        "shape": view.shape,
        "columns": view.columns,
        "query": view.query,
    }
    text = f"created view {view.name} ({view.shape} over {source.name}): columns {', '.join(view.columns)}\n"
    if a.refresh:
        with ctx.progress.task(f"refreshing {view.name}"):
            result = view.refresh()
        rec["refresh"] = result.to_json()
        text += str(result) + "\n"
    else:
        text += f"fill it with: lineage mv refresh {view.name}\n"
    ctx.out.record(rec, text=text)
    return EXIT_OK


def _view_names(ctx: Context) -> list[str]:
    names = []
    for ident, ice in _iter_tables(ctx, None):
        if "mv.definition" in ice.metadata.properties:
            names.append(".".join(ident))
    return names


def cmd_mv_refresh(ctx: Context) -> int:
    import pyarrow as pa

    mv = _mv_module()
    a = ctx.args
    if a.all and a.views:
        raise InvalidArgumentError("pass view names or --all, not both")
    names = _view_names(ctx) if a.all else list(a.views)
    if not names:
        if a.all:
            ctx.note("no materialized views in this catalog")
            return EXIT_OK
        raise InvalidArgumentError("name the view(s) to refresh, or pass --all")
    spark = None
    if a.engine == "spark":
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(f"{PROG} mv refresh").getOrCreate()
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    failures = []
    with ctx.progress.task("refreshing views", total=len(names)) as task:
        for name in names:
            task.update(description=f"refreshing {name}")
            try:
                r = mv.refresh(name, catalog=ctx.catalog(), engine=a.engine, full=a.full, spark=spark)
                results.append(r.to_json())
                texts.append(str(r))
            except LineageError as exc:
                if len(names) == 1:
                    raise
                failures.append((name, exc))
                results.append({"view": name, "status": "failed", "reason": str(exc)})
                texts.append(f"{name}: failed: {exc}")
            task.advance()
    for r in results:
        if isinstance(r.get("seconds"), float):
            r["seconds"] = round(r["seconds"], 3)
    if ctx.out.fmt == "table":
        lines = [text for text in texts if text]
        ctx.out.record({"results": results}, text="".join(line + "\n" for line in lines))
    else:
        ctx.out.table(pa.Table.from_pylist(results))
    for name, exc in failures:
        print(f"{PROG}: error: refreshing {name} failed: {exc}", file=sys.stderr)
    return EXIT_FAILURE if failures else EXIT_OK


def cmd_mv_list(ctx: Context) -> int:
    import pyarrow as pa

    mv = _mv_module()
    rows = []
    sources: dict[str, int | None] = {}
    for ident, ice in _iter_tables(ctx, ctx.args.namespace):
        props = ice.metadata.properties
        if "mv.definition" not in props:
            continue
        name = ".".join(ident)
        source = props.get("mv.source")
        try:
            checkpoint = mv.open_view(name, catalog=ctx.catalog()).checkpoint
        except LineageError as exc:
            log.warning("cannot read the checkpoint of %s: %s", name, exc)
            checkpoint = None
        if source not in sources:
            try:
                sources[source] = ctx.open(source).version
            except LineageError:
                sources[source] = None
        current = sources[source]
        snap = ice.metadata.current_snapshot()
        rows.append(
            {
                "view": name,
                "shape": props.get("mv.shape"),
                "source": source,
                "reflects_version": checkpoint,
                "source_version": current,
                "behind": None if checkpoint is None or current is None else current - checkpoint,
                "view_version": snap.sequence_number if snap else 0,
                "query": props.get("mv.query"),
            }
        )
    schema = pa.schema(
        [
            ("view", pa.string()),
            ("shape", pa.string()),
            ("source", pa.string()),
            ("reflects_version", pa.int64()),
            ("source_version", pa.int64()),
            ("behind", pa.int64()),
            ("view_version", pa.int64()),
            ("query", pa.string()),
        ]
    )
    ctx.out.table(pa.Table.from_pylist(rows, schema=schema), empty_note="no materialized views")
    return EXIT_OK


# ---------------------------------------------------------------- demo


def cmd_demo(ctx: Context) -> int:
    from lineage import demo

    argv = ["--rows", str(ctx.args.rows)] if ctx.args.rows is not None else []
    code = demo.main(argv)
    t = None
    try:
        import lineage

        t = lineage.open_table(demo.TABLE, warehouse=demo.WAREHOUSE)
    except LineageError:
        return code
    print()
    print(f"lineage --warehouse {demo.WAREHOUSE} info {demo.TABLE}   (the same table through the CLI)")
    print("".join("  " + line + "\n" for line in info_text(table_info(t, ctx.progress)).splitlines()), end="")
    v = t.version
    print()
    print("More to try:")
    for cmd in (
        f"log {demo.TABLE} --plot history.html",
        f"changes {demo.TABLE} {max(0, v - 2)} {v} --limit 10",
        f"deleted-rows {demo.TABLE} --limit 10",
        f"compact {demo.TABLE}",
        f"verify {demo.TABLE}",
    ):
        print(f"  lineage --warehouse {demo.WAREHOUSE} {cmd}")
    return code


# ---------------------------------------------------------------- parser


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
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_package_version()}")
    _add_globals(parser, sub=False)
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def sub(name: str, func: Callable[[Context], int], help: str, parent: Any = subs) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help, description=help)
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
    p.add_argument(
        "--partition-by",
        action="append",
        metavar="TRANSFORM",
        help="partition transform, repeatable or comma separated: region, day(ts), bucket(16, id), truncate(4, name)",
    )
    p.add_argument("--property", action="append", metavar="KEY=VALUE", help="table property, repeatable")

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

    p = sub("rewrite-deletes", cmd_rewrite_deletes, "merge position delete files (one per data file or partition)")
    table_arg(p)
    p.add_argument("--granularity", choices=("file", "partition"), help="default: write.delete.granularity")

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

    p = sub("purge", cmd_purge, "erase rows for good, with every earlier image of them (GDPR)")
    table_arg(p)
    p.add_argument("--where", required=True, metavar="SQL", help="the live rows to erase")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation on a terminal")

    p = sub("verify", cmd_verify, "check that lineage, the deleted-rows index and the snapshot agree and every file exists")
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


# ---------------------------------------------------------------- main


def _configure_logging(debug: bool, quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.ERROR if quiet else logging.WARNING)
    for name in ("lineage", "cdf", "index"):
        logging.getLogger(name).setLevel(logging.DEBUG if debug else (logging.ERROR if quiet else logging.WARNING))


def first_line(text: object) -> str:
    """The first non-empty line of a message (DuckDB appends multi-line context)."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0].rstrip() if lines else str(text)


def _error(text: str, debug: bool = False, hint: str = "") -> None:
    """One short line on stderr (the full message with --debug)."""
    print(f"{PROG}: error: {text if debug else first_line(text)}{hint}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lineage`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad usage
    debug = bool(getattr(args, "debug", False))
    _configure_logging(debug, bool(args.quiet))
    started = time.perf_counter()
    try:
        progress = Progress(progress_enabled(bool(args.quiet)) and args.command != "demo")
        ctx = Context(args, Output(args.format, args.output, progress), progress)
        code = args.func(ctx)
        log.debug("%s took %.2fs", args.command, time.perf_counter() - started)
        return code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `lineage scan t | head`): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return EXIT_FAILURE
    except InvalidArgumentError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc), debug)
        return EXIT_USAGE
    except LineageError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc), debug)
        return EXIT_FAILURE
    except Exception as exc:
        if debug:
            traceback.print_exc()
        _error(f"{type(exc).__name__}: {exc}", debug, "" if debug else " (run with --debug for the traceback)")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
