"""CONVERT (``Table.convert_equality_deletes``): equality deletes become position deletes with their sequence numbers.

The reference engine (Spark 3.5 + Iceberg 1.10) reads the table before and after: the rows must be identical,
and afterwards no equality delete file is live.
"""

from __future__ import annotations

import pyarrow as pa
from conftest import SCHEMA, rows
from pyiceberg.manifest import DataFileContent
from test_changelog_equality import EQ, _apply, _events

import lineage
from lineage.maintenance import convert as convert_module
from lineage.storage.metadata import SUMMARY_OPERATION
from lineage.iceberg.planning import live_entries, sequence_of


def _spark(reference, warehouse):
    return rows(reference.read(warehouse, "shop.orders").select(SCHEMA.names).cast(SCHEMA))


def _live_deletes(t: lineage.Table) -> dict[DataFileContent, list]:
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    out: dict[DataFileContent, list] = {}
    for e in live_entries(t.iceberg, snap.manifests(t.iceberg.io)):
        out.setdefault(e.data_file.content, []).append(e)
    return out


def _start(warehouse, partition_by=None, properties=None) -> lineage.Table:
    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], partition_by=partition_by, warehouse=warehouse, properties=properties)
    t.append(pa.table({"id": list(range(6)), "name": [f"n{k}" for k in range(6)], "amount": [float(k) for k in range(6)]}))
    return t


def test_convert_flink_equality_deletes(reference, warehouse):
    t = _start(warehouse, partition_by=["bucket(2, id)"])
    reference.flink_commit(
        warehouse, "shop.orders",
        [("+I", {"id": 1, "name": "x", "amount": 9.0}), ("-D", {"id": 2}), ("+I", {"id": 10, "name": "t", "amount": 1.0}),
         ("+I", {"id": 11, "name": "e", "amount": 1.0}), ("-D", {"id": 11})],
        upsert=True,
    )
    # Non-upsert mode: whole-row equality deletes (only the key columns decide).
    reference.flink_commit(warehouse, "shop.orders", [("-U", {"id": 3, "name": "n3", "amount": 3.0}), ("+U", {"id": 3, "name": "z", "amount": 0.5})])
    before = _spark(reference, warehouse)
    eq_before = {e.data_file.file_path: sequence_of(e) for e in _live_deletes(t)[DataFileContent.EQUALITY_DELETES]}
    version = t.iceberg.metadata.current_snapshot().sequence_number

    result = t.convert_equality_deletes()
    assert result.version == version + 1 and result.equality_files == len(eq_before)
    assert result.positions == 3 and result.data_files >= 1  # keys 1, 2 and 3 of the first commit's files
    snap = t.iceberg.metadata.current_snapshot()
    assert snap.summary.operation.value == "replace" and snap.summary.additional_properties[SUMMARY_OPERATION] == "convert-deletes"
    live = _live_deletes(t)
    assert DataFileContent.EQUALITY_DELETES not in live
    converted = [e for e in live[DataFileContent.POSITION_DELETES] if e.snapshot_id == snap.snapshot_id]
    assert len(converted) == result.position_files
    assert {sequence_of(e) for e in converted} <= set(eq_before.values())  # the replaced deletes' numbers, not the snapshot's
    assert all(sequence_of(e) < snap.sequence_number for e in converted)
    assert _spark(reference, warehouse) == before
    again = t.convert_equality_deletes()
    assert again.version is None and "no equality" in again.detail
    reference.forget(warehouse)


def test_convert_our_equality_commits_with_a_concurrent_writer(reference, warehouse, monkeypatch):
    t = _start(warehouse, properties=EQ)
    model = {k: (k, f"n{k}", float(k)) for k in range(6)}
    first = [("+U", 1, 10.0), ("-D", 2, None), ("+I", 7, 7.0), ("-D", 7, None), ("-D", 3, None), ("+I", 3, 3.5)]
    t.apply_changelog(_events(first), upsert=True)
    _apply(model, first)
    second = [("-U", 1, 10.0), ("+U", 1, 11.0), ("+I", 8, 8.0)]
    t.apply_changelog(_events(second), upsert=True)
    _apply(model, second)
    assert _spark(reference, warehouse) == sorted(model.values(), key=repr)

    # Another writer commits (new equality deletes) while CONVERT writes its files: CONVERT loses the race,
    # re-plans on the new head and converts those too.
    other = lineage.open_table("shop.orders", warehouse=warehouse)
    racing = [("-D", 4, None), ("+U", 8, 80.0)]
    real = convert_module.write_position_deletes
    calls = []

    def write_and_race(ice, targets, *args):  # type: ignore[no-untyped-def]
        if not calls:
            other.apply_changelog(_events(racing), upsert=True)
            _apply(model, racing)
        calls.append(1)
        return real(ice, targets, *args)

    monkeypatch.setattr(convert_module, "write_position_deletes", write_and_race)
    result = t.convert_equality_deletes()
    assert result.attempts == 2 and result.equality_files == 3
    assert DataFileContent.EQUALITY_DELETES not in _live_deletes(t)
    assert _spark(reference, warehouse) == sorted(model.values(), key=repr)
    # Equality commits after CONVERT still work and can be converted again.
    third = [("-D", 1, None), ("+I", 9, 9.0)]
    t.apply_changelog(_events(third), upsert=True)
    _apply(model, third)
    assert t.convert_equality_deletes().equality_files == 1
    assert _spark(reference, warehouse) == sorted(model.values(), key=repr)
    reference.forget(warehouse)


def test_convert_deletes_command(warehouse):
    """``lineage convert-deletes`` reports what it converted; a second run finds nothing to do."""
    import json

    from test_cli import ok, run

    t = _start(warehouse, properties=EQ)
    t.apply_changelog(_events([("-D", 1, None), ("+U", 2, 20.0), ("+I", 30, 3.0), ("-D", 30, None)]), upsert=True)
    first = json.loads(ok(run("--warehouse", warehouse, "-f", "json", "convert-deletes", "shop.orders")).stdout)
    assert first["operation"] == "convert-deletes" and first["committed"] and first["version"] == 3
    assert first["files_removed"] == 1 and first["files_added"] == 1
    assert "3 rows" in first["detail"] and "2 positions in 1 data file" in first["detail"]
    second = ok(run("--warehouse", warehouse, "convert-deletes", "shop.orders")).stdout
    assert "nothing to do" in second or "no equality delete files" in second
    assert DataFileContent.EQUALITY_DELETES not in _live_deletes(t)
