"""Small data files folded by merge-on-read writes: the policy, and a change stream that keeps few files and an exact feed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from conftest import SCHEMA, assert_interop

import cdf
import lineage
from lineage.errors import InvalidArgumentError
from lineage.writes.small_files import FoldPolicy, files_to_fold


def _file(rows: int, equality: bool = False) -> SimpleNamespace:
    """A stand-in for a live file of ``rows`` rows without deletes."""
    return SimpleNamespace(path=f"f{rows}", data_file=SimpleNamespace(record_count=rows), deletes=(),
                           equality_deletes=("eq",) if equality else (), resolved=())


def test_policy_folds_the_smallest_files_while_they_are_no_larger_than_what_the_commit_writes() -> None:
    files = [_file(n) for n in (10, 20, 40, 100, 1000, 30)]
    removed = {i: np.array([0]) for i in range(len(files))}
    policy = FoldPolicy(max_rows=500, min_files=2)
    # kept rows 9, 19, 29, 39, 99, 999: with 10 rows written, 9 (<= 10), 19 (<= 19), 29 (<= 38), 39 (<= 67) and
    # 99 (<= 106) fold; 999 is larger than the 500-row cap
    assert sorted(files_to_fold(files, removed, 10, policy)) == [0, 1, 2, 3, 5]
    assert files_to_fold(files, removed, 5, policy) == []  # the smallest file keeps more rows than the commit writes
    assert sorted(files_to_fold(files, removed, 10, FoldPolicy(max_rows=60, min_files=2))) == [0, 1, 5]  # 9 + 19 + 29
    assert files_to_fold(files, removed, 10, FoldPolicy(max_rows=500, min_files=6)) == []  # too few files touched
    assert files_to_fold(files, removed, 10, FoldPolicy(max_rows=0, min_files=0)) == []  # off
    # a file with equality deletes is never folded, nor one left empty
    assert files_to_fold([_file(10, equality=True), _file(1), _file(5)], {0: np.array([0]), 1: np.array([0]), 2: np.array([0])}, 100,
                         FoldPolicy(max_rows=500, min_files=0)) == [2]


def test_bad_fold_properties_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="lineage.write.fold.max-rows"):
        FoldPolicy.of({"lineage.write.fold.max-rows": "-1"})


def _stream(rng: np.random.Generator, live: dict[int, tuple[str, float]], next_id: int, n: int) -> tuple[pa.Table, dict, int]:
    """A batch of ``n`` events on random live keys (updates as -U/+U, deletes) plus inserts; returns it, the expected
    net effect per key (kind, before, after) and the next fresh key."""
    keys = rng.choice(sorted(live), size=n, replace=False)
    ops, ids, names, amounts, net = [], [], [], [], {}
    for i, k in enumerate(keys.tolist()):
        before = live[k]
        if i % 4 == 3:
            ops.append("-D"), ids.append(k), names.append(before[0]), amounts.append(before[1])
            net[k] = ("delete", before, None)
            del live[k]
        else:
            after = (before[0], before[1] + 1)
            ops += ["-U", "+U"]
            ids += [k, k]
            names += [before[0], after[0]]
            amounts += [before[1], after[1]]
            net[k] = ("update", before, after)
            live[k] = after
    for _ in range(n // 4):
        live[next_id] = (f"n{next_id}", 0.0)
        ops.append("+I"), ids.append(next_id), names.append(f"n{next_id}"), amounts.append(0.0)
        net[next_id] = ("insert", None, live[next_id])
        next_id += 1
    batch = pa.table({"_op": ops, "id": pa.array(ids, pa.int64()), "name": names, "amount": pa.array(amounts, pa.float64())})
    return batch, net, next_id


def _feed_net(t: lineage.Table, version: int) -> dict:
    out: dict = {}
    for r in cdf.changes(t, version - 1, version).to_pylist():
        kind, image = r["_change_type"], (r["name"], r["amount"])
        was = out.get(r["id"], (None, None, None))
        if kind == "insert":
            out[r["id"]] = ("insert", None, image)
        elif kind == "delete":
            out[r["id"]] = ("delete", image, None)
        elif kind == "update_preimage":
            out[r["id"]] = ("update", image, was[2])
        else:
            out[r["id"]] = ("update", was[1], image)
    return out


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_change_stream_keeps_few_data_files_row_ids_and_an_exact_feed(warehouse: str, format_version: int) -> None:
    props = {"format-version": str(format_version), "lineage.write.fold.min-files": "2"}
    t = lineage.create_table("db.stream", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    plain = lineage.create_table("db.plain", SCHEMA, key=["id"], warehouse=warehouse, properties={**props, "lineage.write.fold.max-rows": "0"})
    live = {i: (f"r{i}", float(i)) for i in range(2000)}
    base = pa.table({"id": list(live), "name": [v[0] for v in live.values()], "amount": [v[1] for v in live.values()]}, schema=SCHEMA)
    t.append(base)
    plain.append(base)
    ids_before = dict(zip(*t.scan(columns=["id", "_row_id"]).select(["id", "_row_id"]).to_pydict().values(), strict=True))
    rng = np.random.default_rng(7)
    next_id = 10_000
    folded = 0
    for _ in range(25):
        batch, want, next_id = _stream(rng, live, next_id, 80)
        info = t.apply_changelog(batch)
        plain.apply_changelog(batch)
        folded += info.data_files_removed
        assert _feed_net(t, info.version) == want  # the feed shows each key's net effect, folded rows move silently
    assert folded > 0
    files = len(t.iceberg.inspect.data_files())
    assert files < len(plain.iceberg.inspect.data_files()) / 2, "folding should keep the stream's data files few"
    final = t.scan(columns=["id", "name", "amount", "_row_id"])
    assert {r["id"]: (r["name"], r["amount"]) for r in final.to_pylist()} == live
    for r in final.to_pylist():  # every key live since the base keeps its row id, folded or not
        if r["id"] in ids_before:
            assert r["_row_id"] == ids_before[r["id"]]
    assert len(cdf.changes(t, 1, t.version)) == len(cdf.changes(plain, 1, plain.version))
    assert_interop(t)


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_stream_of_commits_reads_back_no_manifest_it_wrote(warehouse: str, format_version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Folding removes data files at every commit and manifests merge every few commits: the manifests rewritten or
    merged were written by this process, which remembers their entries (no Avro manifest is read again)."""
    from pyiceberg.manifest import ManifestFile

    from lineage.storage import manifests_v3

    props = {"format-version": str(format_version), "lineage.write.fold.min-files": "2", "commit.manifest.min-count-to-merge": "4"}
    t = lineage.create_table("db.stream", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    live = {i: (f"r{i}", float(i)) for i in range(1000)}
    t.append(pa.table({"id": list(live), "name": [v[0] for v in live.values()], "amount": [v[1] for v in live.values()]}, schema=SCHEMA))
    rng = np.random.default_rng(3)
    batch, _, next_id = _stream(rng, live, 10_000, 50)
    t.apply_changelog(batch)  # the base's manifests may be read once (planned from the catalog)
    reads: list[str] = []
    real_v2, real_v3 = ManifestFile.fetch_manifest_entry, manifests_v3._read_entries
    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry",
                        lambda self, io, discard_deleted=True: reads.append(self.manifest_path) or real_v2(self, io, discard_deleted))
    monkeypatch.setattr(manifests_v3, "_read_entries", lambda m, io: reads.append(m.manifest_path) or real_v3(m, io))
    removed = 0
    for _ in range(10):
        batch, _, next_id = _stream(rng, live, next_id, 50)
        removed += t.apply_changelog(batch).data_files_removed
    assert removed > 0
    assert reads == []
    assert {r["id"]: (r["name"], r["amount"]) for r in t.scan(columns=["id", "name", "amount"]).to_pylist()} == live
    assert_interop(t)
