"""``lineage scan``, ``changes`` and ``deleted-rows``: reading rows and the change feed."""

from __future__ import annotations

from typing import Any

from lineage.cli.context import EXIT_OK, Context
from lineage.cli.option_values import parse_columns, parse_timestamp
from lineage.errors import InvalidArgumentError


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
    if a.follow:
        return _follow(ctx, t, from_ts)
    what = "net changes" if a.net else "changes"
    args = dict(net=a.net, columns=parse_columns(a.columns), from_timestamp=from_ts, to_timestamp=to_ts)
    if a.limit is None:  # the whole feed: written batch by batch, so memory holds one batch, whatever the range
        with ctx.progress.task(f"planning the {what} of {t.name}"):
            reader = cdf.change_batches(t, a.from_version, a.to_version, **args)
        ctx.out.stream(reader, empty_note="no changes in this range")
        return EXIT_OK
    with ctx.progress.task(f"computing the {what} of {t.name}"):
        feed = cdf.changes(t, a.from_version, a.to_version, **args)
    ctx.out.table(_limit(feed, a.limit), empty_note="no changes in this range")
    return EXIT_OK


def _follow(ctx: Context, t: Any, from_ts: object) -> int:
    """``changes --follow``: each new range's changes as JSON lines, flushed once the range is written, until TO or Ctrl-C."""
    import cdf

    a = ctx.args
    refused = [opt for opt, given in (("--net", a.net), ("--limit", a.limit is not None), ("--to-timestamp", a.to_timestamp))
               if given]
    if refused:
        raise InvalidArgumentError(f"--follow reads the per-version feed as it grows: it takes no {', '.join(refused)}")
    if ctx.out.fmt not in ("table", "json"):
        raise InvalidArgumentError(f"--follow writes JSON lines, one change per line: --format {ctx.out.fmt} cannot be followed")
    ranges = cdf.follow(t, a.from_version, a.to_version, from_timestamp=from_ts, columns=parse_columns(a.columns),
                        poll_interval=a.poll_interval)
    ctx.out.json_lines(r.changes for r in ranges)
    return EXIT_OK


def cmd_deleted_rows(ctx: Context) -> int:
    import cdf

    a = ctx.args
    t = ctx.open(a.table)
    with ctx.progress.task(f"reading the rows deleted from {t.name}"):
        rows = cdf.deleted_rows(t, a.since, a.until, columns=parse_columns(a.columns))
    ctx.out.table(_limit(rows, a.limit), empty_note="no deleted rows in this range")
    return EXIT_OK
