"""The reference engine's server: one Spark 3.5 + Iceberg 1.10 session serving requests from the tests.

Runs under the reference engine's Python (see build.py), never the project's, and imports no project code:

    <engine>/venv/bin/python tests/reference/server.py --exchange DIR --jars A.jar,B.jar [--driver-memory 1g]
        [--conf spark.key=value ...]

It reads requests on stdin and answers on its original stdout, one JSON line each (protocol.py). Before Spark
starts, file descriptor 1 is pointed at stderr (the client sends stderr to a log file), so whatever the JVM or
a library prints lands in the log and never in the protocol stream.

Each warehouse gets a Spark session of its own (``SparkSession.newSession()``: same JVM and SparkContext,
separate SQL configuration), in which the catalog ``<catalog>`` (default ``lineage``, the name pyiceberg's
SqlCatalog stores in ``iceberg_tables.catalog_name``) is Iceberg's JdbcCatalog on ``<warehouse>/catalog.db``
and is the current catalog. That is how several warehouses can all have a catalog called ``lineage``.

The server exits when stdin closes, on a ``shutdown`` request, on SIGTERM, or when its parent process dies
(checked every second), and takes its JVM with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from typing import Any

import protocol  # sibling module: this file runs as a script, so its folder is on sys.path

MAX_SESSIONS = 8  # warehouses kept open at once; the least recently used one is closed beyond that


class RequestError(Exception):
    """The request is wrong (unknown op, bad or missing argument); reported with kind ``request``."""


def _start_spark(jars: list[str], exchange: str, driver_memory: str, java_options: str, conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    java_options += " " + conf.pop("spark.driver.extraJavaOptions", "")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("iceberg-reference-engine")
        # On the JVM's class path from the start (not spark.jars, which local executors copy and load
        # through a class loader of their own).
        .config("spark.driver.extraClassPath", os.pathsep.join(jars))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", java_options)
        # Loopback only: this is a test engine, it must not listen on the machine's network address.
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # Rows reach the Java API as java.time values (LocalDate, Instant, LocalDateTime), see javawrites.py.
        .config("spark.sql.datetime.java8API.enabled", "true")
        .config("spark.local.dir", os.path.join(exchange, "spark-local"))
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Server:
    """Holds the Spark session, the per-warehouse sessions, and the request handlers (``op_<name>``)."""

    def __init__(self, spark: Any, exchange: str) -> None:
        self.spark = spark
        self.exchange = exchange
        self.jvm = spark._jvm
        self.sessions: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.job_id = uuid.uuid4().hex  # the "Flink job" of javawrites.flink_commit
        self.checkpoints: dict[str, int] = {}
        self.counter = 0

    # ------------------------------------------------------------ sessions and catalogs

    def session(self, args: dict[str, Any]) -> Any:
        """The Spark session of ``args["warehouse"]`` whose current catalog is ``args["catalog"]``."""
        warehouse = _arg(args, "warehouse", str)
        catalog = args.get("catalog") or "lineage"
        if not os.path.isabs(warehouse):
            raise RequestError(f"warehouse must be an absolute path, got {warehouse!r}")
        if not os.path.isdir(warehouse):
            raise RequestError(f"warehouse {warehouse!r} is not a folder")
        key = (os.path.normpath(warehouse), catalog)
        session = self.sessions.get(key)
        if session is not None:
            self.sessions.move_to_end(key)
            self._activate(session)
            return session
        session = self.spark.newSession()
        self._activate(session)
        prefix = f"spark.sql.catalog.{catalog}"
        for suffix, value in {
            "": "org.apache.iceberg.spark.SparkCatalog",
            ".catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            ".uri": "jdbc:sqlite:" + os.path.join(key[0], "catalog.db"),
            # Plain absolute paths, as pyiceberg writes them, so tables created here look like ours.
            ".warehouse": key[0],
            # Load tables fresh for every statement: pyiceberg commits between two requests.
            ".cache-enabled": "false",
            # Passed to the SQLite driver: wait for pyiceberg's write lock instead of failing.
            ".jdbc.busy_timeout": "60000",
            # Iceberg 1.10's table check at start-up (DatabaseMetaData.getTables) never closes its result set;
            # on SQLite that keeps a SHARED lock on catalog.db for the life of the pooled connection, and every
            # later commit (pyiceberg's, or Spark's through another connection) fails with "database is
            # locked". The tables exist: the client creates catalog.db with pyiceberg when it is missing.
            ".jdbc.init-catalog-tables": "false",
        }.items():
            session.conf.set(prefix + suffix, value)
        session.conf.set("spark.sql.defaultCatalog", catalog)
        self.sessions[key] = session
        while len(self.sessions) > MAX_SESSIONS:
            self._close_session(*self.sessions.popitem(last=False))
        return session

    def _activate(self, session: Any) -> None:
        """Make ``session`` the active one of this thread: Spark's CatalogManager reads the catalog settings
        from the active session's configuration, also when the Java API is called directly."""
        self.jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)

    def _close_session(self, key: tuple[str, str], session: Any) -> None:
        self._activate(session)  # the catalog manager looks its catalogs up in the active session's settings
        manager = session._jsparkSession.sessionState().catalogManager()
        try:
            if manager.isCatalogRegistered(key[1]):
                manager.catalog(key[1]).icebergCatalog().close()  # JdbcCatalog: closes its connection pool
        except Exception as exc:  # closing is best effort; the JVM exits at the end anyway
            print(f"closing catalog of {key} failed: {exc}", file=sys.stderr)

    def iceberg_table(self, session: Any, catalog: str, name: str) -> Any:
        """The Java ``org.apache.iceberg.Table`` ``name`` in ``catalog`` of ``session`` (loaded fresh)."""
        ident = self.jvm.org.apache.iceberg.catalog.TableIdentifier.parse(_iceberg_name(name))
        return session._jsparkSession.sessionState().catalogManager().catalog(catalog).icebergCatalog().loadTable(ident)

    # ------------------------------------------------------------ results

    def arrow_result(self, df: Any) -> dict[str, Any]:
        """Collect ``df`` as Arrow into an IPC file in the exchange folder."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(df.schema)
        batches = df._collect_as_arrow()
        table = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
        self.counter += 1
        path = os.path.join(self.exchange, f"result-{self.counter}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return {"arrow": path, "num_rows": table.num_rows}

    # ------------------------------------------------------------ operations

    def op_versions(self, args: dict[str, Any]) -> dict[str, Any]:
        """Versions of Spark, Iceberg, Java and Python in this server."""
        import pyspark

        return {
            "spark": self.spark.version,
            "pyspark": pyspark.__version__,
            "iceberg": self.jvm.org.apache.iceberg.IcebergBuild.version(),
            "java": self.jvm.java.lang.System.getProperty("java.version"),
            "python": sys.version.split()[0],
        }

    def op_sql(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run one SQL statement; Parquet files in ``views`` are temporary views for its duration."""
        session = self.session(args)
        statement = _arg(args, "statement", str)
        views = args.get("views") or {}
        for name, path in views.items():
            session.read.parquet(path).createOrReplaceTempView(name)
        try:
            df = session.sql(statement)
            # Commands (INSERT, MERGE, ALTER ...) ran eagerly above and have no columns to return.
            return self.arrow_result(df) if df.columns else {"arrow": None, "num_rows": 0}
        finally:
            for name in views:
                session.catalog.dropTempView(name)

    def op_read(self, args: dict[str, Any]) -> dict[str, Any]:
        """Read a table (optionally at a snapshot, branch/tag or timestamp) and return its rows."""
        session = self.session(args)
        columns = args.get("columns")
        select = ", ".join(_quote(c) for c in columns) if columns else "*"
        sql = f"SELECT {select} FROM {_quote_name(_arg(args, 'table', str))}"
        if args.get("snapshot_id") is not None:
            sql += f" VERSION AS OF {int(args['snapshot_id'])}"
        elif args.get("ref") is not None:
            sql += " VERSION AS OF '{}'".format(str(args["ref"]).replace("'", "''"))
        elif args.get("as_of_timestamp_ms") is not None:
            sql += f" TIMESTAMP AS OF timestamp_millis({int(args['as_of_timestamp_ms'])})"
        if args.get("where"):
            sql += f" WHERE {args['where']}"
        return self.arrow_result(session.sql(sql))

    def op_append(self, args: dict[str, Any]) -> dict[str, Any]:
        """Append the rows of a Parquet file with Spark's DataFrameWriterV2 (columns matched by name)."""
        from pyspark.sql import functions as F

        session = self.session(args)
        name = _quote_name(_arg(args, "table", str))
        target = session.table(name).schema
        df = session.read.parquet(_arg(args, "data", str))
        unknown = sorted(set(df.columns) - set(target.fieldNames()))
        if unknown:
            raise RequestError(f"columns {unknown} are not in table {args['table']} (its columns: {target.fieldNames()})")
        # Missing columns become typed nulls; present ones are converted by Spark's store assignment (ANSI
        # policy: an overflowing or malformed value fails the write instead of wrapping or becoming null).
        df.select(
            *[F.col(_quote(f.name)) if f.name in df.columns else F.lit(None).cast(f.dataType).alias(f.name) for f in target]
        ).writeTo(name).append()
        table = self.iceberg_table(session, args.get("catalog") or "lineage", args["table"])
        return {"snapshot_id": table.currentSnapshot().snapshotId()}

    def op_metadata(self, args: dict[str, Any]) -> dict[str, Any]:
        """The table's metadata as Iceberg Java parsed it (TableMetadataParser JSON) and its location."""
        session = self.session(args)
        table = self.iceberg_table(session, args.get("catalog") or "lineage", _arg(args, "table", str))
        current = table.operations().current()
        return {
            "metadata_location": current.metadataFileLocation(),
            "metadata": json.loads(self.jvm.org.apache.iceberg.TableMetadataParser.toJson(current)),
        }

    def op_flink_commit(self, args: dict[str, Any]) -> dict[str, Any]:
        """One Flink-style checkpoint commit through the Java API (see javawrites.flink_commit)."""
        import javawrites

        session = self.session(args)
        catalog = args.get("catalog") or "lineage"
        name = _arg(args, "table", str)
        table = self.iceberg_table(session, catalog, name)
        ckey = f"{args['warehouse']}|{catalog}|{name}"
        checkpoint = args.get("checkpoint_id") or self.checkpoints.get(ckey, 0) + 1
        self.checkpoints[ckey] = checkpoint
        properties = {
            "flink.job-id": self.job_id,
            "flink.operator-id": "reference-engine-committer",
            "flink.max-committed-checkpoint-id": str(checkpoint),
            **(args.get("snapshot_properties") or {}),
        }
        try:
            return javawrites.flink_commit(
                session, table, _arg(args, "events", str), args.get("key"), bool(args.get("upsert")), properties
            )
        except javawrites.WriteRequestError as exc:
            raise RequestError(str(exc)) from None

    def op_remove_orphan_files(self, args: dict[str, Any]) -> dict[str, Any]:
        """Iceberg's DeleteOrphanFiles action (what CALL system.remove_orphan_files runs) without the
        procedure's 24-hour floor: files under the table location that no Iceberg metadata references and
        that are older than ``older_than_ms`` (default: now). ``dry_run`` (default true) only lists them."""
        session = self.session(args)
        table = self.iceberg_table(session, args.get("catalog") or "lineage", _arg(args, "table", str))
        older_than = args.get("older_than_ms")
        action = (
            self.jvm.org.apache.iceberg.spark.actions.SparkActions.get(session._jsparkSession)
            .deleteOrphanFiles(table)
            .olderThan(int(older_than) if older_than is not None else int(time.time() * 1000))
        )
        if args.get("dry_run", True):
            # A Consumer that only collects: the procedure's dry_run passes a no-op lambda, which py4j cannot.
            action = action.deleteWith(self.jvm.java.util.stream.Stream.builder())
        result = action.execute()
        return {"orphan_file_locations": sorted(str(p) for p in result.orphanFileLocations())}

    def op_forget(self, args: dict[str, Any]) -> dict[str, Any]:
        """Close the sessions (and JDBC connections) of a warehouse, e.g. before deleting it."""
        warehouse = os.path.normpath(_arg(args, "warehouse", str))
        closed = 0
        for key in [k for k in self.sessions if k[0] == warehouse]:
            self._close_session(key, self.sessions.pop(key))
            closed += 1
        return {"closed": closed}

    # ------------------------------------------------------------ dispatch

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one request and build its response (never raises)."""
        started = time.monotonic()
        response: dict[str, Any] = {"id": request.get("id")}
        try:
            op = request.get("op")
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
            if handler is None:
                raise RequestError(f"unknown op {op!r}")
            args = request.get("args") or {}
            if not isinstance(args, dict):
                raise RequestError("args must be a JSON object")
            response.update(ok=True, result=handler(args))
        except RequestError as exc:
            response.update(ok=False, error={"kind": protocol.ERROR_REQUEST, "type": "RequestError", "message": str(exc)})
        except Exception as exc:  # every failure goes back to the test, which raises it there
            response.update(ok=False, error=_describe(exc))
        response["seconds"] = round(time.monotonic() - started, 4)
        return response


def _describe(exc: Exception) -> dict[str, Any]:
    """Spark's or Iceberg's error as the client reports it: Java exception class and message first."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    if isinstance(exc, Py4JJavaError):
        java = exc.java_exception
        return {
            "kind": protocol.ERROR_SPARK,
            "type": java.getClass().getName(),
            "message": str(java.getMessage()),
            "detail": _causes(java),
        }
    if isinstance(exc, CapturedException):
        cause = getattr(exc, "_origin", None)
        return {
            "kind": protocol.ERROR_SPARK,
            "type": type(exc).__name__,
            "message": exc.getMessage() if hasattr(exc, "getMessage") else str(exc),
            "detail": _causes(cause) if cause is not None else str(getattr(exc, "_stackTrace", "") or "")[:4000],
        }
    return {"kind": protocol.ERROR_INTERNAL, "type": type(exc).__name__, "message": str(exc), "detail": traceback.format_exc()}


def _causes(java: Any) -> str:
    """The Java exception's chain of causes, one ``Class: message`` line each (the root cause last)."""
    lines, seen = [], set()
    while java is not None and java.hashCode() not in seen and len(lines) < 10:
        seen.add(java.hashCode())
        lines.append(f"{java.getClass().getName()}: {java.getMessage()}")
        java = java.getCause()
    return "\n".join(lines[1:]) if len(lines) > 1 else ""


def _arg(args: dict[str, Any], name: str, kind: type) -> Any:
    value = args.get(name)
    if not isinstance(value, kind):
        raise RequestError(f"argument {name!r} must be a {kind.__name__}, got {value!r}")
    return value


def _iceberg_name(name: str) -> str:
    """``"ns.table"`` as is; a bare ``"table"`` lives in the namespace ``default`` (as lineage.create_table)."""
    return name if "." in name else f"default.{name}"


def _quote(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def _quote_name(name: str) -> str:
    return ".".join(_quote(p) for p in _iceberg_name(name).split("."))


def _watch_parent(parent: int) -> None:
    """Exit (with the JVM) as soon as the process that started this server is gone."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            print("parent process died; exiting", file=sys.stderr, flush=True)
            if os.getpgid(0) == os.getpid():  # our own process group (the client starts one): take the JVM along
                os.killpg(os.getpid(), signal.SIGKILL)
            os._exit(3)


def main(argv: list[str] | None = None) -> int:
    """Serve requests until stdin closes or a ``shutdown`` request arrives (or run the build's warm-up)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exchange", required=True, help="folder for result files and Spark's scratch space")
    ap.add_argument("--jars", required=True, help="comma-separated jars for Spark's class path")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark configuration")
    ap.add_argument("--cds-archive", help="class-data-sharing archive to map (made by the build)")
    ap.add_argument("--warmup", metavar="DIR", help="run warmup.py in DIR and exit (the build's smoke test)")
    ap.add_argument("--cds-dump", help="with --warmup: write the classes loaded to this CDS archive at exit")
    args = ap.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    log4j = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
    # C1 only and the serial collector: short-lived, small workloads start faster without C2 and G1.
    java_options = f"-Dlog4j2.configurationFile=file:{log4j} -XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    if args.cds_archive and os.path.exists(args.cds_archive):
        java_options += f" -XX:SharedArchiveFile={args.cds_archive}"  # ignored by the JVM if it does not match
    if args.warmup:
        if args.cds_dump:
            java_options += f" -XX:ArchiveClassesAtExit={args.cds_dump}"
        return _warmup(args, java_options, conf)

    # The protocol gets a private copy of stdout; fd 1 itself now goes to stderr (the log), for the JVM too.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    spark = _start_spark(args.jars.split(","), args.exchange, args.driver_memory, java_options, conf)
    try:
        server = Server(spark, args.exchange)
        out.write(protocol.encode({"event": protocol.READY, "protocol": protocol.PROTOCOL_VERSION, "pid": os.getpid(),
                                   "versions": server.op_versions({})}))
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            try:
                request = protocol.decode(line)
            except ValueError as exc:
                out.write(protocol.encode({"id": None, "ok": False, "error": {
                    "kind": protocol.ERROR_REQUEST, "type": "ProtocolError", "message": f"not a JSON object: {exc}"}}))
                continue
            if request.get("op") == "shutdown":
                out.write(protocol.encode({"id": request.get("id"), "ok": True, "result": {}}))
                break
            out.write(protocol.encode(server.handle(request)))
    finally:
        spark.stop()
    return 0


def _warmup(args: argparse.Namespace, java_options: str, conf: dict[str, str]) -> int:
    import warmup

    spark = _start_spark(args.jars.split(","), args.exchange, args.driver_memory, java_options, conf)
    try:
        warmup.run(Server(spark, args.exchange), args.warmup)
    finally:
        spark.stop()
        # The JVM writes the CDS archive when it exits, which it does when its stdin closes: wait for that.
        jvm = spark.sparkContext._gateway.proc
        jvm.stdin.close()
        jvm.wait(timeout=900)
    return 0


if __name__ == "__main__":
    sys.exit(main())
