"""The ``lineage`` CLI, run as a subprocess on real tables: output, files written and exit codes.

Each subprocess costs about a second (imports), so assertions are grouped and
independent read-only commands run a few at a time.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lineage

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LINEAGE_WAREHOUSE", "LINEAGE_PROGRESS")}
    env.update(extra or {})
    return env


def run(
    *args: str, cwd: str | Path | None = None, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """``python -m lineage.cli ARGS`` with captured output (stdin is not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "lineage.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(env),
        input=stdin if stdin is not None else "",
        timeout=300,
    )


def run_many(*commands: tuple[str, ...], **kwargs) -> list[subprocess.CompletedProcess]:  # type: ignore[no-untyped-def]
    """Run independent commands concurrently (results in order)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda c: run(*c, **kwargs), commands))


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def fails(p: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """Exit code ``code``, one short error line on stderr naming ``needles``, and no traceback."""
    assert p.returncode == code, f"exit {p.returncode} (wanted {code})\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    assert "error:" in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, f"{n!r} not in stderr:\n{p.stderr}"


@pytest.fixture(scope="module")
def wh(tmp_path_factory) -> str:
    """A warehouse with shop.orders (4 row-changing commits) and shop.kept (retention of 1 version)."""
    root = str(tmp_path_factory.mktemp("cli") / "wh")
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], partition_by=["bucket(4, id)"], warehouse=root)
    t.append(pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "cy"], "amount": [10.0, 20.0, 30.0]}))  # v1
    t.update("name = 'bob'", {"amount": "amount * 2"})  # v2
    t.delete("id = 3")  # v3
    t.upsert(pa.table({"id": [1, 4], "name": ["ann", "dee"], "amount": [11.0, 40.0]}))  # v4
    k = lineage.create_table("shop.kept", SCHEMA, key=["id"], warehouse=root, properties={"lineage.cdf.retention.versions": "1"})
    k.append(pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1.0, 2.0]}))
    k.delete("id = 1")
    k.append(pa.table({"id": [3], "name": ["c"], "amount": [3.0]}))
    return root


def table_lines(stdout: str) -> list[list[str]]:
    """Rows of the aligned table format, split on runs of spaces (header first, dashes dropped)."""
    lines = [line for line in stdout.splitlines() if line.strip() and not set(line) <= {"-", " "}]
    return [line.split() for line in lines]


# ---------------------------------------------------------------- usage


def test_script_help_and_usage_errors(wh, tmp_path):
    script = Path(sys.executable).parent / "lineage"
    assert script.exists(), "the lineage console script is not installed (pip install -e .)"
    installed = subprocess.run(
        [str(script), "--warehouse", wh, "--format", "json", "tables"], capture_output=True, text=True, env=_env()
    )
    ok(installed)
    assert {r["table"] for r in json.loads(installed.stdout)} == {"shop.orders", "shop.kept"}

    (help_, version, no_cmd, no_table, bad_fmt, bad_cmd, parquet, bad_version, no_wh) = run_many(
        ("--help",),
        ("--version",),
        (),
        ("--warehouse", wh, "scan"),
        ("--warehouse", wh, "--format", "xml", "info", "shop.orders"),
        ("--warehouse", wh, "frobnicate"),
        ("--warehouse", wh, "--format", "parquet", "scan", "shop.orders"),
        ("--warehouse", wh, "changes", "shop.orders", "abc"),
        ("--warehouse", str(tmp_path / "nowhere"), "info", "shop.orders"),
    )
    ok(help_)
    for cmd in (
        "create",
        "info",
        "log",
        "scan",
        "changes",
        "deleted-rows",
        "compact",
        "upgrade",
        "rewrite-deletes",
        "expire",
        "vacuum",
        "rehome",
        "purge",
        "verify",
        "mv",
        "demo",
    ):
        assert f"\n    {cmd} " in help_.stdout, cmd
    assert "--warehouse" in help_.stdout and "--catalog" in help_.stdout and "--format" in help_.stdout
    assert ok(version).stdout.startswith("lineage ")
    for p in (no_cmd, no_table, bad_fmt, bad_cmd):
        assert p.returncode == 2 and "usage:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "required: TABLE" in no_table.stderr
    assert "invalid choice: 'xml'" in bad_fmt.stderr
    fails(parquet, 2, "--output")
    fails(bad_version, 2, "must be a version number")
    fails(no_wh, 1, "no warehouse at")
    assert not (tmp_path / "nowhere").exists(), "a read command must not create a warehouse"


# ---------------------------------------------------------------- tables


def test_create_info_and_tables(tmp_path):
    wh = str(tmp_path / "wh")
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(
        json.dumps(
            {"fields": [{"name": "k", "type": "int64", "nullable": False}, {"name": "ts", "type": "timestamp[us, tz=UTC]"}]}
        )
    )
    created = ok(
        run(
            "--warehouse",
            wh,
            "create",
            "sales.orders",
            "--schema",
            "id:int64,region:string,price:decimal(10,2),at:timestamp[us]",
            "--key",
            "id",
            "--partition-by",
            "region",
            "--partition-by",
            "day(at)",
            "--property",
            "lineage.cdf.retention.versions=5",
            "--property",
            "write.update.mode=copy-on-write",
        )
    )
    assert "created sales.orders" in created.stdout
    assert "id int64 (key), region string, price decimal128(10, 2), at timestamp[us]" in created.stdout
    assert "region, day(at)" in created.stdout

    from_file, dup, bad_type, bad_prop, bad_key, info, info_json, tables = run_many(
        ("--warehouse", wh, "-f", "json", "create", "sales.events", "--schema", str(schema_file), "--key", "k", "--format-version", "3"),
        ("--warehouse", wh, "create", "sales.orders", "--schema", "id:int64"),
        ("--warehouse", wh, "create", "sales.x", "--schema", "id:int99"),
        ("--warehouse", wh, "create", "sales.y", "--schema", "id:int64", "--property", "write.delete.mode=sometimes"),
        ("--warehouse", wh, "create", "sales.z", "--schema", "id:int64", "--key", "nope"),
        ("--warehouse", wh, "info", "sales.orders"),
        ("--warehouse", wh, "info", "sales.orders", "--format", "json"),  # global option after the subcommand
        ("--warehouse", wh, "--format", "csv", "tables"),
    )
    rec = json.loads(ok(from_file).stdout)
    assert rec["key"] == ["k"] and [c["name"] for c in rec["columns"]] == ["k", "ts"] and rec["format_version"] == 3
    fails(dup, 1, "already exists")
    fails(bad_type, 2, "unknown column type 'int99'")
    fails(bad_prop, 2, "write.delete.mode")
    fails(bad_key, 2, "nope")
    text = ok(info).stdout
    for needle in (
        "partitioned by      region, day(at)",
        "version             0",
        "CDF retention       lineage.cdf.retention.versions=5",
        "write.update.mode=copy-on-write",
        "live rows           0",
    ):
        assert needle in text, (needle, text)
    rec = json.loads(ok(info_json).stdout)
    assert rec["version"] == 0 and rec["key"] == ["id"] and rec["partition_by"] == ["region", "day(at)"]
    assert rec["retention"] == {"versions": "5", "days": None, "oldest_cdf_version": 0}
    assert rec["data_files"]["count"] == 0 and rec["lineage"]["segments"] == 0
    rows = list(csv.DictReader(io.StringIO(ok(tables).stdout)))
    assert sorted(r["table"] for r in rows) == ["sales.events", "sales.orders"]


def test_catalog_option_uses_any_pyiceberg_catalog(tmp_path):
    uri = f"sqlite:///{tmp_path / 'other.db'}"
    base = ("--catalog", "type=sql", "--catalog", f"uri={uri}", "--warehouse", str(tmp_path / "files"))
    ok(run(*base, "create", "ns.t", "--schema", "id:int64!,v:string"))
    info, info_uri = run_many(
        (*base, "-f", "json", "info", "ns.t"),
        ("--catalog-uri", uri, "--warehouse", str(tmp_path / "files"), "-f", "json", "info", "ns.t"),
    )
    assert json.loads(ok(info).stdout)["location"].startswith(str(tmp_path / "files"))
    assert json.loads(ok(info_uri).stdout)["table"] == "ns.t"
    assert not (tmp_path / "files" / "catalog.db").exists()  # the table went into the named catalog
    fails(run("--catalog", "type=nope", "info", "ns.t"), 2, "--catalog")


# ---------------------------------------------------------------- reads


def test_info_log_and_plots(wh, tmp_path):
    info, log_, log_json, html_plot, svg_plot, png_plot, bad_plot = run_many(
        ("--warehouse", wh, "info", "shop.orders"),
        ("--warehouse", wh, "log", "shop.orders"),
        ("--warehouse", wh, "--format", "json", "log", "shop.kept"),
        ("--warehouse", wh, "log", "shop.orders", "--plot", str(tmp_path / "h.html")),
        ("--warehouse", wh, "-q", "log", "shop.kept", "--plot", str(tmp_path / "k.svg"), "--plot-scale", "linear"),
        ("--warehouse", wh, "-q", "log", "shop.orders", "--plot", str(tmp_path / "h.png")),
        ("--warehouse", wh, "log", "shop.orders", "--plot", str(tmp_path / "h.gif")),
    )
    text = ok(info).stdout
    for needle in (
        "columns             id int64 (key), name string, amount double",
        "partitioned by      bucket(4, id)",
        "version             4  (4 commits in the log)",
        "live rows           3",
        "delete files        ",
        "oldest CDF start    version 0",
        "CDF retention       unset",
    ):
        assert needle in text, (needle, text)
    rows = table_lines(ok(log_).stdout)
    assert rows[0][:6] == ["version", "committed_at", "operation", "inserted", "updated", "deleted"]
    body = [r for r in rows[1:] if r[0].isdigit()]
    assert [(r[0], r[3], r[4], r[5], r[6]) for r in body] == [
        ("1", "append", "3", "0", "0"),
        ("2", "update", "0", "1", "0"),
        ("3", "delete", "0", "0", "1"),
        ("4", "upsert", "1", "1", "0"),
    ]
    assert "changes are available after version 0" in log_.stdout
    kept = json.loads(ok(log_json).stdout)
    assert [(c["version"], c["operation"], c["in_cdf_window"]) for c in kept] == [
        (1, "append", False),
        (2, "delete", False),
        (3, "append", True),
    ]
    ok(html_plot)
    page = (tmp_path / "h.html").read_text()
    assert "<svg" in page and "CDF retention window" in page and "v4 upsert" in page and "1 inserts" in page
    ok(svg_plot)
    assert svg_plot.stderr == ""  # --quiet: not even the "wrote" note
    drawing = (tmp_path / "k.svg").read_text()
    assert drawing.startswith("<svg") and "changes after v2" in drawing and "linear scale" in drawing
    ok(png_plot)
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fails(bad_plot, 2, ".html, .svg or .png")


def test_scan(wh, tmp_path):
    out_pq = tmp_path / "rows.parquet"
    plain, filtered, as_of, csv_out, parquet, bad_where, bad_col, no_table, bad_as_of = run_many(
        ("--warehouse", wh, "scan", "shop.orders"),
        (
            "--warehouse",
            wh,
            "-f",
            "json",
            "scan",
            "shop.orders",
            "--where",
            "amount > 15 AND _row_created_at_version = 1",
            "--columns",
            "id,amount,_row_id",
        ),
        ("--warehouse", wh, "-f", "json", "scan", "shop.orders", "--as-of", "1", "--limit", "2", "--no-lineage"),
        ("--warehouse", wh, "-f", "csv", "-o", str(tmp_path / "rows.csv"), "scan", "shop.orders", "--order-by", "amount,id"),
        ("--warehouse", wh, "-f", "parquet", "-o", str(out_pq), "scan", "shop.orders"),
        ("--warehouse", wh, "scan", "shop.orders", "--where", "amount >"),
        ("--warehouse", wh, "scan", "shop.orders", "--where", "nosuch = 1"),
        ("--warehouse", wh, "scan", "shop.nope"),
        ("--warehouse", wh, "scan", "shop.orders", "--as-of", "42"),
    )
    rows = table_lines(ok(plain).stdout)
    assert rows[0] == ["id", "name", "amount", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]
    assert rows[1:] == [
        ["1", "ann", "11.0", "0", "1", "4"],
        ["2", "bob", "40.0", "1", "1", "2"],
        ["4", "dee", "40.0", "3", "4", "4"],
    ]
    assert json.loads(ok(filtered).stdout) == [{"id": 2, "amount": 40.0, "_row_id": 1}]
    assert json.loads(ok(as_of).stdout) == [{"id": 1, "name": "ann", "amount": 10.0}, {"id": 2, "name": "bob", "amount": 20.0}]
    ok(csv_out)
    assert csv_out.stdout == ""
    got = list(csv.DictReader((tmp_path / "rows.csv").open()))
    assert [r["id"] for r in got] == ["1", "2", "4"] and got[0]["_row_last_updated_at_version"] == "4"
    ok(parquet)
    assert pq.read_table(out_pq).num_rows == 3
    fails(bad_where, 2, "not a valid SQL expression")
    assert len(bad_where.stderr.strip().splitlines()) == 1  # DuckDB's multi-line context stays out
    fails(bad_col, 2, "nosuch")
    fails(no_table, 1, "shop.nope does not exist")
    fails(bad_as_of, 2, "version 42")


def test_changes_are_written_batch_by_batch_and_equal_the_api(wh, tmp_path):
    import cdf
    from lineage.cli.format import json_default

    out = tmp_path / "feed.parquet"
    whole, net = run_many(
        ("--warehouse", wh, "-f", "parquet", "-o", str(out), "changes", "shop.orders", "0"),
        ("--warehouse", wh, "-f", "json", "changes", "shop.orders", "0", "--net"),
    )
    ok(whole)
    t = lineage.open_table("shop.orders", warehouse=wh)
    assert pq.read_table(out).to_pylist() == cdf.changes(t, 0).to_pylist()
    assert json.loads(ok(net).stdout) == json.loads(json.dumps(cdf.changes(t, 0, net=True).to_pylist(), default=json_default))


def test_changes_and_deleted_rows(wh):
    (feed, net, cols, by_time, reversed_, unknown, retention, kept_ok, deleted, deleted_range, no_from, bad_ts, epoch, abbreviated) = run_many(
        ("--warehouse", wh, "-f", "json", "changes", "shop.orders", "1", "4"),
        ("--warehouse", wh, "-f", "json", "changes", "shop.orders", "0", "--net"),
        ("--warehouse", wh, "-f", "csv", "changes", "shop.orders", "1", "--columns", "amount"),
        (
            "--warehouse",
            wh,
            "-f",
            "json",
            "changes",
            "shop.orders",
            "--from-timestamp",
            "1h",
            "--to-timestamp",
            str(int(time.time() * 1000) + 86_400_000),
        ),
        ("--warehouse", wh, "changes", "shop.orders", "3", "1"),
        ("--warehouse", wh, "changes", "shop.orders", "9"),
        ("--warehouse", wh, "changes", "shop.kept", "0"),
        ("--warehouse", wh, "changes", "shop.kept", "2"),
        ("--warehouse", wh, "deleted-rows", "shop.orders"),
        ("--warehouse", wh, "-f", "json", "deleted-rows", "shop.orders", "--since", "3", "--until", "4"),
        ("--warehouse", wh, "changes", "shop.orders"),
        ("--warehouse", wh, "changes", "shop.orders", "--from-timestamp", "yesterday"),
        ("--warehouse", wh, "-f", "json", "changes", "shop.orders", "--from-timestamp", "0"),
        ("--warehouse", wh, "changes", "shop.orders", "--from", "0"),
    )
    events = json.loads(ok(feed).stdout)
    assert [(e["id"], e["_change_type"], e["_commit_version"], e["_changed_columns"]) for e in events] == [
        (2, "update_preimage", 2, ["amount"]),
        (2, "update_postimage", 2, ["amount"]),
        (3, "delete", 3, None),
        (1, "update_preimage", 4, ["amount"]),
        (1, "update_postimage", 4, ["amount"]),
        (4, "insert", 4, None),
    ]
    assert sorted((e["id"], e["_change_type"]) for e in json.loads(ok(net).stdout)) == [
        (1, "insert"),
        (2, "insert"),
        (4, "insert"),
    ]
    rows = list(csv.DictReader(io.StringIO(ok(cols).stdout)))
    assert list(rows[0])[:2] == ["amount", "_change_type"] and "id" not in rows[0]
    assert rows[0]["_changed_columns"] == '["amount"]'
    assert len(json.loads(ok(by_time).stdout)) == 9  # versions (0, 4]: 3 + 1 inserts, 2 update pairs, 1 delete
    fails(reversed_, 2, "reversed")
    fails(unknown, 2, "from_version=9")
    fails(retention, 2, "retention window", "oldest available version is 2")
    assert "insert" in ok(kept_ok).stdout
    dl = table_lines(ok(deleted).stdout)
    assert dl[0][:4] == ["id", "name", "amount", "_row_deleted_at_version"] and dl[1][:4] == ["3", "cy", "30.0", "3"]
    assert json.loads(ok(deleted_range).stdout) == []
    fails(no_from, 2, "FROM")
    fails(bad_ts, 2, "--from-timestamp")
    # a bare number is epoch milliseconds: 0 is before the first commit, so every change (not "0 ago", which is now)
    assert len(json.loads(ok(epoch).stdout)) == 9
    fails(abbreviated, 2, "--from")  # not taken for --from-timestamp


# ---------------------------------------------------------------- writes and maintenance


def test_writes_maintenance_and_verify(tmp_path):
    wh = str(tmp_path / "wh")
    # each delete keeps its own delete file (not merged into the data file's previous one): rewrite-deletes has work
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], partition_by=["bucket(2, id)"], warehouse=wh,
                             properties={"lineage.write.delete.merge": "false"})
    (tmp_path / "a.csv").write_text("id,name,amount\n1,ann,10\n2,bob,20\n3,cy,30\n4,dee,40\n")
    (tmp_path / "b.jsonl").write_text('{"id": 5, "name": "eve", "amount": 50}\n{"id": 1, "name": "ann", "amount": 11}\n')
    w = ("--warehouse", wh)
    assert "version 1 (append): 4 inserted" in ok(run(*w, "append", "shop.orders", str(tmp_path / "a.csv"))).stdout
    fails(run(*w, "append", "shop.orders", str(tmp_path / "a.csv")), 2, "already")  # keys exist: KeyViolationError
    assert "version 2 (upsert): 1 inserted, 1 updated" in ok(run(*w, "upsert", "shop.orders", str(tmp_path / "b.jsonl"))).stdout
    assert (
        "version 3 (update): 1 updated"
        in ok(run(*w, "update", "shop.orders", "--where", "id = 2", "--set", "amount=amount * 2")).stdout
    )
    for i in range(2):  # 4 commits removing rows of the 2 appended files: one of them has 2 delete files to merge
        ok(run(*w, "delete", "shop.orders", "--where", f"id = {3 + i}"))
    assert t.refresh().version == 5

    nothing, bad_set = run_many(
        (*w, "delete", "shop.orders", "--where", "id = 99"), (*w, "update", "shop.orders", "--set", "amount='x' || 1")
    )
    assert "matched nothing; no commit (version stays 5)" in ok(nothing).stdout
    fails(bad_set, 2, "amount")

    rewrite = json.loads(ok(run(*w, "-f", "json", "rewrite-deletes", "shop.orders")).stdout)
    assert rewrite["operation"] == "rewrite-deletes" and rewrite["committed"] and rewrite["version"] == 6
    compact = ok(run(*w, "compact", "shop.orders", "--target-file-size", "64MB"))
    assert "compact: committed version 7" in compact.stdout and "file(s) removed" in compact.stdout
    bad_size, bad_fraction, bad_age, bad_retain, rehome = run_many(
        (*w, "compact", "shop.orders", "--target-file-size", "lots"),
        (*w, "rehome", "shop.orders", "--max-live-fraction", "2"),
        (*w, "vacuum", "shop.orders", "--older-than", "7x"),
        (*w, "expire", "shop.orders", "--retain-last", "0"),
        (*w, "rehome", "shop.orders", "--max-live-fraction", "1"),
    )
    fails(bad_size, 2, "--target-file-size")
    fails(bad_fraction, 2, "--max-live-fraction")
    fails(bad_age, 2, "--older-than")
    fails(bad_retain, 2, "--retain-last")
    ok(rehome)
    assert "shop.orders: rehome:" in rehome.stdout
    expire = ok(run(*w, "expire", "shop.orders", "--retain-last", "2", "--older-than", "0s"))
    assert "expired" in expire.stdout
    dry = json.loads(ok(run(*w, "-f", "json", "vacuum", "shop.orders", "--older-than", "0", "--dry-run")).stdout)
    assert dry["dry_run"] and dry["files"] and all(os.path.exists(p) for p in dry["files"])
    real = ok(run(*w, "vacuum", "shop.orders", "--older-than", "0"))
    assert f"{len(dry['files'])} file(s) removed" in real.stdout
    assert not any(os.path.exists(p) for p in dry["files"])

    purge = ok(run(*w, "purge", "shop.orders", "--where", "name = 'ann'"))
    assert "purge: committed version" in purge.stdout and "erased 1 row(s)" in purge.stdout
    verify_ok, log_, after = run_many(
        (*w, "verify", "shop.orders"),
        (*w, "-f", "json", "log", "shop.orders"),
        (*w, "-f", "json", "scan", "shop.orders", "--columns", "id,name"),
    )
    assert ok(verify_ok).stdout.startswith("OK: shop.orders is consistent")
    ops = [c["operation"] for c in json.loads(ok(log_).stdout)]
    assert (
        ops[:7] == ["append", "upsert", "update", "delete", "delete", "rewrite-deletes", "compact"]
        and ops[-1] == "purge"
    )
    assert json.loads(ok(after).stdout) == [{"id": 2, "name": "bob"}, {"id": 5, "name": "eve"}]


def test_maintain_and_rewrite_manifests(tmp_path):
    wh = str(tmp_path / "wh")
    props = {"commit.manifest-merge.enabled": "false", "lineage.maintain.vacuum.enabled": "false"}
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=wh, properties=props)
    for i in range(6):  # six small files: compaction's min-input-files is 5
        t.upsert(pa.table({"id": [i, 10 + i], "name": ["a", "b"], "amount": [1.0, 2.0]}))
    w = ("--warehouse", wh)
    dry = json.loads(ok(run(*w, "-f", "json", "maintain", "shop.orders", "--dry-run")).stdout)
    steps = {s["step"]: s["status"] for s in dry["steps"]}
    assert dry["dry_run"] and dry["committed"] == [] and steps["vacuum"] == "disabled"
    assert steps["rewrite-data-files"] == "would run" and t.refresh().version == 6
    manifests = json.loads(ok(run(*w, "-f", "json", "rewrite-manifests", "shop.orders", "--dry-run")).stdout)
    assert not manifests["committed"] and manifests["detail"].startswith("would rewrite 6 manifest(s) into 1")
    done = ok(run(*w, "rewrite-manifests", "shop.orders"))
    assert "rewrite-manifests: committed version 7" in done.stdout
    text = ok(run(*w, "maintain", "shop.orders")).stdout
    assert text.startswith("maintenance of shop.orders") and "rewrite-data-files        done" in text
    assert ok(run(*w, "verify", "shop.orders")).stdout.startswith("OK")


def test_verify_reports_a_missing_file(tmp_path):
    wh = str(tmp_path / "wh")
    t = lineage.create_table("shop.broken", SCHEMA, key=["id"], warehouse=wh)
    t.append(pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1.0, 2.0]}))
    t.delete("id = 1")
    victim = t.state().live_files()[0].path
    os.remove(victim.removeprefix("file://"))
    text, as_json, scan = run_many(
        ("--warehouse", wh, "verify", "shop.broken"),
        ("--warehouse", wh, "-f", "json", "verify", "shop.broken"),
        ("--warehouse", wh, "scan", "shop.broken"),
    )
    assert text.returncode == 1, text
    assert text.stdout.startswith("FAILED: shop.broken has") and victim in text.stdout and "missing" in text.stdout
    assert "verify found" in text.stderr and "Traceback" not in text.stderr
    rec = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and rec["ok"] is False and any(victim in p for p in rec["problems"])
    assert scan.returncode == 1 and "Traceback" not in scan.stderr and "error:" in scan.stderr
    debug = run("--warehouse", wh, "--debug", "scan", "shop.broken")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# ---------------------------------------------------------------- materialized views, progress, demo


def test_materialized_views(tmp_path):
    wh = str(tmp_path / "wh")
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=wh)
    t.append(pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "ann"], "amount": [10.0, 20.0, 30.0]}))
    w = ("--warehouse", wh)
    created = ok(
        run(
            *w,
            "mv",
            "create",
            "shop.totals",
            "SELECT name, SUM(amount) AS total, COUNT(*) AS n FROM shop.orders GROUP BY name",
            "--refresh",
        )
    )
    assert "created view shop.totals (aggregate over shop.orders)" in created.stdout and "rebuilt" in created.stdout
    t.update("id = 3", {"amount": "amount + 1"})
    listed, bad_query, missing = run_many(
        (*w, "-f", "json", "mv", "list"),
        (*w, "mv", "create", "shop.bad", "SELECT name FROM shop.orders ORDER BY name"),
        (*w, "mv", "refresh", "shop.nope"),
    )
    views = json.loads(ok(listed).stdout)
    assert [(v["view"], v["shape"], v["source"], v["reflects_version"], v["source_version"], v["behind"]) for v in views] == [
        ("shop.totals", "aggregate", "shop.orders", 1, 2, 1)
    ]
    fails(bad_query, 2, "ORDER BY")
    fails(missing, 1, "shop.nope")
    refreshed = ok(run(*w, "mv", "refresh", "--all"))
    assert "shop.totals: refreshed (source 1 -> 2" in refreshed.stdout
    rows = json.loads(ok(run(*w, "-f", "json", "scan", "shop.totals", "--columns", "name,total,n", "--order-by", "name")).stdout)
    assert rows == [{"name": "ann", "total": 41.0, "n": 2}, {"name": "bob", "total": 20.0, "n": 1}]


def test_progress_bars_only_on_request_or_terminal(wh):
    with ThreadPoolExecutor(max_workers=3) as pool:
        forced, quiet, piped = pool.map(
            lambda a: run("--warehouse", wh, *a[0], "info", "shop.orders", env=a[1]),
            [((), {"LINEAGE_PROGRESS": "always"}), (("--quiet",), {"LINEAGE_PROGRESS": "always"}), ((), None)],
        )
    assert "\x1b[" in ok(forced).stderr  # a (transient) bar was drawn on the forced "terminal"
    assert ok(quiet).stderr == "" and ok(piped).stderr == ""  # --quiet, or stderr is not a terminal: no bar
    assert forced.stdout == piped.stdout


def test_demo_subcommand(tmp_path):
    p = ok(run("demo", "--rows", "1000", cwd=tmp_path))
    assert "Row lineage demo" in p.stdout and "-> MATCH" in p.stdout
    assert "lineage --warehouse demo-warehouse info shop.orders" in p.stdout and "live rows" in p.stdout
    assert (tmp_path / "demo-warehouse" / "catalog.db").exists()
    shutil.rmtree(tmp_path / "demo-warehouse")


# ---------------------------------------------------------------- in-process: argument parsing and the plot


def test_argument_parsers():
    import datetime as dt

    from lineage.cli.option_values import parse_duration, parse_schema, parse_size, parse_timestamp

    s = parse_schema("id:int64!, price:decimal(10,2), at:timestamp[us, tz=UTC], tags:list<string>, ok:bool, n:long")
    assert [(f.name, str(f.type), f.nullable) for f in s] == [
        ("id", "int64", False),
        ("price", "decimal128(10, 2)", True),
        ("at", "timestamp[us, tz=UTC]", True),
        ("tags", "list<item: string>", True),
        ("ok", "bool", True),
        ("n", "int64", True),
    ]
    assert parse_schema('{"a": "int32", "b": "string"}').names == ["a", "b"]
    for bad in ("id", "id:int64,id:string", "id:whatever", "[]"):
        with pytest.raises(lineage.InvalidArgumentError):
            parse_schema(bad)
    assert parse_duration("1h30m", "x") == dt.timedelta(minutes=90)
    assert parse_duration("0", "x") == dt.timedelta(0) and parse_duration("2w", "x") == dt.timedelta(days=14)
    for bad in ("7x", "h", "1h junk", ""):
        with pytest.raises(lineage.InvalidArgumentError):
            parse_duration(bad, "--older-than")
    assert (
        parse_size("64MiB", "x") == 64 * 1024**2
        and parse_size("1.5G", "x") == int(1.5 * 1024**3)
        and parse_size("100", "x") == 100
    )
    with pytest.raises(lineage.InvalidArgumentError):
        parse_size("0", "x")
    assert parse_timestamp("1700000000000", "x") == 1700000000000
    assert parse_timestamp("2026-01-02T03:04:05", "x") == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    ago = parse_timestamp("2h", "x")
    assert abs((dt.datetime.now(dt.timezone.utc) - ago).total_seconds() - 7200) < 60


def test_plot_marks_the_retention_window_and_maintenance():
    import datetime as dt

    from lineage.cli.report import Commit, History, html_report, svg

    ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    commits = [
        Commit(1, ts, "append", 1_000_000, 0, 0),
        Commit(2, ts, "update", 0, 12, 0),
        Commit(3, ts, "compact", 0, 0, 0),
        Commit(4, ts, "delete", 0, 0, 3),
    ]
    h = History("shop.orders", commits, oldest=2, current=4, snapshots=[3, 4], retention="lineage.cdf.retention.versions=2")
    drawing = svg(h)
    assert "1M" in drawing and "changes after v2" in drawing and "v3 compact" in drawing and "no row changes" in drawing
    assert "v4 delete (2026-01-01 00:00:00 UTC): 3 deletes" in drawing and "versions 3..4" in drawing
    page = html_report(h, "linear")
    assert page.count('<tr class="out">') == 2 and "version 2 (changes of versions 3..4)" in page and "expired" in page
