"""Catalogs: the embedded default (SQLite inside the warehouse) or any pyiceberg catalog."""

from __future__ import annotations

import os

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from lineage.errors import InvalidArgumentError

DEFAULT_NAMESPACE = "default"
CATALOG_FILE = "catalog.db"
# The name of the embedded catalog: pyiceberg's SqlCatalog stores it in every row of catalog.db
# (iceberg_tables.catalog_name), so another engine's JDBC catalog must use the same name to see our tables.
CATALOG_NAME = "lineage"


def default_catalog(warehouse: str | os.PathLike[str]) -> Catalog:
    """pyiceberg's SqlCatalog on a SQLite file inside ``warehouse`` (created if missing)."""
    root = os.path.abspath(os.fspath(warehouse))
    os.makedirs(root, exist_ok=True)
    # timeout: writers in several processes wait for SQLite's lock instead of failing.
    return SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{os.path.join(root, CATALOG_FILE)}?timeout=60",
        warehouse=root,
    )


def current_metadata_location(catalog: Catalog, table_identifier: tuple[str, ...]) -> str | None:
    """Where the catalog's pointer for a table is now, read without loading the metadata.

    Only pyiceberg's ``SqlCatalog`` can be asked this cheaply (one indexed
    row); for other catalogs, and a table the catalog does not have, None.
    Refreshing a table whose pointer did not move can then skip reading and
    parsing a metadata file whose size grows with the number of snapshots.
    """
    if not isinstance(catalog, SqlCatalog):
        return None
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    namespace = Catalog.namespace_to_string(Catalog.namespace_from(table_identifier))
    name = Catalog.table_name_from(table_identifier)
    with Session(catalog.engine) as session:
        return session.scalar(
            select(IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == name,
            )
        )


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
