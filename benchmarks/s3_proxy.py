"""An HTTP proxy in front of an S3 server that counts requests by kind and adds a fixed latency to each.

Run: ``python benchmarks/s3_proxy.py --target http://127.0.0.1:9000 --port 9100 --latency-ms 20``. Kinds: GET
(with the response bytes), PUT, LIST, HEAD, DELETE, POST (multipart uploads, batch deletes). ``GET /__counts``
returns the counts as JSON (with ``?log=1``, also each request's kind, path, bytes and arrival and answer times);
``POST /__reset`` zeroes them. Each request waits ``latency`` before it is
forwarded, like a same-region object store's first byte.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class Counts:
    """Requests and bytes by kind (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.requests: dict[str, int] = {}
            self.bytes_in = 0  # response bytes of GETs (what a reader downloads)
            self.bytes_out = 0  # request bodies (what a writer uploads)
            self.log: list[list] = []  # [kind, path, response bytes of a GET, arrived ms, answered ms] per request
            self.t0 = time.monotonic()

    def add(self, kind: str, path: str, got: int, sent: int, arrived: float) -> None:
        with self.lock:
            ms = [round((t - self.t0) * 1000, 1) for t in (arrived, time.monotonic())]
            self.log.append([kind, path, got, *ms])
            self.requests[kind] = self.requests.get(kind, 0) + 1
            self.bytes_in += got
            self.bytes_out += sent

    def snapshot(self, log: bool = False) -> dict:
        with self.lock:
            out = {"requests": dict(self.requests), "total": sum(self.requests.values()), "get_bytes": self.bytes_in,
                   "put_bytes": self.bytes_out}
            if log:
                out["log"] = list(self.log)
            return out


def kind_of(method: str, path: str) -> str:
    """The request's kind: LIST for a bucket-level GET (a listing), else the method."""
    parsed = urlparse(path)
    if method == "GET" and ("list-type" in parsed.query or parsed.path.strip("/").count("/") == 0):
        return "LIST"
    return method


def make_handler(target: str, latency: float, counts: Counts) -> type[BaseHTTPRequestHandler]:
    upstream = urlparse(target)
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                out = b""
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None, length: str | None = None) -> None:
            self.send_response(status)
            for k, v in headers or []:
                self.send_header(k, v)
            self.send_header("Content-Length", length if self.command == "HEAD" and length is not None else str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self) -> None:
            if self.path.startswith("/__counts"):
                self._body()
                snap = counts.snapshot(log="log=1" in self.path)
                self._reply(200, json.dumps(snap).encode(), [("Content-Type", "application/json")])
                return
            if self.path == "/__reset":
                self._body()
                counts.reset()
                self._reply(200, b"{}")
                return
            body = self._body()
            arrived = time.monotonic()
            time.sleep(latency)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            for attempt in range(2):
                con = getattr(local, "con", None)
                if con is None:
                    con = local.con = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=300)
                try:
                    con.request(self.command, self.path, body=body or None, headers=headers)
                    resp = con.getresponse()
                    data = resp.read()
                    break
                except (http.client.HTTPException, OSError):
                    local.con = None
                    if attempt:
                        raise
            kind = kind_of(self.command, self.path)
            counts.add(kind, self.path, len(data) if self.command == "GET" else 0, len(body), arrived)
            self._reply(resp.status, data, [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP | {"content-length"}],
                        resp.getheader("Content-Length"))

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


class Running:
    """This proxy in a child process on a free 127.0.0.1 port, in front of ``target`` (``stop`` ends it)."""

    def __init__(self, target: str, latency_ms: float) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--target", target, "--port", str(self.port),
                                      "--latency-ms", str(latency_ms)])
        deadline = time.monotonic() + 30
        while True:
            try:
                self.counts()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the proxy did not start") from None
                time.sleep(0.05)

    def counts(self, log: bool = False) -> dict:
        """Requests by kind and bytes since the last reset (with ``log``, each request too)."""
        with urllib.request.urlopen(f"{self.endpoint}/__counts{'?log=1' if log else ''}", timeout=10) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        """Zero the counts."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/__reset", method="POST"), timeout=10).read()

    def stop(self) -> None:
        """End the proxy process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.target, args.latency_ms / 1000, Counts()))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
