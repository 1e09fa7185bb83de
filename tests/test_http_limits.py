"""The exporter's HTTP bounds, on a real server over real sockets: slow and stalled clients
cannot hold it (read timeout, connection limit), oversized request heads are refused."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import requests

from conftest import Running, Samples, parse_samples, value
from polling import wait_for
from grpo_monitor.runtime.http import MAX_HEADER_BYTES, MAX_HEADERS, MAX_REQUEST_LINE_BYTES

HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n"  # no blank line: never complete


def _address(running: Running) -> tuple[str, int]:
    host, port = running.url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


@contextmanager
def stalled_clients(running: Running, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections, opened one after the other, that each sent half a request."""
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(_address(running), timeout=10)
            s.sendall(HALF_REQUEST)
            s.settimeout(None)  # blocking: closed_by_server's MSG_DONTWAIT then answers at once
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def rejects(samples: Samples, reason: str) -> float | None:
    return value(samples, "grpo_http_rejects_total", reason=reason)


def exchange(running: Running, data: bytes) -> bytes:
    """Send ``data``, read the answer until the server closes the connection."""
    with socket.create_connection(_address(running), timeout=10) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("max_connections", [64, 8])
def test_scrape_answered_while_stalled_clients_hold_connections(
        start_exporter: Callable[..., Running], max_connections: int) -> None:
    """50 clients that send half a request and stall. With room for them all, they are held
    and a scrape still gets its own thread; with room for 8, each new connection drops the one
    that has waited longest, so the scrape gets in and at most 8 connections are ever open."""
    running = start_exporter(max_connections=max_connections, read_timeout=600.0)
    with stalled_clients(running, 50) as socks:
        resp = requests.get(f"{running.url}/metrics", timeout=10)
        assert resp.status_code == 200 and "grpo_exporter_ready 1.0" in resp.text
        at_scrape = parse_samples(resp.text)  # the server's own account, while the scrape is answered
        assert rejects(at_scrape, "read_timeout") == 0
        if max_connections >= 51:
            assert value(at_scrape, "grpo_http_connections") == 51  # 50 stalled + this scrape
            assert rejects(at_scrape, "evicted") == 0
            assert not any(closed_by_server(s) for s in socks)
        else:
            # 50 stalled + 1 scrape admitted, 8 at a time: the 43 oldest dropped, in order.
            assert value(at_scrape, "grpo_http_connections") == max_connections
            assert rejects(at_scrape, "evicted") == 43
            wait_for(lambda: [closed_by_server(s) for s in socks] == [True] * 43 + [False] * 7)


def test_stalled_and_trickling_clients_are_dropped_after_the_read_timeout(
        start_exporter: Callable[..., Running]) -> None:
    """Slowloris: 25 clients stall after half a request and 25 send one more byte every 50 ms,
    which resets any per-read timeout; every one of them is dropped once the read timeout has
    passed since its connection, and the exporter answers throughout."""
    running = start_exporter(read_timeout=1.0)
    stop = threading.Event()
    with stalled_clients(running, 50) as socks:
        trickling = socks[25:]

        def trickle() -> None:
            while not stop.wait(0.05):
                for s in trickling:
                    try:
                        s.send(b"a")  # one endless header line, far below the size limits
                    except OSError:
                        pass

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            assert requests.get(f"{running.url}/-/healthy", timeout=10).status_code == 200
            wait_for(lambda: all(closed_by_server(s) for s in socks), timeout=30)
        finally:
            stop.set()
            t.join(5)
    s = running.scrape()
    assert rejects(s, "read_timeout") == 50
    assert rejects(s, "evicted") == 0
    assert value(s, "grpo_http_connections") == 1  # this scrape


@pytest.mark.parametrize(("request_head", "status", "reason"), [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n",
     431, "header_too_large"),
    (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-H-%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
     + b"\r\n", 431, "too_many_headers"),
    (b"GET /" + b"a" * MAX_REQUEST_LINE_BYTES + b" HTTP/1.1\r\n\r\n", 414, "request_line_too_long"),
])
def test_oversized_request_heads_are_refused(exporter: Running, request_head: bytes, status: int,
                                             reason: str) -> None:
    answer = exchange(exporter, request_head)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    assert b"\r\nConnection: close\r\n" in answer
    s = exporter.scrape()
    assert rejects(s, reason) == 1
    assert sum(v for (name, _), v in s.items() if name == "grpo_http_rejects_total") == 1


def test_heads_within_the_limits_are_served(exporter: Running) -> None:
    """The limits are not off by one: exactly MAX_HEADERS headers of MAX_HEADER_BYTES in all."""
    last = b"Connection: close\r\n"
    filler = (MAX_HEADER_BYTES - len(last)) // (MAX_HEADERS - 1) - len(b"X-H-00: \r\n")
    headers = b"".join(b"X-H-%02d: " % i + b"v" * filler + b"\r\n" for i in range(MAX_HEADERS - 1))
    headers += last
    assert MAX_HEADER_BYTES - MAX_HEADERS < len(headers) <= MAX_HEADER_BYTES
    answer = exchange(exporter, b"GET /-/healthy HTTP/1.1\r\n" + headers + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nOK\n")


def test_a_body_on_a_get_closes_the_connection(exporter: Running) -> None:
    """Unread body bytes must not be taken for the next request on a keep-alive connection."""
    answer = exchange(exporter, b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nContent-Length: 22\r\n\r\n"
                                b"GET /metrics HTTP/1.1\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 ") == 1
    assert b"\r\nConnection: close\r\n" in answer
