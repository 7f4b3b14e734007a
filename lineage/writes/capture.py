"""Pre-image capture: the values of removed row images, for the deleted-rows index.

With the table property ``lineage.cdf.capture-preimages=true``, every write
that removes images (delete, update, upsert, merge; merge-on-read or
copy-on-write) stores their values in its index segment, so a change feed
reads a commit's pre-images from the segment instead of the data files, and
vacuum no longer pins those files. Planners already read the removed rows
from the table; they select the old values alongside (:func:`old_values`,
:func:`split_old`). A plan without them (Spark upserts) gets them read back
by position from the files they are in (the write loop does that).
"""

from __future__ import annotations

import pyarrow as pa

from lineage.sql.predicate import quote_ident

_OLD = "__old_"


def old_values(schema: pa.Schema, alias: str = "") -> str:
    """A SELECT-list tail naming each data column's current value ``__old_<i>`` (``alias`` qualifies them)."""
    return "".join(f", {alias}{quote_ident(c)} AS {quote_ident(f'{_OLD}{i}')}" for i, c in enumerate(schema.names))


def old_names(schema: pa.Schema) -> str:
    """The SELECT-list tail that picks the columns :func:`old_values` named."""
    return "".join(f", {quote_ident(f'{_OLD}{i}')}" for i in range(len(schema)))


def split_old(table: pa.Table, schema: pa.Schema) -> tuple[pa.Table, pa.Table | None]:
    """``table`` without the ``__old_<i>`` columns, and those columns as a table of ``schema`` (None if absent)."""
    old = [f"{_OLD}{i}" for i in range(len(schema))]
    if not old or old[0] not in table.column_names:
        return table, None
    values = pa.Table.from_arrays([table.column(o).cast(f.type) for o, f in zip(old, schema, strict=True)],
                                  schema=pa.schema([f.with_nullable(True) for f in schema]))
    return table.drop_columns(old), values
