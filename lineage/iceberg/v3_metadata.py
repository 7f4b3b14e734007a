"""Iceberg format version 3 table metadata, written as the spec says.

pyiceberg 0.12 models v3 metadata (``TableMetadataV3`` with ``next-row-id``,
snapshots with ``first-row-id`` and ``added-rows``) and applies updates to it
(adding a snapshot advances ``next-row-id`` by the snapshot's ``added-rows``),
but refuses to serialise it. This module writes the JSON itself: the same
fields pyiceberg writes for v2 plus the v3 ones, with ``next-row-id`` always
present (the spec requires it; a table created or upgraded by pyiceberg has
none yet, which the spec defines as 0).

The catalog commit (:func:`lineage.catalog.commit_metadata`) writes every
metadata file through :func:`write_table_metadata` and applies updates
through :func:`apply_updates`, so a v3 table's commit stays one
compare-and-swap on the catalog's pointer.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.utils.config import Config
from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.typedef import IcebergBaseModel

V3 = 3
SUPPORTED_FORMAT_VERSIONS = (2, 3)


def is_v3(metadata: TableMetadata) -> bool:
    """Whether ``metadata`` is of format version 3 or later (row lineage, deletion vectors)."""
    return int(metadata.format_version) >= V3


def with_next_row_id(metadata: TableMetadata) -> TableMetadata:
    """``metadata`` with ``next-row-id`` set (0 when a v3 table has none yet, as the spec initialises it)."""
    if is_v3(metadata) and getattr(metadata, "next_row_id", None) is None:
        return metadata.model_copy(update={"next_row_id": 0})
    return metadata


def apply_updates(base: TableMetadata, updates: Iterable[Any], context: Any) -> TableMetadata:
    """Apply pyiceberg table updates one by one, keeping ``next-row-id`` defined on v3 metadata.

    pyiceberg advances ``next-row-id`` only when the base has one; an upgrade
    to v3 leaves it unset, so it is set to 0 after every update.
    """
    from pyiceberg.table.update import UpgradeFormatVersionUpdate, _apply_table_update

    metadata = with_next_row_id(base)
    for change in updates:
        if isinstance(change, UpgradeFormatVersionUpdate) and change.format_version == V3 and metadata.format_version == 2:
            metadata = _upgraded(metadata)  # pyiceberg 0.12 refuses to upgrade past 2
            context.add_update(change)
        else:
            metadata = with_next_row_id(_apply_table_update(change, metadata, context))
    return metadata


def upgraded(metadata: TableMetadata, next_row_id: int) -> TableMetadata:
    """v2 ``metadata`` as v3 with ``next-row-id`` = ``next_row_id`` (the base of a commit that upgrades a lineage table).

    The spec's upgrade sets ``next-row-id`` to 0; a lineage table's rows already
    have ids below its own high-water mark, so the commit that upgrades it
    starts assigning ids there (a snapshot's ``first-row-id`` may exceed the
    table's ``next-row-id``; ids are unique, not dense).
    """
    return _upgraded(metadata).model_copy(update={"next_row_id": int(next_row_id)})


def _upgraded(metadata: TableMetadata) -> TableMetadata:
    """v2 ``metadata`` as v3 (the spec's upgrade: ``next-row-id`` 0, snapshots unchanged, so without row ids)."""
    obj = IcebergBaseModel.model_dump(metadata, mode="json")
    obj.update({"format-version": V3, "next-row-id": 0})
    return TableMetadataV3.model_validate(obj)


def metadata_json(metadata: TableMetadata, exclude_none: bool = True) -> bytes:
    """The metadata file's bytes (UTF-8 JSON); v3 too, which pyiceberg's ``model_dump_json`` refuses.

    The bytes are pyiceberg's serialisation, but each snapshot's JSON is
    encoded once per process (:data:`_SNAPSHOT_JSON`) and spliced in: every
    commit writes the whole snapshot list again, and encoding it anew made a
    commit's cost grow with the number of snapshots since the last expiry.
    """
    metadata = with_next_row_id(metadata)
    snapshots = metadata.snapshots
    if len(snapshots) >= _SPLICE_FROM:
        shell = IcebergBaseModel.model_dump_json(metadata.model_copy(update={"snapshots": []}), exclude_none=exclude_none)
        if shell.count(_NO_SNAPSHOTS) == 1:  # (a property value holding the same text would be escaped)
            body = _snapshots_body(str(metadata.table_uuid), tuple(snapshots), exclude_none)
            return shell.replace(_NO_SNAPSHOTS, f'"snapshots":[{body}]').encode("utf-8")
    return IcebergBaseModel.model_dump_json(metadata, exclude_none=exclude_none).encode("utf-8")


_SPLICE_FROM = 16  # snapshots: below this, encoding the list whole costs no more than splicing it
_NO_SNAPSHOTS = '"snapshots":[]'
# Snapshot id -> (the snapshot, its JSON): snapshots are immutable; the object is kept so the entry is its own.
_SNAPSHOT_JSON: OrderedDict[tuple[int, bool], tuple[Snapshot, str]] = OrderedDict()
_SNAPSHOT_JSON_MAX = 20_000
_SNAPSHOT_JSON_LOCK = threading.Lock()


# Table uuid -> the snapshots of the last metadata encoded and their joined JSON: the next commit's list is the
# same objects plus its own snapshot, so the text is extended, not joined from 500 parts again.
_LAST_BODY: OrderedDict[tuple[str, bool], tuple[tuple[Snapshot, ...], str]] = OrderedDict()


def _snapshots_body(table_uuid: str, snapshots: tuple[Snapshot, ...], exclude_none: bool) -> str:
    """The JSON of ``snapshots`` joined by commas (the inside of the metadata's ``snapshots`` array)."""
    key = (table_uuid, exclude_none)
    with _SNAPSHOT_JSON_LOCK:
        last = _LAST_BODY.get(key)
    n = len(last[0]) if last is not None else 0
    if last is not None and 0 < n <= len(snapshots) and all(map(operator.is_, last[0], snapshots[:n])):
        body = "".join([last[1], *("," + _snapshot_json(snap, exclude_none) for snap in snapshots[n:])])
    else:
        body = ",".join(_snapshot_json(snap, exclude_none) for snap in snapshots)
    with _SNAPSHOT_JSON_LOCK:
        _LAST_BODY[key] = (snapshots, body)
        _LAST_BODY.move_to_end(key)
        while len(_LAST_BODY) > 64:
            _LAST_BODY.popitem(last=False)
    return body


def _snapshot_json(snapshot: Snapshot, exclude_none: bool) -> str:
    key = (snapshot.snapshot_id, exclude_none)
    with _SNAPSHOT_JSON_LOCK:
        hit = _SNAPSHOT_JSON.get(key)
        if hit is not None and (hit[0] is snapshot or hit[0] == snapshot):
            _SNAPSHOT_JSON.move_to_end(key)
            return hit[1]
    text = IcebergBaseModel.model_dump_json(snapshot, exclude_none=exclude_none)
    with _SNAPSHOT_JSON_LOCK:
        _SNAPSHOT_JSON[key] = (snapshot, text)
        while len(_SNAPSHOT_JSON) > _SNAPSHOT_JSON_MAX:
            _SNAPSHOT_JSON.popitem(last=False)
    return text


def write_table_metadata(metadata: TableMetadata, io: FileIO, location: str) -> None:
    """Write a table metadata file at ``location`` (any format version; v2 with pyiceberg's ``None`` handling)."""
    exclude_none = is_v3(metadata) or not Config().get_bool("legacy-current-snapshot-id")
    data = Compressor.get_compressor(location).bytes_compressor()(metadata_json(metadata, exclude_none))
    with io.new_output(location).create(overwrite=False) as out:
        out.write(data)
