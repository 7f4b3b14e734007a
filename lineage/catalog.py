"""Catalogs: the embedded default (SQLite inside the warehouse) or any pyiceberg catalog."""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.properties import property_as_bool

import lineage.iceberg.v3_metadata as v3_metadata
import lineage.storage.files as storage_files
import lineage.storage.removals as removals
from lineage.errors import CatalogUnavailableError, InvalidArgumentError, TableNotFoundError, UnsupportedFormatError

if TYPE_CHECKING:  # imported when a catalog is opened: SQLAlchemy is not part of importing the library
    from pyiceberg.catalog.sql import SqlCatalog

DEFAULT_NAMESPACE = "default"
CATALOG_FILE = "catalog.db"
# The name of the embedded catalog: pyiceberg's SqlCatalog stores it in every row of catalog.db
# (iceberg_tables.catalog_name), so another engine's JDBC catalog must use the same name to see our tables.
CATALOG_NAME = "lineage"


def is_sql_catalog(catalog: object) -> bool:
    """Whether ``catalog`` is pyiceberg's ``SqlCatalog``.

    Its module (and SQLAlchemy under it) is imported when a catalog is first
    opened, not with the library: while it is not imported, no catalog can
    be one.
    """
    sql = sys.modules.get("pyiceberg.catalog.sql")
    return sql is not None and isinstance(catalog, sql.SqlCatalog)


def default_catalog(warehouse: str | os.PathLike[str]) -> Catalog:
    """pyiceberg's SqlCatalog on a SQLite file inside ``warehouse`` (created if missing)."""
    from pyiceberg.catalog.sql import SqlCatalog

    root = os.path.abspath(os.fspath(warehouse))
    os.makedirs(root, exist_ok=True)
    # timeout: writers in several processes wait for SQLite's lock instead of failing.
    # The path is percent-encoded: SQLAlchemy decodes the URL, so a folder named "a%25b" would otherwise become "a%b".
    catalog = SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{quote(os.path.join(root, CATALOG_FILE))}?timeout=60",
        warehouse=root,
    )
    _write_ahead_log(catalog)
    return catalog


def _write_ahead_log(catalog: SqlCatalog) -> None:
    """Commit to the embedded catalog through SQLite's write-ahead log, without a sync per commit.

    In its default rollback-journal mode SQLite syncs the journal and the
    database at every commit: about 20 ms on a busy disk, the largest single
    cost of a small commit. In WAL mode with ``synchronous=NORMAL`` a commit
    appends to the log and syncs only at checkpoints; the database cannot be
    corrupted, and a power loss may forget the last commits, which is no
    weaker than the metadata and data files the catalog points at (written
    without a sync of their own). Readers and the writer no longer block
    each other. The log is checkpointed often and kept under 512 KiB. A database that cannot switch (e.g. on a read-only folder)
    stays as it is.
    """
    write_ahead_log(catalog, durable=False)


def write_ahead_log(catalog: Catalog, *, durable: bool = True) -> None:
    """Make a pyiceberg ``SqlCatalog`` on a SQLite file commit through SQLite's write-ahead log (WAL mode).

    A commit then appends to the log instead of syncing a rollback journal
    and the database file (two syncs or more, tens of milliseconds on a busy
    disk), and readers no longer block the writer. ``durable`` (the
    default) keeps ``synchronous=FULL``: a commit is on disk when it
    returns, as before, at the cost of one sync of the log; ``False`` syncs
    only at checkpoints (a power loss may forget the last commits; the
    embedded catalog of a local warehouse runs so). WAL mode is a property
    of the database file, and needs every process using it on one host (not
    a network file system). ``InvalidArgumentError`` for another catalog.
    """
    from sqlalchemy import event

    if not is_sql_catalog(catalog) or catalog.engine.dialect.name != "sqlite":  # type: ignore[attr-defined]
        raise InvalidArgumentError(f"write_ahead_log takes a SqlCatalog on SQLite, got {type(catalog).__name__}")
    synchronous = "FULL" if durable else "NORMAL"

    def on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        try:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            dbapi_connection.execute(f"PRAGMA synchronous={synchronous}")
            # Checkpoint every 100 pages (a few dozen commits; SQLite's default is 1000) and cut the log back to
            # 512 KiB after one: the log stays small beside the tables' files.
            dbapi_connection.execute("PRAGMA wal_autocheckpoint=100")
            dbapi_connection.execute(f"PRAGMA journal_size_limit={512 * 1024}")
        except sqlite3.Error:
            pass

    event.listen(catalog.engine, "connect", on_connect)  # type: ignore[attr-defined]
    catalog.engine.dispose()  # type: ignore[attr-defined]  # connections opened while the catalog created its tables get the settings too


def current_metadata_location(catalog: Catalog, table_identifier: tuple[str, ...]) -> str | None:
    """Where the catalog's pointer for a table is now, read without loading the metadata.

    Only pyiceberg's ``SqlCatalog`` can be asked this cheaply (one indexed
    row); for other catalogs, and a table the catalog does not have, None.
    Refreshing a table whose pointer did not move can then skip reading and
    parsing a metadata file whose size grows with the number of snapshots.
    """
    if not is_sql_catalog(catalog):
        return None
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(table_identifier))
    name = Catalog.table_name_from(table_identifier)
    # a plain connection and one prepared statement: an ORM session costs 0.5 ms, and every read asks this
    with catalog.engine.connect() as connection:
        return connection.execute(_location_query(), {"catalog": catalog.name, "namespace": namespace, "name": name}).scalar()


@functools.cache
def _location_query() -> Any:
    """The query of :func:`current_metadata_location`, built once (SQLAlchemy then reuses its compiled form)."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import bindparam, select

    return select(IcebergTables.metadata_location).where(
        IcebergTables.catalog_name == bindparam("catalog"),
        IcebergTables.table_namespace == bindparam("namespace"),
        IcebergTables.table_name == bindparam("name"),
    )


@dataclass(frozen=True)
class PreparedMetadata:
    """A metadata commit computed from the metadata a table object holds: the new metadata, its file, its base."""

    metadata: TableMetadata
    location: str
    base_location: str


def commit_metadata(iceberg: IcebergTable, updates: tuple, requirements: tuple) -> None:
    """Commit table metadata updates; on success ``iceberg`` holds the new metadata.

    For pyiceberg's ``SqlCatalog`` (the embedded default) the commit is made
    here (:func:`prepare_metadata`, :func:`write_metadata`,
    :func:`swap_metadata`), with the same compare-and-swap on the catalog row
    that ``SqlCatalog.commit_table`` makes, but from the metadata ``iceberg``
    already holds: ``commit_table`` re-reads and re-parses the current
    metadata file and deep-copies the updated metadata, work proportional to
    the number of snapshots (about 1 ms per snapshot on a 2-core machine).
    Other catalogs go through ``commit_table``.
    """
    prepared = prepare_metadata(iceberg, updates, requirements)
    if prepared is None:
        try:
            iceberg._do_commit(updates, requirements)
        except NotImplementedError as exc:  # pyiceberg serialises no v3 metadata; only our SqlCatalog path does
            raise UnsupportedFormatError(
                f"this catalog ({type(iceberg.catalog).__name__}) cannot commit Iceberg format version 3 metadata from "
                "Python; use a SQL catalog (SQLite or PostgreSQL)"
            ) from exc
        return
    write_metadata(iceberg, prepared)
    swap_metadata(iceberg, prepared)


def prepare_metadata(iceberg: IcebergTable, updates: tuple, requirements: tuple) -> PreparedMetadata | None:
    """The new metadata and its file name, for a catalog this module commits to itself; None for other catalogs.

    The requirements are checked against the base metadata ``iceberg``
    holds; :func:`swap_metadata` then succeeds only if the catalog still
    points at that base, so a commit never lands on top of a change it did
    not see. Nothing is written: a commit sends the metadata file
    (:func:`write_metadata`) together with its manifests, one round trip to
    an object store instead of two.
    """
    catalog = iceberg.catalog
    if not is_sql_catalog(catalog) or not catalog.engine.dialect.supports_sane_rowcount:
        return None
    from pyiceberg.table.locations import load_location_provider
    from pyiceberg.table.update import _TableMetadataUpdateContext, _update_table_metadata_log

    base, base_location = iceberg.metadata, iceberg.metadata_location
    for requirement in requirements:
        requirement.validate(base)
    metadata = v3_metadata.apply_updates(base, updates, _TableMetadataUpdateContext())
    metadata = _update_table_metadata_log(metadata, base_location, base.last_updated_ms)
    if metadata.last_updated_ms == base.last_updated_ms:
        metadata = metadata.model_copy(update={"last_updated_ms": int(time.time() * 1000)})
    version = catalog._parse_metadata_version(base_location) + 1
    location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(version)
    return PreparedMetadata(metadata, location, base_location)


def write_metadata(iceberg: IcebergTable, prepared: PreparedMetadata) -> None:
    """Write the prepared metadata file (in the caller's parallel-puts block, if any: it must land before the swap)."""
    v3_metadata.write_table_metadata(prepared.metadata, iceberg.io, prepared.location)


def swap_metadata(iceberg: IcebergTable, prepared: PreparedMetadata) -> None:
    """Point the catalog at the prepared metadata file if it still points at its base; ``CommitFailedException`` if not."""
    from pyiceberg.exceptions import CommitFailedException

    catalog = iceberg.catalog
    base = iceberg.metadata
    table_identifier = iceberg.name()
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(table_identifier))
    name = Catalog.table_name_from(table_identifier)
    with catalog.engine.begin() as connection:  # a Core statement built once: no ORM session, compiled once per dialect
        result = connection.execute(_swap_statement(), {
            "w_catalog": catalog.name, "w_namespace": namespace, "w_name": name, "w_base": prepared.base_location,
            "v_location": prepared.location, "v_previous": prepared.base_location,
        })
        if result.rowcount < 1:
            raise CommitFailedException(f"Table has been updated by another process: {namespace}.{name}")
    _delete_old_metadata(iceberg, base, prepared.metadata)
    iceberg.metadata = prepared.metadata
    iceberg.metadata_location = prepared.location


@functools.lru_cache(maxsize=1)
def _swap_statement() -> Any:
    """The catalog row's compare-and-swap: ``UPDATE iceberg_tables SET metadata_location ... WHERE ... = base``."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import bindparam
    from sqlalchemy import update as sql_update

    return (
        sql_update(IcebergTables)
        .where(
            IcebergTables.catalog_name == bindparam("w_catalog"),
            IcebergTables.table_namespace == bindparam("w_namespace"),
            IcebergTables.table_name == bindparam("w_name"),
            IcebergTables.metadata_location == bindparam("w_base"),
        )
        .values(metadata_location=bindparam("v_location"), previous_metadata_location=bindparam("v_previous"))
    )


def _delete_old_metadata(iceberg: IcebergTable, base: TableMetadata, metadata: TableMetadata) -> None:
    """Remove the metadata files that fell out of ``write.metadata.previous-versions-max`` after a landed commit.

    On an object store each removal is a request the writer need not wait
    for: they are queued and sent in batches, one request each, off the
    writer's path (:mod:`lineage.storage.removals`). A removal that fails
    leaves a file for ``vacuum``; the commit has landed either way.
    """
    if not storage_files.is_remote(metadata.location):
        try:
            iceberg.catalog._delete_old_metadata(iceberg.io, base, metadata)
        except Exception:  # noqa: BLE001 - the commit landed; old metadata files are vacuum's to remove
            pass
        return
    if not property_as_bool(metadata.properties, TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED,
                            TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED_DEFAULT):
        return
    kept = {log.metadata_file for log in metadata.metadata_log}
    removals.remove_later(sorted({log.metadata_file for log in base.metadata_log} - kept))


def resolve_catalog(warehouse: str | os.PathLike[str] | None, catalog: Catalog | None) -> Catalog:
    """The catalog to use: the one given, or the default one in ``warehouse``."""
    if catalog is not None:
        if not isinstance(catalog, Catalog):
            raise InvalidArgumentError(f"catalog must be a pyiceberg Catalog, got {type(catalog).__name__}")
        return catalog
    if warehouse is None:
        raise InvalidArgumentError("pass warehouse= (a local folder) or catalog= (a pyiceberg Catalog)")
    return default_catalog(warehouse)


def identifier(name: str) -> tuple[str, str]:
    """Split ``"ns.table"`` (or ``"table"`` in the default namespace) into its parts."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"table name must be a non-empty string, got {name!r}")
    parts = name.strip().split(".")
    if len(parts) == 1:
        return DEFAULT_NAMESPACE, parts[0]
    if any(not p for p in parts):
        raise InvalidArgumentError(f"table name {name!r} has an empty part")
    return ".".join(parts[:-1]), parts[-1]


def load_iceberg(catalog: Catalog, name: str) -> tuple[IcebergTable, str]:
    """Load table ``name`` (``ns.table``) from ``catalog``: the pyiceberg table and its full name, or TableNotFoundError.

    An unreachable catalog is :class:`~lineage.errors.CatalogUnavailableError` (see :func:`read_catalog`).
    """
    from pyiceberg.exceptions import NoSuchTableError

    ns, tbl = identifier(name)
    try:
        ice = read_catalog(catalog, f"open {ns}.{tbl}", lambda: catalog.load_table((ns, tbl)))
    except NoSuchTableError:
        raise TableNotFoundError(f"table {ns}.{tbl} does not exist in this catalog") from None
    storage_files.register(ice.metadata.location, ice.io.properties)
    return ice, f"{ns}.{tbl}"


T = TypeVar("T")


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the catalog's database could not be reached or dropped the connection (or timed out)."""
    try:
        from sqlalchemy.exc import InterfaceError, OperationalError
    except ImportError:  # pragma: no cover - sqlalchemy comes with pyiceberg's SQL catalog
        return isinstance(exc, (ConnectionError, TimeoutError))
    return isinstance(exc, (OperationalError, InterfaceError, ConnectionError, TimeoutError))


def read_catalog(catalog: Catalog, what: str, call: Callable[[], T]) -> T:
    """``call()``, a read of ``catalog``; an unreachable catalog raises :class:`~lineage.errors.CatalogUnavailableError`.

    A connection the pool held from before a server restart fails once and
    is discarded by the pool (SQLAlchemy invalidates it): the read is tried
    again once on a fresh connection before the catalog counts as away.
    ``what`` says what the read was for ("open shop.orders").
    """
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - only connection failures are handled; the rest is raised as it is
        if not is_unreachable(exc):
            raise
    try:
        return call()
    except Exception as exc:  # noqa: BLE001
        if not is_unreachable(exc):
            raise
        raise unavailable(catalog, what, exc) from exc


def unavailable(catalog: Catalog, what: str, cause: BaseException) -> CatalogUnavailableError:
    """The :class:`~lineage.errors.CatalogUnavailableError` for ``cause``, naming the catalog (its password masked)."""
    uri = str(getattr(catalog, "properties", {}).get("uri", "")) if catalog is not None else ""
    where = f" at {_masked(uri)}" if uri else ""
    detail = str(getattr(cause, "orig", None) or cause).strip().splitlines()
    reason = f"{type(cause).__name__}: {detail[0] if detail else ''}".rstrip(": ")
    return CatalogUnavailableError(
        f"the catalog {getattr(catalog, 'name', '')!r}{where} could not be reached to {what} ({reason}); nothing was changed. "
        "Check that the catalog's server runs and accepts connections, then retry"
    )


def _masked(uri: str) -> str:
    """``uri`` with the password of its user part replaced by ``***``."""
    return re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", uri)
