"""Issue 25, class 8: `patchset serve`'s HTTP listener (auditor/httpd.py) answers every
request or closes it quietly, and no client can hold it.

Real sockets against the real exporter in this process (no audit runs: the exporter's
own series are enough to serve /metrics). Every case checks, besides its answer, that
nothing was printed to stderr (socketserver prints a traceback per failed request) and
that the exporter's log has no line but the ones the case expects.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest

from patchset.auditor import api, exporter, httpd
from patchset.auditor.model import HostFacts

CLIENT_TIMEOUT = 1.0
SLACK = 1.5


class Served:
    def __init__(self, ex: exporter.Exporter, address: str, port: int,
                 log: list[str]) -> None:
        self.ex, self.address, self.port, self.log = ex, address, port, log

    def connect(self) -> socket.socket:
        sock = socket.create_connection((self.address, self.port), timeout=10)
        return sock

    def exchange(self, raw: bytes) -> bytes:
        """Send `raw`, read until the server closes."""
        with self.connect() as sock:
            sock.sendall(raw)
            return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def head(reply: bytes) -> str:
    return reply.split(b"\r\n\r\n", 1)[0].decode("latin-1")


def start(max_connections: int = httpd.MAX_CONNECTIONS) -> tuple[exporter.Exporter, Served]:
    log: list[str] = []
    ex = exporter.Exporter(["gpu1"], lambda h: api.Gathered(HostFacts(h)),
                           lambda g: {"hosts": []}, interval=60, log=log.append)
    address, port = ex.serve("127.0.0.1", 0, client_timeout=CLIENT_TIMEOUT,
                             max_connections=max_connections)
    return ex, Served(ex, address, port, log)


@pytest.fixture()
def served(capfd: pytest.CaptureFixture) -> Iterator[Served]:
    ex, s = start()
    yield s
    ex.stop()
    err = capfd.readouterr().err
    assert err == "", err                   # never a traceback, never an access log


def get(served: Served, path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.0", "Host: x", *headers]
    return served.exchange(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


# ---------------------------------------------------------------- Accept

HOSTILE_ACCEPT = [      # (Accept, the content type served)
    ("application/openmetrics-text; version=abc", "text/plain"),   # a TypeError there
    (" text/plain;;version=99999999999999999999escaping=allow-utf-8", "text/plain"),
    ("application/openmetrics-text; version=1.0.0; escaping=bogus, */*;q=x",
     "application/openmetrics-text"),
    ("a" * 60000, "text/plain"),
    (";;;;==,,,", "text/plain"),
]


@pytest.mark.parametrize("accept,ctype", HOSTILE_ACCEPT, ids=range(len(HOSTILE_ACCEPT)))
def test_a_hostile_accept_gets_metrics_in_a_format_it_serves(served: Served, accept: str,
                                                             ctype: str) -> None:
    """RFC 9110 12.5.1: an Accept the server cannot honour may be disregarded; a scraper
    is served the text format rather than a 406 (or, before, no answer at all)."""
    reply = get(served, "/metrics", f"Accept: {accept}")
    assert status(reply) == 200, reply[:200]
    assert f"Content-Type: {ctype}; version=" in head(reply)
    assert b"patchset_audits_total" in reply
    assert served.log == []


def test_an_openmetrics_accept_is_still_honoured(served: Served) -> None:
    reply = get(served, "/metrics", "Accept: application/openmetrics-text; version=1.0.0")
    assert status(reply) == 200 and "application/openmetrics-text" in head(reply)
    assert reply.rstrip().endswith(b"# EOF")


# ---------------------------------------------------------------- what it cannot serve

@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_a_method_rfc_9110_defines_but_not_served_is_405_with_allow(served: Served,
                                                                    method: str) -> None:
    reply = served.exchange(f"{method} /metrics HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    assert status(reply) == 405, reply[:200]
    assert "\r\nAllow: GET, HEAD" in head(reply)


def test_an_unknown_method_is_501(served: Served) -> None:
    assert status(served.exchange(b"BREW /metrics HTTP/1.0\r\n\r\n")) == 501


def test_an_unknown_path_is_404_and_head_has_no_body(served: Served) -> None:
    assert status(get(served, "/etc/passwd")) == 404
    assert status(get(served, "/../metrics")) == 404
    reply = served.exchange(b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert status(reply) == 200 and reply.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("raw,code", [
    (b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n", 414),
    (b"GET /metrics HTTP/1.0\r\nX-Big: " + b"b" * 70000 + b"\r\n\r\n", 431),
    (b"GET /metrics HTTP/1.0\r\n" + b"X-H: 1\r\n" * 150 + b"\r\n", 431),
    (b"\x00\x01\x02 garbage\r\n\r\n", 400),
    (b"GET /metrics HTTP/9.9\r\n\r\n", 505),
], ids=["request-line", "header-line", "header-count", "garbage", "version"])
def test_what_it_cannot_read_is_a_4xx_or_5xx_never_silence(served: Served, raw: bytes,
                                                           code: int) -> None:
    assert status(served.exchange(raw)) == code


def test_a_route_that_raises_is_a_500_and_one_log_line(served: Served,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(_accept: object) -> tuple:
        raise RuntimeError("secret-ish detail\nsecond line")
    monkeypatch.setattr(served.ex, "metrics_text", boom)
    reply = get(served, "/metrics")
    assert status(reply) == 500
    assert served.log == ["patchset serve: /metrics failed (RuntimeError)"]
    assert status(get(served, "/healthz")) == 200          # and it keeps serving


# ---------------------------------------------------------------- clients going away

def test_clients_that_go_away_early_leave_no_trace(served: Served) -> None:
    """Reset before the request ends, right after it, and before the answer is read:
    nothing on stderr (the fixture checks), nothing in the log, and the next client is
    served."""
    linger = struct.pack("ii", 1, 0)                        # close() sends a RST
    for raw in (b"GET /metr", b"GET /metrics HTTP/1.0\r\n\r\n",
                b"GET /metrics HTTP/1.0\r\nAccept: text/plain\r\n\r\n"):
        for _ in range(10):
            sock = served.connect()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            sock.sendall(raw)
            sock.close()
    time.sleep(0.5)
    assert status(get(served, "/metrics")) == 200
    assert served.log == []


def test_a_client_that_never_reads_a_large_answer_is_dropped_at_the_deadline(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    big = b"x" * (32 << 20)                                 # beyond the socket buffers
    monkeypatch.setattr(served.ex, "metrics_text", lambda _accept: (big, httpd.TEXT))
    sock = served.connect()
    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    time.sleep(CLIENT_TIMEOUT + SLACK)                      # not reading
    sock.settimeout(5)
    got = read_all(sock)
    sock.close()
    assert len(got) < len(big)                              # the server gave up on it
    assert served.log == []


# ---------------------------------------------------------------- time and connection bounds

def closed_within(sock: socket.socket, seconds: float,
                  drip: bytes = b"") -> float:
    """Seconds until the server closes `sock` (sending `drip` a byte at a time meanwhile);
    fails when it stays open past `seconds`."""
    start = time.monotonic()
    sock.settimeout(0.2)
    for i in range(10 ** 6):
        if time.monotonic() - start > seconds:
            pytest.fail(f"connection still open after {seconds}s")
        try:
            if drip:
                sock.sendall(drip[i % len(drip):i % len(drip) + 1])
            if sock.recv(65536) == b"":
                return time.monotonic() - start
            return time.monotonic() - start                # an answer, then the close
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start
    raise AssertionError("unreachable")


def test_an_idle_connection_is_closed_at_the_client_timeout(served: Served) -> None:
    with served.connect() as sock:
        took = closed_within(sock, CLIENT_TIMEOUT + SLACK)
    assert took >= CLIENT_TIMEOUT * 0.8


def test_a_request_dripped_a_byte_at_a_time_is_closed_at_the_client_timeout(
        served: Served) -> None:
    """Each byte comes well within any per-read timeout; the connection's one deadline
    still ends it."""
    with served.connect() as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n")
        took = closed_within(sock, CLIENT_TIMEOUT + SLACK, drip=b"X-Slow: abcdefgh\r\n")
    assert took >= CLIENT_TIMEOUT * 0.5
    assert served.log == []


def test_connections_over_the_cap_get_503_and_are_closed(capfd: pytest.CaptureFixture) -> None:
    ex, served = start(max_connections=3)
    try:
        idle = [served.connect() for _ in range(3)]
        time.sleep(0.3)                                     # all three accepted and held
        started = time.monotonic()
        reply = get(served, "/metrics")
        assert time.monotonic() - started < 1.0
        assert status(reply) == 503 and "Retry-After: 1" in head(reply)
        for sock in idle:
            sock.close()
        time.sleep(0.3)                                     # their slots are free again
        assert status(get(served, "/metrics")) == 200
        assert served.log == []
    finally:
        ex.stop()
    assert capfd.readouterr().err == ""


def test_the_listen_backlog_is_not_socketservers_5(served: Served) -> None:
    """`ss` shows a listening socket's backlog as its Send-Q."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{served.port}"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert int(out[2]) == httpd.BACKLOG >= 128


def test_stop_does_not_wait_for_a_client(capfd: pytest.CaptureFixture) -> None:
    ex, served = start()
    sock = served.connect()
    sock.sendall(b"GET /metrics HTTP/1.0\r\n")              # half a request, held open
    time.sleep(0.2)
    started = time.monotonic()
    ex.stop()
    assert time.monotonic() - started < CLIENT_TIMEOUT
    sock.close()
    assert capfd.readouterr().err == ""
