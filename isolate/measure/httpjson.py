"""The one JSON-over-HTTP client of isolate/ (probe, drift, bisect through them), on
whichever connection reaches the server: the host's own SSH connection (connect/tunnel.py
SshEndpoint: a server bound to the host's 127.0.0.1, a host known by an ssh-config alias)
or a direct URL (`--url`). One exchange (`request`), one redaction policy (`shown`: the
key replaced by `<redacted>`, then clipped, never the other way round). A server's
refusal (an HTTP status: HttpStatus) and no answer at all (patchset.errors.Unreachable,
exit 3) are told apart."""

from __future__ import annotations

import json
from typing import Any

from patchset.agent.lib.bounded import InputError, loads
from patchset.errors import PatchsetError, Unreachable

from patchset.isolate.measure.drift import DriftError

ERROR_CHARS = 300
REDACTED = "<redacted>"          # as the agent's redactor writes it (patchset/agent/lib/redact.py)


class HttpStatus(Exception):
    """The server answered with an HTTP error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body

    def text(self) -> str:
        """Enough of the body to redact a key in it whole before it is clipped for show."""
        return self.body[:4096].decode("utf-8", "replace").replace("\n", " ")


def request(endpoint: Any, method: str, path: str, body: dict | None, key: str | None,
            timeout: float) -> bytes:
    """One exchange through an HttpEndpoint (connect/tunnel.py): `body` sent as JSON, a
    bearer key if given; the reply's body for a 2xx status, else HttpStatus. No answer is
    Unreachable, an answer that is not bounded HTTP the endpoint's error, as raised."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    reply = endpoint.request(method, path, data, headers, timeout=timeout)
    if not 200 <= reply.status < 300:
        raise HttpStatus(reply.status, reply.body)
    return reply.body


def redact(text: str, key: str | None) -> str:
    return text.replace(key, REDACTED) if key else text


def clip(text: str, limit: int) -> str:
    """Clip after redacting (a key cut in half by the clip would no longer match)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def shown(text: str, key: str | None, limit: int = ERROR_CHARS) -> str:
    """What of a server's text may be shown: the key redacted, then clipped."""
    return clip(redact(text, key), limit)


class EndpointClient:
    """The drift probe's client (isolate/measure/drift.py Client): `request` with the key held,
    a server's refusal or a body that is not JSON as a DriftError."""

    def __init__(self, endpoint: Any, key: str | None = None) -> None:
        self.endpoint = endpoint
        self._key = key

    def describe(self) -> str:
        return self.endpoint.describe()

    def close(self) -> None:
        self.endpoint.close()

    def post(self, path: str, body: dict, timeout: float, want_json: bool = True) -> Any:
        return self._send("POST", path, body, timeout, want_json)

    def get(self, path: str, timeout: float) -> bytes:
        """The body of a GET (the server's /metrics): bytes, never parsed here."""
        return self._send("GET", path, None, timeout, False)

    def _send(self, method: str, path: str, body: dict | None, timeout: float,
              want_json: bool) -> Any:
        where = f"{self.describe()} {path}"
        try:
            data = request(self.endpoint, method, path, body, self._key, timeout)
        except Unreachable:
            raise                         # no answer: nothing to say about the server
        except HttpStatus as exc:
            raise DriftError(f"{where}: HTTP {exc.status}: {shown(exc.text(), self._key)}") \
                from None
        except PatchsetError as exc:
            raise DriftError(f"{where}: {exc}") from None
        if not want_json:
            return data
        try:
            return loads(data, where)
        except InputError as exc:
            raise DriftError(str(exc)) from None
