"""Where test tables live: a local warehouse or a bucket of a real S3 HTTP server (moto) on 127.0.0.1.

:class:`MotoServer` runs ``python -m moto.server`` on a free port (a process
of its own: the server does not compete with the tests for the GIL);
:class:`Lake` is a catalog and warehouse pair a test (or a child process:
it pickles) opens tables in.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase

ACCESS_KEY = "testing-key"
SECRET_KEY = "testing-secret"
REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """moto's S3 server in a child process on 127.0.0.1 (``stop`` ends it)."""

    def __init__(self, log_path: str) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the moto server did not start (see {log_path})") from None
                time.sleep(0.1)

    def client(self) -> Any:
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def new_bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"lake-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """End the server process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass(frozen=True)
class Lake:
    """A catalog and a warehouse: ``kind`` is ``local`` (both in ``root``) or ``s3`` (SQLite catalog in ``root``, data in a bucket).

    ``catalog_uri`` replaces the SQLite catalog (a PostgreSQL one, say).
    """

    kind: str
    root: str
    warehouse: str
    properties: dict[str, str] = field(default_factory=dict)
    catalog_uri: str | None = None

    def catalog(self) -> Any:
        """A new catalog object (each process and thread opens its own)."""
        from pyiceberg.catalog.sql import SqlCatalog

        from lineage.catalog import CATALOG_NAME, default_catalog

        if self.kind == "local" and self.catalog_uri is None:
            return default_catalog(self.root)
        os.makedirs(self.root, exist_ok=True)
        uri = self.catalog_uri or f"sqlite:///{os.path.join(self.root, 'catalog.db')}?timeout=60"
        return SqlCatalog(CATALOG_NAME, uri=uri, warehouse=self.warehouse, **self.properties)

    def where(self) -> dict[str, Any]:
        """Keyword arguments naming this lake for ``create_table``, ``open_table`` and ``cdf.mv``."""
        if self.kind == "local" and self.catalog_uri is None:
            return {"warehouse": self.root}
        return {"catalog": self.catalog()}

    def cli(self) -> list[str]:
        """Global options of the ``lineage`` command naming this lake."""
        if self.kind == "local" and self.catalog_uri is None:
            return ["--warehouse", self.root]
        os.makedirs(self.root, exist_ok=True)
        uri = self.catalog_uri or f"sqlite:///{os.path.join(self.root, 'catalog.db')}"
        args = ["--warehouse", self.warehouse, "--catalog-uri", uri]
        for k, v in sorted(self.properties.items()):
            args += ["--catalog", f"{k}={v}"]
        return args


def s3_lake(server: MotoServer, root: str, catalog_uri: str | None = None) -> Lake:
    """A lake whose data lives in a new bucket of ``server``."""
    bucket = server.new_bucket()
    props = {"s3.endpoint": server.endpoint, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY,
             "s3.region": REGION}
    return Lake("s3", root, f"s3://{bucket}/wh", props, catalog_uri)


S3_PROPERTY_EXAMPLES = int(os.environ.get("LINEAGE_S3_PROPERTY_EXAMPLES", "3"))  # model-based tests on S3: a smaller budget
# ... and no shrinking by default (every step is a few requests to the server: shrinking takes many minutes);
# LINEAGE_S3_SHRINK=1 shrinks a failing example.
S3_PHASES = tuple(Phase) if os.environ.get("LINEAGE_S3_SHRINK") else (Phase.explicit, Phase.reuse, Phase.generate)


@contextlib.contextmanager
def temp_lake(server: MotoServer | None, prefix: str = "lake-") -> Iterator[Lake]:
    """A lake in a new temporary folder (hypothesis examples cannot use function fixtures): local, or on ``server``."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        yield Lake("local", tmp, tmp) if server is None else s3_lake(server, os.path.join(tmp, "catalog"))


def stored_files(root: str) -> set[str]:
    """Every file under a table's location (a folder or a key prefix), as the table names its files."""
    import lineage.storage.files as files

    return {f.location for f in files.list_files(root)}
