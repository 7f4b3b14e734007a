"""Every operation on a table whose warehouse is ``s3://`` (a real S3 HTTP server, moto, on 127.0.0.1).

The same steps run on a local warehouse too (the ``lake`` fixture), so a
difference between the two is a failure here.
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

import cdf
import lineage
from conftest import SCHEMA, assert_interop, rows
from lineage.maintenance.verify import verify


def _batch(ids, names=None, amounts=None) -> pa.Table:  # noqa: ANN001
    ids = list(ids)
    return pa.table({"id": ids, "name": names or [f"n{i}" for i in ids], "amount": amounts or [float(i) for i in ids]},
                    schema=SCHEMA)


@pytest.mark.parametrize("capture", ["false", "true"])
def test_writes_feed_and_maintenance(lake, capture) -> None:
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], properties={"lineage.cdf.capture-preimages": capture},
                             **lake.where())
    assert t.iceberg.metadata.location.startswith(lake.warehouse)
    t.append(_batch(range(1, 11)))
    t.update("id <= 2", {"amount": "amount + 100"})
    t.delete("id = 3")
    t.upsert(_batch([4, 11], ["four", "eleven"], [4.5, 11.0]))
    t.merge(_batch([5, 12], ["merged", "twelve"]), deletes=pa.table({"id": [8]}))
    t.update("id = 6", {"name": "'cow'"}, mode=lineage.COPY_ON_WRITE)
    t.apply_changelog(pa.table({"id": [7, 13], "name": ["seven", "thirteen"], "amount": [7.0, 13.0],
                                "op": ["+U", "+I"]}), op_column="op", upsert=True)
    again = lineage.open_table("shop.orders", **lake.where())
    live = {r[0]: r for r in rows(again.scan(), ["id", "name", "amount"])}
    assert sorted(live) == [1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13]
    assert live[1][2] == 101.0 and live[4][1] == "four" and live[5][1] == "merged" and live[6][1] == "cow"
    assert live[7][1] == "seven" and live[13][1] == "thirteen"
    assert again.count("id > 10") == 3

    feed = cdf.changes(again, 0)
    kinds = feed.column("_change_type").to_pylist()
    assert kinds.count("delete") == 2 and kinds.count("update_preimage") == kinds.count("update_postimage") == 6
    assert kinds.count("insert") == 13
    net = cdf.changes(again, 1, net=True)
    assert sorted(net.column("_change_type").to_pylist()).count("delete") == 2
    batches = pa.Table.from_batches(list(cdf.change_batches(again, 0, batch_rows=3)))
    assert rows(batches) == rows(feed)
    deleted = cdf.deleted_rows(again, 0)
    assert deleted.num_rows >= 1
    assert_interop(again)

    assert not verify(again).problems
    again.compact()
    again.rewrite_deletes()
    again.expire_snapshots(retain_last=2)
    report = again.vacuum(older_than=datetime.timedelta(0))
    assert report.files_removed > 0
    assert not verify(again).problems
    assert rows(again.scan(), ["id", "name", "amount"]) == sorted(live.values(), key=repr)
    # the feed of the versions retention kept still reads
    last = again.version
    assert cdf.changes(again, last - 1).num_rows >= 0
