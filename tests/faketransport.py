"""The test fake of the Transport interface (patchset/transport.py): its agent is a script.

A subclass (or an `answer` callable) says what the agent returns for each request; the
fake stamps the request exactly as a real transport does and records it, so tests can
assert what was sent, in what order, and that bad input stopped before any call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from patchset import transport as wire

Answer = Callable[[dict, "wire.EventSink | None"], dict]


class FakeTransport:
    provisions = False

    def __init__(self, host: str = "gpu1", target: str = "/opt/sglang",
                 answer: Answer | None = None) -> None:
        self.host, self.target = host, target
        self.sudo = False
        self.requests: list[dict] = []
        self.round_trips = self.bytes_sent = 0
        self._answer = answer

    def call(self, request: dict, files: Mapping[str, Path] | None = None,
             on_event: wire.EventSink | None = None) -> dict:
        request = wire.stamp(request, self.target)
        self.requests.append(request)
        self.round_trips += 1
        return self.answer(request, on_event)

    def answer(self, request: dict, on_event: wire.EventSink | None) -> dict:
        if self._answer is None:
            raise AssertionError(f"unexpected agent call {request.get('op')!r}")
        return self._answer(request, on_event)

    def elevate(self) -> None:
        self.sudo = True

    def close(self) -> None:
        pass
