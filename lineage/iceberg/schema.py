"""Schemas, keys and partition specs: from the caller's terms to Iceberg's.

Also conforms incoming batches to a table's schema, with specific errors for
unknown columns, missing required columns, type mismatches and nulls where
the schema forbids them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import DoubleType, FloatType, IcebergType, ListType, MapType, NestedField, StructType

import lineage.columns as columns
from lineage.arrays import unique
from lineage.identity_cache import IdentityCache
from lineage.errors import InvalidArgumentError, KeyViolationError, SchemaMismatchError, UnknownColumnError

LINEAGE_COLUMNS = columns.LINEAGE_COLUMNS  # the reserved names are defined in lineage.columns


def iceberg_schema(arrow_schema: pa.Schema, key: Sequence[str] | None) -> Schema:
    """Convert a pyarrow schema to an Iceberg schema whose identifier fields are ``key``.

    Key columns become required fields (Iceberg requires that of identifier fields).
    """
    if not isinstance(arrow_schema, pa.Schema):
        raise InvalidArgumentError(f"schema must be a pyarrow.Schema, got {type(arrow_schema).__name__}")
    if len(arrow_schema) == 0:
        raise InvalidArgumentError("schema must have at least one column")
    names = arrow_schema.names
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"schema has duplicate column names: {sorted({n for n in names if names.count(n) > 1})}")
    reserved = [n for n in names if n in LINEAGE_COLUMNS or n.startswith("_lineage") or n.startswith("__")]
    if reserved:
        raise InvalidArgumentError(f"column names {reserved} are reserved for lineage; rename them")
    base = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema))
    key = list(key or [])
    unknown = [k for k in key if k not in names]
    if unknown:
        raise UnknownColumnError(f"key column(s) {unknown} are not in the schema (columns: {names})")
    if len(set(key)) != len(key):
        raise InvalidArgumentError(f"key lists a column twice: {key}")
    fields = []
    for f in base.fields:
        if f.name in key:
            if not f.field_type.is_primitive or isinstance(f.field_type, (FloatType, DoubleType)):
                raise InvalidArgumentError(
                    f"key column {f.name!r} has type {f.field_type}; keys must be primitive, non-floating-point columns"
                )
            f = NestedField(f.field_id, f.name, f.field_type, required=True, doc=f.doc)
        fields.append(f)
    ids = [f.field_id for f in fields if f.name in key]
    return Schema(*fields, identifier_field_ids=ids)


_TRANSFORM_RE = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?(\w+)\s*\)\s*$")


def partition_spec(schema: Schema, partition_by: Sequence[str] | None) -> PartitionSpec:
    """Build a partition spec from strings like ``"region"``, ``"day(ts)"``, ``"bucket(16, id)"``."""
    if not partition_by:
        return PartitionSpec()
    if isinstance(partition_by, str):
        partition_by = [partition_by]
    fields = []
    for i, expr in enumerate(partition_by):
        if not isinstance(expr, str):
            raise InvalidArgumentError(f"partition_by entries must be strings like 'day(ts)', got {expr!r}")
        m = _TRANSFORM_RE.match(expr)
        if m:
            name, arg, column = m.group(1).lower(), m.group(2), m.group(3)
        elif re.fullmatch(r"\s*\w+\s*", expr):
            name, arg, column = "identity", None, expr.strip()
        else:
            raise InvalidArgumentError(
                f"partition_by entry {expr!r} is not understood; use 'col', 'identity(col)', 'year|month|day|hour(col)', "
                "'bucket(N, col)' or 'truncate(W, col)'"
            )
        try:
            source = schema.find_field(column)
        except ValueError:
            raise UnknownColumnError(f"partition_by column {column!r} is not in the schema") from None
        transform: Transform
        suffix = ""
        if name == "identity" and arg is None:
            transform = IdentityTransform()
        elif name in ("year", "month", "day", "hour") and arg is None:
            transform = {"year": YearTransform, "month": MonthTransform, "day": DayTransform, "hour": HourTransform}[name]()
            suffix = f"_{name}"
        elif name in ("bucket", "truncate") and arg is not None and int(arg) <= 0:
            raise InvalidArgumentError(f"partition_by entry {expr!r}: {name} needs a positive number, got {arg}")
        elif name == "bucket" and arg is not None:
            transform = BucketTransform(int(arg))
            suffix = f"_bucket_{arg}"
        elif name == "truncate" and arg is not None:
            transform = TruncateTransform(int(arg))
            suffix = f"_trunc_{arg}"
        else:
            raise InvalidArgumentError(f"partition_by entry {expr!r}: unknown transform or wrong arguments")
        if not transform.can_transform(source.field_type):
            raise InvalidArgumentError(f"partition_by entry {expr!r}: cannot apply {name} to {source.field_type}")
        fields.append(PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=f"{column}{suffix}"))
    return PartitionSpec(*fields)


def arrow_schema(schema: Schema) -> pa.Schema:
    """The pyarrow schema (without field-id metadata) that reads of the table return.

    Kept per schema (both are immutable): a commit asks for it about ten times,
    and converting it anew cost a change-stream commit 2 to 3 ms of CPU.
    """
    return _ARROW_SCHEMAS.get(schema, lambda: _arrow_schema(schema))


def _arrow_schema(schema: Schema) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow  # imports pyarrow.dataset and pandas: not with the library

    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema_to_pyarrow(schema, include_field_ids=False)])


_ARROW_SCHEMAS: IdentityCache[pa.Schema] = IdentityCache()


_FAMILIES = (
    ("integer", pa.types.is_integer),
    ("floating", pa.types.is_floating),
    ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)),
    ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)),
    ("timestamp", pa.types.is_timestamp),
    ("date", pa.types.is_date),
    ("time", pa.types.is_time),
    ("decimal", pa.types.is_decimal),
    ("boolean", pa.types.is_boolean),
)


def _family(t: pa.DataType) -> str:
    # Nested values by the families of their items (DuckDB returns list<l: string> for a large_list<element:
    # large_string> column, a change feed's _changed_columns is a list of dictionary-encoded strings).
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    if pa.types.is_map(t):
        return f"map<{_family(t.key_type)}, {_family(t.item_type)}>"
    if _is_list(t):
        return f"list<{_family(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {_family(f.type)}" for f in t) + ">"
    for name, test in _FAMILIES:
        if test(t):
            return name
    return str(t)


def required_nulls(values: pa.Array | pa.ChunkedArray, t: pa.DataType) -> str | None:
    """The path of a required nested field of type ``t`` that holds a null in ``values`` under a non-null parent
    (``element``, ``point.x``, ``value``), or None."""
    if not _has_required(t):
        return None
    for arr in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        found = _required_nulls(arr, t)
        if found is not None:
            return found
    return None


def _has_required(t: pa.DataType) -> bool:
    return any(not f.nullable or _has_required(f.type) for f in _children(t))


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    if pa.types.is_struct(t):
        return list(t)
    if _is_list(t):
        return [t.value_field]
    return []


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t) \
        or pa.types.is_large_list_view(t)


def _required_nulls(arr: pa.Array, t: pa.DataType) -> str | None:
    if pa.types.is_map(t):
        return _required_nulls(_entries(arr), pa.struct([t.key_field, t.item_field]))
    if pa.types.is_struct(t):
        children = [arr.field(i) for i in range(t.num_fields)]
        if arr.null_count:  # a null struct's fields are not values
            children = [c.filter(arr.is_valid()) for c in children]
    elif _children(t):
        children = [arr.flatten()]  # the items of the non-null lists
    else:
        return None
    for f, child in zip(_children(t), children, strict=True):
        if not f.nullable and child.null_count:
            return f.name
        found = _required_nulls(child, f.type)
        if found is not None:
            return f"{f.name}.{found}"
    return None


def cast_nested(values: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``values`` cast to ``target``, whose nested fields may be required.

    A required field under a null parent (a null struct, or a null struct in a
    list or map) holds no value, but Arrow's cast and the Parquet writer refuse
    any null in a required field: DuckDB reads a null struct's fields as nulls,
    and ``pa.nulls`` makes them so. Such a field gets a placeholder (zero, an
    empty string or list) under its null parent. A required field that is null
    under a non-null parent is refused by the cast (``ArrowInvalid``).
    """
    if not _has_required(target):
        return values if values.type.equals(target) else values.cast(target)
    relaxed = relaxed_type(target)
    values = values if values.type.equals(relaxed) else values.cast(relaxed)
    if isinstance(values, pa.ChunkedArray):
        values = pa.chunked_array([_fill(c, target) for c in values.chunks], relaxed)
    else:
        values = _fill(values, target)
    return values.cast(target)


def null_values(n: int, t: pa.DataType) -> pa.Array:
    """``n`` nulls of type ``t`` (a column missing from a batch or a data file), required nested fields filled."""
    return cast_nested(pa.nulls(n, relaxed_type(t)), t)


def cast_table(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table | pa.RecordBatch:
    """``table`` (or a batch) cast to ``schema`` column by column with :func:`cast_nested` (also when the types are
    the same already: a null struct made by ``if_else`` or ``pa.nulls`` has null required fields)."""
    if table.schema == schema and not any(_has_required(t) for t in schema.types):
        return table
    return type(table).from_arrays([cast_nested(c, f.type) for c, f in zip(table.columns, schema, strict=True)], schema=schema)


def relaxed_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (a map's keys stay required: Arrow requires it)."""
    if pa.types.is_map(t):
        return pa.map_(t.key_field, t.item_field.with_type(relaxed_type(t.item_type)).with_nullable(True))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(relaxed_type(f.type)).with_nullable(True) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        field = t.value_field.with_type(relaxed_type(t.value_type)).with_nullable(True)
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    return t


def _fill(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """``arr`` (of ``relaxed_type(t)``) with a placeholder in each required field of ``t`` under a null struct."""
    if not _has_required(t):
        return arr
    if pa.types.is_struct(t):
        children = [_fill(arr.field(i), f.type) for i, f in enumerate(t)]
        if arr.null_count:
            valid = arr.is_valid()
            children = [pc.if_else(valid, c, _placeholder(c.type, f.type)) if not f.nullable and c.null_count else c
                        for c, f in zip(children, t, strict=True)]
        return pa.StructArray.from_arrays(children, fields=list(arr.type), mask=arr.is_null() if arr.null_count else None)
    if not (pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_large_list(t)):
        return arr
    offsets, first, end = _rebased(arr)
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_map(t):
        keys, items = arr.keys.slice(first, end - first), arr.items.slice(first, end - first)
        return pa.MapArray.from_arrays(offsets, keys, _fill(items, t.item_type), type=arr.type, mask=mask)
    values = _fill(arr.values.slice(first, end - first), t.value_type)
    return type(arr).from_arrays(offsets, values, type=arr.type, mask=mask)


def _rebased(arr: pa.ListArray | pa.LargeListArray | pa.MapArray) -> tuple[pa.Array, int, int]:
    """The offsets of a list or map array from zero, and where its items start and end in the whole of its values:
    a slice's offsets point into its parent's values, and ``from_arrays`` with a mask takes no sliced offsets."""
    offsets = arr.offsets
    first = offsets[0].as_py() if len(offsets) else 0
    offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
    return offsets, first, first + (offsets[-1].as_py() if len(offsets) else 0)


def with_null_collections(projected: pa.RecordBatch, source: pa.RecordBatch, requested: Schema,
                          source_schema: Schema) -> pa.RecordBatch:
    """``projected``, pyiceberg's projection of ``source`` (of ``source_schema``) to ``requested`` for writing, with
    the null lists and maps of ``source`` null again, at any depth.

    pyiceberg rebuilds a list of structs and a map with struct values from their offsets without their validity
    (apache/iceberg-python #3833): a null became an empty list or map in the data file. Each such array gets the
    null mask of its source array back; offsets and values stay as projected. Columns are paired by field id, as
    pyiceberg pairs them; an array whose nulls are intact is kept as it is.
    """
    columns = []
    for field, column in zip(requested.fields, projected.columns, strict=True):
        name = _source_name(source_schema, field.field_id)
        given = source.column(name) if name in source.schema.names else None
        fixed = None if given is None else _with_nulls(column, given, field.field_type, source_schema)
        columns.append(column if fixed is None else fixed)
    return pa.RecordBatch.from_arrays(columns, schema=projected.schema)


def _source_name(source_schema: Schema, field_id: int) -> str | None:
    try:
        return source_schema.find_field(field_id).name
    except ValueError:
        return None


def _with_nulls(out: pa.Array, given: pa.Array, t: IcebergType, source_schema: Schema) -> pa.Array | None:
    """``out`` (the projection of ``given``, of Iceberg type ``t``) with the null lists and maps of ``given``; None
    when ``out`` has them already."""
    if isinstance(t, StructType) and isinstance(out, pa.StructArray) and isinstance(given, pa.StructArray):
        children, changed = [], False
        for i, f in enumerate(t.fields):
            name = _source_name(source_schema, f.field_id)
            src = given.field(name) if given.type.get_field_index(name or "") >= 0 else None
            fixed = None if src is None else _with_nulls(out.field(i), src, f.field_type, source_schema)
            changed |= fixed is not None
            children.append(out.field(i) if fixed is None else fixed)
        if not changed:
            return None
        return pa.StructArray.from_arrays(children, fields=list(out.type), mask=out.is_null() if out.null_count else None)
    is_map = isinstance(t, MapType) and isinstance(out, pa.MapArray) and isinstance(given, pa.MapArray)
    is_list = isinstance(t, ListType) and isinstance(out, (pa.ListArray, pa.LargeListArray)) \
        and isinstance(given, (pa.ListArray, pa.LargeListArray)) and not isinstance(out, pa.MapArray)
    if not (is_map or is_list):
        return None
    offsets, first, end = _rebased(out)
    _, given_first, given_end = _rebased(given)
    if is_map:
        parts = [(out.keys, given.keys, t.key_type), (out.items, given.items, t.value_type)]
    else:
        parts = [(out.values, given.values, t.element_type)]
    children = [(o.slice(first, end - first), g.slice(given_first, given_end - given_first), ct) for o, g, ct in parts]
    fixed = [_with_nulls(o, g, ct, source_schema) for o, g, ct in children]
    if all(f is None for f in fixed) and out.null_count == given.null_count:
        return None
    values = [o if f is None else f for (o, _, _), f in zip(children, fixed, strict=True)]
    mask = given.is_null() if given.null_count else None
    if is_map:
        return pa.MapArray.from_arrays(offsets, *values, type=out.type, mask=mask)
    return type(out).from_arrays(offsets, values[0], type=out.type, mask=mask)


def _placeholder(relaxed: pa.DataType, t: pa.DataType) -> pa.Scalar:
    """A value of ``t`` (as a scalar of ``relaxed``) that stands under a null parent: never read as a value."""
    if pa.types.is_struct(t):
        children = [pa.nulls(1, r.type) if f.nullable else pa.array([_placeholder(r.type, f.type)], r.type)
                    for r, f in zip(relaxed, t, strict=True)]
        return pa.StructArray.from_arrays(children, fields=list(relaxed))[0]
    if _children(t):
        return pa.scalar([], relaxed)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.scalar(b"" if "binary" in str(t) else "", relaxed)
    return pa.Array.from_buffers(relaxed, 1, [None, pa.py_buffer(bytes(max(t.bit_width // 8, 1)))])[0]


def _entries(arr: pa.MapArray) -> pa.StructArray:
    """The entries of the non-null maps of ``arr``, a struct of key and value (a map has no flatten)."""
    maps = arr.filter(arr.is_valid()) if arr.null_count else arr
    first, end = (maps.offsets[0].as_py(), maps.offsets[-1].as_py()) if len(maps) else (0, 0)
    return maps.values.slice(first, end - first)


def to_arrow_table(data: object) -> pa.Table:
    """Accept a pyarrow Table, RecordBatch, RecordBatchReader or pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InvalidArgumentError(
        f"data must be a pyarrow Table/RecordBatch/RecordBatchReader or a pandas DataFrame, got {type(data).__name__}"
    )


def conform(data: pa.Table, schema: Schema, key: Sequence[str] = (), keep_offsets: bool = False) -> pa.Table:
    """Return ``data`` cast to the table's arrow schema, or raise a specific error.

    Columns may come in any order; missing optional columns are filled with nulls.
    With ``keep_offsets`` string and binary columns keep their offset width
    (``string`` or ``large_string``): the Parquet writer takes either, and the
    cast would copy every value.
    """
    target = arrow_schema(schema)
    names = set(data.column_names)
    if len(names) != len(data.column_names):
        raise SchemaMismatchError(f"data has duplicate column names: {data.column_names}")
    if keep_offsets:
        fields = []
        for f in target:
            given = data.schema.field(f.name).type if f.name in names else f.type
            same = {given, f.type} <= {pa.string(), pa.large_string()} or {given, f.type} <= {pa.binary(), pa.large_binary()}
            fields.append(f.with_type(given) if same else f)
        target = pa.schema(fields)
    unknown = sorted(names - set(target.names))
    if unknown:
        raise UnknownColumnError(f"data has column(s) {unknown} that the table does not have (table columns: {target.names})")
    columns = []
    for field in target:
        if field.name not in names:
            if not field.nullable:
                raise SchemaMismatchError(f"data lacks required column {field.name!r}")
            columns.append(null_values(data.num_rows, field.type))
            continue
        col = data.column(field.name)
        if pa.types.is_dictionary(col.type) and not pa.types.is_dictionary(field.type):
            col = col.cast(col.type.value_type)  # dictionary-encoded values (pandas categoricals, the change feed's)
        relaxed = relaxed_type(field.type)  # nested nullability is checked below, with the path of the field
        if not col.type.equals(field.type) and not col.type.equals(relaxed):
            if _family(col.type) != _family(field.type) and not pa.types.is_null(col.type):
                raise SchemaMismatchError(f"column {field.name!r} has type {col.type}, the table expects {field.type}")
            try:
                cast = col.cast(relaxed, safe=True)  # safe: integers out of range, decimals losing digits are refused
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatchError(f"column {field.name!r}: cannot convert {col.type} to {field.type}: {exc}") from None
            overflow = _float_overflow(col, cast)
            if overflow:
                raise SchemaMismatchError(f"column {field.name!r}: cannot convert {col.type} to {field.type}: "
                                          f"{overflow} value(s) beyond the range of the table's type")
            col = cast
        if not field.nullable and col.null_count:
            error = KeyViolationError if field.name in key else SchemaMismatchError
            raise error(f"column {field.name!r} is required but {col.null_count} row(s) are null")
        inner = required_nulls(col, field.type)
        if inner is not None:  # Arrow's cast does not check nested nullability; the Parquet writer would refuse the file
            raise SchemaMismatchError(f"column {field.name!r}: {inner} is required but holds a null")
        columns.append(cast_nested(col, field.type))
    return pa.Table.from_arrays(columns, schema=target)


def _float_overflow(before: pa.Array | pa.ChunkedArray, after: pa.Array | pa.ChunkedArray) -> int:
    """How many finite floating-point values of ``before`` became infinite in ``after``, its cast: Arrow's safe
    cast of double to float turns values beyond float's range into infinities without a word (Spark's ANSI store
    assignment refuses them). Values already infinite or NaN stay so."""
    return 0 if before.type.equals(after.type) else _infinities(after) - _infinities(before)


def _infinities(values: pa.Array | pa.ChunkedArray) -> int:
    """The infinite floating-point values in ``values`` at any depth (in non-null lists, maps and structs)."""
    t = values.type
    if pa.types.is_floating(t):
        return int(pc.sum(pc.is_inf(values)).as_py() or 0)
    if not _children(t) or not _has_float(t):
        return 0
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    if pa.types.is_struct(t):
        return sum(_infinities(f) for c in chunks for f in c.flatten())
    return sum(_infinities(_entries(c) if pa.types.is_map(t) else c.flatten()) for c in chunks)


def _has_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or any(_has_float(f.type) for f in _children(t))


def check_columns(schema: Schema, columns: Sequence[str], what: str) -> None:
    """Raise UnknownColumnError if any of ``columns`` is not a table or lineage column."""
    known = [f.name for f in schema.fields]
    unknown = [c for c in columns if c not in known and c not in LINEAGE_COLUMNS]
    if unknown:
        raise UnknownColumnError(f"{what}: unknown column(s) {unknown}; the table has {known + list(LINEAGE_COLUMNS)}")


def null_or_duplicate_keys(data: pa.Table, key: Sequence[str]) -> str | None:
    """Describe null or duplicate key values in ``data``, or return None if there are none."""
    for k in key:
        nulls = data.column(k).null_count
        if nulls:
            return f"key column {k!r} is null in {nulls} row(s)"
    if len(key) == 1 and _is_numeric_key(data.schema.field(key[0]).type):
        # One integer-like key: a batch in key order needs one pass, any other a sort; no hash table.
        if _strictly_increasing(data.column(key[0])):
            return None
        ordered = np.sort(data.column(key[0]).to_numpy())
        repeated = unique(ordered[1:][ordered[1:] == ordered[:-1]])
        if len(repeated):
            sample = [{key[0]: v} for v in pa.array(repeated[:3]).cast(data.schema.field(key[0]).type).to_pylist()]
            return f"{len(repeated)} key value(s) occur more than once in the batch, e.g. {sample}"
        return None
    counts = data.group_by(list(key)).aggregate([([], "count_all")])
    dups = counts.filter(pc.greater(counts.column("count_all"), 1))
    if dups.num_rows:
        sample = dups.slice(0, 3).drop_columns(["count_all"]).to_pylist()
        return f"{dups.num_rows} key value(s) occur more than once in the batch, e.g. {sample}"
    return None


_BLOCK = 1 << 20


def _strictly_increasing(col: pa.ChunkedArray) -> bool:
    """Whether a null-free integer-like column increases strictly, read chunk by chunk in blocks.

    A bulk load's batch of millions of rows arrives in key order: this pass
    neither concatenates its chunks nor allocates a comparison array of the
    column's length (each is tens of MB, and fresh pages are costly).
    """
    previous = None
    for chunk in col.chunks:
        if not len(chunk):
            continue
        values = chunk.to_numpy(zero_copy_only=False)  # a view for null-free 64-bit columns
        if previous is not None and not values[0] > previous:
            return False
        for start in range(0, len(values) - 1, _BLOCK):
            end = min(start + _BLOCK + 1, len(values))
            if not (values[start + 1:end] > values[start:end - 1]).all():
                return False
        previous = values[-1]
    return True


def _is_numeric_key(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)


def projection_field_ids(metadata: TableMetadata) -> dict[str, int] | None:
    """Column name -> Iceberg field id when data files must be read by field id, else ``None``.

    Reading by field id is what Iceberg requires once columns were renamed,
    added or promoted, but DuckDB's field-id projection makes a Parquet scan
    several times slower. Every data file was written under one of the
    table's schemas; while each of them names and types the current columns
    exactly as the current schema does, reading by name gives the same rows.
    """
    current = metadata.schema()
    fields = {f.field_id: (f.name, f.field_type) for f in current.fields}
    for past in metadata.schemas:
        seen = {f.field_id: (f.name, f.field_type) for f in past.fields}
        if any(seen.get(fid) != spec for fid, spec in fields.items()):
            return {f.name: f.field_id for f in current.fields}
    return None
