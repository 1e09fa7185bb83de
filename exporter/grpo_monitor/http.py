"""The HTTP side: /metrics, /-/healthy, /-/ready, on a threading server."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("grpo_monitor.http")

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
LANDING = b"""<!doctype html><html><head><title>grpo-monitor exporter</title></head><body>
<h1>grpo-monitor exporter</h1><ul><li><a href="metrics">/metrics</a></li>
<li><a href="-/healthy">/-/healthy</a></li><li><a href="-/ready">/-/ready</a></li></ul></body></html>
"""


def parse_listen_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[V6]:PORT``, as Prometheus spells it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class ExporterServer(ThreadingHTTPServer):
    daemon_threads = True
    # A scrape must not wait behind a slow client: each request has its own thread.

    def __init__(self, address: str, metrics: Callable[[], bytes], ready: Callable[[], bool]) -> None:
        host, port = parse_listen_address(address)
        if ":" in host:
            import socket

            self.address_family = socket.AF_INET6
        self.render_metrics = metrics
        self.is_ready = ready
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        return f"http://{host}:{port}" if ":" not in str(host) else f"http://[{host}]:{port}"

    def start(self) -> None:
        # A short poll interval only makes shutdown() quick; requests never wait on it.
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="grpo-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ExporterServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two send()s; with Nagle on, a keep-alive client's delayed ACK
    # holds a small body back ~40 ms (Prometheus keeps its connections alive).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body = self.server.render_metrics()
            except Exception:
                log.exception("rendering /metrics failed")
                self._send(500, b"internal error rendering metrics\n")
                return
            self._send(200, body, CONTENT_TYPE_TEXT, compress=True)
        elif path == "/-/healthy":
            self._send(200, b"OK\n")
        elif path == "/-/ready":
            if self.server.is_ready():
                self._send(200, b"OK\n")
            else:
                self._send(503, b"replaying snapshots already on disk\n")
        elif path == "/":
            self._send(200, LANDING, "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
              compress: bool = False) -> None:
        headers = {"Content-Type": ctype}
        if compress and "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s " + format, self.address_string(), *args)
