"""The tests' handle on the reference engine: Spark 3.5 + Apache Iceberg 1.10, a foreign Iceberg engine.

``ReferenceEngine`` builds the engine if needed (build.py, cached per machine), starts its server
(server.py) on first use, and sends it requests. Every operation names a **warehouse** (the folder given to
``lineage.create_table(..., warehouse=...)``) and works on that warehouse's embedded catalog
``<warehouse>/catalog.db`` through Iceberg's own ``JdbcCatalog`` under the catalog name ``lineage``, the name
pyiceberg's SqlCatalog stores there. Results come back as ``pyarrow.Table`` with the Iceberg types' Arrow
equivalents: long -> int64, int -> int32, float -> float32, double -> float64, string -> string, boolean ->
bool, date -> date32, timestamp -> timestamp[us], timestamptz -> timestamp[us, tz=UTC], decimal(p, s) ->
decimal128(p, s), binary -> binary.

In the tests, use the session-scoped fixture ``reference`` (tests/conftest.py) and mark the test::

    @pytest.mark.reference
    def test_spark_reads_our_table(reference, warehouse):
        t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
        t.append(pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1.0, 2.0]}))
        assert reference.read(warehouse, "shop.orders").num_rows == 2

By hand (builds on first use, then starts Spark; ``close()`` stops it)::

    from reference import ReferenceEngine      # with tests/ on sys.path
    with ReferenceEngine() as engine:
        print(engine.versions)
        print(engine.sql("wh", "SELECT * FROM shop.orders.snapshots").to_pylist())

Operations (all take ``warehouse`` first, a path; ``catalog=`` overrides the catalog name):

- ``sql(warehouse, statement, views=None)``: any Spark SQL statement; SELECT/CALL results as a table.
- ``read(warehouse, table, snapshot_id=None, ref=None, as_of_timestamp_ms=None, columns=None, where=None)``.
- ``append(warehouse, table, data)``: Spark DataFrameWriterV2 append of Arrow data; the new snapshot id.
- ``flink_commit(warehouse, table, events, key=None, upsert=False, ...)``: one Flink checkpoint (RowDelta
  with equality deletes, position deletes for rows written and deleted in the same batch).
- ``row_delta(warehouse, table, upserts=None, deletes=None, key=None)``: the common upsert-sink commit.
- ``metadata(warehouse, table)``, ``snapshots(warehouse, table)``: the table as Iceberg Java parses it.
- ``remove_orphan_files(warehouse, table, older_than_ms=None, dry_run=True)``: what Iceberg calls orphans.
- ``forget(warehouse)``, ``versions``, ``close()``.

Failures raise ``SparkError`` (Spark or Iceberg refused: its exception class and message),
``ReferenceRequestError`` (a wrong argument) or ``ReferenceServerError`` (the server died, timed out or
could not start; the message ends with its log). All are ``ReferenceEngineError``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from lineage.catalog import CATALOG_FILE, CATALOG_NAME, default_catalog

from . import build, protocol

EXCHANGE_PREFIX = "lineage-reference-"
LOG_ENV = "LINEAGE_REFERENCE_LOG"  # write the server's log here instead of the (deleted) exchange folder

Warehouse = str | os.PathLike[str]


class ReferenceEngineError(Exception):
    """Base class of the reference engine's errors."""


class SparkError(ReferenceEngineError):
    """Spark or Iceberg refused an operation. ``error_type`` is the exception class (Java or PySpark's),
    ``spark_message`` its message, ``detail`` the root cause or stack, ``op``/``args`` the request."""

    def __init__(self, op: str, args: Mapping[str, Any], error: Mapping[str, Any]) -> None:
        self.op = op
        self.args_ = dict(args)
        self.error_type = str(error.get("type"))
        self.spark_message = str(error.get("message"))
        self.detail = str(error.get("detail") or "")
        what = args.get("statement") or args.get("table") or ""
        caused = f"\ncaused by: {self.detail.splitlines()[-1]}" if self.detail.strip() and "Exception" in self.detail else ""
        super().__init__(f"{op}({what!s}) failed in the reference engine: {self.error_type}: {self.spark_message}{caused}")


class ReferenceRequestError(ReferenceEngineError, ValueError):
    """The request was wrong (bad argument, events that do not fit the table); nothing was written."""


class ReferenceServerError(ReferenceEngineError):
    """The server could not be built or started, died, timed out, or hit a bug of its own."""


@dataclass(frozen=True)
class FlinkCommit:
    """What ``flink_commit``/``row_delta`` committed: one Iceberg snapshot and the files it added."""

    snapshot_id: int
    sequence_number: int
    operation: str  # "append" without delete files, else "overwrite" (or "delete" without data files)
    summary: dict[str, str]
    data_files: list[str]
    equality_delete_files: list[str]
    position_delete_files: list[str]


@dataclass
class _Process:
    """The running server; a separate object so the finalizer can stop it without the engine."""

    popen: subprocess.Popen[bytes]
    exchange: str
    log_path: str
    messages: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the server to shut down; kill its process group (server and JVM) if it does not."""
        if self.popen.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.popen.stdin.write(protocol.encode({"id": 0, "op": "shutdown"}))  # type: ignore[union-attr]
                self.popen.stdin.close()  # type: ignore[union-attr]
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.popen.pid, sig)  # the server leads its own process group
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.popen.wait(wait)
                        break
        with contextlib.suppress(OSError, ValueError):
            self.popen.stdout.close()  # type: ignore[union-attr]
        # The exchange folder is scratch (the log too, unless $LINEAGE_REFERENCE_LOG put it elsewhere):
        # errors carry the log's tail.
        shutil.rmtree(self.exchange, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log (stderr of the server and its JVM)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64_000))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class ReferenceEngine:
    """A Spark 3.5 + Iceberg 1.10 engine in a separate process, started on first use (see the module doc).

    Arguments: ``driver_memory`` for the JVM (default ``"1g"``); ``spark_conf``, extra Spark settings
    (``spark.driver.extraJavaOptions`` is added to the server's own); ``start_timeout`` seconds for the build
    and the start of Spark; ``request_timeout`` seconds per request (the server is killed when one runs over,
    and the next request starts a fresh one). Thread-safe: requests are served one at a time.
    """

    def __init__(self, *, driver_memory: str = "1g", spark_conf: Mapping[str, str] | None = None,
                 start_timeout: float = 900.0, request_timeout: float = 600.0) -> None:
        self.driver_memory = driver_memory
        self.spark_conf = dict(spark_conf or {})
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.timings: dict[str, float] = {}  # "build" and "start" seconds of the last start, for reports
        self.op_stats: dict[str, list[float]] = {}  # op -> [count, seconds (wall, as the test waited)]
        self.cpu_seconds = 0.0  # CPU time of stopped servers and their JVMs (see stats())
        self._versions: dict[str, str] = {}
        self._proc: _Process | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.RLock()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> ReferenceEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.popen.poll() is None

    def start(self) -> None:
        """Build the engine if missing and start the server (no-op when running). Called by every operation."""
        with self._lock:
            if self.running:
                return
            self._stop_process()
            started = time.monotonic()
            try:
                engine = build.ensure_built()
            except build.ReferenceBuildError as exc:
                raise ReferenceServerError(f"the reference engine could not be built: {exc}") from exc
            self.timings["build"] = round(time.monotonic() - started, 3)
            _remove_stale_exchanges()
            exchange = tempfile.mkdtemp(prefix=f"{EXCHANGE_PREFIX}{os.getpid()}-")
            log_path = os.environ.get(LOG_ENV) or os.path.join(exchange, "server.log")
            cmd = engine.server_command(exchange, "--driver-memory", self.driver_memory)
            for key, value in self.spark_conf.items():
                cmd += ["--conf", f"{key}={value}"]
            started = time.monotonic()
            with open(log_path, "ab") as log:
                popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=build.engine_env(),
                                         cwd=exchange, start_new_session=True)
            proc = _Process(popen, exchange, log_path)
            threading.Thread(target=_pump, args=(popen.stdout, proc.messages), daemon=True, name="reference-reader").start()
            self._proc = proc
            self._finalizer = weakref.finalize(self, proc.stop)
            ready = self._receive(proc, None, self.start_timeout, "start")
            if ready.get("event") != protocol.READY or ready.get("protocol") != protocol.PROTOCOL_VERSION:
                self._stop_process()
                raise ReferenceServerError(f"the server started with an unexpected greeting: {ready}")
            self._versions = ready.get("versions", {})
            self.timings["start"] = round(time.monotonic() - started, 3)

    def close(self) -> None:
        """Stop the server and its JVM and delete the exchange folder. The engine can be started again."""
        with self._lock:
            self._stop_process()

    def _stop_process(self) -> None:
        if self._proc is not None:
            self.cpu_seconds += _group_cpu_seconds(self._proc.popen.pid)
        if self._finalizer is not None:
            self._finalizer()  # runs proc.stop once
            self._finalizer = None
        self._proc = None

    def stats(self) -> dict[str, Any]:
        """Where the engine's time went: build and start seconds, requests per op with their wall seconds, and
        the CPU seconds of the server and its JVM (Linux; of stopped servers plus the running one)."""
        cpu = self.cpu_seconds + (_group_cpu_seconds(self._proc.popen.pid) if self.running and self._proc else 0.0)
        return {**self.timings, "ops": {op: (int(n), round(sec, 2)) for op, (n, sec) in self.op_stats.items()},
                "cpu_seconds": round(cpu, 1)}

    @property
    def versions(self) -> dict[str, str]:
        """Versions in the server (starts it): ``{"spark": "3.5.9", "iceberg": "1.10.2", "java": ..., ...}``."""
        self.start()
        return dict(self._versions)

    # ------------------------------------------------------------------ operations

    def sql(self, warehouse: Warehouse, statement: str, *, views: Mapping[str, Any] | None = None,
            catalog: str = CATALOG_NAME) -> pa.Table:
        """Run one Spark SQL statement in the warehouse's session and return its rows (empty for commands).

        The warehouse's catalog is the current one, so tables are ``namespace.table`` and procedures
        ``system.<name>``. ``views`` maps temporary view names to data (anything ``append`` takes), registered
        for this statement only: the way to MERGE typed rows. Examples::

            engine.sql(wh, "INSERT INTO shop.orders VALUES (7, 'gus', 7.5)")
            engine.sql(wh, "DELETE FROM shop.orders WHERE id = 7")                   # merge-on-read per table
            engine.sql(wh, "UPDATE shop.orders SET amount = amount * 2 WHERE id < 3")
            engine.sql(wh, "MERGE INTO shop.orders t USING src s ON t.id = s.id "
                           "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
                       views={"src": pa.table({"id": [1, 9], "name": ["a", "i"], "amount": [1.0, 9.0]})})
            engine.sql(wh, "ALTER TABLE shop.orders SET TBLPROPERTIES ('write.delete.mode'='copy-on-write')")
            engine.sql(wh, "CALL system.rewrite_data_files(table => 'shop.orders', options => map('min-input-files','1'))")
            engine.sql(wh, "CALL system.rewrite_position_delete_files(table => 'shop.orders', options => map('rewrite-all','true'))")
            engine.sql(wh, "CALL system.expire_snapshots(table => 'shop.orders', retain_last => 1, "
                           "older_than => TIMESTAMP '2100-01-01 00:00:00')")
            engine.sql(wh, "CALL system.remove_orphan_files(table => 'shop.orders', older_than => TIMESTAMP '2100-01-01 00:00:00')")
            engine.sql(wh, "SELECT snapshot_id, operation, summary FROM shop.orders.snapshots")   # metadata tables
        """
        args: dict[str, Any] = {"statement": statement}
        with self._inputs() as stage:
            if views:
                args["views"] = {name: stage(data) for name, data in views.items()}
            return self._table(self._call("sql", warehouse, catalog, args))

    def read(self, warehouse: Warehouse, table: str, *, snapshot_id: int | None = None, ref: str | None = None,
             as_of_timestamp_ms: int | None = None, columns: Sequence[str] | None = None, where: str | None = None,
             catalog: str = CATALOG_NAME) -> pa.Table:
        """The table's rows as Spark with Iceberg reads them (position and equality deletes applied).

        ``snapshot_id`` (time travel to a snapshot), ``ref`` (a branch or tag name) or ``as_of_timestamp_ms``
        (the snapshot current at that time) pick the version; ``columns`` selects columns, ``where`` is a
        Spark SQL filter. Examples::

            engine.read(wh, "shop.orders")
            engine.read(wh, "shop.orders", snapshot_id=t.iceberg.snapshot_by_id(...).snapshot_id)
            engine.read(wh, "shop.orders", columns=["id", "amount"], where="amount > 10")
        """
        args = {"table": table, "snapshot_id": snapshot_id, "ref": ref, "as_of_timestamp_ms": as_of_timestamp_ms,
                "columns": list(columns) if columns is not None else None, "where": where}
        return self._table(self._call("read", warehouse, catalog, args))

    def append(self, warehouse: Warehouse, table: str, data: Any, *, catalog: str = CATALOG_NAME) -> int:
        """Append rows with Spark (``df.writeTo(table).append()``) and return the new snapshot's id.

        ``data``: a pyarrow Table/RecordBatch, a list of dicts, or a dict of lists; columns are matched by name
        and cast to the table's types, missing columns are null. Example::

            engine.append(wh, "shop.orders", [{"id": 8, "name": "hal", "amount": 8.0}])
        """
        with self._inputs() as stage:
            result = self._call("append", warehouse, catalog, {"table": table, "data": stage(data)})
        return int(result["snapshot_id"])

    def flink_commit(self, warehouse: Warehouse, table: str, events: Any, *, key: Sequence[str] | None = None,
                     upsert: bool = False, snapshot_properties: Mapping[str, str] | None = None,
                     checkpoint_id: int | None = None, catalog: str = CATALOG_NAME) -> FlinkCommit:
        """Commit one checkpoint of change events as Flink's Iceberg sink does, through Iceberg's Java API.

        ``events``: a list of ``(kind, row)`` pairs in order, kind one of ``"+I"``, ``"-U"``, ``"+U"``,
        ``"-D"`` and row a dict (missing columns are null), or a pyarrow table with an ``_op`` column.
        ``key``: the equality columns (default: the table's identifier fields, i.e. ``lineage``'s key).
        ``upsert``: Flink's upsert mode (``+I``/``+U`` replace the key's row; ``-D`` may carry only the key
        and the partition source columns). A row written and then deleted or rewritten within the events
        gets a position delete against this commit's own data file; other deletes become equality deletes.
        Flink's snapshot properties are set (``flink.job-id``, ``flink.operator-id``,
        ``flink.max-committed-checkpoint-id`` = ``checkpoint_id``, by default one more than the last one this
        engine committed to the table); ``snapshot_properties`` adds or overrides. Example::

            c = engine.flink_commit(wh, "shop.orders", [
                ("+I", {"id": 10, "name": "ivy", "amount": 1.0}),
                ("-U", {"id": 1, "name": "ann", "amount": 10.0}),
                ("+U", {"id": 1, "name": "ann", "amount": 11.0}),
                ("-D", {"id": 10, "name": "ivy", "amount": 1.0}),   # written above: a position delete
            ])
            c.operation, c.equality_delete_files, c.position_delete_files   # "overwrite", [1 file], [1 file]
        """
        args = {"table": table, "key": list(key) if key else None, "upsert": upsert,
                "snapshot_properties": dict(snapshot_properties or {}), "checkpoint_id": checkpoint_id}
        with self._inputs() as stage:
            args["events"] = stage(_events_table(events))
            result = self._call("flink_commit", warehouse, catalog, args)
        return FlinkCommit(**result)

    def row_delta(self, warehouse: Warehouse, table: str, *, upserts: Any = None, deletes: Any = None,
                  key: Sequence[str] | None = None, snapshot_properties: Mapping[str, str] | None = None,
                  catalog: str = CATALOG_NAME) -> FlinkCommit:
        """One upsert-mode Flink commit: delete the ``deletes`` keys, then upsert the ``upserts`` rows.

        Gives equality deletes (key columns only) for every deleted and every upserted key plus one data file
        of the upserted rows. ``deletes``: rows with at least the key (and partition source) columns.
        Example::

            engine.row_delta(wh, "shop.orders", upserts=[{"id": 2, "name": "bo", "amount": 5.0}], deletes=[{"id": 3}])
        """
        events = [("-D", row) for row in _rows(deletes)] + [("+I", row) for row in _rows(upserts)]
        return self.flink_commit(warehouse, table, events, key=key, upsert=True,
                                 snapshot_properties=snapshot_properties, catalog=catalog)

    def metadata(self, warehouse: Warehouse, table: str, *, catalog: str = CATALOG_NAME) -> dict[str, Any]:
        """The table's current metadata as Iceberg Java parsed it (the metadata JSON as a dict), plus
        ``metadata_location``. Example: ``engine.metadata(wh, "shop.orders")["current-snapshot-id"]``."""
        result = self._call("metadata", warehouse, catalog, {"table": table})
        return {**result["metadata"], "metadata_location": result["metadata_location"]}

    def snapshots(self, warehouse: Warehouse, table: str, *, catalog: str = CATALOG_NAME) -> list[dict[str, Any]]:
        """The table's snapshots as Iceberg Java sees them, oldest first: dicts with ``snapshot-id``,
        ``parent-snapshot-id``, ``sequence-number``, ``timestamp-ms``, ``summary`` (with ``operation``)."""
        return list(self.metadata(warehouse, table, catalog=catalog).get("snapshots", []))

    def remove_orphan_files(self, warehouse: Warehouse, table: str, *, older_than_ms: int | None = None,
                            dry_run: bool = True, catalog: str = CATALOG_NAME) -> list[str]:
        """Files under the table's location that Iceberg's metadata does not reference, older than
        ``older_than_ms`` (default: now), as Iceberg's DeleteOrphanFiles action finds them; deleted unless
        ``dry_run`` (the default). ``CALL system.remove_orphan_files`` refuses intervals under 24 hours, this
        does not. Example: ``engine.remove_orphan_files(wh, "shop.orders")`` -> sorted list of paths."""
        args = {"table": table, "older_than_ms": older_than_ms, "dry_run": dry_run}
        return list(self._call("remove_orphan_files", warehouse, catalog, args)["orphan_file_locations"])

    def forget(self, warehouse: Warehouse) -> None:
        """Close the warehouse's Spark session and JDBC connections (cheap; reopened on next use)."""
        if self.running:
            self._call("forget", warehouse, CATALOG_NAME, {})

    # ------------------------------------------------------------------ plumbing

    def _call(self, op: str, warehouse: Warehouse, catalog: str, args: dict[str, Any]) -> Any:
        root = os.path.abspath(os.fspath(warehouse))
        if os.path.isdir(root) and not os.path.exists(os.path.join(root, CATALOG_FILE)):
            # The server's JdbcCatalog does not create catalog tables (see server.py); pyiceberg does.
            default_catalog(root)
        args = {**args, "warehouse": root, "catalog": catalog}
        with self._lock:
            self.start()
            proc = self._proc
            assert proc is not None
            request_id = next(self._ids)
            try:
                proc.popen.stdin.write(protocol.encode({"id": request_id, "op": op, "args": args}))  # type: ignore[union-attr]
                proc.popen.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, ValueError, OSError):
                self._died(proc, f"{op}: could not send the request")
            started = time.monotonic()
            response = self._receive(proc, request_id, self.request_timeout, op)
            entry = self.op_stats.setdefault(op, [0, 0.0])
            entry[0] += 1
            entry[1] += time.monotonic() - started
        if response.get("ok"):
            return response.get("result")
        error = response.get("error") or {}
        kind = error.get("kind")
        if kind == protocol.ERROR_SPARK:
            raise SparkError(op, args, error)
        if kind == protocol.ERROR_REQUEST:
            raise ReferenceRequestError(f"{op}: {error.get('message')}")
        raise ReferenceServerError(f"{op}: bug in the reference server: {error.get('type')}: {error.get('message')}\n"
                                   f"{error.get('detail', '')}")

    def _receive(self, proc: _Process, request_id: int | None, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = proc.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._died(proc, f"{what}: no answer within {timeout:.0f} s (server killed; the next call starts a new one)")
            if message is None:
                self._died(proc, f"{what}: the server exited (code {proc.popen.wait()})")
            if request_id is None or message.get("id") == request_id:
                return message

    def _died(self, proc: _Process, why: str) -> Any:
        tail = proc.log_tail()
        self._stop_process()
        raise ReferenceServerError(f"reference engine: {why}\n--- server log (last lines) ---\n{tail}")

    def _table(self, result: Mapping[str, Any]) -> pa.Table:
        path = result.get("arrow")
        if not path:
            return pa.table({})
        try:
            with pa.memory_map(path) as source:
                return ipc.open_file(source).read_all()
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)

    @contextlib.contextmanager
    def _inputs(self):  # noqa: ANN202
        """A function that writes data to a Parquet file in the exchange folder; the files go afterwards."""
        self.start()
        assert self._proc is not None
        folder = self._proc.exchange
        written: list[str] = []

        def stage(data: Any) -> str:
            table = _arrow(data)
            path = os.path.join(folder, f"input-{os.getpid()}-{next(self._ids)}.parquet")
            # Spark 3.5 reads microsecond timestamps only; Iceberg has no finer unit in format v2 either.
            pq.write_table(table, path, coerce_timestamps="us", allow_truncated_timestamps=False)
            written.append(path)
            return path

        try:
            yield stage
        finally:
            for path in written:
                with contextlib.suppress(OSError):
                    os.remove(path)


# ---------------------------------------------------------------------- helpers


def _pump(stream: Any, messages: queue.Queue[dict[str, Any] | None]) -> None:
    """Reader thread: protocol lines from the server into the queue; None at end of stream."""
    try:
        for line in stream:
            try:
                messages.put(protocol.decode(line))
            except ValueError:
                print(f"reference engine: ignoring a malformed protocol line: {line[:200]!r}", file=sys.stderr)
    except (OSError, ValueError):
        pass
    messages.put(None)


def _rows(data: Any) -> list[dict[str, Any]]:
    if data is None:
        return []
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return data.to_pylist()
    return [dict(r) for r in data]


def _arrow(data: Any) -> pa.Table:
    """Arrow data from a Table, RecordBatch, list of dicts or dict of lists; drops all-null untyped columns."""
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    elif isinstance(data, Mapping):
        table = pa.table(dict(data))
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        rows = [dict(r) for r in data]
        # Columns are the union of all rows' keys (pa.Table.from_pylist would take the first row's only).
        names = list(dict.fromkeys(k for r in rows for k in r))
        table = pa.table({k: pa.array([r.get(k) for r in rows]) for k in names})
    else:
        raise ReferenceRequestError(f"expected Arrow data, a list of dicts or a dict of lists, got {type(data).__name__}")
    # A column of Python Nones has Arrow type null, which Parquet cannot carry to Spark: the server fills
    # missing columns with typed nulls instead.
    keep = [i for i, f in enumerate(table.schema) if not pa.types.is_null(f.type)]
    return table.select(keep)


def _events_table(events: Any) -> pa.Table:
    if isinstance(events, (pa.Table, pa.RecordBatch)):
        table = _arrow(events)
        if "_op" not in table.column_names:
            raise ReferenceRequestError("an events table needs an _op column (+I, -U, +U, -D)")
    else:
        pairs = list(events)
        for pair in pairs:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[1], Mapping)):
                raise ReferenceRequestError(f"events are (kind, row dict) pairs, got {pair!r}")
        table = _arrow([{"_op": kind, **row} for kind, row in pairs])
        if not pairs:
            table = pa.table({"_op": pa.array([], pa.string())})
    if "_seq" in table.column_names:
        table = table.drop_columns(["_seq"])
    return table.append_column("_seq", pa.array(range(table.num_rows), pa.int64()))


def _remove_stale_exchanges() -> None:
    """Delete exchange folders left by test processes that were killed (their pid is gone)."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        if not name.startswith(EXCHANGE_PREFIX):
            continue
        pid = name[len(EXCHANGE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes in a process group (0 where /proc is missing)."""
    total = 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp, ..., utime (11), stime (12)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

