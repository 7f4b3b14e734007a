"""benchmarks/large.py's measuring parts: file kinds of a real table, the process-tree sampler, the extrapolation."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import large_measure as lm  # noqa: E402
import record  # noqa: E402
import report_scale  # noqa: E402

import lineage  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")


def test_every_file_of_a_table_gets_its_kind(tmp_path, monkeypatch) -> None:
    from lineage.storage import metadata

    monkeypatch.setattr(metadata, "INLINE_SEGMENT_RUNS", -1)  # segments in files of their own, as a large commit writes them
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    t = lineage.create_table("s.t", schema, key=["id"], warehouse=str(tmp_path), properties={"lineage.key-index.defer-rows": "0"})
    t.append(pa.table({"id": list(range(100)), "v": [str(i) for i in range(100)]}, schema=schema))
    t.delete("id < 10")
    sizes = lm.table_sizes(record.files_under(str(tmp_path / "s" / "t")))
    for kind in ("data", "position_deletes", "manifests", "manifest_lists", "metadata_json", "lineage_segments",
                 "lineage_lists", "deleted_rows_index", "key_index"):
        assert sizes[kind]["files"] >= 1 and sizes[kind]["bytes"] > 0, kind
    assert sizes["other"]["files"] == 0


def test_new_files_are_what_a_step_wrote() -> None:
    assert lm.new_files({"a": 1, "b": 2}, {"a": 1, "b": 5, "c": 3}) == {"c": 3}


def test_the_sampler_sees_a_child_python_process_grow() -> None:
    # The tree sampled is a shell's, not this process's: a test worker may have started a JVM (Spark) already.
    code = "import time; x = bytearray(200 * 2**20); time.sleep(3)"
    child = subprocess.Popen(["/bin/sh", "-c", f'"{sys.executable}" -c "{code}"; :'])
    try:
        sampler = lm.TreeSampler(child.pid, interval=0.05).start()
        time.sleep(1.5)
        peaks = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert peaks["python_peak_mb"] >= 200
    assert peaks["jvm_peak_mb"] == 0 and peaks["executor_peak_mb"] == 0


def test_extrapolation_follows_the_line_through_the_two_largest_sizes() -> None:
    points = [(1_000_000, 100.0), (10_000_000, 190.0)]
    assert report_scale.extrapolate(points, 100_000_000) == pytest.approx(1090.0)
    assert report_scale.extrapolate([(1, 5.0), *points], 1_000_000_000) == pytest.approx(190.0 + 10.0 * 990)


def test_a_value_that_fell_is_not_extrapolated_below_zero() -> None:
    merged = [(10_000_000, 10.0), (100_000_000, 1.0)]  # ten manifests merged into one
    assert report_scale.extrapolate(merged, 1_000_000_000) == pytest.approx(10.0)  # through the origin
    assert report_scale.extrapolate(merged, 1_000_000_000, memory=True) == pytest.approx(1.0)  # memory stays flat


def test_the_embedded_run_end_to_end(tmp_path) -> None:
    import json

    import large

    out = tmp_path / "record.json"
    args = ["--rows", "3000", "--append-rows", "1000", "--data-dir", str(tmp_path / "data"), "--systems", "embedded",
            "--upsert-rows", "30", "--out", str(out)]
    assert large.main(args) == 0
    doc = json.loads(out.read_text())
    r = doc["results"]
    assert [s["step"] for s in r["steps"]] == ["delete", "update", "upsert", "feed", "scan", "scan-16m"]
    assert r["agree"] and r["live_rows"]["embedded"] == r["outcomes"]["embedded"]["live_rows"] > 2900
    assert r["build"]["sizes"]["data"]["files"] == 3 and r["build"]["sizes"]["key_index"]["bytes"] > 0
    assert "grew_mb" in r["build"]["reindex"] and "plan_grew_mb" in r["build"]["planning"]
    assert all(s["python_after_anon_mb"] > 0 and s["python_after_file_mb"] >= 0 for s in r["steps"])  # what each step left held
    changed = {s["step"]: s.get("rows_changed") for s in r["steps"]}
    assert changed["delete"] > 0 and changed["update"] > 0 and changed["upsert"] == 30
    # the system ran in a process of its own, on its own copy of the catalog: the shared one still points at the start
    assert r["outcomes"]["embedded"]["process"] != os.getpid()
    assert r["outcomes"]["embedded"]["version"] > r["build"]["base_version"]
    shared = large.folders(str(tmp_path / "data"), 3000)["ours"]
    assert lineage.open_table(large.NAME, warehouse=shared).version == r["build"]["base_version"]
    # a second run reuses the table from its starting snapshot and gets the same answers
    assert large.main([*args[:-1], str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())["results"]
    assert again["built_this_run"] is False and again["live_rows"] == r["live_rows"] and again["feed_rows"] == r["feed_rows"]
