"""Bad input: every public entry point fails with a specific lineage error and changes nothing.

DESIGN.md section 7: "Every public entry point validates its input and fails
with a clear, specific error (which argument, which value, what is allowed)
and leaves the table exactly as it was."

Each case below runs one bad call against freshly seeded tables and checks:

* the exception is the specific class from :mod:`lineage.errors` (and so a
  :class:`lineage.LineageError`), never a raw DuckDB / pyarrow / pydantic one;
* its message names the offending argument or value;
* afterwards, reloaded from the catalog, every table has the same metadata
  location, current snapshot id, version, commit log and scan result (with
  lineage), and no file was added to or removed from the warehouse.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo

import lineage
import lineage.errors as errors
from lineage import (
    BadPredicateError,
    InvalidArgumentError,
    KeyViolationError,
    LineageError,
    SchemaMismatchError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnknownColumnError,
    UnknownVersionError,
)
from conftest import SCHEMA, rows

KEYED = "shop.orders"
KEYLESS = "shop.events"
NEW = "shop.fresh"  # the name create_table cases try to create

# The keyless table has a required (non-key) column, for "missing required column".
KEYLESS_SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("amount", pa.float64(), nullable=False)])


@dataclass
class Tables:
    warehouse: str
    keyed: lineage.Table
    keyless: lineage.Table


@pytest.fixture
def tables(warehouse) -> Tables:
    keyed = lineage.create_table(KEYED, SCHEMA, key=["id"], warehouse=warehouse)
    keyed.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.0, 0.0, 3.0]}))
    keyless = lineage.create_table(KEYLESS, KEYLESS_SCHEMA, warehouse=warehouse)
    keyless.append(pa.table({"id": [1, 1], "name": ["x", "y"], "amount": [5.0, 6.0]}))
    return Tables(warehouse, keyed, keyless)


def _files(warehouse: str) -> set[str]:
    out = set()
    for root, _dirs, names in os.walk(warehouse):
        for name in names:
            if name.startswith("catalog.db"):
                continue  # the SQLite catalog itself (and its journal)
            out.add(os.path.relpath(os.path.join(root, name), warehouse))
    return out


def _table_fingerprint(warehouse: str, name: str) -> dict:
    t = lineage.open_table(name, warehouse=warehouse)
    snap = t.iceberg.metadata.current_snapshot()
    return {
        "metadata_location": t.iceberg.metadata_location,
        "snapshot_id": snap.snapshot_id if snap else None,
        "version": t.version,
        "history": [(c.version, c.snapshot_id, c.operation) for c in t.history()],
        "rows": rows(t.scan()),
        "properties": t.properties,
        "schema": str(t.iceberg.schema()),
    }


def fingerprint(warehouse: str) -> dict:
    """Everything a rejected call must leave exactly as it was."""
    return {
        KEYED: _table_fingerprint(warehouse, KEYED),
        KEYLESS: _table_fingerprint(warehouse, KEYLESS),
        "files": _files(warehouse),
    }


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[Tables], object]
    error: type[LineageError]
    needles: tuple[str, ...] = ()  # substrings the message must contain (the offending argument / value)
    not_error: type[Exception] | None = None  # a (sub)class that would be misleading here
    check_files: bool = True


def _batch(**cols) -> pa.Table:
    return pa.table(cols)


CASES = [
    # ------------------------------------------------------------------ append
    Case("append-unknown-column", lambda t: t.keyed.append(_batch(id=[10], bogus=[1])), UnknownColumnError, ("bogus",)),
    Case("append-reserved-lineage-column", lambda t: t.keyed.append(_batch(id=[10], _row_id=[0])), UnknownColumnError, ("_row_id",)),
    Case("append-missing-key-column", lambda t: t.keyed.append(_batch(name=["x"], amount=[1.0])), SchemaMismatchError, ("'id'",)),
    Case("append-missing-required-column", lambda t: t.keyless.append(_batch(id=[10], name=["x"])), SchemaMismatchError, ("'amount'",)),
    Case("append-null-in-required-column", lambda t: t.keyless.append(_batch(id=[10], amount=pa.array([None], pa.float64()))), SchemaMismatchError, ("'amount'",)),
    Case("append-wrong-type-string-for-int", lambda t: t.keyed.append(_batch(id=["x"])), SchemaMismatchError, ("'id'", "string")),
    Case("append-wrong-type-string-for-double", lambda t: t.keyed.append(_batch(id=[10], amount=["1.5"])), SchemaMismatchError, ("'amount'",)),
    Case("append-lossy-float-for-int", lambda t: t.keyed.append(_batch(id=[1.5])), SchemaMismatchError, ("'id'",)),
    Case(
        "append-duplicate-column-names",
        lambda t: t.keyed.append(pa.Table.from_arrays([pa.array([10]), pa.array([11])], names=["id", "id"])),
        SchemaMismatchError,
        ("id",),
    ),
    Case("append-null-key", lambda t: t.keyed.append(_batch(id=pa.array([10, None], pa.int64()))), KeyViolationError, ("'id'",)),
    Case("append-python-list", lambda t: t.keyed.append([{"id": 10}]), InvalidArgumentError, ("list",)),
    Case("append-python-dict", lambda t: t.keyed.append({"id": [10]}), InvalidArgumentError, ("dict",)),
    Case("append-none", lambda t: t.keyed.append(None), InvalidArgumentError, ("NoneType",)),
    # ------------------------------------------------------------------ delete
    Case("delete-unknown-column", lambda t: t.keyed.delete("nope = 1"), UnknownColumnError, ("nope",)),
    Case("delete-unknown-column-iceberg-expr", lambda t: t.keyed.delete(EqualTo("nope", 1)), UnknownColumnError, ("nope",)),
    Case("delete-syntax-error", lambda t: t.keyed.delete("id = "), BadPredicateError, ("id = ",)),
    Case("delete-unbalanced-parenthesis", lambda t: t.keyed.delete("(id = 1"), BadPredicateError, ("(id = 1",)),
    Case(
        "delete-multi-statement-injection",
        lambda t: t.keyed.delete("TRUE); DELETE FROM __probe; SELECT (1"),
        BadPredicateError,
        ("DELETE FROM __probe",),
    ),
    Case("delete-two-statements", lambda t: t.keyed.delete("id = 1; SELECT 1"), BadPredicateError, ("SELECT 1",)),
    Case("delete-non-boolean-double", lambda t: t.keyed.delete("amount"), BadPredicateError, ("amount",)),
    Case("delete-non-boolean-arithmetic", lambda t: t.keyed.delete("id + 1"), BadPredicateError, ("id + 1",)),
    Case("delete-non-boolean-string", lambda t: t.keyed.delete("name"), BadPredicateError, ("name",)),
    Case("delete-type-error", lambda t: t.keyed.delete("name + 1 = 2"), BadPredicateError, ("name + 1 = 2",), not_error=UnknownColumnError),
    Case("delete-empty-predicate", lambda t: t.keyed.delete("   "), BadPredicateError, ("where",)),
    Case("delete-none-predicate", lambda t: t.keyed.delete(None), InvalidArgumentError, ("where",)),
    Case("delete-predicate-wrong-type", lambda t: t.keyed.delete(5), BadPredicateError, ("int",)),
    # well-typed, but fails on the table's data ('a' is not an integer): still bad input, not a raw DuckDB error
    Case("delete-predicate-fails-on-data", lambda t: t.keyed.delete("CAST(name AS INTEGER) = 1"), InvalidArgumentError, ("name",)),
    Case("delete-bad-mode", lambda t: t.keyed.delete("id = 1", mode="bogus"), InvalidArgumentError, ("mode", "bogus")),
    Case("delete-bad-mode-no-match", lambda t: t.keyed.delete("FALSE", mode="bogus"), InvalidArgumentError, ("mode", "bogus")),
    # ------------------------------------------------------------------ update
    Case("update-set-unknown-column", lambda t: t.keyed.update("TRUE", {"bogus": "1"}), UnknownColumnError, ("bogus",)),
    Case("update-set-lineage-column", lambda t: t.keyed.update("TRUE", {"_row_id": "1"}), UnknownColumnError, ("_row_id",)),
    Case("update-where-unknown-column", lambda t: t.keyed.update("nope = 1", {"amount": "1"}), UnknownColumnError, ("nope",)),
    Case("update-where-syntax-error", lambda t: t.keyed.update("id = = 1", {"amount": "1"}), BadPredicateError, ("id = = 1",)),
    Case("update-where-non-boolean", lambda t: t.keyed.update("amount", {"name": "'z'"}), BadPredicateError, ("amount",)),
    Case("update-set-syntax-error", lambda t: t.keyed.update("TRUE", {"amount": "amount +"}), InvalidArgumentError, ("amount", "amount +")),
    Case("update-set-unknown-column-in-expression", lambda t: t.keyed.update("TRUE", {"amount": "nope + 1"}), UnknownColumnError, ("nope",)),
    Case(
        "update-set-multi-statement",
        lambda t: t.keyed.update("TRUE", {"amount": "1); DELETE FROM __probe; SELECT (1"}),
        InvalidArgumentError,
        ("amount",),
    ),
    # a type error is not an unknown column: both columns exist
    Case(
        "update-set-type-error",
        lambda t: t.keyed.update("TRUE", {"amount": "amount + name"}),
        InvalidArgumentError,
        ("amount + name",),
        not_error=UnknownColumnError,
    ),
    Case("update-set-result-of-wrong-type", lambda t: t.keyed.update("TRUE", {"amount": "'abc'"}), SchemaMismatchError, ("'amount'",)),
    Case("update-set-expression-fails-on-data", lambda t: t.keyed.update("TRUE", {"amount": "CAST(name AS DOUBLE)"}), InvalidArgumentError, ("amount",)),
    Case("update-set-key-to-null", lambda t: t.keyed.update("TRUE", {"id": "NULL"}), KeyViolationError, ("id",)),
    Case("update-set-key-to-null-one-row", lambda t: t.keyed.update("id = 2", {"id": "NULL", "amount": "7"}), KeyViolationError, ("id",)),
    Case("update-set-required-to-null", lambda t: t.keyless.update("TRUE", {"amount": "NULL"}), SchemaMismatchError, ("amount",)),
    Case("update-set-empty", lambda t: t.keyed.update("TRUE", {}), InvalidArgumentError, ("set",)),
    Case("update-set-not-a-mapping", lambda t: t.keyed.update("TRUE", "amount = 1"), InvalidArgumentError, ("set",)),
    Case("update-set-expression-not-a-string", lambda t: t.keyed.update("TRUE", {"amount": 5}), InvalidArgumentError, ("amount",)),
    Case("update-bad-mode", lambda t: t.keyed.update("TRUE", {"amount": "1"}, mode="MOR"), InvalidArgumentError, ("mode", "MOR")),
    # ------------------------------------------------------------------ upsert
    Case("upsert-null-key", lambda t: t.keyed.upsert(_batch(id=pa.array([1, None], pa.int64()), amount=[1.0, 2.0])), KeyViolationError, ("'id'", "null")),
    Case("upsert-duplicate-keys", lambda t: t.keyed.upsert(_batch(id=[2, 7, 2], amount=[1.0, 2.0, 3.0])), KeyViolationError, ("'id': 2",)),
    Case("upsert-duplicate-new-keys", lambda t: t.keyed.upsert(_batch(id=[8, 8], amount=[1.0, 2.0])), KeyViolationError, ("'id': 8",)),
    Case("upsert-table-without-key", lambda t: t.keyless.upsert(_batch(id=[1], amount=[9.0])), KeyViolationError, (KEYLESS, "key")),
    Case("upsert-unknown-column", lambda t: t.keyed.upsert(_batch(id=[1], bogus=[1])), UnknownColumnError, ("bogus",)),
    Case("upsert-missing-key-column", lambda t: t.keyed.upsert(_batch(amount=[1.0])), SchemaMismatchError, ("'id'",)),
    Case("upsert-wrong-type", lambda t: t.keyed.upsert(_batch(id=[1], amount=["x"])), SchemaMismatchError, ("'amount'",)),
    Case("upsert-python-list", lambda t: t.keyed.upsert([{"id": 1}]), InvalidArgumentError, ("list",)),
    Case("upsert-bad-mode", lambda t: t.keyed.upsert(_batch(id=[1], amount=[1.0]), mode=5), InvalidArgumentError, ("mode", "5")),
    # ------------------------------------------------------------------ reads
    Case("scan-as-of-unknown-version", lambda t: t.keyed.scan(as_of=99), UnknownVersionError, ("99",)),
    Case("scan-as-of-negative", lambda t: t.keyed.scan(as_of=-1), UnknownVersionError, ("-1",)),
    Case("count-as-of-unknown-version", lambda t: t.keyed.count(as_of=2), UnknownVersionError, ("2",)),
    Case("scan-as-of-string", lambda t: t.keyed.scan(as_of="1"), InvalidArgumentError, ("as_of", "'1'")),
    Case("scan-as-of-float", lambda t: t.keyed.scan(as_of=1.0), InvalidArgumentError, ("as_of", "1.0")),
    Case("scan-as-of-bool", lambda t: t.keyed.scan(as_of=True), InvalidArgumentError, ("as_of", "True")),
    Case("scan-unknown-column", lambda t: t.keyed.scan(columns=["id", "nope"]), UnknownColumnError, ("nope",)),
    Case("scan-columns-as-string", lambda t: t.keyed.scan(columns="id"), InvalidArgumentError, ("columns",)),
    Case("scan-where-unknown-column", lambda t: t.keyed.scan(where="nope > 1"), UnknownColumnError, ("nope",)),
    Case("scan-where-non-boolean", lambda t: t.keyed.scan(where="amount"), BadPredicateError, ("amount",)),
    # ------------------------------------------------------------------ create / open
    Case(
        "create-key-not-in-schema",
        lambda t: lineage.create_table(NEW, SCHEMA, key=["nokey"], warehouse=t.warehouse),
        UnknownColumnError,
        ("nokey",),
    ),
    Case(
        "create-key-on-float-column",
        lambda t: lineage.create_table(NEW, SCHEMA, key=["amount"], warehouse=t.warehouse),
        InvalidArgumentError,
        ("amount",),
    ),
    Case(
        "create-partition-garbage",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=["id +"], warehouse=t.warehouse),
        InvalidArgumentError,
        ("id +",),
    ),
    Case(
        "create-partition-unknown-column",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=["nope"], warehouse=t.warehouse),
        UnknownColumnError,
        ("nope",),
    ),
    Case(
        "create-partition-unknown-transform",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=["frobnicate(id)"], warehouse=t.warehouse),
        InvalidArgumentError,
        ("frobnicate(id)",),
    ),
    Case(
        "create-partition-transform-wrong-type",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=["day(id)"], warehouse=t.warehouse),
        InvalidArgumentError,
        ("day(id)",),
    ),
    Case(
        "create-partition-bucket-without-count",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=["bucket(id)"], warehouse=t.warehouse),
        InvalidArgumentError,
        ("bucket(id)",),
    ),
    Case(
        "create-partition-bucket-zero",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=["bucket(0, id)"], warehouse=t.warehouse),
        InvalidArgumentError,
        ("bucket(0, id)",),
    ),
    Case(
        "create-partition-entry-not-a-string",
        lambda t: lineage.create_table(NEW, SCHEMA, partition_by=[None], warehouse=t.warehouse),
        InvalidArgumentError,
        ("partition_by",),
    ),
    Case(
        "create-reserved-row-id",
        lambda t: lineage.create_table(NEW, pa.schema([("id", pa.int64()), ("_row_id", pa.int64())]), warehouse=t.warehouse),
        InvalidArgumentError,
        ("_row_id",),
    ),
    Case(
        "create-reserved-created-version",
        lambda t: lineage.create_table(NEW, pa.schema([("id", pa.int64()), ("_row_created_at_version", pa.int64())]), warehouse=t.warehouse),
        InvalidArgumentError,
        ("_row_created_at_version",),
    ),
    Case(
        "create-reserved-dunder-prefix",
        lambda t: lineage.create_table(NEW, pa.schema([("id", pa.int64()), ("__lineage_row_id", pa.int64())]), warehouse=t.warehouse),
        InvalidArgumentError,
        ("__lineage_row_id",),
    ),
    Case(
        "create-duplicate-column-names",
        lambda t: lineage.create_table(NEW, pa.schema([("id", pa.int64()), ("id", pa.string())]), warehouse=t.warehouse),
        InvalidArgumentError,
        ("id",),
    ),
    Case(
        "create-schema-not-arrow",
        lambda t: lineage.create_table(NEW, {"id": "long"}, warehouse=t.warehouse),
        InvalidArgumentError,
        ("schema", "dict"),
    ),
    Case(
        "create-format-version-1",
        lambda t: lineage.create_table(NEW, SCHEMA, warehouse=t.warehouse, properties={"format-version": "1"}),
        InvalidArgumentError,
        ("format-version",),
    ),
    Case(
        "create-bad-mode-property",
        lambda t: lineage.create_table(NEW, SCHEMA, warehouse=t.warehouse, properties={"write.delete.mode": "bogus"}),
        InvalidArgumentError,
        ("write.delete.mode", "bogus"),
    ),
    Case(
        "create-existing-name",
        lambda t: lineage.create_table(KEYED, pa.schema([("other", pa.string())]), warehouse=t.warehouse),
        TableAlreadyExistsError,
        (KEYED,),
        # pyiceberg's SqlCatalog writes the would-be metadata file before it finds the
        # name taken; that unreferenced file is allowed (vacuum removes it).
        check_files=False,
    ),
    Case("open-missing-table", lambda t: lineage.open_table("shop.missing", warehouse=t.warehouse), TableNotFoundError, ("shop.missing",)),
    Case("open-missing-namespace", lambda t: lineage.open_table("nowhere.missing", warehouse=t.warehouse), TableNotFoundError, ("nowhere.missing",)),
    Case("open-empty-name", lambda t: lineage.open_table("", warehouse=t.warehouse), InvalidArgumentError, ("name",)),
    Case("open-without-warehouse-or-catalog", lambda t: lineage.open_table(KEYED), InvalidArgumentError, ("warehouse",)),
]


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_rejected_and_changes_nothing(case: Case, tables: Tables):
    before = fingerprint(tables.warehouse)
    try:
        case.call(tables)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a Rust panic is a BaseException; it must be reported, not crash the run
        error: BaseException | None = exc
    else:
        error = None
    after = fingerprint(tables.warehouse)

    assert error is not None, f"bad input was accepted (table changed: {before != after})"
    assert isinstance(error, case.error), f"expected {case.error.__name__}, got {type(error).__module__}.{type(error).__name__}: {error}"
    assert isinstance(error, LineageError)
    if case.not_error is not None:
        assert not isinstance(error, case.not_error), f"{type(error).__name__} is misleading here: {error}"
    message = str(error)
    for needle in case.needles:
        assert needle in message, f"message does not name {needle!r}: {message}"

    if not case.check_files:
        before.pop("files"), after.pop("files")
    assert after == before, "a rejected call changed the table"
    with pytest.raises(TableNotFoundError):
        lineage.open_table(NEW, warehouse=tables.warehouse)


def test_rejected_write_through_same_handle_then_good_write(tables: Tables):
    """A handle that saw a rejected write keeps working, and the next version is the next number."""
    t = tables.keyed
    v = t.version
    with pytest.raises(KeyViolationError):
        t.upsert(pa.table({"id": [1, 1], "amount": [1.0, 2.0]}))
    with pytest.raises(UnknownColumnError):
        t.delete("nope = 1")
    info = t.upsert(pa.table({"id": [1, 9], "name": ["A", "I"], "amount": [1.5, 9.0]}))
    assert info.committed and info.version == v + 1
    assert info.inserted == 1 and info.updated == 1
    assert t.version == v + 1
    assert rows(t.scan(), ["id", "name", "amount"]) == rows(
        pa.table({"id": [1, 2, 3, 9], "name": ["A", "b", "c", "I"], "amount": [1.5, 0.0, 3.0, 9.0]})
    )


def test_every_error_is_a_lineage_error():
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if obj.__module__ == errors.__name__]
    assert len(classes) >= 12
    for cls in classes:
        assert issubclass(cls, LineageError), cls
        assert getattr(lineage, cls.__name__) is cls, f"{cls.__name__} is not exported from lineage"
    # input errors are also ValueErrors, so generic callers can catch them
    for cls in (UnknownColumnError, SchemaMismatchError, BadPredicateError, KeyViolationError, UnknownVersionError):
        assert issubclass(cls, InvalidArgumentError) and issubclass(cls, ValueError)
    assert issubclass(lineage.UnsupportedFormatError, lineage.LineageMetadataError)
