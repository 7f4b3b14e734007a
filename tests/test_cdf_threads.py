"""The embedded feed's threads: one worker pool per process, the GIL's switch interval lowered while feeds run."""

from __future__ import annotations

import sys
import threading

import pyarrow as pa
import pytest

import cdf
import cdf.threads as threads


def test_the_switch_interval_is_lowered_while_any_feed_runs_and_restored_after():
    before = sys.getswitchinterval()
    with threads.prompt_handover():
        assert sys.getswitchinterval() == pytest.approx(threads.SWITCH_SECONDS)
        with threads.prompt_handover():  # a second feed at once (another thread of the process)
            assert sys.getswitchinterval() == pytest.approx(threads.SWITCH_SECONDS)
        assert sys.getswitchinterval() == pytest.approx(threads.SWITCH_SECONDS)  # the first still runs
    assert sys.getswitchinterval() == pytest.approx(before)


def test_a_lower_switch_interval_is_kept(monkeypatch):
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(threads.SWITCH_SECONDS / 2)
        with threads.prompt_handover():
            assert sys.getswitchinterval() == pytest.approx(threads.SWITCH_SECONDS / 2)
        assert sys.getswitchinterval() == pytest.approx(threads.SWITCH_SECONDS / 2)
    finally:
        sys.setswitchinterval(before)


def test_the_worker_pool_is_kept_by_the_process_and_replaced_in_a_forked_child(monkeypatch):
    pool = threads.worker()
    assert threads.worker() is pool
    monkeypatch.setattr(threads.os, "getpid", lambda: -1)  # as a child forked after the pool started sees it
    child = threads.worker()
    assert child is not pool
    assert child.submit(lambda: 7).result() == 7


def test_feeds_in_several_threads_at_once_give_the_feed(table):
    t = table
    t.append(pa.table({"id": [1, 2, 3], "name": list("abc"), "amount": [1.0, 2.0, 3.0]}))
    t.update("id = 2", {"amount": "amount * 10"})
    t.delete("id = 3")
    before = sys.getswitchinterval()
    want = cdf.changes(t, 0)
    got: list[pa.Table] = []
    runners = [threading.Thread(target=lambda: got.append(cdf.changes(t, 0))) for _ in range(2 * threads.WORKERS + 1)]
    for r in runners:
        r.start()
    for r in runners:
        r.join()
    assert len(got) == len(runners) and all(g.equals(want) for g in got)
    assert want.num_rows == 6  # 3 inserts, an update pair, a delete
    assert sys.getswitchinterval() == pytest.approx(before)
