"""What an operation needs to know about one table: :class:`TableContext`.

Writes, maintenance, reconciliation and the change feed take a
``TableContext``, never :class:`lineage.Table`: the public ``Table`` is a
facade that builds one context and hands it to the operations it runs, so the
operations sit below the facade and never import it (docs/architecture.md).

A context holds the loaded pyiceberg table (which carries the table's
identifier, metadata and FileIO), the catalog it was loaded from and the memo
of the current snapshot's files (:func:`lineage.state.state_at`). It reads
the table's settings through the property registry
(:mod:`lineage.properties`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.table import Table as IcebergTable

from lineage.catalog import current_metadata_location, is_unreachable, unavailable
from lineage.columns import LINEAGE_SCHEMA
from lineage.outcome import is_transient, reload
from lineage.properties import COMMIT_RETRIES, KEY_ENFORCE, MERGE_ON_READ, PREIMAGE_CAPTURE, check_mode, registry
from lineage.iceberg.schema import arrow_schema, projection_field_ids
from lineage.state import SnapshotFiles, TableState, carried_memo, state_at


@dataclass
class TableContext:
    """One table as the operations see it: its pyiceberg table, its catalog and the files planned for its snapshot.

    ``iceberg`` is refreshed in place by :meth:`refresh`; ``memo`` is what
    :func:`lineage.state.state_at` keeps between calls (emptied as soon as
    the current snapshot is another one).
    """

    iceberg: IcebergTable
    catalog: Catalog
    memo: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ identity and schema
    @property
    def name(self) -> str:
        """The table's name, ``namespace.table``."""
        return ".".join(self.iceberg.name()[-2:])

    @property
    def io(self) -> FileIO:
        """The FileIO that reads and writes the table's files."""
        return self.iceberg.io

    @property
    def key(self) -> list[str]:
        """The table's key columns (its Iceberg identifier fields, in schema order)."""
        schema = self.iceberg.schema()
        return [schema.find_column_name(fid) for fid in schema.identifier_field_ids]

    @property
    def arrow_schema(self) -> pa.Schema:
        """The data columns as a pyarrow schema."""
        return arrow_schema(self.iceberg.schema())

    @property
    def probe_schema(self) -> pa.Schema:
        """The data columns and the lineage columns (what a predicate may name)."""
        return pa.schema(list(self.arrow_schema) + LINEAGE_SCHEMA)

    @property
    def properties(self) -> dict[str, str]:
        """The Iceberg table properties."""
        return dict(self.iceberg.metadata.properties)

    def field_ids(self) -> dict[str, int] | None:
        """Parquet field ids of the data columns by name (None when files are matched by name)."""
        return projection_field_ids(self.iceberg.metadata)

    # ------------------------------------------------------------------ settings
    def setting(self, name: str) -> Any:
        """A table property's typed value (its default when unset); InvalidArgumentError for a bad value."""
        return registry[name].read(self.iceberg.metadata.properties)

    @property
    def commit_retries(self) -> int:
        """How many times a commit is retried after a lost race (``commit.retry.num-retries``)."""
        return int(self.setting(COMMIT_RETRIES))

    @property
    def capture_preimages(self) -> bool:
        """Whether writes store removed rows' values in the deleted-rows index."""
        return bool(self.setting(PREIMAGE_CAPTURE))

    @property
    def enforce_key(self) -> bool:
        """Whether appends check that their keys are not live yet (``lineage.key.enforce``)."""
        return bool(self.setting(KEY_ENFORCE))

    def mode(self, mode: str | None, prop: str) -> str:
        """The write mode: ``mode`` if given (checked), else the table property ``prop`` (merge-on-read by default)."""
        if mode is None:
            return check_mode(self.iceberg.metadata.properties.get(prop, MERGE_ON_READ), f"table property {prop}")
        return check_mode(mode, "mode")

    # ------------------------------------------------------------------ state
    def refresh(self) -> TableContext:
        """Reload the table's metadata from the catalog (only a look at the catalog's pointer when nothing moved).

        A transient catalog error is retried a few times.
        """

        def load() -> None:
            location = current_metadata_location(self.iceberg.catalog, self.iceberg.name())
            if location is None or location != self.iceberg.metadata_location:
                self.iceberg.refresh()

        error = reload(load, self.name, retry=is_transient)
        if error is not None:
            raise unavailable(self.iceberg.catalog, f"read {self.name}", error) if is_unreachable(error) else error
        return self

    def state(self, as_of: int | None = None) -> TableState:
        """The table's state at a version (current by default), after a refresh."""
        self.refresh()
        return state_at(self.iceberg, as_of, memo=self.memo)

    def state_in_hand(self, persist: bool = False) -> TableState:
        """The state of the metadata this context holds, without asking the catalog (write loops refresh themselves).

        ``persist``: a writer's state, whose foreign lineage is stored under the table's location (lineage.reconcile).
        """
        return state_at(self.iceberg, memo=self.memo, persist=persist)

    def carry_files(self, snapshot_id: int, files: SnapshotFiles | None) -> None:
        """Keep the live files a commit derived for its snapshot, so the next write does not plan them again."""
        self.memo = carried_memo(snapshot_id, files)


class HasContext(Protocol):
    """Anything that carries a table context (the public :class:`lineage.Table` does: ``table.context``)."""

    @property
    def context(self) -> TableContext:
        """The table's context."""
        ...


def context_of(table: TableContext | HasContext) -> TableContext:
    """``table`` itself when it is a context, else its ``context``: maintenance entry points take either."""
    return table if isinstance(table, TableContext) else table.context
