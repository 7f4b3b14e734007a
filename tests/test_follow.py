"""Following the change feed: ``cdf.follow`` and ``lineage changes --follow``.

What a follower yields, range after range, must be ``cdf.changes(t, start)``
row for row, whether a writer commits while it follows, whether it resumes
from a version it stored (a property over random commits and random resume
points), and whatever maintenance or another engine committed in between.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa
import pytest
from conftest import SCHEMA
from hypothesis import given, settings
from hypothesis import strategies as st

import cdf
import lineage
from lineage.cli.format import json_default
from lineage.errors import InvalidArgumentError, RetentionError, UnknownColumnError, VersionRangeError


def _rows(ids: list[int], name: str = "n", amount: float = 1.0) -> pa.Table:
    return pa.table({"id": ids, "name": [name] * len(ids), "amount": [amount + i for i in ids]}, schema=SCHEMA)


def _collect(ranges) -> tuple[list[tuple[int, int]], list[dict]]:  # noqa: ANN001
    """The (from, to) of each range and all their rows, reading each range's reader to the end."""
    spans, rows = [], []
    for r in ranges:
        spans.append((r.from_version, r.to_version))
        rows.extend(r.changes.read_all().to_pylist())
    return spans, rows


def _contiguous(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    return [a for a, _ in spans] == [start] + [b for _, b in spans[:-1]] and spans[-1][1] == end and all(a < b for a, b in spans)


def test_follow_while_a_writer_commits(warehouse: str) -> None:
    t = lineage.create_table("s.followed", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_rows([1, 2, 3, 4]))  # 1

    def writer() -> None:
        w = lineage.open_table(t.name, warehouse=warehouse)
        w.update("id = 1", {"amount": "amount + 1"})  # 2
        w.upsert(_rows([2, 5], "u"))  # 3
        w.compact()  # 4: maintenance, no change events
        w.iceberg.append(_rows([9], "f").cast(w.arrow_schema))  # 5: another writer, reconciled by the follower
        w.refresh()
        for i in range(4):  # 6-9
            time.sleep(0.05)
            w.delete(f"id = {i + 1}")

    thread = threading.Thread(target=writer)
    thread.start()
    spans, rows = _collect(cdf.follow(lineage.open_table(t.name, warehouse=warehouse), 0, 9, poll_interval=0.02, max_versions=2))
    thread.join()
    assert _contiguous(spans, 0, 9) and all(b - a <= 2 for a, b in spans)
    assert rows == cdf.changes(t, 0).to_pylist()
    assert [r["_row_id"] for r in rows if r["id"] == 9] == [5]  # the foreign row appears once reconciled, with a row id

    # a follower started later from a stored version goes on from there; a stop event ends it while it waits
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    spans, rows = _collect(cdf.follow(t, 6, columns=["id"], poll_interval=0.05, stop=stop))
    assert spans == [(6, 9)] and rows == cdf.changes(t, 6, columns=["id"]).to_pylist()


def test_follow_checks_its_arguments(warehouse: str) -> None:
    t = lineage.create_table("s.args", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.cdf.retention.versions": "1"})
    t.append(_rows([1]))
    t.delete("id = 1")
    with pytest.raises(RetentionError) as feed_error:
        cdf.changes(t, 0)
    with pytest.raises(RetentionError) as follow_error:
        cdf.follow(t, 0)  # checked by the call, not at the first step
    assert str(follow_error.value) == str(feed_error.value)
    for kwargs, error in (({"poll_interval": 0}, InvalidArgumentError), ({"max_versions": 0}, InvalidArgumentError),
                          ({"to_version": 0}, VersionRangeError), ({"columns": ["nope"]}, UnknownColumnError),
                          ({"stop": True}, InvalidArgumentError)):
        with pytest.raises(error):
            cdf.follow(t, 1, **kwargs)


OPS = st.lists(st.sampled_from(["append", "update", "delete", "upsert", "compact"]), min_size=2, max_size=7)


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(ops=OPS, resume=st.lists(st.integers(0, 8), min_size=1, max_size=3), max_versions=st.sampled_from([None, 1, 2]))
def test_resumed_followers_yield_the_feed(ops: list[str], resume: list[int], max_versions: int | None) -> None:
    """Random commits; followers start at random versions and stop after random ranges; each resumes from the last
    range it finished. Together they yield ``cdf.changes`` from the first start, row for row."""
    with tempfile.TemporaryDirectory() as wh:
        t = lineage.create_table("s.prop", SCHEMA, key=["id"], warehouse=wh)
        t.append(_rows([1, 2, 3]))
        for i, op in enumerate(ops):
            {"append": lambda: t.append(_rows([10 + i])), "update": lambda: t.update(f"id % 2 = {i % 2}", {"amount": "amount + 1"}),
             "delete": lambda: t.delete(f"id = {i % 4 + 1}"), "upsert": lambda: t.upsert(_rows([i % 3 + 1, 20 + i], "u")),
             "compact": lambda: t.compact()}[op]()
        end = t.version
        start = min(resume[0], end)
        stored, rows = start, []
        for stop_after in [*resume[1:], None]:  # each follower handles a few ranges, then "crashes"
            ranges = cdf.follow(t, stored, end, poll_interval=0.01, max_versions=max_versions)
            for n, r in enumerate(ranges):
                if stop_after is not None and n >= stop_after:
                    break  # the range was never handled: the next follower reads it again
                rows.extend(r.changes.read_all().to_pylist())
                stored = r.to_version
        assert stored == end
        assert rows == cdf.changes(t, start).to_pylist()


def test_cli_follow_writes_json_lines(warehouse: str) -> None:
    t = lineage.create_table("s.cli", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_rows([1, 2]))  # 1

    def cli(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "lineage.cli", "--warehouse", warehouse, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    follower = cli("changes", "s.cli", "0", "4", "--follow", "--poll-interval", "0.05")
    time.sleep(0.5)
    t.update("id = 1", {"amount": "0"})  # 2
    t.delete("id = 2")  # 3
    t.upsert(_rows([1, 3], "x"))  # 4: the follower stops here
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    expected = json.loads(json.dumps(cdf.changes(t, 0).to_pylist(), default=json_default))
    assert [json.loads(line) for line in out.splitlines()] == expected

    refused = cli("changes", "s.cli", "0", "--follow", "--net")
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and "--follow reads the per-version feed as it grows: it takes no --net" in err
