"""Small stdlib HTTP plumbing shared by the server and router stand-ins."""

from __future__ import annotations

import enum
import json
import logging
import socket
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

access_log = logging.getLogger("uvicorn.access")


def to_json(obj: Any) -> bytes:
    """Compact JSON as FastAPI/ORJSON send it (sets/tuples as lists, enums by value)."""

    def default(o: Any) -> Any:
        if isinstance(o, (set, frozenset, tuple)):
            return list(o)
        if isinstance(o, enum.Enum):
            return o.value
        if hasattr(o, "__dataclass_fields__"):
            import dataclasses

            return dataclasses.asdict(o)
        return str(o)

    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=default).encode()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), handler)


class Handler(BaseHTTPRequestHandler):
    """Routes: ``routes[(METHOD, path)] = fn(handler) -> (status, body, content_type)``."""

    server_version = "uvicorn"
    sys_version = ""
    routes: dict[tuple[str, str], Callable] = {}
    prefix_routes: list[tuple[str, str, Callable]] = []  # (method, path prefix, fn)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        access_log.info("%s - %s", self.address_string(), format % args)

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        fn = self.routes.get((method, path))
        if fn is None:
            for m, prefix, f in self.prefix_routes:
                if m == method and path.startswith(prefix):
                    fn = f
                    break
        if fn is None:
            known = any(p == path for (_, p) in self.routes) or any(
                path.startswith(p) for _, p, _ in self.prefix_routes)
            if known:
                self.send_json(405, {"detail": "Method Not Allowed"})
            else:
                self.send_json(404, {"detail": "Not Found"})
            return
        try:
            fn(self)
        except BrokenPipeError:
            pass

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def read_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def send_bytes(self, status: int, body: bytes, content_type: str | None = "application/json") -> None:
        self.send_response(status)
        if content_type:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any) -> None:
        self.send_bytes(status, to_json(obj))

    def send_empty(self, status: int) -> None:
        self.send_bytes(status, b"", None)


def request(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
            timeout: float = 30.0) -> tuple[int, bytes, str]:
    """(status, body, content type); status 0 when the peer is unreachable."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else to_json(body)
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("content-type", "") if exc.headers else ""
    except (urllib.error.URLError, OSError):
        return 0, b"", ""
