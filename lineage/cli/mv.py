"""``lineage mv create``, ``mv refresh`` and ``mv list``: materialized views (see :mod:`cdf.mv`)."""

from __future__ import annotations

import sys
from typing import Any

from lineage.cli.context import EXIT_FAILURE, EXIT_OK, PROG, Context, first_line, iter_tables, log
from lineage.errors import InvalidArgumentError, LineageError
from lineage.properties import MV_DEFINITION, MV_QUERY, MV_SHAPE, MV_SOURCE


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
    for ident, ice in iter_tables(ctx, None):
        if MV_DEFINITION in ice.metadata.properties:
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
            ctx.note("no materialized views found" + (" (some tables could not be read)" if ctx.skipped else " in this catalog"))
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
            except Exception as exc:  # one view's failure, expected or not, must not stop the others
                if len(names) == 1:
                    raise
                log.debug("refreshing %s failed", name, exc_info=True)
                why = str(exc) if isinstance(exc, LineageError) else f"{type(exc).__name__}: {exc}"
                failures.append((name, why))
                results.append({"view": name, "status": "failed", "reason": why})
                texts.append(f"{name}: failed: {first_line(why)}")
            task.advance()
    for r in results:
        if isinstance(r.get("seconds"), float):
            r["seconds"] = round(r["seconds"], 3)
    if ctx.out.fmt == "table":
        lines = [text for text in texts if text]
        ctx.out.record({"results": results}, text="".join(line + "\n" for line in lines))
    else:
        ctx.out.table(pa.Table.from_pylist(results))
    for name, why in failures:
        print(f"{PROG}: error: refreshing {name} failed: {first_line(why)}", file=sys.stderr)
    return EXIT_FAILURE if failures else EXIT_OK


def cmd_mv_list(ctx: Context) -> int:
    import pyarrow as pa

    mv = _mv_module()
    rows = []
    sources: dict[str, int | None] = {}
    for ident, ice in iter_tables(ctx, ctx.args.namespace):
        props = ice.metadata.properties
        if MV_DEFINITION not in props:
            continue
        name = ".".join(ident)
        source = props.get(MV_SOURCE)
        try:
            checkpoint = mv.open_view(name, catalog=ctx.catalog()).checkpoint
        except LineageError as exc:
            ctx.skip(f"view {name}", f"listed without the version it reflects: {exc}")
            checkpoint = None
        if source not in sources:
            try:
                sources[source] = ctx.open(source).version
            except LineageError as exc:
                sources[source] = None
                ctx.skip(f"source table {source}", f"its version is not listed: {exc}")
        current = sources[source]
        snap = ice.metadata.current_snapshot()
        rows.append(
            {
                "view": name,
                "shape": props.get(MV_SHAPE),
                "source": source,
                "reflects_version": checkpoint,
                "source_version": current,
                "behind": None if checkpoint is None or current is None else current - checkpoint,
                "view_version": snap.sequence_number if snap else 0,
                "query": props.get(MV_QUERY),
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
