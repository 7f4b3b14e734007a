"""Parsing position delete files: data file path -> sorted unique positions, against a plain model.

The reader takes the paths dictionary-encoded (an integer per row, not a
string) so that a delete file naming every data file of a large table stays
cheap; its result must be what grouping the rows by path gives.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

import lineage.storage.deletes as deletes

SCHEMA = pa.schema([pa.field("file_path", pa.string(), False), pa.field("pos", pa.int64(), False)])
PATHS = st.one_of(st.sampled_from(["s3://b/data/a.parquet", "s3://b/data/b.parquet", "/t/data/0-é.parquet", "/t/data/00.parquet", "z"]),
                  st.integers(0, 300).map(lambda i: f"s3://b/data/{i:05d}-{'x' * (i % 7)}.parquet"))  # many, sharing prefixes


def model(rows: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each path's positions, sorted and unique, paths in sorted order."""
    out: dict[str, set[int]] = {}
    for path, pos in rows:
        out.setdefault(path, set()).add(pos)
    return {p: sorted(out[p]) for p in sorted(out)}


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(PATHS, st.integers(0, 5000)), max_size=200),
    row_group=st.integers(1, 64),
    dictionary=st.booleans(),
    page_limit=st.sampled_from([None, 64, 512]),
)
def test_read_matches_the_model(rows: list[tuple[str, int]], row_group: int, dictionary: bool, page_limit: int | None) -> None:
    """``page_limit``: a small dictionary page, so that a row group's paths fall back to plain pages part way."""
    table = pa.table({"file_path": [p for p, _ in rows], "pos": [n for _, n in rows]}, schema=SCHEMA)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "deletes.parquet")
        # several row groups (a dictionary each), dictionary-encoded in the file or plain
        limits = {} if page_limit is None else {"dictionary_pagesize_limit": page_limit, "data_page_size": page_limit}
        pq.write_table(table, path, row_group_size=row_group, use_dictionary=dictionary, **limits)
        parsed = deletes._read(path)
    expected = model(rows)
    assert list(parsed) == list(expected)
    for p, positions in expected.items():
        assert parsed[p].dtype == np.int64
        assert parsed[p].tolist() == positions
        assert not parsed[p].flags.writeable
