"""A throwaway PostgreSQL cluster for the shared-catalog tests: ``initdb`` and ``pg_ctl`` on a free port in a temporary folder.

Run as root, the cluster runs as the unprivileged user ``nobody`` (PostgreSQL
refuses to run as root). ``pg_ctl`` is looked up on PATH and in Debian's
``/usr/lib/postgresql/<version>/bin``; ``.ci/run`` installs the Debian
``postgresql`` package when it is missing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass

from lakes import free_port

USER = "nobody"


def find_binary(name: str) -> str | None:
    """The path of a PostgreSQL server program (``initdb``, ``pg_ctl``), or None."""
    found = shutil.which(name)
    if found:
        return found
    hits = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return hits[-1] if hits else None


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in ``folder`` listening on 127.0.0.1:``port`` (trust authentication, database ``lineage``)."""

    folder: str
    port: int = 0

    def __post_init__(self) -> None:
        self.initdb, self.pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        if self.initdb is None or self.pg_ctl is None:
            raise RuntimeError("PostgreSQL's initdb/pg_ctl are not installed (Debian: apt-get install postgresql)")
        self.port = self.port or free_port()
        self.data = os.path.join(self.folder, "data")
        self.log = os.path.join(self.folder, "server.log")
        os.makedirs(self.folder, exist_ok=True)
        if os.geteuid() == 0:
            info = pwd.getpwnam(USER)
            os.chown(self.folder, info.pw_uid, info.pw_gid)
            os.chmod(self.folder, 0o700)
        self._run(self.initdb, "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        self.start()
        self.psql("CREATE DATABASE lineage")

    @property
    def uri(self) -> str:
        """The SQLAlchemy URI of the ``lineage`` database."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/lineage"

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["setpriv", f"--reuid={USER}", f"--regid={pwd.getpwnam(USER).pw_gid}", "--clear-groups", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, cwd=self.folder, timeout=120)

    def start(self) -> None:
        """Start the server (and wait until it accepts connections)."""
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off -c max_connections=200"
        self._run(self.pg_ctl, "-D", self.data, "-l", self.log, "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: as a crash would)."""
        self._run(self.pg_ctl, "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate") -> None:
        """Stop and start the server again (connections are dropped)."""
        self.stop(mode)
        self.start()

    def psql(self, sql: str, database: str = "postgres") -> list[tuple]:
        """Run one statement (autocommit) and return its rows."""
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database)
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall() if cur.description else []
        finally:
            con.close()

    def close(self) -> None:
        """Stop the server and remove its folder."""
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_for(server: PostgresServer, timeout: float = 30) -> None:
    """Wait until ``server`` accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.psql("SELECT 1")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
