"""What an append accepts besides the table's exact Arrow types: encodings of the same values, and nothing lossy."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

import lineage
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
