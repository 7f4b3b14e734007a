"""Native row lineage of Iceberg v3 tables Spark wrote (lineage.iceberg.row_lineage), row for row against Spark and DuckDB.

One table goes through INSERT, merge-on-read UPDATE, DELETE and MERGE (deletion
vectors), copy-on-write UPDATE and ``rewrite_data_files``; after every step our
``_row_id`` and ``_last_updated_sequence_number`` of each live row equal Spark's
``SELECT _row_id, _last_updated_sequence_number`` and DuckDB's ``iceberg_scan``,
and our live rows equal Spark's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.manifest import FileFormat

from lineage import duck
from lineage.catalog import default_catalog
import lineage.storage.manifests_v3 as manifests_v3
from lineage.iceberg import row_lineage

pytestmark = pytest.mark.reference

MOR = ("'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
       "'write.merge.mode'='merge-on-read'")

STEPS = [
    ("insert", "INSERT INTO db.t SELECT id, cast(id AS string), id % 3 FROM range(0, 3000)"),
    ("insert again", "INSERT INTO db.t SELECT id, cast(id AS string), id % 3 FROM range(3000, 4000)"),
    ("update (deletion vectors)", "UPDATE db.t SET v = concat(v, '-u') WHERE id % 11 = 0"),
    ("delete (deletion vectors)", "DELETE FROM db.t WHERE id % 7 = 0 OR id BETWEEN 100 AND 180"),
    ("update merged into vectors", "UPDATE db.t SET v = concat(v, '-w') WHERE id % 13 = 0"),
    ("merge", "MERGE INTO db.t t USING (SELECT id, 'm' AS v FROM range(3900, 4100)) s ON t.id = s.id "
              "WHEN MATCHED AND t.id % 2 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET t.v = s.v "
              "WHEN NOT MATCHED THEN INSERT (id, v, p) VALUES (s.id, s.v, s.id % 3)"),
    ("copy-on-write update", "ALTER TABLE db.t SET TBLPROPERTIES ('write.update.mode'='copy-on-write')"),
    ("copy-on-write update rows", "UPDATE db.t SET v = 'cow' WHERE id BETWEEN 2000 AND 2050"),
    ("rewrite_data_files", "CALL lineage.system.rewrite_data_files(table => 'db.t', "
                           "options => map('rewrite-all', 'true'))"),
    ("delete after rewrite", "DELETE FROM db.t WHERE id % 5 = 1"),
]


def _sorted(t: pa.Table, names: list[str]) -> list[tuple]:
    cols = [t.column(n).to_pylist() for n in names]
    return sorted(zip(*cols, strict=True))


def _check(reference, warehouse: str, step: str) -> None:
    spark = reference.sql(warehouse, "SELECT id, v, _row_id, _last_updated_sequence_number FROM db.t")
    table = default_catalog(warehouse).load_table("db.t")
    snapshot = table.current_snapshot()
    ours = row_lineage.live_row_lineage(table, snapshot, columns=["id", "v"])
    names = ["id", "v", "_row_id", "_last_updated_sequence_number"]
    assert ours.num_rows == spark.num_rows, step
    assert _sorted(ours, names) == _sorted(spark, names), f"{step}: our lineage differs from Spark's"
    assert None not in ours.column("_row_id").to_pylist()
    assert len(set(ours.column("_row_id").to_pylist())) == ours.num_rows, f"{step}: row ids are not unique"
    con = duck.connect("iceberg")
    try:
        ddb = con.execute(f"SELECT id, v, _row_id, _last_updated_sequence_number FROM "
                          f"iceberg_scan('{table.metadata_location}')").to_arrow_table()
    finally:
        con.close()
    assert _sorted(ddb, names) == _sorted(ours, names), f"{step}: DuckDB's iceberg_scan differs from ours"
    files = row_lineage.native_files(table, snapshot)
    assert sum(f.first_row_id is None for f in files) == 0
    assert sum(f.record_count for f in files) - sum(len(row_lineage.deleted_positions(table.io, f)) for f in files) \
        == spark.num_rows
    for f in files:  # a data file's vector is a PUFFIN blob naming it
        if f.deletion_vector is not None:
            assert f.deletion_vector.file_format == FileFormat.PUFFIN
            assert manifests_v3.referenced_data_file(f.deletion_vector) == f.path


@dataclass
class History:
    """The table after every step ran, checked against Spark and DuckDB after each one."""

    warehouse: str
    seen_vectors: bool
    seen_written: bool


@pytest.fixture(scope="module")
def v3_table(reference, tmp_path_factory) -> History:
    """Runs every step once per worker: the tests below read the table the whole history left behind."""
    warehouse = str(tmp_path_factory.mktemp("v3") / "wh")
    os.makedirs(warehouse)
    reference.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS db")
    reference.sql(warehouse, f"CREATE TABLE db.t (id bigint, v string, p int) USING iceberg TBLPROPERTIES "
                             f"('format-version'='3', {MOR})")
    seen_vectors = seen_written = False
    for step, statement in STEPS:
        reference.sql(warehouse, statement)
        _check(reference, warehouse, step)
        table = default_catalog(warehouse).load_table("db.t")
        for f in row_lineage.native_files(table, table.current_snapshot()):
            seen_vectors |= f.deletion_vector is not None
            ids = row_lineage.read_row_lineage(f).column("_row_id").to_numpy()
            seen_written |= not np.array_equal(ids, f.first_row_id + np.arange(f.record_count))
    return History(warehouse, seen_vectors, seen_written)


def test_native_lineage_equals_spark_and_duckdb_after_every_step(v3_table):
    """The fixture checks every step (``_check``); here: both vectors and row ids written in files were read."""
    assert v3_table.seen_vectors and v3_table.seen_written


def test_first_row_id_inheritance_follows_manifest_order(reference, v3_table):
    """Inherited ids: the manifest's first_row_id plus the record counts of earlier files with a null one."""
    warehouse = v3_table.warehouse
    table = default_catalog(warehouse).load_table("db.t")
    snapshot = table.current_snapshot()
    assert snapshot.first_row_id is not None
    ids = row_lineage.first_row_ids(table, snapshot)
    ranges = sorted((first, first + f.record_count) for f in row_lineage.native_files(table, snapshot)
                    if (first := ids[f.path]) is not None)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False)), "row id ranges of live files overlap"
    assert max(hi for _, hi in ranges) <= table.metadata.next_row_id
    # every earlier snapshot reads the same way (time travel)
    for snap in table.metadata.snapshots[:3]:
        old = row_lineage.live_row_lineage(table, snap, columns=["id"])
        rows = reference.sql(warehouse, f"SELECT id, _row_id, _last_updated_sequence_number FROM db.t "
                                       f"VERSION AS OF {snap.snapshot_id}")
        names = ["id", "_row_id", "_last_updated_sequence_number"]
        assert _sorted(old, names) == _sorted(rows, names)


def test_read_row_lineage_of_selected_positions(v3_table):
    table = default_catalog(v3_table.warehouse).load_table("db.t")
    f = row_lineage.native_files(table, table.current_snapshot())[0]
    everything = row_lineage.read_row_lineage(f)
    picked = np.array([0, f.record_count - 1], np.int64)
    some = row_lineage.read_row_lineage(f, picked)
    assert some.to_pylist() == everything.take(pa.array(picked)).to_pylist()
