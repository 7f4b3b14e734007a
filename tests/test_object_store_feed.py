"""The default-mode change feed on an object store: which bytes it reads, and in how many round trips.

The feed reads the row images it shows by position: the footers of the files
holding them (one wave of GETs), then the column chunks of the row groups
holding them (a second wave: all at once, nearby chunks in one request), not
a request per chunk one after another. A proxy in front of the moto server
counts the requests and adds latency, so requests sent one after another
show.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lineage
import lineage.storage.puts as puts
import lineage.storage.s3_ranges as s3_ranges
from test_object_store_requests import _proxied, _rows


@pytest.fixture
def slow(moto_server, tmp_path):
    """A lake on a new bucket of the moto server behind a counting proxy adding 50 ms per request."""
    yield from _proxied(moto_server, tmp_path, 50)


def test_coalesced_merges_near_ranges_and_cuts_long_ones():
    ranges = [(100, 200), (0, 50), (60, 90), (500, 500)]
    assert s3_ranges.coalesced(ranges, gap=9, piece=1000) == [(0, 50), (60, 90), (100, 200)]
    assert s3_ranges.coalesced(ranges, gap=10, piece=1000) == [(0, 200)]
    assert s3_ranges.coalesced([(0, 10), (30, 40)], gap=20, piece=1000) == [(0, 40)]
    assert s3_ranges.coalesced([(0, 25)], gap=0, piece=10) == [(0, 10), (10, 20), (20, 25)]
    assert s3_ranges.coalesced([]) == []


def test_held_ranges_serve_reads_within_them_and_are_dropped_after(moto_server):
    import lineage.storage.files as files
    from test_object_store_requests import _bucket

    body = bytes(range(256)) * 1600  # 409,600 bytes
    location = f"{_bucket(moto_server)}/x/held.bin"
    puts.put(location, body)
    puts.forget()
    with s3_ranges.holding({location: [(1000, 2000), (2000, 2500), (200_000, 200_010)]}, files.settings_for) as fetched:
        assert (fetched.requests, fetched.bytes) == (2, 1510)  # the adjacent ranges in one request
        assert s3_ranges.held(location, 1200, 2400) == body[1200:2400]  # across pieces
        assert s3_ranges.held(location, 200_000, 200_010) == body[200_000:200_010]
        assert s3_ranges.held(location, 900, 1100) is None  # not all held
        assert s3_ranges.held(location, 2400, 2600) is None
        reader = files.open_input(location)  # reads past the tail come from the held ranges (checked by value)
        reader.seek(1500)
        assert reader.read(900) == body[1500:2400]
    assert s3_ranges.held(location, 1200, 2400) is None
    missing = location + ".missing"
    with s3_ranges.holding({missing: [(0, 10)]}, files.settings_for) as fetched:  # left for the reader to report
        assert fetched.requests == 0 and s3_ranges.held(missing, 0, 10) is None


def _chain(log: list[list]) -> int:
    """The most requests of a proxy log sent one after another (each arriving after the previous was answered)."""
    best: dict[int, int] = {}
    entries = sorted(log, key=lambda e: e[4])
    for i, e in enumerate(entries):
        best[i] = 1 + max((best[j] for j in range(i) if entries[j][4] <= e[3]), default=0)
    return max(best.values(), default=0)


@pytest.mark.parametrize("budget", [None, 1])
def test_the_feed_reads_the_chunks_of_the_row_groups_it_needs_in_one_wave(slow, monkeypatch, budget) -> None:
    """``budget``: bytes fetched ahead at most (1: none, each chunk is read as it is decoded; the same rows)."""
    import cdf
    import lineage.read.chunk_ranges as chunk_ranges

    if budget is not None:
        monkeypatch.setattr(chunk_ranges, "MAX_HELD_BYTES", budget)
    lake, proxy = slow
    # a base file of 20 row groups of 10,000 rows: the updates touch two of them
    t = lineage.create_table("shop.orders", _rows(np.arange(1), "a").schema, key=["id"],
                             properties={"write.parquet.row-group-limit": "10000"}, **lake.where())
    t.append(_rows(np.arange(200_000), "a"))
    base = t.state().live_files()[0].path
    for i, ids in enumerate(([5, 6], [45_005], [7, 200_001])):
        t.upsert(_rows(np.array(ids), f"u{i}"))
    expected = cdf.changes(t, 1)
    reader = lineage.open_table("shop.orders", **lake.where())
    puts.forget()  # as a reader in another process: no footers or objects held
    proxy.reset()
    got = cdf.changes(reader, 1)
    counts = proxy.counts(log=True)
    key = ["_commit_version", "_change_type", "id"]
    got, expected = cdf.decode_change_columns(got), cdf.decode_change_columns(expected)  # pyarrow sorts strings, not dictionaries
    assert got.sort_by([(k, "ascending") for k in key]).equals(expected.sort_by([(k, "ascending") for k in key]))
    assert got.num_rows == 9  # 4 updates (pre- and post-image) and an insert
    base_key = "/" + base.split("://", 1)[1]
    on_base = [e for e in counts["log"] if e[1] == base_key]
    file_bytes = t.state().live_files()[0].data_file.file_size_in_bytes
    read = sum(e[2] for e in on_base)
    assert read < file_bytes * 0.25, (read, file_bytes)  # its tail (the footer) and the chunks of 2 of 20 row groups
    if budget is not None:  # pyarrow reads a small row group's chunks in one request, as it decodes the group
        assert len(on_base) == 3, [e[:3] for e in on_base]
        return
    assert len(on_base) <= 3, [e[:3] for e in on_base]  # its tail, then its chunks coalesced by row group
    assert {e[0] for e in counts["log"]} == {"GET"}
    # one after another: the manifest list, the manifests, the footers, the chunks
    assert _chain(counts["log"]) <= 4, sorted((e[3], e[4], e[1][-20:]) for e in counts["log"])


NESTED = pa.schema([pa.field("id", pa.int64(), False), ("name", pa.string()), ("tags", pa.list_(pa.string())), ("amount", pa.float64())])


def _nested_rows(ids: list[int], tag: str) -> pa.Table:
    return pa.table({"id": ids, "name": [None if i % 3 == 0 else f"{tag}{i}" for i in ids],
                     "tags": [None if i % 4 == 0 else [tag] * (i % 3) for i in ids], "amount": [float(i) for i in ids]},
                    schema=NESTED)


def _feeds(t: lineage.Table) -> list[pa.Table]:
    import cdf

    key = [(k, "ascending") for k in ("_commit_version", "_change_type", "id")]
    return [cdf.decode_change_columns(cdf.changes(t, a, net=net)).drop_columns(["_commit_timestamp"]).sort_by(key)
            for a in (0, 3) for net in (False, True)]


@pytest.mark.parametrize("short", [False, True])
def test_chunks_fetched_ahead_give_the_feed_read_chunk_by_chunk(s3, monkeypatch, short) -> None:
    """Row groups of 7 rows (changes at their boundaries), a column added after the first files, nulls and a list
    column; the chunks fetched ahead in 97-byte pieces, no two requests merged, within a budget that leaves some chunks
    to the reader; ``short``: every ranged GET of the fetch answers one byte short. The feed must equal the one read
    with nothing fetched ahead (one GET per chunk)."""
    from pyiceberg.types import StringType

    import lineage.decoded_cache as decoded_cache
    import lineage.read.chunk_ranges as chunk_ranges
    import lineage.storage.s3_get as s3_get
    import lineage.storage.s3_reader as s3_reader

    t = lineage.create_table("shop.nested", NESTED, key=["id"], properties={"write.parquet.row-group-limit": "7"}, **s3.where())
    t.append(_nested_rows(list(range(40)), "a"))
    t.upsert(_nested_rows([0, 6, 7, 13, 14, 20, 21, 39, 40], "u"))
    with t.iceberg.update_schema() as u:
        u.add_column("note", StringType())
    t.refresh()
    t.update("id % 5 = 0 OR id = 7", {"note": "'n'"})
    t.delete("id IN (1, 8, 27, 28)")
    t.upsert(_nested_rows([2, 9, 41], "w").append_column("note", pa.array([None, "m", "k"])))

    fetched: list[tuple[str, str]] = []

    def get_range(location: str, settings, byte_range: str):  # noqa: ANN001, ANN202
        data, size = s3_get.get_range(location, settings, byte_range)
        fetched.append((location, byte_range))
        return (data[:-1] if short else data), size

    def read() -> list[pa.Table]:
        puts.forget()  # as a reader in another process: nothing held
        decoded_cache.clear()
        return _feeds(lineage.open_table("shop.nested", **s3.where()))

    monkeypatch.setattr(s3_reader, "TAIL_BYTES", 600)  # files this small would be read whole with their footers
    monkeypatch.setattr(chunk_ranges, "MAX_HELD_BYTES", 0)
    expected = read()
    assert not fetched
    monkeypatch.setattr(s3_ranges, "s3_get", types.SimpleNamespace(get_range=get_range, parallel_reads=s3_get.parallel_reads))
    monkeypatch.setattr(s3_ranges, "GAP_BYTES", 0)
    monkeypatch.setattr(s3_ranges, "PIECE_BYTES", 97)
    monkeypatch.setattr(chunk_ranges, "MAX_HELD_BYTES", 2_000)
    served = []
    held = s3_ranges.held
    monkeypatch.setattr(s3_ranges, "held", lambda *a: served.append(r := held(*a)) or r)
    got = read()
    assert fetched and any(r is not None for r in served)  # chunks were fetched ahead and read from what was held
    assert not short or any(r is None for r in served)  # ... and, one byte short, some read from the store
    for g, e in zip(got, expected, strict=True):
        assert g.equals(e), (g.to_pylist(), e.to_pylist())
    assert expected[0].num_rows > 40 and expected[0].column("note").null_count < expected[0].num_rows


@settings(max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "100")), deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_held_ranges_serve_exactly_the_bytes_fetched(data) -> None:
    """Against the object's bytes: ranges coalesced with any gap and piece size, each request answered in full or short
    (a reply may end early), read back at any ``[start, end)``: :func:`s3_ranges.held` gives exactly those bytes when
    the replies cover them, and None otherwise."""
    from unittest import mock

    size = data.draw(st.integers(1, 400), label="size")
    body = bytes((i * 7 + 3) % 256 for i in range(size))
    wanted = data.draw(st.lists(st.tuples(st.integers(0, size), st.integers(0, size)).map(sorted).map(tuple), max_size=6),
                       label="ranges")
    gap = data.draw(st.integers(0, 50), label="gap")
    piece = data.draw(st.integers(1, 120), label="piece")
    short = data.draw(st.dictionaries(st.integers(0, size), st.integers(1, 60), max_size=4), label="short replies")
    covered = np.zeros(size, bool)

    def get_range(location: str, settings: object, byte_range: str) -> tuple[bytes, int]:
        start, last = (int(x) for x in byte_range.split("-"))
        end = max(start, last + 1 - short.get(start, 0))
        covered[start:end] = True
        return body[start:end], size

    fake = types.SimpleNamespace(get_range=get_range, parallel_reads=lambda: 4)
    location = "s3://bucket/held-property"
    with mock.patch.object(s3_ranges, "s3_get", fake), mock.patch.object(s3_ranges, "GAP_BYTES", gap), \
            mock.patch.object(s3_ranges, "PIECE_BYTES", piece), s3_ranges.holding({location: wanted}, lambda _: None):
        for _ in range(8):
            start, end = sorted(data.draw(st.tuples(st.integers(0, size), st.integers(0, size)), label="read"))
            got = s3_ranges.held(location, start, end)
            if start < end and covered[start:end].all():
                assert got == body[start:end]
            else:
                assert got is None or (got == b"" and start == end)
    assert s3_ranges.held(location, 0, 1) is None  # nothing is kept after the block
