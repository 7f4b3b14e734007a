"""The CDC stream of benchmarks/cdc.py: its generator and the checks of a change feed against it."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SEED = 12
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("amount", pa.float64()), ("rev", pa.int64())])

def images(ids: np.ndarray, revs: np.ndarray) -> dict[str, Any]:
    """The row image of each (key, revision): values are a function of both, so a feed row can be checked."""
    ids = np.asarray(ids, np.int64)
    revs = np.asarray(revs, np.int64)
    names = np.char.add("n", ((ids * 31 + revs) % 1000).astype(str))
    return {"id": ids, "name": pa.array(names.tolist() if len(names) else [], pa.string()), "amount": (ids % 1000) + revs * 0.125, "rev": revs}


def generate(scale: int, commits: int, events: int, out: str) -> None:
    """Write base.parquet, batch-NNNNN.parquet (``_op`` first) and expected.parquet (batch, kind, id, rev)."""
    if scale < 10 * events:
        raise SystemExit(f"--scale must be at least 10 x --events ({10 * events}) so that batches find untouched live keys")
    rng = np.random.default_rng(SEED)
    cap = scale + commits * events + 1
    live = np.zeros(cap, bool)
    live[:scale] = True
    rev = np.zeros(cap, np.int64)
    pool = list(range(scale))  # live keys, swap-remove
    where = np.full(cap, -1, np.int64)
    where[:scale] = np.arange(scale)
    next_id = scale

    def drop(k: int) -> None:
        i = where[k]
        last = pool[-1]
        pool[i] = last
        where[last] = i
        pool.pop()
        where[k] = -1

    def add(k: int) -> None:
        where[k] = len(pool)
        pool.append(k)

    pq.write_table(pa.table(images(np.arange(scale), np.zeros(scale, np.int64)), schema=SCHEMA), os.path.join(out, "base.parquet"))
    expected = []
    for b in range(commits):
        ops: list[str] = []
        ids: list[int] = []
        revs: list[int] = []
        start: dict[int, tuple[bool, int]] = {}
        once: list[int] = []  # keys touched once in this batch (candidates for a second touch)

        def emit(op: str, k: int, r: int) -> None:
            ops.append(op)
            ids.append(k)
            revs.append(r)

        def touch(k: int, kind: str) -> None:
            if k not in start:
                start[k] = (bool(live[k]), int(rev[k]))
            if kind == "update":
                emit("-U", k, int(rev[k]))
                rev[k] += 1
                emit("+U", k, int(rev[k]))
            elif kind == "delete":
                emit("-D", k, int(rev[k]))
                live[k] = False
                drop(k)
            else:
                emit("+I", k, int(rev[k]))
                live[k] = True
                add(k)

        while len(ops) < events - 1:
            if once and rng.random() < 0.1 / 1.1:
                k = once.pop(int(rng.integers(len(once))))
                if live[k]:
                    touch(k, "update" if rng.random() < 0.6 else "delete")
                else:
                    rev[k] += 1  # a re-inserted key comes back with a new image
                    touch(k, "insert")
                continue
            r = rng.random()
            if r < 2 / 7:
                k = next_id
                next_id += 1
                touch(k, "insert")
            else:
                while True:
                    k = pool[int(rng.integers(len(pool)))]
                    if k not in start:
                        break
                touch(k, "update" if r < 5 / 7 else "delete")
            once.append(k)
        batch = pa.table({"_op": ops, **images(np.array(ids), np.array(revs))})
        pq.write_table(batch, os.path.join(out, f"batch-{b:05d}.parquet"))
        for k, (was, r0) in start.items():
            now, r1 = bool(live[k]), int(rev[k])
            if was and now:
                expected += [(b, "update_preimage", k, r0), (b, "update_postimage", k, r1)]
            elif now:
                expected.append((b, "insert", k, r1))
            elif was:
                expected.append((b, "delete", k, r0))
    cols = list(zip(*expected)) if expected else [[], [], [], []]
    pq.write_table(
        pa.table({"batch": pa.array(cols[0], pa.int32()), "kind": pa.array(cols[1], pa.string()), "id": pa.array(cols[2], pa.int64()),
                  "rev": pa.array(cols[3], pa.int64())}),
        os.path.join(out, "expected.parquet"),
    )
    final_ids = np.flatnonzero(live)
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump({"rows": int(len(final_ids)), "sum_id": int(final_ids.sum()), "sum_rev": int(rev[final_ids].sum())}, f)


# ---------------------------------------------------------------- checks


def check_feed(feed: pa.Table, expected: pa.Table, done: int) -> dict[str, Any]:
    """Compare a feed (batch, kind, id, rev) with the generator's net effects of the first ``done`` batches."""
    want = {}
    for b, kind, k, r in zip(*(expected.column(c).to_pylist() for c in ("batch", "kind", "id", "rev")), strict=True):
        if b < done:
            want[(b, kind, k, r)] = want.get((b, kind, k, r), 0) + 1
    got: dict[tuple, int] = {}
    for row in zip(*(feed.column(c).to_pylist() for c in ("batch", "kind", "id", "rev")), strict=True):
        got[row] = got.get(row, 0) + 1
    missing = sum(max(0, n - got.get(r, 0)) for r, n in want.items())
    extra = sum(max(0, n - want.get(r, 0)) for r, n in got.items())
    bad_batches = {r[0] for r, n in want.items() if got.get(r, 0) != n} | {r[0] for r, n in got.items() if want.get(r, 0) != n}
    kinds: dict[str, int] = {}
    for (_, kind, _, _), n in got.items():
        kinds[kind] = kinds.get(kind, 0) + n
    return {"expected_rows": sum(want.values()), "rows": sum(got.values()), "missing": missing, "extra": extra,
            "commits_exact": done - len(bad_batches), "commits": done, "kinds": kinds}


def check_values(feed: pa.Table) -> int:
    """Feed rows whose name/amount are not the image of their (id, rev)."""
    if not feed.num_rows:
        return 0
    exp = images(feed.column("id").to_numpy(), feed.column("rev").to_numpy())
    bad_amount = ~np.isclose(feed.column("amount").to_numpy(zero_copy_only=False), exp["amount"])
    bad_name = np.array(feed.column("name").to_pylist(), dtype=object) != np.array(exp["name"].to_pylist(), dtype=object)
    return int((bad_amount | bad_name).sum())


def folder_bytes(root: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total
