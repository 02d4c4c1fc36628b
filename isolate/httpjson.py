"""JSON over HTTP for the drift probe, on whichever connection reaches the server: the
host's own SSH connection (connect/tunnel.py SshEndpoint: a server bound to the host's
127.0.0.1, a host known by an ssh-config alias) or a direct URL (`--url`). The server's
refusals (an HTTP status) and an unreachable server are told apart (exit 1 vs exit 3)."""

from __future__ import annotations

import json
from typing import Any

from patchset.agent.bounded import InputError, loads
from patchset.errors import PatchsetError, Unreachable

from .drift import DriftError

ERROR_CHARS = 300


class EndpointClient:
    """POST JSON through an HttpEndpoint (connect/tunnel.py), a bearer key if given."""

    def __init__(self, endpoint: Any, key: str | None = None) -> None:
        self.endpoint = endpoint
        self._key = key

    def describe(self) -> str:
        return self.endpoint.describe()

    def close(self) -> None:
        self.endpoint.close()

    def post(self, path: str, body: dict, timeout: float, want_json: bool = True) -> Any:
        return self._send("POST", path, json.dumps(body).encode(), timeout, want_json)

    def get(self, path: str, timeout: float) -> bytes:
        """The body of a GET (the server's /metrics): bytes, never parsed here."""
        return self._send("GET", path, None, timeout, False)

    def _send(self, method: str, path: str, data: bytes | None, timeout: float,
              want_json: bool) -> Any:
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        where = f"{self.describe()} {path}"
        try:
            reply = self.endpoint.request(method, path, data, headers, timeout=timeout)
        except Unreachable:
            raise                         # no answer: nothing to say about the server
        except PatchsetError as exc:
            raise DriftError(f"{where}: {exc}") from None
        if reply.status != 200:
            text = reply.body[:ERROR_CHARS].decode(errors="replace")
            raise DriftError(f"{where}: HTTP {reply.status}: {redact(text, self._key)}")
        if not want_json:
            return reply.body
        try:
            return loads(reply.body, where)
        except InputError as exc:
            raise DriftError(str(exc)) from None


def redact(text: str, key: str | None) -> str:
    return text.replace(key, "***") if key else text

