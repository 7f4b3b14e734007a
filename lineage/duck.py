"""DuckDB connections with the extensions this project uses, loaded from wheels.

Extensions come from the ``duckdb-extension-*`` PyPI wheels installed next to
duckdb and are loaded by file path; DuckDB never downloads anything.
"""

from __future__ import annotations

import collections
import glob
import importlib.util
import itertools
import os
import re
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from lineage.errors import InvalidArgumentError, LineageError
import lineage.storage.duckdb_s3 as duckdb_s3
import lineage.storage.files as store_files

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


def extension_path(name: str) -> str:
    """Path of the ``name`` extension binary shipped by its PyPI wheel."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        raise LineageError(f"the DuckDB extension {name!r} is not installed; pip install duckdb-extension-{name}")
    root = list(spec.submodule_search_locations)[0]
    hits = sorted(glob.glob(os.path.join(root, "extensions", "*", f"{name}.duckdb_extension")))
    if not hits:
        raise LineageError(f"the duckdb-extension-{name} wheel has no extension binary under {root}")
    return hits[-1]


def connect(*extensions: str, isolated: bool = False) -> duckdb.DuckDBPyConnection:
    """A new connection to an in-memory DuckDB database with ``extensions`` loaded from their wheels.

    By default connections are cursors of one database per process and set
    of extensions: opening a database costs tens of milliseconds (a large
    share of a small commit), a cursor much less. Everything this project
    creates in DuckDB is TEMP or registered, hence private to its connection,
    and closing the connection drops it. Settings, however, belong to the
    database: a connection that will be :func:`seal`-ed (it evaluates a
    user's expression) must be ``isolated``, a database of its own.
    """
    needed = list(extensions)
    if "iceberg" in needed and "avro" not in needed:
        needed.insert(0, "avro")  # the iceberg extension reads manifests through avro
    if isolated:
        con = _open(tuple(needed))
        duckdb_s3.attach(con, load_extension)
        _ISOLATED.add(con)
    else:
        db = _database(tuple(needed))
        duckdb_s3.attach(db, load_extension)
        con = db.cursor()
    # DuckDB 1.5 runs small-looking ASOF joins as nested loops (rows x runs); lineage runs need the sort-merge plan.
    con.execute("SET asof_loop_join_threshold = 0")
    return con


def load_extension(db: duckdb.DuckDBPyConnection, name: str) -> None:
    """Load the ``name`` extension into ``db`` from its wheel (:func:`extension_path`).

    A database that checks signatures checks the extension's. One that
    allows unsigned extensions (those of :func:`_open`, and their cursors)
    loads only a file whose signature DuckDB checked in this process and
    that is unchanged since (:func:`_verify_once`).
    """
    path = extension_path(name)
    if db.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()[0]:
        _verify_once(path)
    db.execute(f"LOAD '{path}'")


def _open(extensions: tuple[str, ...]) -> duckdb.DuckDBPyConnection:
    """A new in-memory database that loads extensions only from their wheels, each verified once per process.

    DuckDB checks an extension's signature at every ``LOAD`` by hashing the
    whole file (150 ms for httpfs' 21 MB, 400 ms for iceberg's 50 MB), in
    every new database: that was most of the cost of an isolated database
    on S3, one per write. These databases start with unsigned extensions
    allowed, and :func:`load_extension` loads into them only a file that
    passed DuckDB's own check in this process and has not changed since
    (same inode, size, modification and change times). A sealed database
    loads nothing more (``enable_external_access = false`` refuses ``LOAD``).
    """
    import duckdb  # here, at the first connection: a process that only reads change feeds never loads it (30 MB)

    db = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                "allow_unsigned_extensions": True})
    for name in extensions:
        load_extension(db, name)
    return db


_VERIFIED: dict[str, tuple[int, ...]] = {}  # extension file -> its fingerprint when DuckDB checked its signature
_VERIFY_LOCK = threading.Lock()


def _fingerprint(path: str) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _verify_once(path: str) -> None:
    """Have DuckDB check the signature of the extension file ``path`` unless it did in this process and the file is unchanged since.

    The check is a ``LOAD`` into a throwaway database that checks
    signatures, after the extensions checked before (an extension may need
    another loaded first: iceberg reads manifests through avro).
    """
    import duckdb

    with _VERIFY_LOCK:
        if _VERIFIED.get(path) == _fingerprint(path):
            return
        prints = {p: _fingerprint(p) for p in [*(p for p, f in _VERIFIED.items() if p != path and _fingerprint(p) == f), path]}
        checker = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
        try:
            for p in prints:
                checker.execute(f"LOAD '{p}'")  # raises for a file without a valid signature
        finally:
            checker.close()
        for p, fingerprint in prints.items():
            if _fingerprint(p) != fingerprint:
                raise LineageError(f"the DuckDB extension {p} changed while its signature was checked; retry")
            _VERIFIED[p] = fingerprint


_ISOLATED: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
_DATABASES: dict[tuple[int, tuple[str, ...]], duckdb.DuckDBPyConnection] = {}
_DATABASES_LOCK = threading.Lock()


def _database(extensions: tuple[str, ...]) -> duckdb.DuckDBPyConnection:
    """The process's shared database with ``extensions`` loaded (a forked child opens its own)."""
    key = (os.getpid(), extensions)
    with _DATABASES_LOCK:
        db = _DATABASES.get(key)
        if db is None:
            db = _DATABASES[key] = _open(extensions)
        return db


def seal(con: duckdb.DuckDBPyConnection, paths: Iterable[str] = (), *, exact_floats: bool = False) -> None:
    """From now on ``con`` reads no file but ``paths``, its memory is limited and its configuration is locked.

    ``exact_floats``: the expression it evaluates reads a floating-point column (see the comment below).

    Call it once the connection has loaded its extensions and before it
    evaluates a user's expression: DuckDB then refuses every other file
    (``read_csv('/etc/...')``, ``glob``, ``COPY``, ``ATTACH``), network access
    and extension loading, and no ``SET`` can lift that. Expressions are
    validated before they reach DuckDB (:mod:`lineage.sql.expressions`); this is
    the second line, for a gap in the first. The database's memory limit is
    :func:`memory_limit`; DuckDB's temp directory stays usable, so large
    queries (sorts, joins, aggregates, the temporary result tables of
    :func:`fetch_arrow`) spill to disk rather than fail. ``con`` must be a
    database of its own (``connect(isolated=True)``): settings apply to a
    whole database, and sealing the shared one would lock every other
    connection out of the table's files.
    """
    if con not in _ISOLATED:
        raise LineageError("internal: duck.seal() needs a connection from duck.connect(isolated=True)")
    listed = ", ".join("'" + p.replace("'", "''") + "'" for p in sorted(set(paths)))
    if exact_floats:
        # DuckDB skips Parquet row groups by their min/max statistics, which leave NaN out, while its own
        # comparisons order NaN above every number: `x > 2.5` would miss a NaN row in a row group whose max is 1.
        # A filter on a floating-point column is evaluated on every row of the files kept instead.
        con.execute("SET disabled_optimizers = 'filter_pushdown,statistics_propagation'")
    con.execute(f"SET memory_limit = '{memory_limit()}'")
    con.execute(f"SET temp_directory = '{temp_directory()}'")
    con.execute(f"SET allowed_paths = [{listed}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


SEALED_IDLE = 4  # sealed databases kept open for reuse, per process


@contextmanager
def sealed(paths: Iterable[str], *, exact_floats: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection of a database :func:`seal`-ed to ``paths``, lent to the caller alone until it leaves.

    A new database costs 20-80 ms, more than a small scan; a scan of an
    unchanged table reads the same files again. So the database is kept for
    the next caller with the same seal (files, ``exact_floats``, memory
    limit, temp directory, object-store secrets) while fewer than
    :data:`SEALED_IDLE` wait; the caller gets a connection (cursor) of its
    own, whose TEMP views and tables and registered Arrow data close with
    it, so nothing of one caller is seen by the next. The settings of the
    seal are the database's and locked. A database whose caller raised is
    closed, not kept, and so is one that read files of an object store.
    """
    key = (tuple(sorted(set(paths))), exact_floats, memory_limit(), temp_directory(), store_files.generation())
    with _SEALED_LOCK:
        db = _SEALED.pop(key, None)
    if db is None:
        db = connect(isolated=True)
        db.execute("SET GLOBAL asof_loop_join_threshold = 0")  # for its cursors (connect set it for this connection)
        seal(db, key[0], exact_floats=exact_floats)
    con = db.cursor()
    try:
        yield con
    except BaseException:
        con.close()
        db.close()
        raise
    con.close()
    if any(store_files.is_remote(p) for p in key[0]):
        db.close()  # it may cache parts of remote files (DuckDB's external file cache): reads and requests stay as they were
        return
    with _SEALED_LOCK:
        if key in _SEALED:  # another caller with the same seal gave one back first
            spare: duckdb.DuckDBPyConnection | None = db
        else:
            _SEALED[key] = db
            spare = _SEALED.popitem(last=False)[1] if len(_SEALED) > SEALED_IDLE else None
    if spare is not None:
        spare.close()


_SEALED: collections.OrderedDict[tuple[object, ...], duckdb.DuckDBPyConnection] = collections.OrderedDict()
_SEALED_LOCK = threading.Lock()


ENV_MEMORY_LIMIT = "LINEAGE_DUCKDB_MEMORY_LIMIT"
DEFAULT_MEMORY_PERCENT = 50
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
MIN_MEMORY_LIMIT = 2**20  # the limit is set in whole MiB


def memory_limit() -> str:
    """The memory limit of a sealed connection, in DuckDB's syntax (``'8192MiB'``); see :func:`memory_limit_bytes`."""
    return f"{memory_limit_bytes() >> 20}MiB"


def memory_limit_bytes() -> int:
    """The memory limit of a sealed connection, in bytes (whole MiB).

    ``LINEAGE_DUCKDB_MEMORY_LIMIT`` (environment variable) sets it: a size
    (``4GB``, ``512MiB``) or a share of the memory this process may use
    (``25%``); the default is 50%. DuckDB's own default is 80% per database,
    and a process can have several sealed databases open at once. The
    limit covers DuckDB's buffer pool (hash tables, sorts, temporary tables),
    which spills to disk when it is full; it does not cover the values a
    single function call builds, which is why functions whose cost an
    argument sets are refused or bounded (:mod:`lineage.sql.allowlist`).
    """
    raw = os.environ.get(ENV_MEMORY_LIMIT, "").strip() or f"{DEFAULT_MEMORY_PERCENT}%"
    match = _SIZE.match(raw)
    if match is None:
        raise InvalidArgumentError(f"{ENV_MEMORY_LIMIT} must be a size (4GB, 512MiB) or a share of memory (25%), got {raw!r}")
    number, unit = float(match.group(1)), match.group(2).upper()
    if unit == "%":
        if not 0 < number <= 100:
            raise InvalidArgumentError(f"{ENV_MEMORY_LIMIT} must be a share of memory above 0% and at most 100%, got {raw!r}")
        limit = int(available_memory() * number / 100)
    else:
        limit = int(number * _UNITS[unit])
    if limit < MIN_MEMORY_LIMIT:
        raise InvalidArgumentError(f"{ENV_MEMORY_LIMIT} must be at least 1MiB, got {raw!r}")
    return limit >> 20 << 20


ENV_TEMP_DIRECTORY = "LINEAGE_DUCKDB_TEMP_DIRECTORY"


def temp_directory() -> str:
    """Where a sealed connection spills what does not fit its memory limit (quoted for SQL use by the caller).

    ``LINEAGE_DUCKDB_TEMP_DIRECTORY`` (environment variable) sets it; the
    default is ``lineage-duckdb`` under the system's temporary directory
    (``TMPDIR``), not DuckDB's own default ``.tmp`` in the working directory of
    whatever program imports this library. DuckDB creates the directory on
    the first spill and deletes its files when the connection closes.
    """
    raw = os.environ.get(ENV_TEMP_DIRECTORY, "").strip()
    path = raw or os.path.join(tempfile.gettempdir(), "lineage-duckdb")
    return path.replace("'", "''")


def is_error(exc: BaseException, kind: str = "Error") -> bool:
    """Whether ``exc`` is DuckDB's ``duckdb.<kind>``; False while DuckDB is not loaded (no connection can have raised it).

    For ``except`` clauses around code that may not have opened a connection: naming ``duckdb.Error``
    there would load DuckDB for every write.
    """
    module = sys.modules.get("duckdb")
    return module is not None and isinstance(exc, getattr(module, kind))


def out_of_memory(exc: BaseException) -> LineageError | None:
    """The error to raise when ``exc`` is a sealed connection reaching its memory limit (None for any other error)."""
    if not is_error(exc, "OutOfMemoryException"):
        return None
    first = next((line for line in str(exc).splitlines() if line.strip()), str(exc))
    return LineageError(
        f"DuckDB reached the memory limit of this operation ({memory_limit()}, set by {ENV_MEMORY_LIMIT}; "
        f"raise it, or leave DuckDB's temp directory room to spill, {ENV_TEMP_DIRECTORY}): {first}"
    )


def available_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if lower (Linux)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # a platform without these names: assume a small machine
        total = 4 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


_SCRATCH: duckdb.DuckDBPyConnection | None = None
_SCRATCH_LOCK = threading.RLock()


@contextmanager
def scratch() -> Iterator[duckdb.DuckDBPyConnection]:
    """A shared in-memory connection that reads no file, for parsing and typing (one caller at a time).

    Opening a DuckDB connection costs milliseconds; parsing an expression
    costs microseconds, so the validator and type probes share this one.
    Callers must drop what they register before they leave.
    """
    global _SCRATCH
    with _SCRATCH_LOCK:
        if _SCRATCH is None:
            con = connect(isolated=True)
            seal(con)
            _SCRATCH = con
        yield _SCRATCH


def fetch_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> "pa.Table":
    """The result of ``sql`` as an Arrow table, materialised in DuckDB first.

    Exporting a query over the ``live`` view straight to Arrow
    (``to_arrow_table`` or a record-batch reader) hung forever, with no CPU
    used, in DuckDB 1.5.5 on a 10M-row table whose view had both branches
    (single-run files and ASOF-joined multi-run files); ``CREATE TABLE AS``
    of the same query, then exporting that table, takes 1.5 s. Row order is
    kept (DuckDB preserves insertion order).
    """
    name = f"__result_{next(_RESULTS)}"
    con.execute(f"CREATE TEMP TABLE {name} AS {sql}")
    try:
        return con.execute(f"SELECT * FROM {name}").to_arrow_table()
    finally:
        con.execute(f"DROP TABLE IF EXISTS {name}")


_RESULTS = itertools.count()


def duckdb_types(schema: "pa.Schema") -> list[tuple[str, str]]:
    """``(column, DuckDB type)`` for each field of an Arrow schema."""
    import pyarrow as pa

    name = f"__probe_{next(_RESULTS)}"
    with scratch() as con:
        con.register(name, pa.Table.from_batches([], schema=schema))
        try:
            return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {name}").fetchall()]
        finally:
            con.unregister(name)


_PARENTS: list[object] = []


def _after_fork_in_child() -> None:
    """Forget the parent's databases and locks in a forked child, which opens its own.

    The child must not use a parent's connection (DuckDB's worker threads did
    not fork) nor wait for a lock a parent thread held at fork time. The
    parent's databases stay referenced, never closed nor destroyed here:
    DuckDB's destructor in a child crashes the process. (The shared databases
    of :func:`_database` are keyed by process id.)
    """
    global _VERIFY_LOCK, _SEALED, _SEALED_LOCK, _SCRATCH, _SCRATCH_LOCK
    _PARENTS.extend([_SEALED, _SCRATCH])
    _VERIFY_LOCK = threading.Lock()
    _SEALED, _SEALED_LOCK = collections.OrderedDict(), threading.Lock()
    _SCRATCH, _SCRATCH_LOCK = None, threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)
