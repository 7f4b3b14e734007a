"""Writing Parquet data files, position delete files and equality delete files for a commit.

Data files are written as pyiceberg writes them (field ids, statistics,
partition values; :func:`lineage.storage.v3_parquet.write_files`); we only
decide which rows go to which file so that each file's lineage is known
exactly. Position delete files follow the Iceberg spec
(reserved field ids 2147483546 ``file_path`` and 2147483545 ``pos``), sorted
by path and position, with path bounds so readers match them to their data
file without opening them.
"""

from __future__ import annotations

import io as _io
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import WriteTask
from pyiceberg.table.locations import load_location_provider
from pyiceberg.types import LongType, StringType

from lineage.columns import HIDDEN_COLUMNS
from lineage.errors import UnsupportedFormatError
import lineage.storage.lineage_columns as lineage_columns
import lineage.storage.v3_parquet as v3_parquet
from lineage.storage.deletes import PATH_FIELD_ID, remember_vectors
from lineage.storage.fileio import write_bytes
import lineage.storage.written_keys as written_keys
from lineage.properties import TARGET_FILE_SIZE, read
from lineage.storage.rle import Runs

POS_FIELD_ID = 2147483545
POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_FIELD_ID)}),
    ]
)

_DELETE_WRITE_SCHEMA = pa.schema([POSITION_DELETE_SCHEMA.field(0).with_type(pa.dictionary(pa.int32(), pa.string())),
                                  POSITION_DELETE_SCHEMA.field(1)])

# Hidden columns that carry lineage through partitioning; never written.
_HIDDEN = HIDDEN_COLUMNS


@dataclass(frozen=True)
class WrittenFile:
    """A data file written for a commit, with what is known of its rows' lineage.

    ``None`` means "assigned at commit": fresh row ids for ``row_ids`` and the
    commit's version for ``created`` / ``updated``. Values are per-row arrays
    or, when an engine encoded them already, :class:`~lineage.storage.rle.Runs`;
    in an array, :data:`FRESH` marks one row so (see :func:`with_fresh_rows`).
    """

    data_file: DataFile
    row_ids: np.ndarray | Runs | None
    created: np.ndarray | Runs | None
    updated: np.ndarray | Runs | None


FRESH = -1  # a row id or created version in a WrittenFile's array that the commit assigns (a fresh insert's)


def with_fresh_rows(images: pa.Table, inserts: pa.Table) -> pa.Table:
    """``images`` (data columns and hidden lineage columns) followed by ``inserts`` (data columns only), whose hidden
    columns are :data:`FRESH`: written as one set of data files, the inserts get fresh row ids and the commit's version."""
    fresh = inserts
    for f in images.schema:
        if f.name in _HIDDEN and f.name not in inserts.column_names:
            fresh = fresh.append_column(f, pa.array(np.full(inserts.num_rows, FRESH, np.int64)).cast(f.type))
    return pa.concat_tables([images, fresh.select(images.column_names).cast(images.schema)])


def _target_rows(table: pa.Table, properties: dict[str, str]) -> int:
    target = int(read(properties, TARGET_FILE_SIZE))
    per_row = max(1.0, table.nbytes / max(1, table.num_rows))
    return max(1, int(target / per_row))


def write_data_files(iceberg: IcebergTable, data: pa.Table) -> list[WrittenFile]:
    """Write ``data`` (table columns plus optional hidden lineage columns) as data files.

    ``iceberg`` may be any object with the table's ``metadata`` and ``io``
    (Spark executors pass a lightweight stand-in).

    Rows keep their order inside each partition; hidden columns, when present,
    are returned per file as lineage arrays.
    """
    # pyiceberg's writer (its module imports pyarrow.dataset and pandas) and our FileIO over it: at the first write
    from pyiceberg.io.pyarrow import _determine_partitions

    from lineage.storage.store_fileio import bound

    if data.num_rows == 0:
        return []
    metadata = iceberg.metadata
    schema = metadata.schema()
    spec = metadata.spec()
    if spec.is_unpartitioned():
        parts = [(None, data)]
    else:
        parts = [(p.partition_key, p.arrow_table_partition) for p in _determine_partitions(spec, schema, data)]
    write_uuid = uuid.uuid4()
    tasks: list[WriteTask] = []
    lineage: list[tuple[np.ndarray | None, ...]] = []
    bodies: list[pa.Table] = []  # each file's rows (their key columns are kept for the key index)
    # Iceberg v3: rows that keep their id carry _row_id and _last_updated_sequence_number in the file (spec, Row Lineage).
    native = lineage_columns.writes_lineage_columns(metadata) and _HIDDEN[0] in data.column_names
    write_schema = lineage_columns.write_schema(schema) if native else schema
    for key, part in parts:
        step = _target_rows(part, metadata.properties)
        for start in range(0, part.num_rows, step):
            chunk = part.slice(start, step)
            hidden = tuple(
                chunk.column(c).to_numpy().astype(np.int64) if c in chunk.column_names else None for c in _HIDDEN
            )
            body = chunk.drop_columns([c for c in _HIDDEN if c in chunk.column_names])
            if native:
                body = lineage_columns.with_lineage_columns(body, hidden[0], hidden[2])  # type: ignore[arg-type]
            tasks.append(
                WriteTask(write_uuid=write_uuid, task_id=len(tasks), schema=write_schema, record_batches=body.to_batches(), partition_key=key)
            )
            lineage.append(hidden)
            bodies.append(body)
    if native:
        data_files = [lineage_columns.without_lineage_stats(df) for df in _native_files(bound(iceberg.io), metadata, tasks)]
    else:
        data_files = _write_files(bound(iceberg.io), metadata, tasks)  # pyiceberg's threads join the caller's puts
    key_names = [schema.find_column_name(fid) for fid in schema.identifier_field_ids]
    if key_names:  # the key index reads these next (a commit's delta, or the first build after a bulk append)
        for df, body in zip(data_files, bodies, strict=True):
            written_keys.remember(df.file_path, body.select(key_names))
    return [WrittenFile(df, *hidden) for df, hidden in zip(data_files, lineage, strict=True)]


def write_copy(
    iceberg: IcebergTable, data: pa.Table, template: DataFile, lineage: tuple[np.ndarray, np.ndarray] | None = None
) -> DataFile:
    """Write ``data`` as one data file in ``template``'s partition, whatever its values say.

    Used to rewrite a file in place (same rows, same positions) when some
    values were erased and no longer determine the partition. On Iceberg v3,
    ``lineage`` (row ids, updated versions) is written into the copy so that
    its rows keep their native ``_row_id`` and ``_last_updated_sequence_number``.
    """
    from lineage.storage.store_fileio import bound

    metadata = iceberg.metadata
    schema = metadata.schema()
    native = lineage is not None and lineage_columns.writes_lineage_columns(metadata)
    if native:
        data = lineage_columns.with_lineage_columns(data, *lineage)
        schema = lineage_columns.write_schema(schema)
    task = WriteTask(write_uuid=uuid.uuid4(), task_id=0, schema=schema, record_batches=data.to_batches(), partition_key=None)
    (df,) = _native_files(bound(iceberg.io), metadata, [task]) if native else _write_files(bound(iceberg.io), metadata, [task])
    df = lineage_columns.without_lineage_stats(df)
    return restamped(df, df.content, template.partition, None, spec_id_of(template, iceberg.metadata.default_spec_id))


def _native_files(file_io: Any, metadata: Any, tasks: list[WriteTask]) -> list[DataFile]:
    """Data files with the v3 row lineage columns (``metadata``: the table's), ``_row_id`` delta-encoded in Parquet
    (:mod:`lineage.storage.v3_parquet`)."""
    return _write_files(file_io, lineage_columns.write_metadata(metadata), tasks)


def _write_files(file_io: Any, metadata: Any, tasks: list[WriteTask]) -> list[DataFile]:
    """One data file per task, of ``metadata``'s current schema: :func:`lineage.storage.v3_parquet.write_files` for
    Parquet, pyiceberg's writer (which refuses it) for another file format."""
    from pyiceberg.io.pyarrow import write_file

    if metadata.properties.get("write.format.default", "parquet").lower() != "parquet":
        return list(write_file(file_io, metadata, iter(tasks)))
    return v3_parquet.write_files(file_io, metadata, tasks)


def restamped(df: DataFile, content: DataFileContent, partition: Any, equality_ids: list[int] | None, spec_id: int) -> DataFile:
    """A copy of the writer's ``df`` with another content, partition, equality ids and spec id (statistics kept)."""
    return DataFile.from_args(
        content=content,
        file_path=df.file_path,
        file_format=df.file_format,
        partition=partition,
        record_count=df.record_count,
        file_size_in_bytes=df.file_size_in_bytes,
        column_sizes=df.column_sizes,
        value_counts=df.value_counts,
        null_value_counts=df.null_value_counts,
        nan_value_counts=df.nan_value_counts,
        lower_bounds=df.lower_bounds,
        upper_bounds=df.upper_bounds,
        split_offsets=df.split_offsets,
        equality_ids=equality_ids,
        sort_order_id=None,
        spec_id=spec_id,
        key_metadata=None,
    )


def write_equality_deletes(iceberg: IcebergTable, keys: pa.Table, field_ids: Sequence[int]) -> list[DataFile]:
    """Equality delete files (one per partition of the current spec) of the rows ``keys`` on columns ``field_ids``.

    ``keys`` has exactly the columns of ``field_ids`` (by name); each row
    deletes the rows of older data files equal to it in those columns. The
    partition of a row follows from its values, so the spec's source columns
    must be among them (or the spec unpartitioned: a global delete).
    """
    from pyiceberg.io.pyarrow import _determine_partitions

    from lineage.storage.store_fileio import bound

    if keys.num_rows == 0:
        return []
    meta = iceberg.metadata
    schema = meta.schema()
    eq_schema = Schema(*[schema.find_field(i) for i in field_ids], schema_id=schema.schema_id, identifier_field_ids=list(field_ids))
    keys = keys.select([schema.find_column_name(i) for i in field_ids])  # in the equality schema's order
    keys = keys.cast(pa.schema([pa.field(f.name, f.type, nullable=not schema.find_field(f.name).required) for f in keys.schema]))
    spec = meta.spec()
    if spec.is_unpartitioned():
        parts = [(None, keys)]
    else:
        parts = [(p.partition_key, p.arrow_table_partition.select(keys.column_names)) for p in _determine_partitions(spec, schema, keys)]
    # pyiceberg's writer writes the table's current schema: hand it metadata whose schema is the equality columns.
    eq_meta = meta.model_copy(update={"schemas": [eq_schema]})
    write_uuid = uuid.uuid4()
    tasks = [
        WriteTask(write_uuid=write_uuid, task_id=i, schema=eq_schema, record_batches=part.to_batches(), partition_key=pk)
        for i, (pk, part) in enumerate(parts)
    ]
    return [
        restamped(df, DataFileContent.EQUALITY_DELETES, df.partition, list(field_ids), meta.default_spec_id)
        for df in _write_files(bound(iceberg.io), eq_meta, tasks)
    ]


def spec_id_of(data_file: DataFile, default: int) -> int:
    """A data file's partition spec id (files fresh from the writer do not carry one yet)."""
    try:
        return int(data_file.spec_id)
    except AttributeError:
        return default


def write_position_deletes(
    iceberg: IcebergTable, targets: Sequence[tuple[DataFile, np.ndarray]], granularity: str = "file", *, file_scoped_limit: int = 16
) -> list[DataFile]:
    """Write position delete files for ``(data file, positions)`` pairs.

    ``granularity`` is ``"file"`` (one delete file per data file, the Iceberg
    default), ``"partition"`` (one per partition) or ``"auto"`` (per data
    file, but one per partition for a partition with more than
    ``file_scoped_limit`` targets); never global.
    """
    if granularity not in ("file", "partition", "auto"):
        raise ValueError(f"unknown delete granularity {granularity!r}")
    metadata = iceberg.metadata
    if int(metadata.format_version) >= 3:
        raise UnsupportedFormatError(
            "this table has Iceberg format version 3, where deletes are deletion vectors and no position delete file may be "
            "added; set write.delete.mode, write.update.mode and write.merge.mode to copy-on-write"
        )
    by_partition: dict[object, list[tuple[DataFile, np.ndarray]]] = defaultdict(list)
    for data_file, positions in targets:
        by_partition[(spec_id_of(data_file, metadata.default_spec_id), data_file.partition)].append((data_file, positions))
    groups: dict[object, list[tuple[DataFile, np.ndarray]]] = defaultdict(list)
    for partition, members in by_partition.items():
        scoped = granularity == "partition" or (granularity == "auto" and len(members) > file_scoped_limit)
        for data_file, positions in members:
            groups[partition if scoped else data_file.file_path].append((data_file, positions))
    provider = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
    out = []
    for members in groups.values():
        members.sort(key=lambda m: m[0].file_path)
        paths = np.concatenate([np.full(len(p), i) for i, (_, p) in enumerate(members)])
        names = [m[0].file_path for m in members]
        positions = np.concatenate([np.sort(p) for _, p in members]).astype(np.int64)
        # The paths stay dictionary-encoded, as Parquet stores them: cast to strings first, a delete file of a million
        # positions held ~100 MB of repeated paths. Without the Arrow schema in the footer the file is the same
        # (a required string column, dictionary pages) and every reader reads plain strings.
        path_dict = pa.DictionaryArray.from_arrays(pa.array(paths, pa.int32()), pa.array(names))
        table = pa.Table.from_arrays([path_dict, pa.array(positions)], schema=_DELETE_WRITE_SCHEMA)
        sink = _io.BytesIO()
        pq.write_table(table, sink, compression="zstd", store_schema=False)
        location = provider.new_data_location(f"{uuid.uuid4()}-deletes.parquet")
        size = write_bytes(iceberg.io, location, sink.getvalue())
        # kept as read back, so the next commit that merges this file's positions (lineage.storage.merged_deletes) reads nothing
        remember_vectors(location, {name: np.unique(p) for name, (_, p) in zip(names, members, strict=True)})
        first = members[0][0]
        out.append(
            DataFile.from_args(
                content=DataFileContent.POSITION_DELETES,
                file_path=location,
                file_format=FileFormat.PARQUET,
                partition=first.partition,
                record_count=len(positions),
                file_size_in_bytes=size,
                column_sizes={},
                value_counts={PATH_FIELD_ID: len(positions), POS_FIELD_ID: len(positions)},
                null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
                nan_value_counts={},
                lower_bounds={
                    PATH_FIELD_ID: to_bytes(StringType(), names[0]),
                    POS_FIELD_ID: to_bytes(LongType(), int(positions.min())),
                },
                upper_bounds={
                    PATH_FIELD_ID: to_bytes(StringType(), names[-1]),
                    POS_FIELD_ID: to_bytes(LongType(), int(positions.max())),
                },
                split_offsets=None,
                equality_ids=None,
                sort_order_id=None,
                spec_id=spec_id_of(first, metadata.default_spec_id),
                key_metadata=None,
            )
        )
    return out
