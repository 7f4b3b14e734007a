"""Flink-style commits through Iceberg's Java API, for the reference engine's server (engine Python only).

``flink_commit`` replays a batch of change events as Flink's Iceberg sink writes one checkpoint
(``BaseEqualityDeltaWriter`` in Iceberg's Flink module) and commits it the way Flink's committer does:

- events are ``+I`` (insert), ``-U`` (update before), ``+U`` (update after), ``-D`` (delete), in order;
- each event is routed to the partition of its row (``PartitionKey`` over the Iceberg schema), and each
  partition has its own data file, equality delete file and position delete file, written lazily;
- a row written by this batch remembers (data file, position) under its key; deleting that key later in
  the same batch writes a **position delete** against the new data file (Flink's within-checkpoint delete;
  on a format-version 3 table a **deletion vector**, since v3 forbids new position delete files),
  any other delete writes an **equality delete** on the key columns (v3 keeps equality deletes);
- upsert mode (``upsert=True``): ``+I``/``+U`` first delete the key, ``-U`` is ignored, ``-D`` deletes the
  key; equality delete files hold the key columns only. Otherwise ``-U``/``-D`` delete the full row and
  equality delete files hold full rows (equality still on the key columns), as in Flink;
- the commit is an ``AppendFiles`` when there are no delete files, else a ``RowDelta`` with all files, with
  Flink's snapshot properties (``flink.job-id``, ``flink.max-committed-checkpoint-id``, ...).

Types: rows cross from Parquet into Spark (cast to the Iceberg schema's Spark types) and from Spark ``Row``
objects into Iceberg ``Record`` objects with ``SparkValueConverter`` on the JVM side, so values keep their
Iceberg types (a long stays a ``java.lang.Long`` even when small; py4j would turn a Python int below 2**31 into
an ``Integer``). Only dates, timestamps and uuids come back to Python, as int or str, to be turned into the
``LocalDate``/``OffsetDateTime``/``LocalDateTime``/``UUID`` the generic writers expect by Iceberg methods whose
parameter types are fixed. Nested types, ``time`` and nanosecond timestamps are not supported.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

OPS = ("+I", "-U", "+U", "-D")


class WriteRequestError(ValueError):
    """The events or arguments do not fit the table; nothing was written."""


@dataclass
class _Partition:
    """One partition's writers in this batch (Flink has one delta writer per partition)."""

    key: Any  # PartitionKey copy (None when unpartitioned)
    data: Any = None
    data_path: str | None = None
    data_rows: int = 0
    eq_deletes: Any = None
    positions: list[int] = field(default_factory=list)
    inserted: dict[tuple, int] = field(default_factory=dict)  # key -> position in this batch's data file


class _Batch:
    """The writers of one checkpoint, following BaseEqualityDeltaWriter."""

    def __init__(self, spark: Any, table: Any, key: list[str], upsert: bool) -> None:
        jvm = self.jvm = spark._jvm
        gateway = spark.sparkContext._gateway
        self.table = table
        schema = self.schema = table.schema()
        self.spec = table.spec()
        names = jvm.java.util.ArrayList()
        ids = gateway.new_array(jvm.int, len(key))
        for i, column in enumerate(key):
            ids[i] = schema.findField(column).fieldId()
            names.add(column)
        self.key_schema = schema.select(names)
        fmt = table.properties().get("write.format.default") or "parquet"
        self.format = jvm.org.apache.iceberg.FileFormat.fromString(fmt)
        # Upsert mode deletes by key only (the inserted row may differ in every other column); otherwise the
        # deleted row is known in full and Flink writes it whole.
        self.delete_schema = self.key_schema if upsert else schema
        self.factory = jvm.org.apache.iceberg.data.GenericAppenderFactory(
            table, schema, self.spec, jvm.java.util.HashMap(), ids, self.delete_schema, None
        )
        self.files = (
            jvm.org.apache.iceberg.io.OutputFileFactory.builderFor(table, 1, 1)
            .format(self.format)
            .operationId(uuid.uuid4().hex)
            .build()
        )
        self.partition_key = jvm.org.apache.iceberg.PartitionKey(self.spec, schema)
        self.wrapper = jvm.org.apache.iceberg.data.InternalRecordWrapper(schema.asStruct())
        self.partitions: dict[str, _Partition] = {}
        # Format version 3 forbids new position delete files: deletes of this batch's own rows are deletion
        # vectors (Iceberg's BaseDVFileWriter; the data files are new, so no earlier deletes to merge).
        self.dvs = None
        if jvm.org.apache.iceberg.TableUtil.formatVersion(table) >= 3:
            puffins = (  # as Spark's position delta writer: a factory of .puffin names for the vectors
                jvm.org.apache.iceberg.io.OutputFileFactory.builderFor(table, 1, 1)
                .format(jvm.org.apache.iceberg.FileFormat.PUFFIN)
                .operationId(uuid.uuid4().hex)
                .build()
            )
            self.dvs = jvm.org.apache.iceberg.deletes.BaseDVFileWriter(puffins, _constant_null(spark))

    def route(self, record: Any) -> _Partition:
        if not self.spec.isPartitioned():
            return self.partitions.setdefault("", _Partition(None))
        self.partition_key.partition(self.wrapper.wrap(record))
        path = self.partition_key.toPath()
        part = self.partitions.get(path)
        if part is None:
            part = self.partitions[path] = _Partition(self.partition_key.copy())
        return part

    def _output(self, part: _Partition) -> Any:
        return self.files.newOutputFile(self.spec, part.key) if part.key is not None else self.files.newOutputFile()

    def write(self, part: _Partition, key: tuple, record: Any) -> None:
        if part.data is None:
            out = self._output(part)
            part.data_path = out.encryptingOutputFile().location()
            part.data = self.factory.newDataWriter(out, self.format, part.key)
        previous = part.inserted.get(key)
        if previous is not None:  # the same key written twice in one batch: the older image is deleted
            part.positions.append(previous)
        part.inserted[key] = part.data_rows
        part.data.write(record)
        part.data_rows += 1

    def delete(self, part: _Partition, key: tuple, delete_record: Any) -> None:
        position = part.inserted.pop(key, None)
        if position is not None:
            part.positions.append(position)
            return
        if part.eq_deletes is None:
            part.eq_deletes = self.factory.newEqDeleteWriter(self._output(part), self.format, part.key)
        part.eq_deletes.write(delete_record)

    def close(self) -> dict[str, list[Any]]:
        """Close every writer; the data, equality delete and position delete files written."""
        files: dict[str, list[Any]] = {"data": [], "equality": [], "position": []}
        for part in self.partitions.values():
            if part.data is not None:
                part.data.close()
                files["data"].append(part.data.toDataFile())
            if part.eq_deletes is not None:
                part.eq_deletes.close()
                files["equality"].append(part.eq_deletes.toDeleteFile())
            if part.positions and self.dvs is not None:  # v3: a deletion vector, all partitions in one Puffin file
                for pos in sorted(part.positions):
                    self.dvs.delete(part.data_path, pos, self.spec, part.key if part.key is not None else self.partition_key)
            elif part.positions:
                writer = self.factory.newPosDeleteWriter(self._output(part), self.format, part.key)
                delete = self.jvm.org.apache.iceberg.deletes.PositionDelete.create()
                for pos in sorted(part.positions):  # the spec wants position deletes sorted by (path, pos)
                    writer.write(delete.set(part.data_path, pos))
                writer.close()
                files["position"].append(writer.toDeleteFile())
        if self.dvs is not None:
            self.dvs.close()
            files["position"].extend(self.dvs.result().deleteFiles())
        return files


def flink_commit(
    spark: Any, table: Any, events_path: str, key: list[str] | None, upsert: bool, properties: dict[str, str]
) -> dict[str, Any]:
    """Write and commit one checkpoint of the events in the Parquet file ``events_path`` (see module doc).

    The file has the columns ``_seq`` (0, 1, 2, ... in event order), ``_op`` (one of OPS) and any of the
    table's columns (missing ones are null). Returns the new snapshot's id, sequence number, operation,
    summary and the paths of the files it added.
    """
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    jvm = spark._jvm
    schema = table.schema()
    key = list(key) if key else list(schema.identifierFieldNames())
    if not key:
        raise WriteRequestError(f"table {table.name()} has no identifier fields; pass key=[...] (the equality columns)")
    columns = [f.name() for f in schema.columns()]
    missing_key = [c for c in key if c not in columns]
    if missing_key:
        raise WriteRequestError(f"key columns {missing_key} are not in table {table.name()} (columns: {columns})")

    events = pq.read_table(events_path).sort_by("_seq")
    extra = [c for c in events.column_names if c not in ("_seq", "_op") and c not in columns]
    if extra:
        raise WriteRequestError(f"columns {extra} are not in table {table.name()} (columns: {columns})")
    ops = events.column("_op").to_pylist()
    bad = sorted({str(op) for op in ops if op not in OPS})
    if bad:
        raise WriteRequestError(f"unknown event kinds {bad}; use {list(OPS)}")
    if not ops:
        raise WriteRequestError("no events: a checkpoint commit needs at least one")
    for column in key:
        if column not in events.column_names or events.column(column).null_count:
            raise WriteRequestError(f"every event needs a non-null value for the key column {column!r}")
    spec = table.spec()
    if spec.isPartitioned():
        sources = {schema.findColumnName(f.sourceId()) for f in spec.fields()}
        absent = sorted(sources - set(events.column_names))
        if absent:
            raise WriteRequestError(f"events must carry the partition source columns {absent}: Flink routes each row by them")
    keys = list(zip(*(events.column(c).to_pylist() for c in key)))

    # Cast to the Spark types of the Iceberg schema, so each Row holds exactly the Java types to convert.
    spark_schema = StructType.fromJson(json.loads(jvm.org.apache.iceberg.spark.SparkSchemaUtil.convert(schema).json()))
    df = spark.read.parquet(events_path)
    cols = []
    for f in spark_schema.fields:
        value = F.col(f"`{f.name}`") if f.name in events.column_names else F.lit(None)
        cols.append(value.cast(f.dataType).alias(f.name))
    # Each Row: the table's columns in schema order (what SparkValueConverter reads by position), then the key
    # as a struct (for key-only equality deletes), then the event's sequence number.
    cols.append(F.struct(*[F.col(f"`{c}`").cast(spark_schema[c].dataType) for c in key]).alias("_key"))
    cols.append(F.col("_seq"))
    # ANSI casts: a value that does not fit its column (2**40 into an int) fails instead of wrapping around.
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        collected = df.select(*cols)._jdf.collectAsList()
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)
    if len(collected) != len(ops):
        raise RuntimeError(f"Spark read {len(collected)} events from {events_path}, pyarrow {len(ops)}")
    last = len(columns)  # index of the _key struct in each Row
    # One small Parquet file is read in order, but sort here rather than trust it (a Spark sort costs a shuffle).
    rows = sorted((collected[i] for i in range(len(ops))), key=lambda r: r.getLong(last + 1))

    batch = _Batch(spark, table, key, upsert)
    converter = jvm.org.apache.iceberg.spark.SparkValueConverter
    fixups = _fixups(jvm, schema)
    key_fixups = _fixups(jvm, batch.key_schema)
    for i, op in enumerate(ops):
        jrow = rows[i]
        record = _fix(converter.convert(schema, jrow), fixups)
        part = batch.route(record)
        k = keys[i]
        if op in ("+I", "+U"):
            if upsert:
                batch.delete(part, k, _fix(converter.convert(batch.key_schema, jrow.getStruct(last)), key_fixups))
            batch.write(part, k, record)
        elif op == "-U" and upsert:
            continue  # Flink ignores the before image in upsert mode: the +U that follows deletes the key
        elif upsert:  # -D
            batch.delete(part, k, _fix(converter.convert(batch.key_schema, jrow.getStruct(last)), key_fixups))
        else:  # -U / -D of a full row
            batch.delete(part, k, record)
    files = batch.close()

    if files["equality"] or files["position"]:
        operation = table.newRowDelta()
        for f in files["data"]:
            operation = operation.addRows(f)
        for f in files["equality"] + files["position"]:
            operation = operation.addDeletes(f)
        if table.currentSnapshot() is not None:
            # The checkpoint's base: Iceberg then checks for conflicting deletion vectors from there, not over the
            # whole ancestry (which fails once older snapshots are expired).
            operation = operation.validateFromSnapshot(table.currentSnapshot().snapshotId())
    else:
        operation = table.newAppend()
        for f in files["data"]:
            operation = operation.appendFile(f)
    for k, v in properties.items():
        operation = operation.set(k, str(v))
    operation.commit()
    table.refresh()
    snapshot = table.currentSnapshot()
    return {
        "snapshot_id": snapshot.snapshotId(),
        "sequence_number": snapshot.sequenceNumber(),
        "operation": snapshot.operation(),
        "summary": dict(snapshot.summary()),
        "data_files": [f.location() for f in files["data"]],
        "equality_delete_files": [f.location() for f in files["equality"]],
        "position_delete_files": [f.location() for f in files["position"]],
    }


def _constant_null(spark: Any) -> Any:
    """A ``java.util.function.Function`` that returns null for every argument, built from JDK method handles
    (no Python callback server needed)."""
    jvm, gateway = spark._jvm, spark.sparkContext._gateway
    handles = jvm.java.lang.invoke.MethodHandles
    obj = jvm.java.lang.Class.forName("java.lang.Object")
    args = gateway.new_array(jvm.java.lang.Class, 1)
    args[0] = obj
    null = handles.dropArguments(handles.constant(obj, None), 0, args)  # (Object) -> null
    return jvm.java.lang.invoke.MethodHandleProxies.asInterfaceInstance(jvm.java.lang.Class.forName("java.util.function.Function"), null)


def _fixups(jvm: Any, schema: Any) -> list[tuple[str, Any]]:
    """(column, converter) for top-level types where SparkValueConverter's value is Iceberg's internal one
    (int days, long microseconds, a string for uuid) and the generic writers want a java.time / UUID object.

    The value crosses Python as a plain int or str into a method whose parameter type fixes the Java type,
    so py4j's Integer-or-Long guess does not matter here.
    """
    util = jvm.org.apache.iceberg.util.DateTimeUtil
    out = []
    for f in schema.columns():
        type_id = f.type().typeId().toString()
        if type_id == "DATE":
            out.append((f.name(), util.dateFromDays))
        elif type_id == "TIMESTAMP":
            out.append((f.name(), util.timestamptzFromMicros if f.type().shouldAdjustToUTC() else util.timestampFromMicros))
        elif type_id == "UUID":
            out.append((f.name(), jvm.java.util.UUID.fromString))
        elif type_id in ("STRUCT", "LIST", "MAP", "TIME", "TIMESTAMP_NANO", "VARIANT"):
            raise WriteRequestError(f"column {f.name()} has type {f.type()}, which flink_commit does not support")
    return out


def _fix(record: Any, fixups: list[tuple[str, Any]]) -> Any:
    for name, convert in fixups:
        value = record.getField(name)
        if value is not None:
            record.setField(name, convert(value))
    return record
