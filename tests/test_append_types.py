"""What an append accepts besides the table's exact Arrow types: encodings of the same values, and nothing lossy."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lineage
from lineage import duck
from lineage.errors import SchemaMismatchError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("status", pa.string()), ("amount", pa.float64())])


@pytest.fixture
def table(tmp_path) -> lineage.Table:  # noqa: ANN001
    return lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=str(tmp_path / "wh"))


def _dictionary(values: list, index_type: pa.DataType = pa.int8()) -> pa.DictionaryArray:
    return pa.array(values).dictionary_encode().cast(pa.dictionary(index_type, pa.string()))


def test_dictionary_encoded_strings_are_appended_as_strings(table) -> None:  # noqa: ANN001
    """A change feed's `_change_type` (dictionary<int8, string>) written into a string column, as a user copies a feed."""
    table.append(pa.table({"id": [1, 2, 3], "status": _dictionary(["insert", "delete", None]), "amount": [1.0, 2.0, 3.0]}))
    got = table.scan().sort_by("id")
    assert got.schema.field("status").type in (pa.string(), pa.large_string())
    assert got.column("status").to_pylist() == ["insert", "delete", None]


def test_pandas_categorical_is_appended_and_upserted(table) -> None:  # noqa: ANN001
    frame = pd.DataFrame({"id": [1, 2], "status": pd.Categorical(["open", "paid"]), "amount": [1.0, 2.0]})
    table.append(frame)
    table.upsert(pd.DataFrame({"id": [2, 3], "status": pd.Categorical(["shipped", "open"]), "amount": [5.0, 6.0]}))
    assert table.scan().sort_by("id").column("status").to_pylist() == ["open", "shipped", "open"]


def test_dictionary_of_another_type_is_refused_and_changes_nothing(table) -> None:  # noqa: ANN001
    table.append(pa.table({"id": [1], "status": ["open"], "amount": [1.0]}))
    version = table.version
    numbers = pa.array([7, 8]).dictionary_encode()  # dictionary<int32, int64> for a string column
    with pytest.raises(SchemaMismatchError, match="'status'"):
        table.append(pa.table({"id": [2, 3], "status": numbers, "amount": [1.0, 2.0]}))
    assert table.version == version
    assert table.scan().num_rows == 1


NESTED = pa.schema([pa.field("id", pa.int64(), nullable=False), ("tags", pa.list_(pa.string())),
                    ("s", pa.struct([("a", pa.int32()), ("b", pa.string())]))])


@pytest.mark.parametrize("format_version", [2, 3])
def test_list_and_struct_columns_take_plain_arrow_types_and_sql_updates(tmp_path, format_version) -> None:  # noqa: ANN001
    """The table reads list and struct columns as large types; an append of plain ``list<string>`` values, an update
    whose new images come out of DuckDB (``list<l: string>``) and an upsert were refused with SchemaMismatchError.
    pyiceberg and DuckDB read the rows we read (on v3 the new images' files carry ``_row_id``, delta-encoded)."""
    import cdf
    from conftest import assert_interop

    t = lineage.create_table("s.nested", NESTED, key=["id"], warehouse=str(tmp_path / "wh"), format_version=format_version)
    t.append(pa.table({"id": [1, 2, 3], "tags": [["a"], None, ["b", "c"]], "s": [{"a": 1, "b": "x"}, None, {"a": 3, "b": None}]},
                      schema=NESTED))
    t.update("id = 3", {"tags": "['q']"})
    t.upsert(pa.table({"id": [1, 2, 4], "tags": [["a", "z"], None, []], "s": [{"a": 1, "b": "x"}, None, {"a": 4, "b": "q"}]},
                      schema=NESTED), skip_unchanged=True)
    got = {r["id"]: (r["tags"], r["s"]) for r in t.scan().to_pylist()}
    assert got == {1: (["a", "z"], {"a": 1, "b": "x"}), 2: (None, None), 3: (["q"], {"a": 3, "b": None}), 4: ([], {"a": 4, "b": "q"})}
    feed = cdf.decode_change_columns(cdf.changes(t, 1))
    pairs = [(r["id"], r["_change_type"], r["_changed_columns"]) for r in feed.sort_by("_commit_version").to_pylist()]
    assert sorted(pairs, key=str) == sorted([(3, "update_preimage", ["tags"]), (3, "update_postimage", ["tags"]),
                                            (1, "update_preimage", ["tags"]), (1, "update_postimage", ["tags"]),
                                            (4, "insert", None)], key=str)
    with pytest.raises(SchemaMismatchError):  # a list of another element family changes nothing
        t.append(pa.table({"id": [9], "tags": pa.array([[1.5]], pa.list_(pa.float64()))}))
    assert t.version == 3
    assert_interop(t)


def test_a_change_feed_is_written_back_into_a_table(tmp_path) -> None:  # noqa: ANN001
    """The embedded feed's ``_change_type`` (dictionary) and ``_changed_columns`` (list of dictionary) go into string
    and list<string> columns as they come, the same values as the decoded feed's."""
    import cdf

    source = lineage.create_table("s.src", SCHEMA, key=["id"], warehouse=str(tmp_path / "wh"))
    source.append(pa.table({"id": [1, 2], "status": ["a", "b"], "amount": [1.0, 2.0]}, schema=SCHEMA))
    source.update("id = 1", {"status": "'c'", "amount": "5"})
    source.delete("id = 2")
    feed = cdf.changes(source, 0)
    sink_schema = SCHEMA.append(pa.field("_change_type", pa.string())).append(pa.field("_changed_columns", pa.list_(pa.string())))
    sink = lineage.create_table("s.sink", sink_schema, warehouse=str(tmp_path / "wh"))
    sink.append(feed.select(sink_schema.names))
    order = [("_change_type", "ascending"), ("id", "ascending")]
    expected = cdf.decode_change_columns(feed).select(["id", "_change_type", "_changed_columns"])
    assert sink.scan(columns=["id", "_change_type", "_changed_columns"]).sort_by(order).to_pylist() == \
        expected.sort_by(order).to_pylist()


# ---------------------------------------------------------------- required fields inside nested columns


def _nullable(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (map keys stay required) and its narrow leaves wide (int32 as int64,
    float as double): the type of a caller's values."""
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _nullable(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _nullable(t.item_type)))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in t])
    return {pa.int32(): pa.int64(), pa.float32(): pa.float64()}.get(t, t)


def _holds_required_null(value: object, t: pa.DataType) -> bool:
    """The model: does the (non-null) ``value`` of type ``t`` hold a null where ``t`` requires a value, or a number
    beyond the range of its leaf type (an int32 outside 32 bits, a finite double that is infinite as a float)?"""
    if t == pa.int32():
        return not -2**31 <= value < 2**31  # type: ignore[operator]
    if t == pa.float32():
        with np.errstate(over="ignore"):
            return math.isfinite(value) and math.isinf(np.float32(value))  # type: ignore[arg-type]
    if pa.types.is_map(t):
        fields, items = [t.item_field] * len(value), [v for _, v in value]  # type: ignore[union-attr]
    elif pa.types.is_list(t):
        fields, items = [t.value_field] * len(value), list(value)  # type: ignore[arg-type]
    elif pa.types.is_struct(t):
        fields, items = list(t), [value[f.name] for f in t]  # type: ignore[index]
    else:
        return False
    return any(x is None and not f.nullable or x is not None and _holds_required_null(x, f.type) for f, x in zip(fields, items))


_LEAF = st.sampled_from([pa.int64(), pa.string(), pa.int32(), pa.float32()])
NESTED_TYPES = st.recursive(_LEAF, lambda inner: st.one_of(
    st.builds(lambda t, n: pa.list_(pa.field("element", t, nullable=n)), inner, st.booleans()),
    st.builds(lambda t, n: pa.map_(pa.string(), pa.field("value", t, nullable=n)), inner, st.booleans()),
    st.builds(lambda a, an, b, bn: pa.struct([pa.field("x", a, nullable=an), pa.field("y", b, nullable=bn)]),
              inner, st.booleans(), inner, st.booleans()),
), max_leaves=4).filter(lambda t: pa.types.is_nested(t))


def _values(t: pa.DataType) -> st.SearchStrategy:
    """Values of type ``t`` with nulls anywhere (also where ``t`` requires a value)."""
    def maybe(s: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(st.none(), s)

    if pa.types.is_list(t):
        return st.lists(maybe(_values(t.value_type)), max_size=3)
    if pa.types.is_map(t):
        return st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), maybe(_values(t.item_type))), max_size=2, unique_by=lambda e: e[0])
    if pa.types.is_struct(t):
        return st.fixed_dictionaries({f.name: maybe(_values(f.type)) for f in t})
    if t == pa.int32():
        return st.sampled_from([0, 2**31 - 1, -2**31, 2**31, -2**31 - 1])
    if t == pa.float32():
        return st.sampled_from([0.5, -1e39, 1e39, 3.4e38, 3.5e38, 1e-50, math.inf, -math.inf, math.nan])
    return st.integers(-2, 2) if pa.types.is_integer(t) else st.sampled_from(["", "p"])


@settings(max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "200")), deadline=None)
@given(data=st.data(), t=NESTED_TYPES)
def test_conform_refuses_exactly_the_nulls_a_nested_type_forbids(data, t) -> None:  # noqa: ANN001
    """A null inside a nested value where the column's type requires one (a list element, a map value, a struct field,
    at any depth, under a non-null parent) is refused by conform with SchemaMismatchError naming it, whatever the
    input's own nullability; so is a number beyond its narrower leaf type (a double overflowing float: Arrow's safe cast
    makes it inf); anything else is accepted with its values (NaN and infinities pass). Arrow's cast lets such nulls
    through, and the write then failed inside the Parquet writer with a raw ArrowInvalid."""
    from lineage.iceberg.schema import arrow_schema, conform, iceberg_schema

    values = data.draw(st.lists(st.one_of(st.none(), _values(t)), min_size=1, max_size=4))
    schema = iceberg_schema(pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("c", t)]), ["id"])
    target = arrow_schema(schema).field("c").type
    batch = pa.table({"id": pa.array(range(len(values)), pa.int64()), "c": pa.array(values, _nullable(t))})
    bad = any(v is not None and _holds_required_null(v, t) for v in values)
    if bad:
        with pytest.raises(SchemaMismatchError, match="column 'c'"):
            conform(batch, schema, ["id"])
    else:
        got = conform(batch, schema, ["id"])
        assert got.column("c").type.equals(target)
        assert repr(got.column("c").to_pylist()) == repr(pa.array(values, _nullable(t)).cast(target).to_pylist())  # NaN


def test_a_null_in_a_required_list_element_or_map_value_changes_nothing(tmp_path) -> None:  # noqa: ANN001
    from conftest import assert_interop

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("tags", pa.list_(pa.field("element", pa.int64(), nullable=False))),
                        pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)))])
    t = lineage.create_table("s.req", schema, key=["id"], warehouse=str(tmp_path / "wh"))
    t.append(pa.table({"id": [1, 2], "tags": pa.array([[1, 2], None], pa.list_(pa.int64())),
                       "m": pa.array([[("a", 1)], None], pa.map_(pa.string(), pa.int64()))}))
    for bad in (pa.table({"id": [3], "tags": pa.array([[None]], pa.list_(pa.int64()))}),
                pa.table({"id": [3], "m": pa.array([[("a", None)]], pa.map_(pa.string(), pa.int64()))})):
        for write in (t.append, t.upsert):
            with pytest.raises(SchemaMismatchError, match="required but holds a null"):
                write(bad)
    assert t.version == 1
    assert t.upsert(pa.table({"id": [2, 3], "tags": pa.array([[7], []], pa.list_(pa.int64()))})).committed
    assert {r["id"]: r["tags"] for r in t.scan().to_pylist()} == {1: [1, 2], 2: [7], 3: []}
    assert_interop(t)


# ---------------------------------------------------------------- null parents of required fields


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_null_struct_with_required_fields_is_written_and_read_as_null(tmp_path, format_version) -> None:  # noqa: ANN001
    """An optional struct whose fields are required may be null (given as None, or its column left out), also as a
    list element or a map value: every reader returns it as null, and the change feed too. Before, the omitted column
    failed inside the Parquet writer and our scan of a written null failed in Arrow's cast (DuckDB reads a null
    struct's fields as nulls), both with a raw ArrowInvalid."""
    import cdf
    from conftest import assert_interop

    point = pa.struct([pa.field("a", pa.int64(), nullable=False),
                       pa.field("inner", pa.struct([pa.field("b", pa.string(), nullable=False)]), nullable=False)])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", point),
                        pa.field("l", pa.list_(pa.field("element", point))),
                        pa.field("m", pa.map_(pa.string(), pa.field("value", point)))])
    t = lineage.create_table("s.nulls", schema, key=["id"], warehouse=str(tmp_path / "wh"), format_version=format_version)
    full = {"a": 1, "inner": {"b": "x"}}
    loose = pa.struct([pa.field("a", pa.int64()), pa.field("inner", pa.struct([pa.field("b", pa.string())]))])
    some = {"l": pa.array([[None]], pa.list_(loose)), "m": pa.array([[("j", None)]], pa.map_(pa.string(), loose))}
    t.append(pa.table({"id": [1, 2], "s": pa.array([full, None], loose),
                       "l": pa.array([[full, None], [None]], pa.list_(loose)),
                       "m": pa.array([[("k", None)], [("k", full)]], pa.map_(pa.string(), loose))}))
    t.append(pa.table({"id": [3, 4], "l": pa.array([[None], None], pa.list_(loose)),
                       "m": pa.array([[("j", None)], None], pa.map_(pa.string(), loose))}))
    t.upsert(pa.table({"id": [1], "s": pa.array([None], point), **some}))
    expected = {1: (None, [None], [("j", None)]), 2: (None, [None], [("k", full)]), 3: (None, [None], [("j", None)]),
                4: (None, None, None)}
    assert {r["id"]: (r["s"], r["l"], r["m"]) for r in t.scan().to_pylist()} == expected
    assert _readers(t, ["s", "l", "m"]) == {"duckdb": expected, "files": expected}
    t.delete("id = 4")  # the null list and map of structs: pyiceberg's scan reads them as empty ones (see below)
    assert_interop(t)
    feed = cdf.changes(t, 0).to_pylist()
    changes = [(r["id"], r["_change_type"], r["s"]) for r in feed]
    for change in ((1, "insert", full), (1, "update_preimage", full), (1, "update_postimage", None), (2, "insert", None),
                   (3, "insert", None)):
        assert change in changes
    # a null under a non-null parent is still refused, and so is a null in a required struct column
    for bad in (pa.table({"id": [4], "s": pa.array([{"a": None, "inner": {"b": "x"}}], loose)}),
                pa.table({"id": [4], "l": pa.array([[{"a": 1, "inner": None}]], pa.list_(loose))})):
        with pytest.raises(SchemaMismatchError, match="required but holds a null"):
            t.append(bad)
    required = lineage.create_table("s.req_struct", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                                               pa.field("s", point, nullable=False)]),
                                    key=["id"], warehouse=str(tmp_path / "wh"), format_version=format_version)
    with pytest.raises(SchemaMismatchError, match="'s'"):
        required.append(pa.table({"id": [1], "s": pa.array([None], point)}))
    with pytest.raises(SchemaMismatchError, match="'s'"):
        required.append(pa.table({"id": [1]}))
    assert required.version == 0 and t.version == 4


@pytest.mark.parametrize("column, value, table_type", [
    ("f", pa.array([1e39]), pa.float32()),
    ("fl", pa.array([[1.0, -1e39]]), pa.list_(pa.float32())),
    ("i", pa.array([2**31]), pa.int32()),
    ("d", pa.array([123456], pa.decimal128(6, 0)), pa.decimal128(5, 0)),
])
def test_a_value_beyond_a_narrower_column_type_changes_nothing(tmp_path, column, value, table_type) -> None:  # noqa: ANN001
    """A narrowing write (double into float, long into int, a decimal of more digits) whose value does not fit is
    refused naming the column, by append and upsert alike, and the table is untouched; values that fit are written,
    NaN and infinities included. Before, 1e39 was written to a float column as inf."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field(column, table_type)])
    t = lineage.create_table("s.narrow", schema, key=["id"], warehouse=str(tmp_path / "wh"))
    for write in (t.append, t.upsert):
        with pytest.raises(SchemaMismatchError, match=f"column '{column}'"):
            write(pa.table({"id": [1], column: value}))
    assert t.version == 0 and t.scan().num_rows == 0
    fits = {"f": pa.array([math.inf, 3.0e38]), "fl": pa.array([[math.nan, -math.inf], [1e-50]]), "i": pa.array([-2**31, 7]),
            "d": pa.array([99999, -5], pa.decimal128(6, 0))}[column]
    t.append(pa.table({"id": [1, 2], column: fits}))
    assert repr(t.scan(columns=[column]).column(column).to_pylist()) == repr(fits.cast(table_type).to_pylist())


def test_compaction_and_purge_rewrite_null_structs_with_required_fields(tmp_path) -> None:  # noqa: ANN001
    """Files written before a struct column with a required field was added, and rows whose struct a purge erases,
    are rewritten with that struct null: before, compaction failed in Arrow's cast (the added column's nulls) and
    purge would have written a null struct's required field as null."""
    from pyiceberg.types import LongType, NestedField, StructType

    from conftest import assert_interop

    t = lineage.create_table("s.compact", pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())]),
                             key=["id"], warehouse=str(tmp_path / "wh"))
    for i in range(3):
        t.append(pa.table({"id": [i], "v": [i]}))
    with t.iceberg.update_schema() as u:
        u.add_column("s", StructType(NestedField(10, "a", LongType(), required=True)))
    t.refresh()
    point = pa.struct([pa.field("a", pa.int64(), nullable=False)])
    t.append(pa.table({"id": [5, 6], "s": pa.array([{"a": 1}, {"a": 2}], point)}))
    t.delete("id = 0")
    expected = {1: (1, None), 2: (2, None), 5: (None, {"a": 1}), 6: (None, {"a": 2})}
    assert t.compact().version is not None
    assert {r["id"]: (r["v"], r["s"]) for r in t.scan().to_pylist()} == expected
    lineage.maintenance.purge(t, "id = 5")
    del expected[5]
    assert {r["id"]: (r["v"], r["s"]) for r in t.scan().to_pylist()} == expected
    assert_interop(t)


# ---------------------------------------------------------------- null lists and maps (of structs) stay null


def _readers(t: lineage.Table, columns: list[str]) -> dict[str, dict]:
    """``columns`` of the live rows by id as DuckDB's iceberg_scan reads them, and as the current data files hold them
    read with pyarrow.parquet (``files``: the values of an id the test expects, when some data file holds them; a file
    also holds the rows that later commits deleted)."""
    import pyarrow.parquet as pq

    t.refresh()
    con = duck.connect("iceberg")
    try:
        cols = ", ".join(f'"{c}"' for c in ["id", *columns])
        ddb = con.execute(f"SELECT {cols} FROM iceberg_scan('{t.iceberg.metadata_location}')").to_arrow_table()
    finally:
        con.close()
    duckdb = {r["id"]: tuple(r[c] for c in columns) for r in ddb.to_pylist()}
    held: dict[int, list[tuple]] = {}
    for task in t.iceberg.scan().plan_files():
        with t.iceberg.io.new_input(task.file.file_path).open() as f:
            for r in pq.read_table(f, columns=["id", *columns]).to_pylist():
                held.setdefault(r["id"], []).append(tuple(r[c] for c in columns))
    files = {i: v for i, v in duckdb.items() if v in held.get(i, [])}
    return {"duckdb": duckdb, "files": files}


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_null_list_or_map_of_structs_is_written_and_read_as_null(tmp_path, format_version) -> None:  # noqa: ANN001
    """A null ``list<struct>``, ``map<string, struct>`` and a struct's null ``list<struct>`` are null in the data
    file and for every reader: our scan, DuckDB's iceberg_scan, the change feed; also after an update, an upsert
    and a compaction rewrote them. Before, pyiceberg's projection for writing dropped their null mask
    (apache/iceberg-python #3833) and the file held empty ones. pyiceberg's own scan still reads them as empty
    (the same projection, on read): it is the one reader that differs, so the bytes are read with pyarrow."""
    import cdf

    item = pa.struct([pa.field("a", pa.int64())])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                        pa.field("l", pa.list_(item)), pa.field("m", pa.map_(pa.string(), item)),
                        pa.field("s", pa.struct([pa.field("l", pa.list_(item))])),
                        pa.field("ll", pa.list_(pa.list_(item)))])
    t = lineage.create_table("s.null_lists", schema, key=["id"], warehouse=str(tmp_path / "wh"), format_version=format_version)
    one = {"a": 1}
    data = {"l": [None, [], [one, None]], "m": [None, [], [("k", one), ("n", None)]],
            "s": [{"l": None}, {"l": []}, None], "ll": [[None, [one]], None, [[], None]]}
    t.append(pa.table({"id": [1, 2, 3], "v": [1, 2, 3], **{c: pa.array(v, schema.field(c).type) for c, v in data.items()}}))
    columns = list(data)
    expected = {i + 1: tuple(data[c][i] for c in columns) for i in range(3)}

    def check() -> None:
        assert {r["id"]: tuple(r[c] for c in columns) for r in t.scan().to_pylist()} == expected
        assert _readers(t, columns) == {"duckdb": expected, "files": expected}

    check()
    assert {(r["id"], r["_change_type"]): tuple(r[c] for c in columns) for r in cdf.changes(t, 0).to_pylist()} == \
        {(i, "insert"): v for i, v in expected.items()}
    t.update("id IN (1, 2)", {"v": "v + 10"})  # rewritten rows keep their null and empty lists and maps
    check()
    t.upsert(pa.table({"id": [3, 4], "v": [30, 40], "l": pa.array([None, []], schema.field("l").type),
                       "m": pa.array([[], None], schema.field("m").type)}))
    expected[3] = (None, [], None, None)
    expected[4] = ([], None, None, None)
    check()
    feed = {(r["id"], r["_change_type"]): tuple(r[c] for c in columns) for r in cdf.changes(t, 1).to_pylist()}
    assert feed[(1, "update_postimage")] == expected[1] and feed[(3, "update_preimage")] == (
        [one, None], [("k", one), ("n", None)], None, [[], None])
    assert feed[(3, "update_postimage")] == expected[3] and feed[(4, "insert")] == expected[4]
    assert t.compact(target_file_size_bytes=1 << 20, min_file_size_bytes=1 << 20).version is not None
    assert len(list(t.iceberg.scan().plan_files())) == 1
    check()


@settings(max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "200")), deadline=None)
@given(data=st.data(), t=NESTED_TYPES)
def test_the_projection_for_writing_keeps_every_null(data, t) -> None:  # noqa: ANN001
    """pyiceberg's projection of a batch to the data file's schema, with our null masks put back
    (:func:`lineage.iceberg.schema.with_null_collections`), holds the batch's values: null lists and maps stay null at
    any depth (pyiceberg alone made a null list of structs, or a null map with struct values, empty), also for a slice
    of a batch."""
    from pyiceberg.io.pyarrow import ParquetFormatModel, _to_requested_schema

    from lineage.iceberg.schema import conform, iceberg_schema, with_null_collections

    values = data.draw(st.lists(st.one_of(st.none(), _values(t)), min_size=1, max_size=5))
    values = [v for v in values if v is None or not _holds_required_null(v, t)] or [None]
    schema = iceberg_schema(pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("c", t)]), ["id"])
    batch = conform(pa.table({"id": pa.array(range(len(values)), pa.int64()), "c": pa.array(values, _nullable(t))}),
                    schema, ["id"]).to_batches()[0]
    start = data.draw(st.integers(0, len(values) - 1))
    batch = batch.slice(start)
    projected = _to_requested_schema(requested_schema=schema, file_schema=schema, batch=batch, include_field_ids=True,
                                     format_model=ParquetFormatModel())
    kept = with_null_collections(projected, batch, schema, schema)
    assert kept.schema.equals(projected.schema, check_metadata=True)
    assert repr(kept.column("c").to_pylist()) == repr(batch.column("c").to_pylist())


@settings(max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "200")) // 8 + 1, deadline=None)
@given(data=st.data(), t=NESTED_TYPES, format_version=st.sampled_from([2, 3]))
def test_nested_values_are_read_back_as_appended(tmp_path_factory, data, t, format_version) -> None:  # noqa: ANN001
    """An append of nested values of any shape (null and empty lists, maps and structs at any depth) is read back
    as it was written, by our scan and from the data file's bytes."""
    import pyarrow.parquet as pq

    values = data.draw(st.lists(st.one_of(st.none(), _values(t)), min_size=1, max_size=4))
    values = [v for v in values if v is None or not _holds_required_null(v, t)] or [None]
    table = lineage.create_table("s.nested", pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("c", t)]),
                                 key=["id"], warehouse=str(tmp_path_factory.mktemp("wh")), format_version=format_version)
    table.append(pa.table({"id": pa.array(range(len(values)), pa.int64()), "c": pa.array(values, _nullable(t))}))
    target = table.scan().schema.field("c").type
    expected = repr(pa.array(values, _nullable(t)).cast(target).to_pylist())
    assert repr(table.scan().sort_by("id").column("c").to_pylist()) == expected
    (task,) = table.iceberg.scan().plan_files()
    with table.iceberg.io.new_input(task.file.file_path).open() as f:
        assert repr(pq.read_table(f).sort_by("id").column("c").to_pylist()) == expected
