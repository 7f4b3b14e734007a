"""``lineage compact``, ``upgrade``, ``rewrite-deletes``, ``convert-deletes``, ``rewrite-manifests``, ``expire``, ``vacuum``, ``rehome``, ``reindex``,
``purge``, ``maintain`` and ``verify``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from lineage.cli.context import EXIT_FAILURE, EXIT_OK, Context, VerifyFailed
from lineage.cli.format import human_bytes
from lineage.cli.option_values import parse_duration, parse_size
from lineage.errors import InvalidArgumentError


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


def cmd_upgrade(ctx: Context) -> int:
    """``lineage upgrade TABLE --format-version 3``: make a v2 table an Iceberg v3 table keeping every row id."""
    return _run_maintenance(ctx, "upgrading", lambda t: t.upgrade(ctx.args.format_version))


def cmd_rewrite_deletes(ctx: Context) -> int:
    return _run_maintenance(ctx, "rewriting the delete files of", lambda t: t.rewrite_deletes(ctx.args.granularity))


def cmd_convert_deletes(ctx: Context) -> int:
    return _run_maintenance(ctx, "converting the equality deletes of", lambda t: t.convert_equality_deletes())


def cmd_rewrite_manifests(ctx: Context) -> int:
    a = ctx.args
    return _run_maintenance(ctx, "rewriting the manifests of", lambda t: t.rewrite_manifests(dry_run=a.dry_run))


def cmd_maintain(ctx: Context) -> int:
    a = ctx.args
    t = ctx.open(a.table)
    with ctx.progress.task(f"maintaining {t.name}"):
        report = t.maintain(dry_run=a.dry_run)
    rec = {
        "table": t.name,
        "dry_run": report.dry_run,
        "committed": report.committed,
        "steps": [{"step": s.name, "status": s.status, "detail": s.detail} for s in report.steps],
    }
    ctx.out.record(rec, text=str(report) + "\n")
    return EXIT_OK


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


def cmd_reindex(ctx: Context) -> int:
    if ctx.args.merge:
        return _run_maintenance(ctx, "merging the key index of", lambda t: t.merge_key_index(full=ctx.args.full))
    if ctx.args.full:
        raise InvalidArgumentError("--full goes with --merge (a rebuild always writes one segment)")
    return _run_maintenance(ctx, "rebuilding the key index of", lambda t: t.reindex())


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


def cmd_reconcile(ctx: Context) -> int:
    t = ctx.open(ctx.args.table)
    with ctx.progress.task(f"reconciling foreign commits of {t.name}"):
        versions = t.reconcile()
    text = (
        f"{t.name}: lineage of {len(versions)} foreign commit(s) derived and stored (versions {', '.join(map(str, versions))})\n"
        if versions
        else f"{t.name}: no foreign commits on the main branch\n"
    )
    ctx.out.record({"table": t.name, "foreign_versions": versions}, text=text)
    return EXIT_OK


def cmd_verify(ctx: Context) -> int:
    from lineage.maintenance import verify

    t = ctx.open(ctx.args.table)
    with ctx.progress.task(f"verifying {t.name}"):
        report = verify(t, check_row_ids=not ctx.args.skip_row_ids)
    checked = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in report.checked.items())
    rec = {"table": t.name, "ok": report.ok, "problems": list(report.problems), "checked": dict(report.checked), "notes": list(report.notes)}
    if report.ok:
        text = f"OK: {t.name} is consistent (checked {checked or 'an empty table'})\n"
    else:
        text = f"FAILED: {t.name} has {len(report.problems)} problem(s):\n" + "".join(f"  - {p}\n" for p in report.problems)
        if checked:
            text += f"(checked {checked})\n"
    text += "".join(f"note: {n}\n" for n in report.notes)
    ctx.out.record(rec, text=text)
    if not report.ok:
        raise VerifyFailed(f"verify found {len(report.problems)} problem(s) in {t.name}")
    return EXIT_OK
