"""``lineage append``, ``upsert``, ``apply-changelog``, ``delete`` and ``update``: writes from the command line, and reading their input files."""

from __future__ import annotations

import os
from typing import Any

from lineage.cli.context import EXIT_OK, Context
from lineage.cli.format import human_bytes
from lineage.cli.option_values import parse_columns, parse_pairs
from lineage.errors import InvalidArgumentError


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


def _load_inputs(ctx: Context, t: Any, schema: Any = None) -> Any:
    import pyarrow as pa

    tables = [_read_input(p, t.arrow_schema if schema is None else schema, ctx.args.input_format) for p in ctx.args.files]
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


def cmd_apply_changelog(ctx: Context) -> int:
    import pyarrow as pa

    t = ctx.open(ctx.args.table)
    a = ctx.args
    # the operation column is read as text whatever the file format
    data = _load_inputs(ctx, t, pa.schema(list(t.arrow_schema) + [pa.field(a.op_column, pa.string())]))
    with ctx.progress.task(f"applying {data.num_rows:,} change events to {t.name}"):
        info = t.apply_changelog(data, op_column=a.op_column, upsert=a.upsert, order_by=parse_columns(a.order_by), mode=a.mode)
    text = _commit_text(t.name, info) if info.committed else f"{t.name}: the events change nothing; no commit (version stays {info.version})\n"
    if info.ignored:
        text += f"{info.ignored:,} event(s) ignored (-U/-D of keys that were not live)\n"
    ctx.out.record({**_commit_record(info), "ignored": info.ignored}, text=text)
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
