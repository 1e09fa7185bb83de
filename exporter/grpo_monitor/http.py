"""The HTTP side: /metrics, /-/healthy, /-/ready, and (with a token file) the Alertmanager
webhook POST /-/alertmanager/webhook, on a threading server."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_monitor.webhook import WebhookHandler

log = logging.getLogger("grpo_monitor.http")

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
LANDING = b"""<!doctype html><html><head><title>grpo-monitor exporter</title></head><body>
<h1>grpo-monitor exporter</h1><ul><li><a href="metrics">/metrics</a></li>
<li><a href="replay">/replay?run=RUN&amp;step=STEP</a> (sample replay)</li>
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

    def __init__(self, address: str, metrics: Callable[[], bytes], ready: Callable[[], bool],
                 webhook: WebhookHandler | None = None, snapshot_dir: Path | None = None) -> None:
        host, port = parse_listen_address(address)
        if ":" in host:
            import socket

            self.address_family = socket.AF_INET6
        self.render_metrics = metrics
        self.is_ready = ready
        self.webhook = webhook
        self.snapshot_dir = snapshot_dir  # for /replay
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
        elif path == "/replay" and self.server.snapshot_dir is not None:
            from urllib.parse import parse_qs, urlsplit

            from grpo_monitor.replay import replay_http

            status, ctype, body = replay_http(self.server.snapshot_dir,
                                              parse_qs(urlsplit(self.path).query),
                                              self.headers.get("Accept", ""))
            # Sample text is hostile: the page is escaped, loads nothing and runs nothing.
            self._send(status, body, ctype, extra={
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                "X-Content-Type-Options": "nosniff"})
        elif path == "/":
            self._send(200, LANDING, "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_POST(self) -> None:  # noqa: N802
        from grpo_monitor.webhook import PATH

        hook = self.server.webhook
        if self.path.split("?", 1)[0] != PATH or hook is None:
            self.close_connection = True  # the body was not read
            self._send(404, b"not found\n")
            return
        if not hook.authorized(self.headers.get("Authorization")):
            hook.count("unauthorized")
            self.close_connection = True
            self._send(401, b"unauthorized\n", extra={"WWW-Authenticate": 'Bearer realm="grpo-monitor"'})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if length < 0:
            hook.count("bad_request")
            self.close_connection = True
            self._send(411 if "Content-Length" not in self.headers else 400, b"Content-Length required\n")
            return
        if length > hook.max_body_bytes:
            hook.count("too_large")
            self.close_connection = True
            self._send(413, f"body over {hook.max_body_bytes} bytes\n".encode())
            return
        body = self.rfile.read(length)
        code, msg = hook.handle(body)
        self._send(code, (msg + "\n").encode())

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
              compress: bool = False, extra: dict[str, str] | None = None) -> None:
        headers = {"Content-Type": ctype, **(extra or {})}
        if self.close_connection:
            headers["Connection"] = "close"
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
