"""The table metadata file: each snapshot's JSON encoded once and spliced in, byte for byte pyiceberg's serialisation."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import SCHEMA
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.typedef import IcebergBaseModel

import lineage
from lineage.iceberg import v3_metadata


@pytest.mark.parametrize("format_version", [2, 3])
def test_spliced_metadata_equals_pyiceberg_serialisation(warehouse: str, format_version: int) -> None:
    t = lineage.create_table("db.meta", SCHEMA, key=["id"], warehouse=warehouse, properties={
        "format-version": str(format_version), "note": '{"snapshots":[]}'})  # the marker's text in a value is escaped
    t.append(pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1.0, 2.0]}, schema=SCHEMA))
    t.update("id = 1", {"amount": "amount + 1"})
    meta = t.iceberg.metadata
    base = meta.snapshots[-1]
    many = [*meta.snapshots, *(base.model_copy(update={"snapshot_id": base.snapshot_id + i, "parent_snapshot_id": base.snapshot_id + i - 1})
                               for i in range(1, 40))]
    big = meta.model_copy(update={"snapshots": many})
    want = IcebergBaseModel.model_dump_json(v3_metadata.with_next_row_id(big)).encode()
    assert v3_metadata.metadata_json(big) == want  # encodes and remembers each snapshot
    assert all((s.snapshot_id, True) in v3_metadata._SNAPSHOT_JSON for s in many)  # spliced, not encoded whole
    assert v3_metadata.metadata_json(big) == want  # from the remembered snapshots
    assert TableMetadataUtil.parse_raw(v3_metadata.metadata_json(big)).snapshots == many
    grown = big.model_copy(update={"snapshots": [*many, base.model_copy(update={"snapshot_id": base.snapshot_id + 99})]})
    assert v3_metadata.metadata_json(grown) == IcebergBaseModel.model_dump_json(v3_metadata.with_next_row_id(grown)).encode()  # extended
    fewer = big.model_copy(update={"snapshots": many[5:]})  # expired snapshots: joined anew
    assert v3_metadata.metadata_json(fewer) == IcebergBaseModel.model_dump_json(v3_metadata.with_next_row_id(fewer)).encode()
    # a snapshot object with a remembered id but other content (another table's) is encoded anew
    other = many[-1].model_copy(update={"timestamp_ms": many[-1].timestamp_ms + 1})
    changed = big.model_copy(update={"snapshots": [*many[:-1], other]})
    assert v3_metadata.metadata_json(changed) == IcebergBaseModel.model_dump_json(v3_metadata.with_next_row_id(changed)).encode()
    # the table still reads after commits past the splicing threshold
    for i in range(3, 20):
        t.append(pa.table({"id": [i], "name": ["x"], "amount": [0.0]}, schema=SCHEMA))
    assert lineage.open_table("db.meta", warehouse=warehouse).scan().num_rows == 19
