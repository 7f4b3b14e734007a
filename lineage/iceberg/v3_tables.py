"""Lineage tables of Iceberg format version 3: creation and what a write may put into them.

A v3 table carries row lineage natively: every row has ``_row_id`` and
``_last_updated_sequence_number``. This library writes both so that every v3
reader returns the library's own row ids (see :mod:`lineage.storage.manifests_v3`
for the manifests and :mod:`lineage.storage.lineage_columns` for the data files).

pyiceberg 0.12 cannot write v3 metadata, so a v3 table is created as v2 by
the catalog and upgraded at once by a metadata-only commit through
:func:`lineage.catalog.commit_metadata` (which writes v3 JSON itself); a failed
upgrade drops the half-made table again.
"""

from __future__ import annotations

from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.update import AssertTableUUID, UpgradeFormatVersionUpdate

import lineage.catalog as catalog
from lineage.errors import InvalidArgumentError

SUPPORTED = ("2", "3")


def check_format_version(value: object) -> int:
    """The format version a new lineage table may have (2 or 3), or InvalidArgumentError."""
    text = str(value).strip()
    if text not in SUPPORTED:
        raise InvalidArgumentError(
            f"format-version must be 2 or 3 (got {value!r}); v1 has no delete files and no row lineage"
        )
    return int(text)


def upgrade(iceberg: IcebergTable, format_version: int = 3) -> None:
    """Raise ``iceberg``'s format version to ``format_version`` in one metadata-only commit.

    The table's ``next-row-id`` starts at 0 (the spec's value for an upgraded
    table); existing snapshots keep no row ids. Raises CommitFailedException
    when another writer moved the table meanwhile.
    """
    if format_version < iceberg.metadata.format_version:
        raise InvalidArgumentError(f"a table cannot go back from format version {iceberg.metadata.format_version} to {format_version}")
    if format_version == iceberg.metadata.format_version:
        return
    catalog.commit_metadata(
        iceberg, (UpgradeFormatVersionUpdate(format_version=format_version),), (AssertTableUUID(uuid=iceberg.metadata.table_uuid),)
    )

