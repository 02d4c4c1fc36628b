"""HTTP to a host's servers, the way patchset reaches the host itself: through its SSH.

Why: an SGLang server usually listens on its host's 127.0.0.1 (deploy binds servers
there), and many hosts are known only by an ~/.ssh/config alias, so a probe that dials
http://ADDRESS:PORT from here reaches neither. A request to an SSH host's server goes in
a `direct-tcpip` channel of that host's one SSH connection (SshTransport.open_channel:
the same known-hosts check, ProxyJump hops included), and the server sees a client on
its own host. `--url` stays a direct connection (DirectEndpoint), and so does a
`localhost` inventory entry (the server is on this machine).

Where a host's request goes (`role_target`): the first of `roles` (router, then decode)
whose hosts.yaml entry has a `port`; the address is that role's bind address
(`roles.ROLE.host`, else `serving.host`) as seen from the host: unset, a wildcard
(0.0.0.0, ::) or a loopback name (localhost, 127.0.0.1) is 127.0.0.1, any other
address is dialled as written, from the host.

Nothing here reaches a shell: the channel carries bytes. Method, path and headers are
checked before anything is sent (the path starts with "/" and is printable ASCII without
spaces, so no CR/LF can split the request), a response body is capped (MAX_BODY), a
request has one deadline, `timeout` seconds for connect, send, headers and body together
(patchset/agent/lib/httpdeadline.py: a server that drips a byte at a time cannot hold a
probe), and every failure is one line that names the host and host:port (Unreachable: exit
3; a reply that is not bounded HTTP: EndpointError, exit 4). An HTTP error status is a
response, not an exception: the caller judges it.
"""

from __future__ import annotations

import http.client
import re
import socket
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from patchset import validate
from patchset.agent.lib.httpdeadline import (Deadline, DeadlineHTTPConnection,
                                             DeadlineHTTPSConnection, DeadlineSocket)
from patchset.errors import Unreachable, PatchsetError, UsageError

from .inventory import Host

ROLE_PREFERENCE = ("router", "decode")
DEFAULT_TIMEOUT = 600.0
MAX_BODY = 64 * 1024 * 1024        # a chat completion is kilobytes; more is a wrong server
LOOPBACK_BINDS = ("", "0.0.0.0", "::", "localhost", "127.0.0.1")
_CHUNK = 1024 * 1024
_METHOD = re.compile(r"[A-Z]{1,16}")
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_UNSAFE = re.compile(r"[^\x21-\x7e]")        # spaces, controls (CR/LF included), non-ASCII
_UNSAFE_VALUE = re.compile(r"[^\x20-\x7e\t]")


class EndpointError(PatchsetError):
    """The server answered, but not with a bounded HTTP response."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]          # names lower-cased; repeated headers joined by ", "
    body: bytes


class HttpEndpoint(Protocol):
    """One server's HTTP, however it is reached."""

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> HttpResponse:
        """One request; `path` is origin-form ("/v1/chat/completions")."""

    def describe(self) -> str:
        """Where requests go, for reports and errors (never a credential)."""

    def close(self) -> None:
        """Release what the endpoint owns (its own SSH connection, if it opened one)."""


@dataclass(frozen=True)
class RoleTarget:
    role: str
    address: str                     # as seen from the host
    port: int


def role_target(host: Host, roles: tuple[str, ...] = ROLE_PREFERENCE) -> RoleTarget | None:
    """Where `host`'s HTTP requests go (the module docstring's rule); None when none of
    `roles` declares a port."""
    for role in roles:
        settings = host.roles.get(role) or {}
        if settings.get("port"):
            bind = str(settings.get("host") or (host.serving or {}).get("host") or "")
            return RoleTarget(role, connect_address(bind), int(settings["port"]))
    return None


def connect_address(bind: str) -> str:
    """The address to dial, from the host, for a server bound to `bind`."""
    return "127.0.0.1" if bind in LOOPBACK_BINDS else bind


def endpoint_for(host: Host, roles: tuple[str, ...] = ROLE_PREFERENCE, *,
                 at: tuple[str, int] | None = None, transport: Any = None,
                 accept_new: bool = False, max_body: int = MAX_BODY) -> HttpEndpoint:
    """The endpoint of an inventory host's role (or of `at`, an address and port as seen
    from the host, e.g. where its facts say a server listens). An SSH host's requests go
    through `transport` (an SshTransport: share the one the command already holds), else
    through a connection of the endpoint's own, closed with it; localhost is direct."""
    if at is None:
        target = role_target(host, roles)
        if target is None:
            raise UsageError(f"{host.name}: hosts.{host.name}.roles has no "
                             f"{' or '.join(roles)} port; add one or use --url")
        at = (target.address, target.port)
    address, port = at
    if not validate.BIND.ok(address) or not isinstance(port, int) or not 0 < port < 65536:
        raise UsageError(f"{host.name}: {address!r} port {port!r} is not an address and port "
                         "to send HTTP to")
    if host.local:
        return DirectEndpoint(f"http://{_hostport(address, port)}", max_body=max_body)
    owns = transport is None
    if owns:
        from .ssh import SshTransport
        transport = SshTransport(host, "", accept_new=accept_new)
    return SshEndpoint(transport, address, port=port, owns=owns, max_body=max_body)


class _Endpoint:
    """The request cycle both kinds share; a subclass says how a connection is made."""

    prefix = ""
    max_body = MAX_BODY

    def _connection(self, deadline: Deadline) -> http.client.HTTPConnection:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> HttpResponse:
        """One request on a fresh connection (channel), read whole and closed, all of it
        within `timeout` seconds (one deadline: connect, send, headers and body)."""
        headers = _checked(self.describe(), method, path, headers)
        deadline = _deadline(self.describe(), timeout)
        reply = None
        conn = None
        try:
            conn = self._connection(deadline)
            conn.request(method, self.prefix + path, body=body, headers=headers)
            reply = conn.getresponse()
            data = _bounded(reply, self.max_body, self.describe())
            return HttpResponse(reply.status, _header_map(reply), data)
        except PatchsetError:
            raise
        except socket.timeout:
            raise Unreachable(f"{self.describe()}: no answer to {method} "
                                  f"{self.prefix + path} within {timeout:g}s") from None
        except OSError as exc:      # refused, reset, closed channel (RemoteDisconnected too)
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise Unreachable(f"{self.describe()}: unreachable ({reason})") from None
        except http.client.HTTPException as exc:
            raise EndpointError(f"{self.describe()}: not an HTTP response "
                                f"({type(exc).__name__})") from None
        finally:
            if reply is not None:
                reply.close()
            if conn is not None:
                conn.close()

    def __enter__(self) -> "_Endpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DirectEndpoint(_Endpoint):
    """http(s)://HOST[:PORT][/PATH] from this machine (`--url`, localhost): PATH prefixes
    every request. No user:password@, query or fragment: a report would show them."""

    def __init__(self, url: str, *, max_body: int = MAX_BODY) -> None:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = 0
        if "@" in parts.netloc:
            raise UsageError("a URL with user:password@ is refused (reports would show it); "
                             "pass the API key with --api-key-env")
        if (parts.scheme not in ("http", "https") or not parts.hostname or port == 0
                or parts.query or parts.fragment or _UNSAFE.search(url)):
            raise UsageError(f"{url!r}: expected http(s)://HOST[:PORT][/PATH]")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.max_body = max_body

    def describe(self) -> str:
        scheme = "https" if self.https else "http"
        return f"{scheme}://{_hostport(self.host, self.port)}{self.prefix}"

    def _connection(self, deadline: Deadline) -> http.client.HTTPConnection:
        kind = DeadlineHTTPSConnection if self.https else DeadlineHTTPConnection
        return kind(self.host, self.port, deadline)


class SshEndpoint(_Endpoint):
    """host:port as seen from an SSH host, each request in its own `direct-tcpip` channel
    of `transport`'s connection (anything with `host` and `open_channel(host, port)`:
    SshTransport). `owns`: close the transport with the endpoint."""

    def __init__(self, transport: Any, host: str = "127.0.0.1", *, port: int,
                 owns: bool = False, max_body: int = MAX_BODY) -> None:
        self.transport, self.host, self.port = transport, host, port
        self.owns, self.max_body = owns, max_body

    def describe(self) -> str:
        return f"{self.transport.host} {_hostport(self.host, self.port)} via ssh"

    def _connection(self, deadline: Deadline) -> http.client.HTTPConnection:
        return _ChannelConnection(self.transport, self.host, self.port, deadline)

    def close(self) -> None:
        if self.owns:
            self.transport.close()


class _ChannelConnection(DeadlineHTTPConnection):
    """http.client's HTTP/1.1, with an SSH channel for its socket (same deadline)."""

    def __init__(self, transport: Any, host: str, port: int, deadline: Deadline) -> None:
        super().__init__(host, port, deadline)
        self._transport = transport

    def connect(self) -> None:
        channel = self._transport.open_channel(self.host, self.port,
                                               timeout=self.deadline.remaining())
        self.sock = DeadlineSocket(channel, self.deadline)


def _checked(where: str, method: str, path: str,
             headers: dict[str, str] | None) -> dict[str, str]:
    """Refuse what could split or smuggle a request, before anything is sent."""
    if not _METHOD.fullmatch(method):
        raise UsageError(f"{where}: {method!r} is not an HTTP method")
    if not path.startswith("/") or _UNSAFE.search(path):
        raise UsageError(f"{where}: request path {path!r} must start with / and be printable "
                         "ASCII without spaces (no CR/LF)")
    out = dict(headers or {})
    for name, value in out.items():
        if not _HEADER_NAME.fullmatch(str(name)) or _UNSAFE_VALUE.search(str(value)):
            raise UsageError(f"{where}: header {name!r}: a bad name, or a value that is not "
                             "printable ASCII (no CR/LF)")
    return out


def _deadline(where: str, timeout: float) -> Deadline:
    """The request's one deadline; a timeout that is not a finite number of seconds > 0
    is bad input (0 would fail every request, inf or nan would wait for ever)."""
    try:
        return Deadline(timeout)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _bounded(reply: http.client.HTTPResponse, limit: int, where: str) -> bytes:
    """The whole body, or EndpointError past `limit` (a declared length over it fails
    before anything is read)."""
    declared = reply.getheader("Content-Length") or ""
    # latin-1 decoded: '²' passes isdigit and int() refuses it
    over = declared.isascii() and declared.isdigit() and int(declared) > limit
    chunks: list[bytes] = []
    total = 0
    while not over and total <= limit:
        chunk = reply.read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
    raise EndpointError(f"{where}: response body larger than {limit} bytes; refused")


def _header_map(reply: http.client.HTTPResponse) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in reply.getheaders():
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
