"""One deadline per HTTP exchange, across connect, request, headers and body.

Why: a socket timeout bounds each operation only. A server (or a client) that sends one
byte every few seconds never trips it and holds a probe, a gather, a deploy's /health
wait or a `patchset serve` connection for ever. Every HTTP exchange patchset makes or
answers runs on a `DeadlineSocket`: before each send and receive, the socket's timeout
is set to what is left of the exchange's time, and when nothing is left that is
`socket.timeout`, the same failure as a silent peer, so every caller's existing
"no answer" path reports it.

Used by the controller's one HTTP client (connect/tunnel.py: direct and through an SSH
channel), by the agent's reads of a server on its host (`get`: /server_info, /health),
and by `patchset serve`'s connections (auditor/exporter.py). It lives in the agent
package because the agent may import only the standard library and itself (Python 3.8
on hosts); the controller imports it from here.
"""

from __future__ import annotations

import http.client
import io
import math
import socket
import time
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit

_CHUNK = 64 * 1024


class Deadline:
    """A point in monotonic time, `seconds` from now; `remaining()` is what each socket
    operation may still wait."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"a deadline is a finite number of seconds > 0, not {seconds!r}")
        self.seconds, self._clock = float(seconds), clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        """Seconds left; socket.timeout when none are (a caller's "no answer" path)."""
        left = self._end - self._clock()
        if left <= 0:
            raise socket.timeout(f"no complete exchange within {self.seconds:g}s")
        return left


class RawSocket(Protocol):
    """What DeadlineSocket uses of the socket it wraps: a socket.socket, an ssl.SSLSocket or
    a paramiko Channel (connect/tunnel.py)."""

    def settimeout(self, timeout: float | None, /) -> None: ...
    def recv(self, size: int, /) -> bytes: ...
    def send(self, data: bytes, /) -> int: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...


class DeadlineSocket:
    """The socket methods http.client and http.server use, on anything with
    settimeout/send/recv/close (a socket, an SSL socket, a paramiko channel), each
    operation bounded by the deadline's remaining time. Like a socket, the underlying
    one stays open until this and every file made from it are closed: http.client
    closes the socket as soon as a response ends the connection (HTTP/1.0) and reads the
    body from the file afterwards."""

    def __init__(self, sock: RawSocket, deadline: Deadline) -> None:
        self.sock, self.deadline = sock, deadline
        self._files = 0
        self._closed = False

    def recv(self, size: int) -> bytes:
        self.sock.settimeout(self.deadline.remaining())
        return self.sock.recv(size)

    def sendall(self, data: bytes) -> None:
        data = bytes(data)
        offset = 0
        while offset < len(data):
            self.sock.settimeout(self.deadline.remaining())
            offset += self.sock.send(data[offset:offset + _CHUNK])

    def settimeout(self, _timeout: float | None) -> None:
        """Ignored: the deadline sets the timeout of every operation."""

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"DeadlineSocket.makefile: only 'rb', not {mode!r}")
        self._files += 1
        return io.BufferedReader(_Reader(self))

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self._closed = True
        self._release()

    def file_closed(self) -> None:
        self._files -= 1
        self._release()

    def _release(self) -> None:
        if self._closed and self._files <= 0:
            self.sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, owner: DeadlineSocket) -> None:
        self.owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.owner.recv(len(buffer))        # b"" at EOF; socket.timeout at the end
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.owner.file_closed()
        super().close()


def open_socket(address: tuple[str, int], deadline: Deadline) -> socket.socket:
    """A TCP connection to (host, port), every address tried within what is left of the
    deadline (socket.create_connection gives each address the whole timeout). The name
    lookup itself has no timeout: getaddrinfo takes none."""
    host, port = address
    last: OSError = OSError(f"{host}: no address")
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0,
                                                           socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.remaining())
            sock.connect(addr)
            return sock
        except socket.timeout:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            last = exc
    raise last


class _Deadlined(http.client.HTTPConnection):
    """What both connection kinds add to http.client: connect within the deadline, then
    every operation on a DeadlineSocket."""

    def __init__(self, host: str, port: int | None, deadline: Deadline) -> None:
        super().__init__(host, port, timeout=deadline.remaining())
        self.deadline = deadline
        self._create_connection = self._open

    def _open(self, address: tuple[str, int], *_: Any) -> socket.socket:
        return open_socket(address, self.deadline)

    def connect(self) -> None:
        super().connect()
        self.sock = DeadlineSocket(self.sock, self.deadline)


class DeadlineHTTPConnection(_Deadlined):
    """http.client's HTTP/1.1 with one deadline for the whole exchange."""


class DeadlineHTTPSConnection(_Deadlined, http.client.HTTPSConnection):
    """The same over TLS (the handshake's operations get the time left at connect)."""


def connection(url: str, deadline: Deadline) -> tuple[http.client.HTTPConnection, str]:
    """(a connection to `url`'s server, the request target: path and query)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    kind = DeadlineHTTPSConnection if parts.scheme == "https" else DeadlineHTTPConnection
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return kind(parts.hostname, parts.port, deadline), target


def get(url: str, headers: dict[str, str], seconds: float, limit: int) -> tuple[int, bytes]:
    """GET `url` (no proxy, no redirect: the agent reads a server on its own host):
    (status, at most `limit` bytes of the body), the whole exchange within `seconds`.
    OSError (socket.timeout too), http.client.HTTPException or ValueError when it fails."""
    conn, target = connection(url, Deadline(seconds))
    try:
        conn.request("GET", target, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read(limit)
    finally:
        conn.close()


def reason(exc: BaseException) -> str:
    """A failed exchange in one line: "Connection refused", "no complete exchange within
    5s", "RemoteDisconnected: ..."."""
    text = getattr(exc, "strerror", None) or str(exc)
    return " ".join(text.split()) or type(exc).__name__
