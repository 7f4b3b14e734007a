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
DEFAULT_RETRIES = 20

# Prefixes of the commit properties a caller may add to a merge (e.g. a consumer's checkpoint).
USER_PROPERTY_PREFIXES = ("lineage.user.", "mv.")


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
