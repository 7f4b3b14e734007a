"""A warehouse whose path holds spaces, '%', '+' and non-ASCII letters works like any other.

URLs percent-decode ('%25' reads as '%'), and Spark names files by encoded
URIs; the catalog, the writers, the change feed and other readers must all
see the folder the user named.
"""

from __future__ import annotations

import os

import pyarrow as pa

import cdf
import lineage
from conftest import SCHEMA, assert_interop, rows

ODD = "lake with spaces+%25 é"


def test_a_warehouse_with_an_odd_path(tmp_path):
    warehouse = tmp_path / ODD
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=str(warehouse))
    assert (warehouse / "catalog.db").is_file()  # not in a folder named after the decoded URL
    assert not os.path.exists(str(tmp_path / "lake with spaces+% é"))
    t.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.0, 2.0, 3.0]}, schema=SCHEMA))
    t.update("id = 2", {"amount": "amount + 10"})
    t.delete("id = 3")
    again = lineage.open_table("shop.orders", warehouse=str(warehouse))
    assert rows(again.scan(), ["id", "name", "amount"]) == [(1, "a", 1.0), (2, "b", 12.0)]
    feed = cdf.changes(again, 0)
    assert sorted(feed.column("_change_type").to_pylist()) == ["delete", "insert", "insert", "insert", "update_postimage", "update_preimage"]
    assert_interop(again)
