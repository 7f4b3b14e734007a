"""Every table property the library reads or sets: name, type, default, validation and description.

One :class:`TableProperty` per property, in :data:`registry`; each module
that reads a property imports its name from here and reads the value with
:meth:`TableProperty.read` (or :func:`read`), so a property has one spelling,
one default and one check. ``docs/reference/properties.md`` is generated
from this registry (``python -m lineage.properties_page``; a test checks the
committed page is up to date).

Iceberg's own properties keep Iceberg's names and defaults; the library's own
start with ``lineage.``. *Managed* properties hold state the library writes
(stream positions, view definitions): they are listed so nobody reuses the
names, and are not meant to be set by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lineage.errors import InvalidArgumentError

MERGE_ON_READ = "merge-on-read"
COPY_ON_WRITE = "copy-on-write"
WRITE_MODES = (MERGE_ON_READ, COPY_ON_WRITE)


@dataclass(frozen=True)
class TableProperty:
    """One table property: how it is spelled, typed, defaulted, checked and what it does.

    ``kind`` is ``bool``, ``int``, ``float``, ``choice``, ``string`` or
    ``managed``; ``minimum``/``maximum`` bound numbers (``exclusive``: the
    minimum itself is refused); ``choices`` lists a choice's values.
    ``owner`` is ``iceberg`` for Iceberg's own properties.
    """

    name: str
    kind: str
    default: Any
    description: str
    group: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    owner: str = "lineage"

    def read(self, properties: Mapping[str, str]) -> Any:
        """The property's value in ``properties`` (its default when unset); InvalidArgumentError when invalid."""
        raw = properties.get(self.name)
        if raw is None or (self.kind in ("int", "float") and str(raw).strip() == ""):
            return self.default
        return self.parse(str(raw))

    def parse(self, raw: str) -> Any:
        """``raw`` as the property's type, checked; InvalidArgumentError naming the property otherwise."""
        what = f"table property {self.name}"
        if self.kind == "bool":
            value = raw.strip().lower()
            if value not in ("true", "false"):
                raise InvalidArgumentError(f"{what} must be 'true' or 'false', got {raw!r}")
            return value == "true"
        if self.kind == "choice":
            if raw not in self.choices:
                raise InvalidArgumentError(f"{what} must be one of {self.choices}, got {raw!r}")
            return raw
        if self.kind in ("int", "float"):
            cast: Callable[[str], float] = int if self.kind == "int" else float
            try:
                number = cast(raw.strip())
            except ValueError:
                raise InvalidArgumentError(f"{what} must be {self.bounds()}, got {raw!r}: not a number") from None
            low_bad = self.minimum is not None and (number <= self.minimum if self.exclusive else number < self.minimum)
            high_bad = self.maximum is not None and number > self.maximum
            if low_bad or high_bad or number != number:  # NaN
                raise InvalidArgumentError(f"{what} must be {self.bounds()}, got {raw!r}")
            return number
        return raw

    def bounds(self) -> str:
        """The accepted values in words, e.g. ``an integer >= 1``."""
        noun = {"int": "an integer", "float": "a number"}.get(self.kind, "a string")
        if self.kind == "bool":
            return "'true' or 'false'"
        if self.kind == "choice":
            return "one of " + ", ".join(f"'{c}'" for c in self.choices)
        parts = []
        if self.minimum is not None:
            parts.append(f"{'>' if self.exclusive else '>='} {_num(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"<= {_num(self.maximum)}")
        return noun + (" " + " and ".join(parts) if parts else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


registry: dict[str, TableProperty] = {}


def _define(name: str, kind: str, default: Any, description: str, group: str, **kw: Any) -> str:
    if name in registry:
        raise ValueError(f"table property {name} defined twice")
    registry[name] = TableProperty(name, kind, default, description, group, **kw)
    return name


def read(properties: Mapping[str, str], name: str) -> Any:
    """The typed value of registered property ``name`` in ``properties`` (its default when unset)."""
    return registry[name].read(properties)


def check_mode(mode: str, what: str) -> str:
    """``mode`` if it is a write mode, else InvalidArgumentError naming ``what`` (a property or argument)."""
    if mode not in WRITE_MODES:
        raise InvalidArgumentError(f"{what} must be one of {WRITE_MODES}, got {mode!r}")
    return mode


_TABLE, _WRITES, _KEYS, _FEED, _COMMITS, _UPKEEP, _STATE = (
    "The table", "Writes", "Keys and the key index", "The change feed", "Commits", "Maintenance", "State kept by the library",
)

# ---------------------------------------------------------------- the table
LINEAGE_ENABLED = _define("lineage.enabled", "bool", False, "Marks a lineage table; set by `create_table` and `adopt`.", _TABLE)
FORMAT_VERSION = _define("format-version", "choice", "2",
                         "Iceberg format version of a new table: 2, or 3 for native row lineage (`create_table(format_version=3)`).",
                         _TABLE, choices=("2", "3"), owner="iceberg")
METADATA_DELETE_AFTER_COMMIT = _define(
    "write.metadata.delete-after-commit.enabled", "bool", False,
    "Delete old metadata JSON files after each commit (`create_table` sets it to true).", _TABLE, owner="iceberg")
METADATA_PREVIOUS_VERSIONS_MAX = _define(
    "write.metadata.previous-versions-max", "int", 100, "Old metadata JSON files kept when deleting after commit.", _TABLE,
    minimum=1, owner="iceberg")
TARGET_FILE_SIZE = _define("write.target-file-size-bytes", "int", 512 * 1024 * 1024, "Target size of written data files.",
                           _WRITES, minimum=1, owner="iceberg")

# ---------------------------------------------------------------- writes
DELETE_MODE = _define("write.delete.mode", "choice", MERGE_ON_READ, "How `delete` removes rows.", _WRITES,
                      choices=WRITE_MODES, owner="iceberg")
UPDATE_MODE = _define("write.update.mode", "choice", MERGE_ON_READ, "How `update` replaces rows.", _WRITES,
                      choices=WRITE_MODES, owner="iceberg")
MERGE_MODE = _define("write.merge.mode", "choice", MERGE_ON_READ, "How `upsert`, `merge` and `apply_changelog` replace rows.",
                     _WRITES, choices=WRITE_MODES, owner="iceberg")
DELETE_GRANULARITY = _define(
    "write.delete.granularity", "choice", None,
    "Scope of position delete files: `file` or `partition`; unset: file-scoped, except a partition in which one commit "
    "deletes from more data files than `lineage.write.delete.file-scoped-limit`.", _WRITES,
    choices=("file", "partition"), owner="iceberg")
FILE_SCOPED_LIMIT = _define(
    "lineage.write.delete.file-scoped-limit", "int", 16,
    "With `write.delete.granularity` unset: a partition in which a commit deletes from more data files than this gets "
    "one partition-scoped delete file.", _WRITES, minimum=1)
DELETE_MERGE = _define(
    "lineage.write.delete.merge", "bool", True,
    "On Iceberg v2, a merge-on-read write that deletes from a data file which already has a file-scoped position "
    "delete file written by this library writes one file with the union and removes the old one in the same snapshot "
    "(as a deletion vector is replaced on v3), so a stream of small commits keeps one delete file per data file; "
    "false: one more delete file per commit and data file (readers then open them all), e.g. when files gather "
    "millions of deleted rows that each commit would rewrite, or another engine rewrites delete files concurrently.",
    _WRITES)
DELETE_MERGE_MAX_ROWS = _define(
    "lineage.write.delete.merge.max-rows", "int", 10_000,
    "With `lineage.write.delete.merge` on: a delete file of ours holding more deleted positions than this is left as "
    "it is (the new positions go to a file of their own, which later commits merge into), so a data file that keeps "
    "losing rows does not have all its deleted positions rewritten by every commit; `rewrite_deletes()` or "
    "`maintain()` merges the rest.",
    _WRITES, minimum=0)
FOLD_MAX_ROWS = _define(
    "lineage.write.fold.max-rows", "int", 50_000,
    "A merge-on-read write that deletes from more than `lineage.write.fold.min-files` data files rewrites the kept "
    "rows of the smallest of them (up to this many rows in all, each file no larger than what the commit writes so "
    "far) instead of writing their deletes, and a write that adds at most this many rows folds the small files it "
    "does not touch by the same rule once at least `lineage.write.fold.min-files` of them qualify, so a stream of "
    "small commits keeps few data files; 0 turns it off.",
    _WRITES, minimum=0)
FOLD_MIN_FILES = _define(
    "lineage.write.fold.min-files", "int", 8,
    "Data files a merge-on-read write must delete from, or small untouched files that qualify, before a write folds "
    "small ones (see `lineage.write.fold.max-rows`).",
    _WRITES, minimum=0)
CHANGELOG_STRATEGY = _define(
    "write.changelog.strategy", "choice", "position",
    "How `apply_changelog` commits: `position` (key lookup, position deletes) or `equality` (equality deletes, upsert "
    "mode only).", _WRITES, choices=("position", "equality"))

# ---------------------------------------------------------------- commits
COMMIT_RETRIES = _define("commit.retry.num-retries", "int", 20, "Attempts of a write or maintenance commit after lost races.",
                         _COMMITS, minimum=0, owner="iceberg")
MANIFEST_MERGE_ENABLED = _define("commit.manifest-merge.enabled", "bool", True, "Merge small manifests on commit.", _COMMITS,
                                 owner="iceberg")
MANIFEST_MIN_COUNT = _define("commit.manifest.min-count-to-merge", "int", 100,
                             "Manifests a snapshot may have before a commit merges them.", _COMMITS, minimum=0, exclusive=True,
                             owner="iceberg")
MANIFEST_TARGET_BYTES = _define("commit.manifest.target-size-bytes", "int", 8 * 1024 * 1024, "Target size of merged manifests.",
                                _COMMITS, minimum=0, exclusive=True, owner="iceberg")
SEGMENT_MERGE_ENABLED = _define("lineage.segment-merge.enabled", "bool", True,
                                "Merge small lineage segments on commit.", _COMMITS)
SEGMENT_MIN_COUNT = _define("lineage.segment.min-count-to-merge", "int", 32,
                            "Lineage segments a list may name before a commit merges them.", _COMMITS, minimum=0, exclusive=True)
SEGMENT_TARGET_BYTES = _define("lineage.segment.target-size-bytes", "int", 8 * 1024 * 1024, "Target size of merged lineage segments.",
                               _COMMITS, minimum=0, exclusive=True)

# ---------------------------------------------------------------- keys and the key index
KEY_ENFORCE = _define("lineage.key.enforce", "bool", True,
                      "`append` refuses keys that are already live (and the key index is kept).", _KEYS)
KEY_INDEX_ENABLED = _define("lineage.key-index.enabled", "bool", True, "Keep a key index for keyed writes.", _KEYS)
KEY_INDEX_DEFER_ROWS = _define(
    "lineage.key-index.defer-rows", "int", 100_000,
    "An append of at least this many rows to a table with no live key leaves building the index to its first keyed use "
    "(0: never defer).", _KEYS, minimum=0)
KEY_INDEX_BUILD_MEMORY = _define(
    "lineage.key-index.build-memory-bytes", "int", 256 * 1024 * 1024,
    "Memory a key index build (`reindex`, the first keyed write) or a merge into a new base holds for the table's keys; "
    "beyond it they are spilled to temporary files in hash ranges.", _KEYS, minimum=0, exclusive=True)
KEY_INDEX_FANOUT = _define("lineage.key-index.merge-fanout", "int", 8, "Segments of one level merged together.", _KEYS, minimum=1)
KEY_INDEX_BASE_FRACTION = _define("lineage.key-index.base-fraction", "float", 0.25,
                                  "Deltas merge into the base once they reach this fraction of it.", _KEYS, minimum=0, exclusive=True)
KEY_INDEX_WRITER_LIMIT = _define("lineage.key-index.writer-merge-limit", "int", 1_000_000,
                                 "Entries a writer may merge in its own commit (larger merges are left to maintenance).",
                                 _KEYS, minimum=0)
KEY_INDEX_MAX_SEGMENTS = _define("lineage.key-index.max-segments", "int", 32, "Segments an index may have before a writer merges.",
                                 _KEYS, minimum=1)

# ---------------------------------------------------------------- the change feed
PREIMAGE_CAPTURE = _define("lineage.cdf.capture-preimages", "bool", False,
                           "Writes store removed rows' values in the deleted-rows index (faster feeds, more bytes).", _FEED)
RETENTION_VERSIONS = _define("lineage.cdf.retention.versions", "int", None,
                             "Feed ranges may start at any of the last N versions.", _FEED, minimum=0, exclusive=True)
RETENTION_DAYS = _define("lineage.cdf.retention.days", "float", None,
                         "Feed ranges may start at any version current in the last D days.", _FEED, minimum=0, exclusive=True)

# ---------------------------------------------------------------- maintenance (Table.maintain)
MAX_SNAPSHOT_AGE_MS = _define("history.expire.max-snapshot-age-ms", "int", 5 * 24 * 3600 * 1000,
                              "`maintain` expires snapshots older than this.", _UPKEEP, minimum=0, exclusive=True, owner="iceberg")
MIN_SNAPSHOTS_TO_KEEP = _define("history.expire.min-snapshots-to-keep", "int", 1, "`maintain` keeps at least this many snapshots.",
                                _UPKEEP, minimum=0, exclusive=True, owner="iceberg")
MAINTAIN_PREFIX = "lineage.maintain."
MAINTAIN_STEPS = (
    "expire-snapshots", "rewrite-data-files", "rewrite-position-deletes", "rewrite-manifests", "merge-key-index", "expire-log", "vacuum",
)
for _step in MAINTAIN_STEPS:
    _define(f"{MAINTAIN_PREFIX}{_step}.enabled", "bool", True, f"`maintain` runs its {_step} step.", _UPKEEP)


def maintain_step_enabled(step: str) -> str:
    """The name of the property that switches `maintain`'s step ``step`` on or off."""
    return f"{MAINTAIN_PREFIX}{step}.enabled"


COMPACT_MIN_INPUT_FILES = _define(MAINTAIN_PREFIX + "rewrite-data-files.min-input-files", "int", 5,
                                  "Files a compaction group needs before `maintain` rewrites it.", _UPKEEP, minimum=0, exclusive=True)
COMPACT_DELETE_RATIO = _define(MAINTAIN_PREFIX + "rewrite-data-files.delete-ratio-threshold", "float", 0.3,
                               "A data file with at least this fraction of deleted rows is rewritten.", _UPKEEP, minimum=0, maximum=1)
COMPACT_DELETE_FILES = _define(MAINTAIN_PREFIX + "rewrite-data-files.delete-file-threshold", "int", None,
                               "A data file with at least this many delete files is rewritten.", _UPKEEP, minimum=0, exclusive=True)
DELETES_MIN_INPUT_FILES = _define(MAINTAIN_PREFIX + "rewrite-position-deletes.min-input-files", "int", 5,
                                  "Delete files of one data file before `maintain` merges them.", _UPKEEP, minimum=0, exclusive=True)
VACUUM_MIN_AGE_MS = _define(MAINTAIN_PREFIX + "vacuum.min-age-ms", "int", 3_600_000,
                            "`maintain`'s vacuum leaves unreferenced files younger than this.", _UPKEEP, minimum=0, exclusive=True)

# ---------------------------------------------------------------- state kept by the library (not settings)
STREAM_POSITIONS = _define("lineage.stream-positions", "managed", None, "Last committed batch of each change stream.", _STATE)
STREAM_BASE = _define("lineage.stream-base-list", "managed", None, "The lineage list the stream positions were read from.", _STATE)
STREAM_LOST = _define("lineage.stream-positions-lost-below", "managed", None,
                      "Versions below this were expired before their stream positions were recorded.", _STATE)
STREAM_RESET_PREFIX = "lineage.stream-reset."  # + stream id: "<batch id>@<version>" (Table.reset_stream_position)
MV_QUERY = _define("mv.query", "managed", None, "A materialized view's query.", _STATE)
MV_SOURCE_UUID = _define("mv.source-uuid", "managed", None, "The UUID of a view's source table.", _STATE)
MV_SHAPE = _define("mv.shape", "managed", None, "A view's shape (projection or aggregate).", _STATE)
MV_IDLE = _define("mv.idle-checkpoint", "managed", None, "The source version an idle view refresh reached.", _STATE)
MV_DEFINITION = _define("mv.definition", "managed", None, "A view's stored definition.", _STATE)
MV_SOURCE = _define("mv.source", "managed", None, "The name of a view's source table.", _STATE)


def capture_preimages(properties: Mapping[str, str]) -> bool:
    """Whether the table property ``lineage.cdf.capture-preimages`` is on (``true``/``false``, default false)."""
    return bool(read(properties, PREIMAGE_CAPTURE))


def delete_granularity(properties: Mapping[str, str]) -> tuple[str, int]:
    """How a merge-on-read write groups its position deletes: ``(granularity, file-scoped limit)``.

    ``granularity`` is ``file`` or ``partition`` when the table sets
    ``write.delete.granularity``, else ``auto``: file-scoped files, except
    for a partition in which the commit deletes from more than the limit
    (``lineage.write.delete.file-scoped-limit``, default 16) data files, which
    gets one partition-scoped file. Writing hundreds of tiny files (and as many
    manifest entries) per commit is what made a change stream's commits
    slower with every commit.
    """
    granularity = read(properties, DELETE_GRANULARITY)
    return granularity or "auto", int(read(properties, FILE_SCOPED_LIMIT))
