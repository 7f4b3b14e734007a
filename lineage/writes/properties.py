"""Table properties that steer writes: the write modes, delete granularity and commit retries.

They are Iceberg's own property names. :mod:`lineage.table` re-exports them
(``lineage.table.PROP_DELETE_MODE`` and so on), and so do ``MERGE_ON_READ`` and
``COPY_ON_WRITE`` from :mod:`lineage`.
"""

from __future__ import annotations

from lineage.errors import InvalidArgumentError

MERGE_ON_READ = "merge-on-read"
COPY_ON_WRITE = "copy-on-write"
_MODES = (MERGE_ON_READ, COPY_ON_WRITE)

# Table properties (Iceberg's own names where Iceberg has one).
PROP_DELETE_MODE = "write.delete.mode"
PROP_UPDATE_MODE = "write.update.mode"
PROP_MERGE_MODE = "write.merge.mode"
PROP_DELETE_GRANULARITY = "write.delete.granularity"
PROP_RETRIES = "commit.retry.num-retries"
# Unset write.delete.granularity: file-scoped delete files, but one partition-scoped file for a partition
# in which a commit deletes from more data files than this (a change stream touches most files each commit).
PROP_FILE_SCOPED_LIMIT = "lineage.write.delete.file-scoped-limit"
DEFAULT_FILE_SCOPED_LIMIT = 16
DEFAULT_RETRIES = 20



def check_mode(mode: str, what: str) -> str:
    """``mode`` if it is a write mode, else InvalidArgumentError naming ``what`` (a property or argument)."""
    if mode not in _MODES:
        raise InvalidArgumentError(f"{what} must be one of {_MODES}, got {mode!r}")
    return mode


# Pre-image capture: writers that remove row images also store their values in the deleted-rows index.
PROP_CAPTURE_PREIMAGES = "lineage.cdf.capture-preimages"


def capture_preimages(properties: dict[str, str]) -> bool:
    """Whether the table property :data:`PROP_CAPTURE_PREIMAGES` is on (``true``/``false``, default false)."""
    raw = str(properties.get(PROP_CAPTURE_PREIMAGES, "false")).strip().lower()
    if raw not in ("true", "false"):
        raise InvalidArgumentError(f"table property {PROP_CAPTURE_PREIMAGES} must be 'true' or 'false', got {raw!r}")
    return raw == "true"


def delete_granularity(properties: dict[str, str]) -> tuple[str, int]:
    """How a merge-on-read write groups its position deletes: ``(granularity, file-scoped limit)``.

    ``granularity`` is ``file`` or ``partition`` when the table sets
    ``write.delete.granularity``, else ``auto``: file-scoped files, except
    for a partition in which the commit deletes from more than the limit
    (:data:`PROP_FILE_SCOPED_LIMIT`, default 16) data files, which gets one
    partition-scoped file. Writing hundreds of tiny files (and as many
    manifest entries) per commit is what made a change stream's commits
    slower with every commit.
    """
    granularity = properties.get(PROP_DELETE_GRANULARITY)
    if granularity is not None and granularity not in ("file", "partition"):
        raise InvalidArgumentError(f"table property {PROP_DELETE_GRANULARITY} must be 'file' or 'partition', got {granularity!r}")
    raw = properties.get(PROP_FILE_SCOPED_LIMIT, str(DEFAULT_FILE_SCOPED_LIMIT))
    try:
        limit = int(raw)
    except ValueError:
        limit = -1
    if limit < 1:
        raise InvalidArgumentError(f"table property {PROP_FILE_SCOPED_LIMIT} must be an integer >= 1, got {raw!r}")
    return granularity or "auto", limit
