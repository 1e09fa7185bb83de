"""The HTTP side: /metrics, the health endpoints, /docs/, /replay and the webhook's transport.

/metrics, /-/healthy, /-/ready, the runbook (/docs/runbook.md, where the cards' runbook_url
points by default, and /docs/background.md, which it links), /replay (with --web.enable-replay)
and (with a token file) the Alertmanager webhook POST /-/alertmanager/webhook, on a threading
server.

With ``--web.config.file`` (web_config.py) the server speaks TLS, asks for basic auth on every
path but the webhook's (Alertmanager sends that one its bearer token, and a request carries one
``Authorization`` header), and adds the configured response headers.

Bounds, so that no client can hold the exporter: a request line, header block and header count
limit; ``--web.read-timeout`` for reading a whole request (TLS handshake and idle keep-alive wait
included), enforced from the accept loop so that a client trickling a byte at a time is dropped
too; and ``--web.max-connections`` connections (a thread each), where a new connection that finds
them all taken drops the one that has waited longest for its request's bytes: a scrape gets
through while slow clients hold connections. Every refusal is counted in
``grpo_http_rejects_total{reason}``.
"""

from __future__ import annotations

import gzip
import io
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from grpo_monitor.runtime import runbook
from grpo_monitor.runtime.web_config import BasicAuth, WebConfig, peer_sans

if TYPE_CHECKING:
    from grpo_monitor.runtime.webhook import WebhookHandler

log = logging.getLogger("grpo_monitor.runtime.http")

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"

# Request heads: Prometheus sends ~200 bytes in 5 headers, a browser a few KiB. Go's net/http
# allows 1 MiB; nginx 8 KiB a line and 32 KiB in all, which these follow.
MAX_REQUEST_LINE_BYTES = 8 * 1024
MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 64
DEFAULT_READ_TIMEOUT = 30.0  # keeps a 15 s scrape interval's keep-alive connection open
DEFAULT_MAX_CONNECTIONS = 64  # a few Prometheus servers, browsers, Alertmanager: far fewer

REJECT_REASONS = ("unauthorized", "request_line_too_long", "header_too_large", "too_many_headers",
                  "read_timeout", "write_timeout", "evicted", "connection_limit", "tls_handshake",
                  "tls_client_san")

# The pages the exporter renders (/replay, /docs/*) are self-contained: inline CSS, no scripts,
# nothing loaded from elsewhere; the browser is told so.
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                 "X-Content-Type-Options": "nosniff"}

# After an error answer with request bytes still unread, read (and drop) this much for at most
# this long before closing: closing with unread input sends a TCP reset, which can destroy the
# answer before the client has read it.
_LINGER_BYTES = 256 * 1024
_LINGER_SECONDS = 2.0


def parse_listen_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[V6]:PORT``, as Prometheus spells it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _drop(sock: socket.socket) -> None:
    """Shut a connection down under its worker thread: the blocked read returns end-of-file.
    socket.socket's own shutdown, not SSLSocket's, which would tear the TLS state down under
    the thread that is using it."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


@dataclass
class _Slot:
    reading_since: float | None  # None while a request is being answered
    deadline: float
    dropped: bool = False


class ConnectionTable:
    """The open connections, each with its worker thread.

    A connection is *reading* from its accept (TLS handshake included) and again after each
    answer (waiting for the next keep-alive request), and must have read a whole request within
    ``read_timeout`` of that moment; it is *serving* while its request is answered. The accept
    thread drops connections past their deadline (``reap``) and, when ``limit`` connections are
    open, the one that has been reading longest (``admit``). Shut-down connections stay in the
    table, marked, until their thread releases them: the table removes an entry before the
    socket is closed, so it never shuts down a file descriptor that was reused."""

    def __init__(self, limit: int, read_timeout: float, count: Callable[[str], None]) -> None:
        self.limit = limit
        self.read_timeout = read_timeout
        self._count = count
        self._slots: dict[socket.socket, _Slot] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return sum(not s.dropped for s in self._slots.values())

    def admit(self, sock: socket.socket) -> bool:
        now = time.monotonic()
        with self._lock:
            live = [(s.reading_since, sk, s) for sk, s in self._slots.items()
                    if not s.dropped]
            if len(live) >= self.limit:
                reading = [entry for entry in live if entry[0] is not None]
                if not reading:
                    self._count("connection_limit")
                    return False
                _, victim, slot = min(reading, key=lambda e: e[0])  # type: ignore[arg-type,return-value]
                slot.dropped = True
                _drop(victim)
                self._count("evicted")
            self._slots[sock] = _Slot(now, now + self.read_timeout)
        return True

    def reading(self, sock: socket.socket) -> None:
        """Waiting for the next request (a connection still reading its first keeps the
        deadline it got at accept)."""
        now = time.monotonic()
        with self._lock:
            slot = self._slots.get(sock)
            if slot is not None and slot.reading_since is None:
                slot.reading_since, slot.deadline = now, now + self.read_timeout

    def serving(self, sock: socket.socket) -> None:
        with self._lock:
            slot = self._slots.get(sock)
            if slot is not None:
                slot.reading_since = None

    def timed_out(self, sock: socket.socket) -> None:
        """A blocking read or write on ``sock`` gave up (its socket timeout): count it, unless
        the connection was already dropped and counted."""
        with self._lock:
            slot = self._slots.get(sock)
            if slot is None or slot.dropped:
                return
            slot.dropped = True
            self._count("read_timeout" if slot.reading_since is not None else "write_timeout")

    def dropped(self, sock: socket.socket) -> bool:
        with self._lock:
            slot = self._slots.get(sock)
            return slot is not None and slot.dropped

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._slots.pop(sock, None)

    def reap(self) -> None:
        now = time.monotonic()
        with self._lock:
            for sock, slot in self._slots.items():
                if not slot.dropped and slot.reading_since is not None and now > slot.deadline:
                    slot.dropped = True
                    _drop(sock)
                    self._count("read_timeout")

    def drop_all(self) -> None:
        """At shutdown: end every worker's wait."""
        with self._lock:
            for sock, slot in self._slots.items():
                slot.dropped = True
                _drop(sock)


class ExporterServer(ThreadingHTTPServer):
    daemon_threads = True
    # A scrape must not wait behind a slow client: each connection has its own thread (up to
    # max_connections). A burst of connects waits in the kernel's queue, not refused.
    request_queue_size = 128

    def __init__(self, address: str, metrics: Callable[[], bytes], ready: Callable[[], bool],
                 webhook: WebhookHandler | None = None, replay_dir: Path | None = None, *,
                 web: WebConfig | None = None, read_timeout: float = DEFAULT_READ_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 registry: CollectorRegistry | None = None) -> None:
        if read_timeout <= 0:
            raise ValueError("--web.read-timeout must be above 0")
        if max_connections < 1:
            raise ValueError("--web.max-connections must be at least 1")
        host, port = parse_listen_address(address)
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.render_metrics = metrics
        self.is_ready = ready
        self.webhook = webhook
        self.replay_dir = replay_dir  # None: /replay is off
        self.web = web
        self.tls = web.tls if web is not None else None
        self.basic_auth = BasicAuth(web.users) if web is not None and web.users else None
        if web is not None:
            log.info("web configuration %s: TLS %s, basic auth %s, %d extra headers", web.path,
                     "on" if self.tls else "off",
                     f"for {len(web.users)} users" if web.users else "off", len(web.headers))
            if web.users and self.tls is None:
                log.warning("basic auth without TLS: passwords cross the network in clear text "
                            "(docs/security.md)")
        self.read_timeout = read_timeout
        registry = registry if registry is not None else CollectorRegistry()
        self.rejects = Counter(
            "grpo_http_rejects", "HTTP requests and connections the exporter turned away, by "
            "reason (docs/security.md).", ["reason"], registry=registry)
        for reason in REJECT_REASONS:
            self.rejects.labels(reason)
        self.connections = ConnectionTable(max_connections, read_timeout, self.reject)
        Gauge("grpo_http_connections", "Open HTTP connections (at most --web.max-connections).",
              registry=registry).set_function(lambda: len(self.connections))
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    def reject(self, reason: str) -> None:
        self.rejects.labels(reason).inc()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{port}" if ":" not in str(host) else f"{scheme}://[{host}]:{port}"

    def start(self) -> None:
        # A short poll interval makes shutdown() quick and reaps slow connections on time
        # (service_actions runs once per poll); requests never wait on it.
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="grpo-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.connections.drop_all()

    # --- socketserver hooks: all but finish_request/shutdown_request run on the accept thread.

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self.tls is not None:
            # No I/O here: the handshake happens on the connection's own thread (_Handler.handle),
            # under its read deadline, so a client that never finishes one holds only itself.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def service_actions(self) -> None:
        self.connections.reap()

    def shutdown_request(self, request: Any) -> None:
        self.connections.release(request)  # before the close: see ConnectionTable
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # the client went away, timed out, or was dropped
            log.debug("connection from %s ended: %r", client_address, exc)
        else:
            log.exception("error answering %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two send()s; with Nagle on, a keep-alive client's delayed ACK
    # holds a small body back ~40 ms (Prometheus keeps its connections alive).
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return "grpo-monitor"  # the Server header: no Python version for a scanner to match

    def setup(self) -> None:
        # Each blocking read or write gives up after the read timeout; the whole request's
        # deadline is ConnectionTable's.
        self.timeout = self.server.read_timeout
        super().setup()
        self._sent_headers: set[str] = set()
        self._status = 0

    def handle(self) -> None:
        if isinstance(self.connection, ssl.SSLSocket) and not self._handshake():
            return
        super().handle()

    def _handshake(self) -> bool:
        conn = self.connection
        assert isinstance(conn, ssl.SSLSocket)
        try:
            conn.do_handshake()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            if isinstance(exc, TimeoutError):
                self.server.connections.timed_out(conn)
            elif not self.server.connections.dropped(conn):
                self.server.reject("tls_handshake")
            log.debug("TLS handshake with %s failed: %s", self.client_address, exc)
            return False
        allowed = self.server.web.client_allowed_sans if self.server.web is not None else frozenset()
        if allowed and not peer_sans(conn.getpeercert() or {}) & allowed:
            self.server.reject("tls_client_san")
            log.debug("client certificate of %s has none of client_allowed_sans", self.client_address)
            return False
        return True

    # --- reading a request, within bounds

    def handle_one_request(self) -> None:
        conns = self.server.connections
        conns.reading(self.connection)
        try:
            head = self._read_head()
            if head is None:
                self.close_connection = True
                return
            self.raw_requestline = head[0]
            # parse_request reads the header block from rfile: give it the block read above.
            socket_file, self.rfile = self.rfile, io.BytesIO(b"".join(head[1:]))
            try:
                parsed = self.parse_request()
            finally:
                self.rfile = socket_file
            if not parsed:
                return
            if self.command != "POST":
                conns.serving(self.connection)  # POST: once its body is read (do_POST)
                if "Content-Length" in self.headers or "Transfer-Encoding" in self.headers:
                    self.close_connection = True  # a body nobody reads must not become a request
            method = getattr(self, "do_" + str(self.command), None)
            if method is None:
                self.send_error(501, f"Unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except OSError as exc:  # timed out, reset, or dropped
            if isinstance(exc, TimeoutError):
                conns.timed_out(self.connection)
            log.debug("connection from %s: %r", self.client_address, exc)
            self.close_connection = True

    def _read_head(self) -> list[bytes] | None:
        """The request line and header lines up to the blank one; None when the client went
        away (or was dropped) first; None after a 414/431 answer when the head is too big."""
        line = self.rfile.readline(MAX_REQUEST_LINE_BYTES + 1)
        if len(line) > MAX_REQUEST_LINE_BYTES:
            self._refuse_head(414, "request_line_too_long",
                              f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
            return None
        if not line.endswith(b"\n"):
            return None
        head, size = [line], 0
        while True:
            line = self.rfile.readline(MAX_HEADER_BYTES - size + 1)
            if len(line) > MAX_HEADER_BYTES - size:
                self._refuse_head(431, "header_too_large", f"headers over {MAX_HEADER_BYTES} bytes")
                return None
            if not line.endswith(b"\n"):
                return None
            head.append(line)
            if line in (b"\r\n", b"\n"):
                return head
            size += len(line)
            if len(head) - 1 > MAX_HEADERS:
                self._refuse_head(431, "too_many_headers", f"more than {MAX_HEADERS} headers")
                return None

    def _refuse_head(self, code: int, reason: str, message: str) -> None:
        self.server.reject(reason)
        # send_error writes a status line only for a request that has a version.
        self.command, self.request_version, self.requestline = None, "HTTP/1.1", ""
        self.close_connection = True
        self.send_error(code, message)
        self.wfile.flush()
        self._linger()

    def _linger(self) -> None:
        """Read what the client is still sending, briefly, so that the close after an error
        answer is a clean one (see _LINGER_BYTES)."""
        self.server.connections.serving(self.connection)
        try:
            socket.socket.shutdown(self.connection, socket.SHUT_WR)
            self.connection.settimeout(_LINGER_SECONDS)
            deadline, left = time.monotonic() + _LINGER_SECONDS, _LINGER_BYTES
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except (OSError, ValueError):
            pass

    # --- answering

    def _authorized(self) -> bool:
        """Basic auth, when the web configuration has users; a 401 answer otherwise."""
        auth = self.server.basic_auth
        if auth is None or auth.check(self.headers.get("Authorization")):
            return True
        self.server.reject("unauthorized")
        self._send(401, b"unauthorized\n",
                   extra={"WWW-Authenticate": 'Basic realm="grpo-monitor", charset="UTF-8"'})
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if not self._authorized():
            return
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
        elif path == "/replay":
            self._replay()
        elif path.startswith("/docs/") and path[len("/docs/"):] in runbook.PAGES:
            self._doc(path[len("/docs/"):])
        elif path == "/":
            self._send(200, self._landing(), "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n")

    def _replay(self) -> None:
        if self.server.replay_dir is None:
            # Logged prompts and responses can be proprietary training data: off unless asked.
            self._send(404, b"/replay is off; the exporter's --web.enable-replay turns it on\n")
            return
        from urllib.parse import parse_qs, urlsplit

        from grpo_monitor.runtime.replay import replay_http

        status, ctype, body = replay_http(self.server.replay_dir, parse_qs(urlsplit(self.path).query),
                                          self.headers.get("Accept", ""))
        # Sample text is hostile: the page is escaped, loads nothing and runs nothing.
        self._send(status, body, ctype, extra=_PAGE_HEADERS)

    def _doc(self, name: str) -> None:
        body = runbook.page(name)
        if body is None:
            self._send(404, f"this install does not carry docs/{name}\n".encode())
            return
        self._send(200, body, "text/html; charset=utf-8", compress=True, extra=_PAGE_HEADERS)

    def _landing(self) -> bytes:
        replay = ('<li><a href="replay">/replay?run=RUN&amp;step=STEP</a> (sample replay)</li>'
                  if self.server.replay_dir is not None else
                  "<li>/replay (sample replay) is off: <code>--web.enable-replay</code></li>")
        return (f"<!doctype html><html><head><title>grpo-monitor exporter</title></head><body>\n"
                f'<h1>grpo-monitor exporter</h1><ul><li><a href="metrics">/metrics</a></li>\n'
                f'<li><a href="{runbook.PATH[1:]}">{runbook.PATH}</a> (the runbook)</li>\n'
                f'{replay}\n<li><a href="-/healthy">/-/healthy</a></li>'
                f'<li><a href="-/ready">/-/ready</a></li></ul></body></html>\n').encode()

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_POST(self) -> None:  # noqa: N802
        from grpo_monitor.runtime.webhook import PATH

        hook = self.server.webhook
        if self.path.split("?", 1)[0] != PATH or hook is None:
            # Not the webhook: a path like any other, behind basic auth; the body is not read.
            self.close_connection = True
            if self._authorized():
                self._send(404, b"not found\n")
            return
        # The webhook answers to its bearer token alone: Alertmanager's http_config sends one
        # Authorization header, and it carries the token (docs/security.md).
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
        self.server.connections.serving(self.connection)
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

    # The web configuration's headers go on every answer (errors included), unless the answer
    # sets the header itself (/replay's stricter Content-Security-Policy).
    def send_response_only(self, code: int, message: str | None = None) -> None:
        self._status = code
        self._sent_headers = set()
        super().send_response_only(code, message)

    def send_header(self, keyword: str, value: str) -> None:
        self._sent_headers.add(keyword.lower())
        super().send_header(keyword, value)

    def end_headers(self) -> None:
        web = self.server.web
        if web is not None and self._status >= 200:
            for name, value in web.headers.items():
                if name.lower() not in self._sent_headers:
                    super().send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s " + format, self.address_string(), *args)

