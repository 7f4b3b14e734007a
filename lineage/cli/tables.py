"""``lineage create``, ``info``, ``tables``, ``log`` and ``demo``: what a table is and what happened to it."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from typing import Any

from lineage.cli.context import EXIT_OK, Context, first_line, iter_tables
from lineage.cli.format import Progress, human_bytes, render_record
from lineage.cli.option_values import parse_columns, parse_pairs, parse_schema, split_top_level
from lineage.errors import InvalidArgumentError, LineageError
from lineage.properties import LINEAGE_ENABLED, MV_DEFINITION, MV_QUERY, MV_SHAPE, MV_SOURCE, RETENTION_DAYS, RETENTION_VERSIONS


def type_name(t: Any) -> str:
    """Arrow type as a person writes it (``string``, not ``large_string``)."""
    return str(t).replace("large_string", "string").replace("large_binary", "binary").replace("large_list", "list")


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


def _columns_text(columns: list[dict[str, Any]], key: list[str]) -> str:
    return ", ".join(
        f"{c['name']} {c['type']}{' (key)' if c['name'] in key else (' not null' if not c['nullable'] else '')}" for c in columns
    )


def _size_of(io: Any, path: str) -> int:
    try:
        return len(io.new_input(path))
    except Exception:
        return 0


def _dir_bytes(folders: list[str], keep: Callable[[str], bool] = lambda name: True) -> tuple[int, int]:
    """Number and bytes of the files under ``folders`` whose names ``keep`` accepts."""
    import lineage.storage.files as store

    n = total = 0
    for folder in folders:
        for found in store.list_files(folder):  # through the store: an object store has no folders to walk
            if keep(found.location.rsplit("/", 1)[-1]):
                total += found.size
                n += 1
    return n, total


def _pinned_bytes(paths: list[str]) -> int:
    import lineage.storage.files as store

    total = 0
    for p in paths:
        try:
            total += store.info(p).size
        except FileNotFoundError:
            pass
    return total


def _is_key_segment(name: str) -> bool:
    return name.endswith(("-keys.kix", "-keys.arrow"))  # the packed format; the Arrow files of earlier releases


def _key_records(io: Any, paths: tuple[str, ...]) -> int | None:
    """Records (entries and tombstones) in the key index segments; None when one cannot be read."""
    from index.key_segment import read_key_segment

    try:
        return sum(read_key_segment(io, p).entries for p in paths)
    except Exception:  # a damaged index still gets an info page (verify reports it)
        return None


def cmd_create(ctx: Context) -> int:
    import lineage

    a = ctx.args
    schema = parse_schema(a.schema)
    key = parse_columns(a.key) if a.key else None
    partition_by = [p for spec in a.partition_by or [] for p in split_top_level(spec)]
    props = parse_pairs(a.property, "--property")
    t = lineage.create_table(
        a.table, schema, key=key, partition_by=partition_by or None, catalog=ctx.catalog(create=True), properties=props,
        format_version=a.format_version,
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
        "format_version": t.iceberg.metadata.format_version,
    }
    text = f"created {t.name} at {rec['location']}\n" + render_record(
        {
            "columns": _columns_text(rec["columns"], t.key),
            "partitioned by": ", ".join(rec["partition_by"]) or "unpartitioned",
            **({"format version": str(rec["format_version"])} if rec["format_version"] != 2 else {}),
            "properties": ", ".join(f"{k}={v}" for k, v in props.items()) or "-",
        },
        indent=2,
    )
    ctx.out.record(rec, text=text)
    return EXIT_OK


def cmd_adopt(ctx: Context) -> int:
    import lineage

    a = ctx.args
    key = parse_columns(a.key) if a.key else None
    with ctx.progress.task(f"adopting {a.table}"):
        done = lineage.adopt(a.table, key=key, catalog=ctx.catalog())
    rec = {
        "table": done.table.name,
        "version": done.version,
        "snapshot_id": done.snapshot_id,
        "data_files": done.data_files,
        "rows": done.rows,
        "key": list(done.key),
        "converted_equality_deletes": done.converted,
    }
    converted = f"; {done.converted} equality delete file(s) converted first" if done.converted else ""
    text = (
        f"adopted {rec['table']} at version {done.version}: {done.rows} row id(s) over {done.data_files} data file(s), "
        f"key {', '.join(done.key) or '(none)'}{converted}; the change feed starts at version {done.version}\n"
    )
    ctx.out.record(rec, text=text)
    return EXIT_OK


def table_info(t: Any, progress: Progress) -> dict[str, Any]:
    """Everything ``lineage info`` reports about a table, as a JSON-able dict."""
    from cdf.retention import PROP_RETENTION_DAYS, PROP_RETENTION_VERSIONS, window
    from lineage.storage.fileio import local_path
    from lineage.maintenance.vacuum import pinned_files
    from lineage.storage.metadata import SUMMARY_LIST, index_dir, is_inline_segment, lineage_dir
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
        # Snapshots from before an adoption have no lineage: scan --as-of starts at the adoption version.
        snapshots = [s.sequence_number for s in main_branch_snapshots(ice) if s.sequence_number >= (lst.adopted or 0)]
        root = local_path(ice.metadata.location)
        # Current folders, and those of tables written by earlier releases.
        lineage_disk = _dir_bytes([lineage_dir(root), os.path.join(root, "metadata", "lineage")])
        index_folders = [index_dir(root), os.path.join(root, "metadata", "index")]
        index_disk = _dir_bytes(index_folders, lambda name: not _is_key_segment(name))
        key_disk = _dir_bytes(index_folders, _is_key_segment)

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
            # a segment inside a list (format 4) is part of that list: the bytes the list records for it
            "segment_bytes": sum(lst.segment_bytes.get(s, 0) if is_inline_segment(s) else _size_of(io, s) for s in lst.segments),
            "list_bytes": _size_of(io, list_path) if list_path else 0,
            "next_row_id": lst.next_row_id,
            "files_on_disk": lineage_disk[0],
            "bytes_on_disk": lineage_disk[1],
        },
        "index": {
            "segments_in_window": len(in_window),
            "segment_bytes_in_window": sum(_size_of(io, p) for p in in_window),
            "pinned_files": len(pinned_only),
            "pinned_bytes": _pinned_bytes(pinned_only),
            "files_on_disk": index_disk[0],
            "bytes_on_disk": index_disk[1],
        },
        "key_index": None if lst.key_index is None else {
            "segments": len(lst.key_index),
            "segment_bytes": (key_bytes := sum(_size_of(io, p) for p in lst.key_index)),
            "records": _key_records(io, lst.key_index),
            "bytes_per_key": round(key_bytes / rows, 1) if rows else None,
            "files_on_disk": key_disk[0],
            "bytes_on_disk": key_disk[1],
        },
        "retention": {
            "versions": props.get(PROP_RETENTION_VERSIONS),
            "days": props.get(PROP_RETENTION_DAYS),
            "oldest_cdf_version": win.oldest,
        },
        "properties": {k: v for k, v in sorted(props.items()) if k not in (MV_DEFINITION,)},
    }
    if rows_error:
        rec["rows_error"] = rows_error
    if MV_DEFINITION in props:
        rec["materialized_view"] = {
            "source": props.get(MV_SOURCE),
            "shape": props.get(MV_SHAPE),
            "query": props.get(MV_QUERY),
        }
        try:
            from cdf.mv import open_view

            rec["materialized_view"]["checkpoint"] = open_view(t.name, catalog=t.catalog).checkpoint
        except Exception as exc:
            rec["materialized_view"]["checkpoint_error"] = str(exc)
    return rec


def info_text(rec: dict[str, Any]) -> str:
    """``lineage info`` for a person."""
    cols = _columns_text(rec["columns"], rec["key"])
    d, x, li, ix, r, s = rec["data_files"], rec["delete_files"], rec["lineage"], rec["index"], rec["retention"], rec["snapshots"]
    rows = f"{rec['rows']:,}" if rec["rows"] is not None else f"unavailable ({rec.get('rows_error')})"
    retention = _retention_text(
        {k: v for k, v in ((RETENTION_VERSIONS, r["versions"]), (RETENTION_DAYS, r["days"])) if v}
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
        *(
            [("key index", f"{ki['segments']} segment(s), {human_bytes(ki['segment_bytes'])}"
                           + (f" ({ki['bytes_per_key']} bytes per live key)" if ki["bytes_per_key"] is not None else "")
                           + f"; on disk {ki['files_on_disk']} file(s), "
                           f"{human_bytes(ki['bytes_on_disk'])}")]
            if (ki := rec["key_index"]) is not None else []
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
        reflects = f"reflects source version {'-' if cp is None else cp}"
        if mv.get("checkpoint_error"):
            reflects = f"cannot be opened: {first_line(mv['checkpoint_error'])}"
        lines.append(("materialized view", f"{mv['shape']} over {mv['source']}, {reflects}"))
        lines.append(("view query", mv["query"]))
    write_props = {
        k: v for k, v in rec["properties"].items() if k.startswith(("write.", "commit.", "lineage.")) and k != LINEAGE_ENABLED
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
    plain = []
    for ident, ice in iter_tables(ctx, ctx.args.namespace):
        props = ice.metadata.properties
        if props.get(LINEAGE_ENABLED) != "true":
            plain.append(".".join(ident))
            continue
        snap = ice.metadata.current_snapshot()
        summary = snap.summary.additional_properties if snap and snap.summary else {}
        rows.append(
            {
                "table": ".".join(ident),
                "kind": "view" if MV_DEFINITION in props else "table",
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
    if plain:
        shown = ", ".join(plain[:5]) + (f" and {len(plain) - 5} more" if len(plain) > 5 else "")
        ctx.skip(f"{len(plain)} Iceberg table(s) without lineage", f"not listed (adopt them to list them): {shown}", error=False)
    return EXIT_OK


def history_of(t: Any) -> tuple[Any, Any]:
    """(commits, report.History) of a table."""
    from cdf.retention import window
    from lineage.cli.report import Commit, History
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
            c.foreign,
            c.gap,
        )
        for c in state.lineage.commits
    ]
    snapshots = [s.sequence_number for s in main_branch_snapshots(t.iceberg)]
    return commits, History(t.name, commits, win.oldest, state.version, snapshots, _retention_text(t.properties))


def cmd_log(ctx: Context) -> int:
    import pyarrow as pa

    from lineage.cli.report import check_plot_path, write_plot

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
            # who committed it: this library, or the engine of a reconciled foreign commit (spark, flink, unknown)
            "writer": pa.array([c.foreign or "lineage" for c in shown], pa.string()),
            "gap": pa.array([c.gap for c in shown], pa.bool_()),  # expired foreign snapshots folded into this version
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


def cmd_demo(ctx: Context) -> int:
    import lineage.cli.demo as demo

    argv = ["--rows", str(ctx.args.rows)] if ctx.args.rows is not None else []
    own = bool(ctx.args.catalog or ctx.args.catalog_uri)  # else the embedded catalog in ./demo-warehouse
    catalog = ctx.catalog(create=True) if own else None
    code = demo.main(argv, catalog=catalog)
    t = None
    try:
        import lineage

        t = lineage.open_table(demo.TABLE, **({"catalog": catalog} if own else {"warehouse": demo.WAREHOUSE}))
    except LineageError:
        return code
    where = demo_options(ctx) if own else f"--warehouse {demo.WAREHOUSE}"
    print()
    print(f"lineage {where} info {demo.TABLE}   (the same table through the CLI)")
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
        print(f"  lineage {where} {cmd}")
    return code


def demo_options(ctx: Context) -> str:
    """The catalog options the demo ran with, as a user would type them again (values of secret-looking keys hidden)."""
    parts = [f"--warehouse {ctx.args.warehouse}"] if ctx.args.warehouse else []
    if ctx.args.catalog_uri:
        parts.append(f"--catalog-uri {ctx.args.catalog_uri}")
    for entry in ctx.args.catalog or []:
        key = entry.split("=", 1)[0]
        secret = any(word in key.lower() for word in ("secret", "password", "token", "credential"))
        parts.append(f"--catalog {key}=..." if secret and "=" in entry else f"--catalog {entry}")
    return " ".join(parts)
