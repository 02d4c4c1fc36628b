"""The server's own account of itself: /server_info, /model_info, /health (local HTTP).

`/server_info` is every ServerArgs field after SGLang's startup hooks resolved them
(moe_runner_backend, attention_backend, quantization, disaggregation_mode, ...);
0.5.14 still serves the deprecated `/get_server_info`, so the gatherer tries both.
"""

from __future__ import annotations

from typing import Any

from ..bounded import loads
from .base import RawRecord, Command, Fact, Unavailable, failure


def _json_body(raw: RawRecord) -> Any:
    why = failure(raw)
    if why:
        raise Unavailable(why)
    status = raw.get("status")
    if status != 200:
        raise Unavailable(f"{raw.get('command')}: HTTP {status}")
    return loads(raw.get("stdout") or "null", str(raw.get("command")))


class _JsonEndpoint(Fact):
    """A GET whose body is one JSON object; `paths` are tried in order (newest first)."""

    paths: tuple[str, ...] = ()

    def command(self, base: str = "http://127.0.0.1:30000", path: str | None = None,
                **kwargs: Any) -> Command:
        return Command("http", target=base.rstrip("/") + (path or self.paths[0]))

    def process(self, raw: RawRecord) -> dict[str, Any]:
        body = _json_body(raw)
        if not isinstance(body, dict):
            raise Unavailable(f"{raw.get('command')}: not a JSON object")
        return body


class ServerInfo(_JsonEndpoint):
    """GET /server_info (fallback /get_server_info) -> the resolved ServerArgs + version."""

    paths = ("/server_info", "/get_server_info")


class ModelInfo(_JsonEndpoint):
    """GET /model_info (fallback /get_model_info) -> model_path, is_generation, ..."""

    paths = ("/model_info", "/get_model_info")


class Health(Fact):
    """GET /health -> {"status": HTTP code or None, "ok": bool, "error": why not}.

    A server that does not answer is a fact about the server (down), not an unknown.
    """

    paths = ("/health",)

    def command(self, base: str = "http://127.0.0.1:30000", path: str = "/health",
                **kwargs: Any) -> Command:
        return Command("http", target=base.rstrip("/") + path)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        status = raw.get("status")
        return {"status": status, "ok": status == 200,
                "error": raw.get("error") or (None if status == 200 else f"HTTP {status}")}
