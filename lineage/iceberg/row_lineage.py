"""Native row lineage of Iceberg v3 snapshots: each row's ``_row_id`` and ``_last_updated_sequence_number``.

Following the spec ("Row Lineage", "First Row ID Inheritance"):

- a data file's ``first_row_id`` is the one its manifest entry records, else
  inherited: the manifest's ``first_row_id`` (from the manifest list) plus the
  ``record_count`` of every data file before it in the manifest whose
  ``first_row_id`` is null too; a manifest without one (a snapshot from before
  an upgrade to v3) gives its files none, and their rows a null ``_row_id``;
- a row's ``_row_id`` is the value in the data file where present and not
  null, else ``first_row_id + _pos``; its ``_last_updated_sequence_number`` is
  the value in the file where present and not null, else the data file's data
  sequence number;
- a data file's deletes are its deletion vector (at most one per data file in
  a snapshot), and any position delete files that still apply to it (a table
  upgraded from v2).

:func:`native_files` plans a snapshot with these, :func:`deleted_positions`
reads a file's deletes, :func:`read_row_lineage` a file's values and
:func:`live_row_lineage` puts them together for every live row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

import lineage.storage.files as files
import lineage.storage.manifests_v3 as manifests_v3
from lineage.errors import LineageMetadataError
from lineage.iceberg.planning import live_entries, plan_snapshot, snapshot_manifests
from lineage.storage.deletes import live_positions, positions_for
from lineage.storage.lineage_columns import LAST_UPDATED_FIELD_ID, ROW_ID_FIELD_ID, present_columns
from lineage.storage.metadata import FileLineage
from lineage.storage.puffin import read_deletion_vector
from lineage.storage.rle import encode_sequence, encode_values

ROW_ID = "_row_id"
LAST_UPDATED = "_last_updated_sequence_number"

LINEAGE_SCHEMA = pa.schema([
    pa.field("_pos", pa.int64(), nullable=False), pa.field(ROW_ID, pa.int64()), pa.field(LAST_UPDATED, pa.int64()),
])


@dataclass(frozen=True)
class NativeFile:
    """A live data file of a v3 snapshot with its native lineage and deletes.

    ``first_row_id`` is explicit or inherited (None when the snapshot
    assigned none); ``deletion_vector`` is the file's current vector (a
    PUFFIN delete-file entry) or None; ``position_deletes`` are Parquet or
    Avro position delete files that still apply.
    """

    data_file: DataFile
    sequence_number: int
    first_row_id: int | None
    deletion_vector: DataFile | None
    position_deletes: tuple[DataFile, ...] = ()

    @property
    def path(self) -> str:
        """The data file's location as the table's metadata names it."""
        return self.data_file.file_path

    @property
    def record_count(self) -> int:
        """Rows in the data file, deleted ones included."""
        return int(self.data_file.record_count)


def first_row_ids(table: IcebergTable, snapshot: Snapshot) -> dict[str, int | None]:
    """Data file path -> ``first_row_id`` (explicit or inherited) of every live data file of ``snapshot``."""
    out: dict[str, int | None] = {}
    for manifest in snapshot_manifests(table, snapshot):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in live_entries(table, [manifest]):  # read with first_row_id inherited (lineage.storage.manifests_v3)
            if entry.data_file.content == DataFileContent.DATA:
                out[entry.data_file.file_path] = manifests_v3.first_row_id(entry.data_file)
    return out


def native_files(table: IcebergTable, snapshot: Snapshot) -> list[NativeFile]:
    """Every live data file of ``snapshot`` with its ``first_row_id``, data sequence number and deletes.

    Raises :class:`LineageMetadataError` when a data file has two deletion
    vectors, which the spec forbids.
    """
    ids = first_row_ids(table, snapshot)
    out = []
    for planned in plan_snapshot(table, snapshot):
        if planned.equality_deletes:
            raise LineageMetadataError(
                f"data file {planned.data_file.file_path} has equality deletes: row lineage does not track rows "
                "through equality deletes (rewrite them as deletion vectors first)"
            )
        vectors = [d for d in planned.position_deletes if manifests_v3.is_deletion_vector(d)]
        if len(vectors) > 1:
            raise LineageMetadataError(
                f"data file {planned.data_file.file_path} has {len(vectors)} deletion vectors; the spec allows one per "
                "data file in a snapshot"
            )
        others = tuple(d for d in planned.position_deletes if not manifests_v3.is_deletion_vector(d))
        out.append(NativeFile(planned.data_file, planned.sequence_number, ids.get(planned.data_file.file_path),
                              vectors[0] if vectors else None, others))
    return out


def vector_positions(io: FileIO | None, vector: DataFile) -> np.ndarray:
    """Positions a deletion vector entry deletes (one ranged read of its blob)."""
    where = manifests_v3.content_range(vector)
    if where is None:
        raise LineageMetadataError(f"deletion vector {vector.file_path} has no content_offset/content_size_in_bytes")
    return read_deletion_vector(io, vector.file_path, *where)


def deleted_positions(io: FileIO | None, f: NativeFile) -> np.ndarray:
    """Sorted positions of ``f`` its deletion vector and position delete files remove."""
    parts = []
    if f.deletion_vector is not None:
        parts.append(vector_positions(io, f.deletion_vector))
    if f.position_deletes:
        parts.append(positions_for(f.path, [d.file_path for d in f.position_deletes]))
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.union1d(parts[0], parts[1])


def read_row_lineage(f: NativeFile, positions: np.ndarray | None = None) -> pa.Table:
    """``_pos``, ``_row_id`` and ``_last_updated_sequence_number`` of the rows of ``f`` at ``positions`` (all without).

    Values written in the file win where not null; the rest are inherited
    (``first_row_id + _pos`` and the file's data sequence number).
    """
    n = f.record_count
    pos = np.arange(n, dtype=np.int64) if positions is None else np.asarray(positions, np.int64)
    inherited_ids = None if f.first_row_id is None else pos + f.first_row_id
    row_id = pa.array(inherited_ids, pa.int64()) if inherited_ids is not None else pa.nulls(len(pos), pa.int64())
    updated = pa.array(np.full(len(pos), f.sequence_number, np.int64))
    parquet = files.parquet_file(f.path)
    present = present_columns(parquet.schema_arrow)
    if present:
        written = parquet.read(columns=list(present.values()), use_threads=False)
        if written.num_rows != n:
            raise LineageMetadataError(f"{f.path} has {written.num_rows} rows, its manifest entry says {n}")
        take = pa.array(pos)
        if ROW_ID_FIELD_ID in present:
            row_id = pc.coalesce(written.column(present[ROW_ID_FIELD_ID]).take(take).combine_chunks()
                                         .cast(pa.int64()), row_id)
        if LAST_UPDATED_FIELD_ID in present:
            updated = pc.coalesce(written.column(present[LAST_UPDATED_FIELD_ID]).take(take).combine_chunks()
                                          .cast(pa.int64()), updated)
    return pa.Table.from_arrays([pa.array(pos), row_id, updated], schema=LINEAGE_SCHEMA)


def live_row_lineage(table: IcebergTable, snapshot: Snapshot, columns: list[str] | None = None) -> pa.Table:
    """Every live row of ``snapshot``: ``_file``, ``_pos``, ``_row_id``, ``_last_updated_sequence_number`` and ``columns``.

    ``columns`` are data columns read by name from each file (for tests and
    checks; readers of values use :mod:`lineage.read`).
    """
    pieces = []
    for f in native_files(table, snapshot):
        live = live_positions(f.record_count, deleted_positions(table.io, f))
        piece = read_row_lineage(f, live)
        if columns:
            values = files.parquet_file(f.path).read(columns=columns, use_threads=False).take(pa.array(live))
            for name in columns:
                piece = piece.append_column(name, values.column(name))
        pieces.append(piece.add_column(0, "_file", pa.array([f.path] * piece.num_rows, pa.string())))
    if not pieces:
        schema = pa.schema([pa.field("_file", pa.string())] + list(LINEAGE_SCHEMA))
        return schema.empty_table()
    return pa.concat_tables(pieces)



def file_lineage(f: NativeFile, dead: np.ndarray | None = None) -> FileLineage:
    """This library's lineage of every position of ``f`` (deleted ones too), from its native values.

    Row ids are the native ``_row_id``; created = updated = the row's
    ``_last_updated_sequence_number`` (versions are sequence numbers; v3 has
    no created field, so a row's last update is the oldest version known to
    have held it). Positions in ``dead`` (deleted already) get version 0,
    never visible: an updated row's old image shares its ``_row_id`` with the
    new one. Raises :class:`LineageMetadataError` for a file without row ids
    (written before the table's upgrade to v3 and not yet assigned any by a
    later snapshot).
    """
    if f.first_row_id is None:
        raise LineageMetadataError(
            f"data file {f.path} has no row ids: its snapshot was committed before the table was upgraded to format "
            "version 3 (commit once with the engine that upgraded it, which assigns them, then retry)"
        )
    values = read_row_lineage(f)
    ids = values.column(ROW_ID).to_numpy()
    updated = values.column(LAST_UPDATED).to_numpy().copy()
    if dead is not None and len(dead):
        updated[dead[dead < len(updated)]] = 0
    return FileLineage(f.path, f.record_count, encode_sequence(ids), encode_values(updated), encode_values(updated))


def native_lineage(table: IcebergTable, snapshot: Snapshot) -> tuple[list[FileLineage], int]:
    """The lineage of every live data file of a v3 ``snapshot`` from its native values (deleted positions: version 0),
    and the table's ``next-row-id``."""
    lineages = [file_lineage(f, deleted_positions(table.io, f)) for f in native_files(table, snapshot)]
    next_row_id = int(getattr(table.metadata, "next_row_id", None) or 0)
    top = max((int((fl.row_ids.values + fl.row_ids.lengths - 1).max()) for fl in lineages if len(fl.row_ids)), default=-1)
    return lineages, max(next_row_id, top + 1)
