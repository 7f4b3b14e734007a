"""Adoption: make an existing Iceberg v2 or v3 table a lineage table, without rewriting a data file.

:func:`adopt` commits one snapshot (Iceberg operation ``replace``: no data or
delete file changes, no change events) whose lineage list describes every
live data file of the table's current snapshot: row ids are ranges over the
files' record counts (file after file, in planning order: manifest order,
then entry order), so no data is read for them; every position (also those
already deleted) has a row id, and created = updated = the adoption version.
For a keyed table (``key=`` or the table's own identifier fields) the commit
also carries the key index, built from one scan of the live key columns; the
key columns become the schema's identifier fields (made required) and must
hold no NULL and no duplicate among the live rows. The table property
``lineage.enabled`` and the schema change land in the same catalog commit as
the snapshot, so a failed adoption leaves a plain Iceberg table.

Equality delete files (Flink's sink) are converted to position deletes first
(:mod:`lineage.maintenance.convert`, its own ``replace`` commit, changing no
reader's answer; deletion vectors on a v3 table), so the adopted state has
position deletes only.

A v3 table keeps its native row lineage: each file's lineage holds the row
ids every v3 reader returns (``_row_id``, read from the files where written,
else inherited), and created = updated = the row's
``_last_updated_sequence_number`` (versions are sequence numbers; v3 has no
created field); positions deleted already get version 0 (never visible: an
updated row's old image shares its row id with the new one); the lineage
list continues from the table's ``next-row-id``.

The change feed starts at the adoption version: its lineage list records it
(``adopted``), and a range starting earlier raises
:class:`~lineage.errors.RetentionError` naming it. Snapshots before it have
no lineage and cannot be read with ``as_of``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation
from pyiceberg.types import NestedField, PrimitiveType

from index.key_index import KeyIndex, KeyIndexChange, index_enabled
from index.key_merge_policy import FULL
import lineage.duck as duck
from lineage.catalog import load_iceberg, resolve_catalog
from lineage.commits.commit import CommitRequest, commit_change
from lineage.errors import CommitConflictError, InvalidArgumentError, KeyViolationError, UnknownColumnError
from lineage.maintenance.convert import convert_equality_deletes
from lineage.storage.metadata import FileLineage, LineageList, lineage_dir, write_segment
from lineage.outcome import Attempt, CommitLoop
from lineage.iceberg.planning import is_v3, plan_snapshot
from lineage.iceberg.row_lineage import native_lineage
from lineage.sql.predicate import quote_ident
from lineage.properties import COMMIT_RETRIES, LINEAGE_ENABLED as PROP_LINEAGE
from lineage.properties import read as read_property
from lineage.storage.rle import sequence_run, value_run
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import arrow_schema, projection_field_ids
from lineage.state import TableState
from lineage.table import Table

OPERATION = "adopt"


@dataclass(frozen=True)
class Adoption:
    """What :func:`adopt` committed."""

    version: int
    snapshot_id: int
    data_files: int
    rows: int  # positions given row ids (live rows plus rows already deleted by position deletes)
    key: tuple[str, ...]
    converted: int  # equality delete files converted to position deletes (v3: deletion vectors) first
    table: Table  # the lineage table, open


def adopt(
    name: str,
    *,
    key: Sequence[str] | None = None,
    warehouse: str | os.PathLike[str] | None = None,
    catalog: Catalog | None = None,
) -> Adoption:
    """Make the existing Iceberg v2 or v3 table ``name`` a lineage table (see the module docs); returns what was committed.

    ``key`` names key columns (default: the table's identifier fields, if
    any). Raises InvalidArgumentError for a table that is a lineage table
    already or not format v2 or v3, UnknownColumnError for unknown key columns,
    KeyViolationError when the live rows hold NULL or duplicate keys.
    """
    cat = resolve_catalog(warehouse, catalog)
    ice, full = load_iceberg(cat, name)
    _check_adoptable(ice, full)
    names = _key_names(ice, key, full)
    converted = [0]

    def convert() -> None:
        converted[0] += convert_equality_deletes(ice, lambda: ice.refresh(), full).equality_files

    if _has_equality_deletes(ice):
        convert()

    def attempt(a: Attempt) -> Adoption:
        _check_adoptable(ice, full)  # another process may have adopted it meanwhile
        txn = ice.transaction()
        if names:
            schema = ice.schema()
            with txn.update_schema(allow_incompatible_changes=True) as update:
                for n in names:
                    if not schema.find_field(n).required:
                        update.update_column(n, required=True)
                update.set_identifier_fields(*names)
        txn.set_properties({PROP_LINEAGE: "true"})
        view = IcebergTable(ice._identifier, txn.table_metadata, ice.metadata_location, ice.io, ice.catalog)  # the table as adopted
        snap = view.metadata.current_snapshot()
        planned = plan_snapshot(view, snap) if snap is not None else []
        if any(p.equality_deletes for p in planned):  # a writer added some after they were converted
            convert()
            raise CommitFailedException("equality deletes were added during adoption; converted them, planning again")
        version = view.metadata.next_sequence_number()
        lineages, next_row_id = [], 0
        if snap is not None and is_v3(view):  # native row ids (row_lineage.file_lineage)
            lineages, next_row_id = native_lineage(view, snap)
        else:
            for p in planned:
                n = p.data_file.record_count
                lineages.append(FileLineage(p.data_file.file_path, n, sequence_run(next_row_id, n), value_run(version, n), value_run(version, n)))
                next_row_id += n
        segments: tuple[str, ...] = ()
        sizes: dict[str, int] = {}
        if lineages:
            path = f"{lineage_dir(view.metadata.location)}/{version:09d}-{uuid.uuid4()}-adopt-segment.parquet"
            a.files.append(path)
            sizes[path] = write_segment(view.io, path, lineages)
            segments = (path,)
        base = LineageList(version=0, next_row_id=next_row_id, segments=segments, segment_bytes=sizes, adopted=version)
        state = TableState(view, snap, base, {})
        change = None
        if names and index_enabled(view):
            _check_null_keys(state, names, full)
            change = KeyIndexChange(index=KeyIndex.build(state), merge=FULL)  # raises KeyViolationError on duplicates
        request = CommitRequest(
            OPERATION, Operation.REPLACE, key_index=change, metadata_updates=txn._updates, metadata_requirements=txn._requirements
        )
        result = commit_change(ice, state, request, a)
        rows = sum(fl.record_count for fl in lineages)
        return Adoption(result.version, result.snapshot_id, len(lineages), rows, tuple(names), converted[0], Table(ice, cat))

    retries = int(read_property(ice.metadata.properties, COMMIT_RETRIES))
    loop: CommitLoop[Adoption] = CommitLoop(f"{full}: adopt", lambda: ice, lambda: ice.refresh(), retries)
    return loop.run(attempt, lambda n: CommitConflictError(f"gave up adopting {full} after {n} attempts: other writers kept committing"))


def _check_adoptable(ice: IcebergTable, name: str) -> None:
    if ice.metadata.properties.get(PROP_LINEAGE) == "true":
        raise InvalidArgumentError(f"table {name} is a lineage table already (created or adopted before); open it with lineage.open_table")
    if ice.metadata.format_version not in (2, 3):
        raise InvalidArgumentError(
            f"table {name} has Iceberg format version {ice.metadata.format_version}; adoption needs format version 2 or 3 "
            "(upgrade it first, e.g. ALTER TABLE ... SET TBLPROPERTIES ('format-version'='2'))"
        )


def _key_names(ice: IcebergTable, key: Sequence[str] | None, name: str) -> list[str]:
    schema = ice.schema()
    if key is None:
        return [schema.find_column_name(i) for i in schema.identifier_field_ids]  # type: ignore[misc]
    names = [key] if isinstance(key, str) else list(key)
    if not names or not all(isinstance(k, str) and k for k in names) or len(set(names)) != len(names):
        raise InvalidArgumentError(f"key must be a list of distinct column names, got {key!r}")
    top = {f.name: f for f in schema.fields}
    unknown = [k for k in names if k not in top]
    if unknown:
        raise UnknownColumnError(f"key column(s) {unknown} are not columns of {name} (columns: {list(top)})")
    bad = [k for k in names if not isinstance(top[k].field_type, PrimitiveType) or _is_float(top[k])]
    if bad:
        raise InvalidArgumentError(f"key column(s) {bad} of {name} cannot be a key (nested or floating point)")
    return names


def _is_float(field: NestedField) -> bool:
    return str(field.field_type) in ("float", "double")


def _has_equality_deletes(ice: IcebergTable) -> bool:
    snap = ice.metadata.current_snapshot()
    if snap is None:
        return False
    for manifest in snap.manifests(ice.io):
        if manifest.content == 0:
            continue
        for entry in manifest.fetch_manifest_entry(ice.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                return True
    return False


def _check_null_keys(state: TableState, names: list[str], table: str) -> None:
    """Refuse live rows with a NULL key (they cannot be a key's image)."""
    schema = arrow_schema(state.iceberg.schema())
    con = duck.connect()
    try:
        register_live_view(con, "live", state.live_files(), schema, projection_field_ids(state.iceberg.metadata))
        cond = " OR ".join(f"{quote_ident(n)} IS NULL" for n in names)
        (count,) = con.execute(f"SELECT count(*) FROM live WHERE {cond}").fetchone()  # type: ignore[misc]
    finally:
        con.close()
    if count:
        raise KeyViolationError(f"table {table} cannot be adopted with key {names}: {count} live row(s) have a NULL key; nothing was changed")
