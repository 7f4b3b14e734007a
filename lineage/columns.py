"""Reserved column names: the lineage columns users see and the hidden columns the library writes or plans with.

Every module that names one of these columns imports it from here, so one name
has one meaning across the library:

* the **lineage columns** a scan returns (``_row_id``, ``_row_created_at_version``,
  ``_row_last_updated_at_version``) and the change feed's own columns;
* the **hidden carry columns** (``__lineage_row_id`` ...) that ride along with
  row images through the data writer and are never stored in data files;
* the **plan columns** (``__file_id``, ``__pos``) naming a live image's file and
  position while a write is planned.

A table's own columns may not use these names (see :func:`lineage.iceberg.schema.iceberg_schema`).
"""

from __future__ import annotations

import pyarrow as pa

# ---------------------------------------------------------------- lineage columns (what a scan returns)
ROW_ID = "_row_id"
CREATED_AT = "_row_created_at_version"
UPDATED_AT = "_row_last_updated_at_version"
LINEAGE_COLUMNS = (ROW_ID, CREATED_AT, UPDATED_AT)
LINEAGE_SCHEMA = [
    pa.field(ROW_ID, pa.int64(), nullable=False),
    pa.field(CREATED_AT, pa.int64(), nullable=False),
    pa.field(UPDATED_AT, pa.int64(), nullable=False),
]

# ---------------------------------------------------------------- change feed columns
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGED_COLUMNS = "_changed_columns"
DELETED_AT = "_row_deleted_at_version"
DELETED_AT_TIMESTAMP = "_row_deleted_at_timestamp"
PURGED = "_purged"

# ---------------------------------------------------------------- hidden carry columns (never written to data files)
HIDDEN_ROW_ID = "__lineage_row_id"
HIDDEN_CREATED = "__lineage_created"
HIDDEN_UPDATED = "__lineage_updated"
HIDDEN_COLUMNS = (HIDDEN_ROW_ID, HIDDEN_CREATED, HIDDEN_UPDATED)

# ---------------------------------------------------------------- plan columns (a live image's place while planning)
FILE_ID = "__file_id"
POS = "__pos"
REMOVED_COLUMNS = (FILE_ID, POS, ROW_ID, CREATED_AT, UPDATED_AT)
