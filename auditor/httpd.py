"""The HTTP listener of `patchset serve`: the standard library's http.server, made safe to
leave reachable (with --public, by anyone on the network).

Every connection gets an answer or a quiet close, and none holds the exporter:
- one deadline per connection (`client_timeout`, 10 s by default) across reading the
  request and writing the answer (patchset/agent/lib/httpdeadline.py, the same deadline the
  HTTP client uses): an idle client, one that drips its headers or one that never reads
  the answer is closed when it runs out; a per-operation timeout would let a byte every
  few seconds hold a thread for ever;
- at most `max_connections` at once; one more is answered 503 (best effort, never
  blocking the accept loop) and closed, so a flood costs threads no more than the cap;
- a listen backlog of BACKLOG (socketserver's default of 5 refuses a scrape burst);
- GET and HEAD only: another method RFC 9110 defines is 405 with `Allow`; a method it
  does not define is 501, an oversized request line 414, an oversized or excessive header
  section 431, a malformed request 400 (http.server's own answers);
- a client that goes away or runs out of time is not logged (one scraper restarting
  would fill the journal with tracebacks); a route that raises is a 500 and one log line.
A route is `accept header -> (status, body, content type)`: what it serves and how it
negotiates is the exporter's (auditor/exporter.py).
"""

from __future__ import annotations

import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from patchset.agent.lib.httpdeadline import Deadline, DeadlineSocket

Route = Callable[[str | None], tuple[int, bytes, str]]

CLIENT_TIMEOUT = 10.0
MAX_CONNECTIONS = 32
BACKLOG = 128
TEXT = "text/plain; charset=utf-8"
ALLOW = "GET, HEAD"
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 21\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
         b"too many connections\n")


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with the connection cap, the backlog and the quiet errors."""

    daemon_threads = True
    block_on_close = False           # stop() never waits for a client; the deadline ends it
    request_queue_size = BACKLOG

    def __init__(self, where: tuple[str, int], routes: dict[str, Route], *,
                 client_timeout: float, max_connections: int,
                 log: Callable[[str], None]) -> None:
        self.address_family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
        self.routes, self.client_timeout, self.log = routes, client_timeout, log
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(where, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback here: a client gone or out of time (an
        OSError) is nothing to log, anything else one line."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            self.log(f"patchset serve: a request failed ({type(exc).__name__})")


def _busy(request: socket.socket) -> None:
    """The 503 of a connection over the cap: one non-blocking send, whatever it gets."""
    try:
        request.setblocking(False)
        request.send(_BUSY)
    except OSError:
        pass


class Handler(BaseHTTPRequestHandler):
    server_version = "patchset-serve"
    timeout = None                   # the connection's deadline bounds every operation
    # an error before the request line is parsed still gets a status line (http.server
    # would answer as to HTTP/0.9: a bare body no HTTP/1.x client can read)
    default_request_version = "HTTP/1.0"
    server: Server

    def setup(self) -> None:
        self.request = DeadlineSocket(self.request, Deadline(self.server.client_timeout))
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path)
        if route is None:
            self._send(404, b"not found\n", TEXT)
            return
        try:
            code, body, ctype = route(self.headers.get("Accept"))
        except Exception as exc:  # noqa: BLE001 - a 500 and one line, never a traceback
            self.server.log(f"patchset serve: {path} failed ({type(exc).__name__})")
            code, body, ctype = 500, b"internal error\n", TEXT
        self._send(code, body, ctype)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def not_allowed(self) -> None:
        self._send(405, f"method not allowed: {ALLOW}\n".encode(), TEXT, Allow=ALLOW)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = \
        not_allowed

    def _send(self, code: int, body: bytes, ctype: str, **extra: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:   # no access log, no error lines on stderr
        return


def start(address: str, port: int, routes: dict[str, Route], *,
          client_timeout: float = CLIENT_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
          log: Callable[[str], None]) -> Server:
    """Listen on (address, port) and serve in a thread of its own. OSError when it cannot
    listen there."""
    server = Server((address, port), routes, client_timeout=client_timeout,
                    max_connections=max_connections, log=log)
    threading.Thread(target=server.serve_forever, daemon=True,
                     name="patchset-serve http").start()
    return server
