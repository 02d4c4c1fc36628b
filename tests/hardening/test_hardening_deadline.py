"""Issue 25, class 9: an HTTP request has ONE deadline, across connect, send, headers and
body (patchset/agent/lib/httpdeadline.py), in every HTTP client patchset has: the tunnel's
direct and SSH-channel endpoints (connect/tunnel.py: probes, drift, bisect, the audit's
probes) and the agent's reads on a host (runner.http: /server_info, /model_info; the
deployer's /health wait). A server that drips a byte at a time never trips a per-operation
socket timeout; here it must be given up within the timeout plus slack, as the one-line
"unreachable" failure naming the host and the request's path. And a timeout that is not a
finite number of seconds > 0 (at most a day) is bad input, exit 2.

The dripping servers are real sockets on this machine's loopback.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from tests.unit.test_cli_usage import cli

from patchset.connect.tunnel import DirectEndpoint, SshEndpoint
from patchset.agent import deployer
from patchset.agent.lib import httpdeadline
from patchset.agent.lib.facts.base import Command
from patchset.agent.lib.redact import Redactor
from patchset.agent.runner import Runner
from patchset.errors import Exit, Unreachable, UsageError

TIMEOUT = 2.0
SLACK = 1.5              # the deadline plus this: a loaded CI machine, never the drip's 30 s
DRIP_FOR = 30.0          # how long a dripping server keeps going (far beyond TIMEOUT)
HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"


class Dripper:
    """A loopback server whose every connection runs `behave(conn)` in a thread."""

    def __init__(self, behave: Callable[[socket.socket], None]) -> None:
        self.behave = behave
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.behave(conn)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def drip(conn: socket.socket, data: bytes, every: float = 0.1) -> None:
    """One byte every `every` seconds, for DRIP_FOR seconds at most."""
    end = time.monotonic() + DRIP_FOR
    for i in range(len(data)):
        if time.monotonic() > end:
            return
        conn.sendall(data[i:i + 1])
        time.sleep(every)


def read_request(conn: socket.socket) -> None:
    conn.settimeout(DRIP_FOR)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk


def drip_headers(conn: socket.socket) -> None:
    read_request(conn)
    drip(conn, HEADERS + b"X-Pad: " + b"a" * 10000 + b"\r\n\r\n")


def drip_body(conn: socket.socket) -> None:
    read_request(conn)
    conn.sendall(HEADERS + b"\r\n")
    drip(conn, b"{" + b" " * 99999)


def never_read(conn: socket.socket) -> None:
    """Accept and never read: a large request body fills the buffers and the client's
    send blocks."""
    time.sleep(DRIP_FOR)


@pytest.fixture(params=[drip_headers, drip_body], ids=["headers", "body"])
def dripper(request: pytest.FixtureRequest) -> Iterator[Dripper]:
    server = Dripper(request.param)
    yield server
    server.close()


def timed(call: Callable[[], object]) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(Exception) as err:
        call()
    return err.value, time.monotonic() - start


def assert_one_line_unreachable(exc: BaseException, where: str, path: str) -> None:
    assert isinstance(exc, Unreachable), repr(exc)
    message = str(exc)
    assert message == f"{where}: no answer to GET {path} within {TIMEOUT:g}s", message
    assert exc.exit_code == Exit.UNREACHABLE and "\n" not in message


# ---------------------------------------------------------------- the controller's client

def test_a_dripping_server_is_given_up_at_the_deadline_direct(dripper: Dripper) -> None:
    endpoint = DirectEndpoint(dripper.url)
    exc, took = timed(lambda: endpoint.request("GET", "/v1/models", timeout=TIMEOUT))
    assert took < TIMEOUT + SLACK, took
    assert_one_line_unreachable(exc, f"http://127.0.0.1:{dripper.port}", "/v1/models")


def test_a_url_prefix_is_in_the_message_path(dripper: Dripper) -> None:
    endpoint = DirectEndpoint(dripper.url + "/api")
    exc, took = timed(lambda: endpoint.request("GET", "/server_info", timeout=TIMEOUT))
    assert took < TIMEOUT + SLACK
    assert_one_line_unreachable(exc, f"http://127.0.0.1:{dripper.port}/api",
                                "/api/server_info")


class ChannelTransport:
    """What SshEndpoint needs of an SshTransport: `host` and `open_channel`. The channel
    is a plain socket to the dripping server (settimeout/send/recv/close, as paramiko's
    Channel has): the deadline is the endpoint's, not the transport's."""

    host = "gpu1"

    def __init__(self, port: int) -> None:
        self.port = port
        self.timeouts: list[float] = []

    def open_channel(self, host: str, port: int, timeout: float) -> socket.socket:
        self.timeouts.append(timeout)
        return socket.create_connection(("127.0.0.1", self.port))


def test_a_dripping_server_is_given_up_at_the_deadline_through_ssh(dripper: Dripper) -> None:
    transport = ChannelTransport(dripper.port)
    endpoint = SshEndpoint(transport, "127.0.0.1", port=30000)
    exc, took = timed(lambda: endpoint.request("GET", "/health", timeout=TIMEOUT))
    assert took < TIMEOUT + SLACK, took
    assert_one_line_unreachable(exc, "gpu1 127.0.0.1:30000 via ssh", "/health")
    assert 0 < transport.timeouts[0] <= TIMEOUT       # opening the channel is within it


def test_a_server_that_never_reads_a_large_request_is_given_up_at_the_deadline() -> None:
    """The send side: a request body larger than the socket buffers blocks the send."""
    server = Dripper(never_read)
    try:
        endpoint = DirectEndpoint(server.url)
        body = b"x" * (48 << 20)
        exc, took = timed(lambda: endpoint.request("POST", "/generate", body,
                                                   timeout=TIMEOUT))
        assert took < TIMEOUT + SLACK, took
        assert isinstance(exc, Unreachable)
        assert str(exc) == (f"http://127.0.0.1:{server.port}: no answer to POST /generate "
                            f"within {TIMEOUT:g}s")
    finally:
        server.close()


def test_a_server_that_answers_in_time_is_read_whole() -> None:
    """The deadline is not a cap on a good answer: a complete one within it is returned."""
    def answer(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n")
        time.sleep(0.3)
        conn.sendall(b"{}")
        conn.close()
    server = Dripper(answer)
    try:
        reply = DirectEndpoint(server.url).request("GET", "/x", timeout=TIMEOUT)
        assert (reply.status, reply.body) == (200, b"{}")
    finally:
        server.close()


@pytest.mark.parametrize("timeout", [0, 0.0, -1, float("nan"), float("inf"), -float("inf"),
                                     True, "5"])
def test_a_timeout_that_is_not_seconds_is_bad_input_before_anything_is_sent(
        timeout: object) -> None:
    seen: list[bytes] = []

    def record(conn: socket.socket) -> None:
        seen.append(conn.recv(100))
    server = Dripper(record)
    try:
        with pytest.raises(UsageError) as err:
            DirectEndpoint(server.url).request("GET", "/x", timeout=timeout)  # type: ignore[arg-type]
        assert err.value.exit_code == Exit.BAD_INPUT and "\n" not in str(err.value)
        assert "finite number of seconds > 0" in str(err.value)
        time.sleep(0.2)
        assert server.conns == [] and seen == []
    finally:
        server.close()


# ---------------------------------------------------------------- the agent's reads

def test_the_agents_server_read_gives_up_at_the_deadline(dripper: Dripper) -> None:
    runner = Runner(Redactor(), http_timeout=TIMEOUT)
    start = time.monotonic()
    rec = runner.http(Command("http", target=f"{dripper.url}/server_info"))
    took = time.monotonic() - start
    assert took < TIMEOUT + SLACK, took
    assert rec.get("status") is None and rec["error"].startswith(f"{dripper.url}/server_info: ")
    assert "\n" not in rec["error"]


def test_the_deployers_health_probe_gives_up_at_the_deadline(dripper: Dripper) -> None:
    start = time.monotonic()
    healthy, seen = deployer.probe(f"{dripper.url}/health", TIMEOUT)
    assert time.monotonic() - start < TIMEOUT + SLACK
    assert healthy is False and "\n" not in seen and seen


def test_the_deadline_is_a_monotonic_one() -> None:
    now = [100.0]
    deadline = httpdeadline.Deadline(2.0, clock=lambda: now[0])
    assert deadline.remaining() == 2.0
    now[0] += 1.5
    assert deadline.remaining() == 0.5
    now[0] += 0.5
    with pytest.raises(socket.timeout):
        deadline.remaining()


# ---------------------------------------------------------------- the CLI

BAD_TIMEOUTS = [("probe", "--url", "http://127.0.0.1:9", "--timeout"),
                ("probe", "--url", "http://127.0.0.1:9", "--kind", "drift", "--timeout"),
                ("audit", "localhost", "--probe", "recall", "--probe-timeout"),
                ("serve", "localhost", "--probe-timeout"),
                ("serve", "localhost", "--client-timeout"),
                ("bisect", "gpu1", "--probe-timeout"),
                ("rollout", "gpu1", "--revert", "mhc-bf16", "--probe-timeout")]


# every option at 0; the probe's --timeout at every kind of bad value
BAD_CASES = [(argv, "0") for argv in BAD_TIMEOUTS] + \
    [(BAD_TIMEOUTS[0], value) for value in ("-1", "nan", "inf", "1e400", "86401", "-0")]


@pytest.mark.parametrize("argv,value", BAD_CASES,
                         ids=[f"{' '.join(a[:1] + a[-2:-1] if 'drift' in a else a[:1])}"
                              f" {a[-1]} {v}" for a, v in BAD_CASES])
def test_a_bad_timeout_on_the_command_line_is_exit_2(tmp_path: Path, argv: tuple,
                                                     value: str) -> None:
    proc = cli(tmp_path, *argv, value)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchset: error: "), proc.stderr
    assert f"'{argv[-1]}'" in lines[0] and "a request's timeout in seconds" in lines[0]
    assert proc.stdout == ""


def test_probe_with_timeout_2_gives_up_on_a_dripping_server(tmp_path: Path) -> None:
    """The whole command: exit 3 (unreachable), the message names the server and path, and
    the probe returns within the deadline (plus the interpreter's start)."""
    server = Dripper(drip_headers)
    try:
        start = time.monotonic()
        proc = cli(tmp_path, "probe", "--url", server.url, "--kind", "recall", "--timeout",
                   "2", "--json")
        took = time.monotonic() - start
    finally:
        server.close()
    assert proc.returncode == Exit.UNREACHABLE, (proc.stdout, proc.stderr)
    assert took < DRIP_FOR / 2, took
    assert f"http://127.0.0.1:{server.port}: no answer to POST /v1/chat/completions within " \
           "2s" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
