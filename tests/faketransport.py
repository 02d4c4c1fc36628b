"""The test fake of the Transport interface (patchset/transport.py): its agent is a script.

A subclass (or an `answer` callable) says what the agent returns for each request; the
fake stamps the request exactly as a real transport does and records it as sent (its JSON
object, wire.encode_request), so tests can assert what was sent, in what order, and that
bad input stopped before any call. An answer is the agent's result object; fields it
leaves out take the Result's defaults, and it crosses the wire's type checks like a real
one (wire.decode_result).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from dataclasses import fields

from patchset import transport as wire
from patchset.agent.lib import wire as agentwire

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

    def call(self, request: agentwire.Request, files: Mapping[str, Path] | None = None,
             on_event: wire.EventSink | None = None) -> agentwire.Result | agentwire.Failure:
        sent = agentwire.encode_request(wire.stamp(request, self.target))
        self.requests.append(sent)
        self.round_trips += 1
        return wire.decode(self.host, request.op, complete(request.op,
                                                           self.answer(sent, on_event)))

    def answer(self, request: dict, on_event: wire.EventSink | None) -> dict:
        if self._answer is None:
            raise AssertionError(f"unexpected agent call {request.get('op')!r}")
        return self._answer(request, on_event)

    def elevate(self) -> None:
        self.sudo = True

    def close(self) -> None:
        pass


def complete(op: str, answer: dict) -> dict:
    """An answer with the op's Result defaults for the fields it leaves out (a failure:
    empty details)."""
    if not answer.get("ok"):
        error = answer.get("error")
        return dict(answer, error={"details": "", **error}) if isinstance(error, dict) else answer
    defaults = agentwire.RESULTS[op]().to_json()
    known = {f.name for f in fields(agentwire.RESULTS[op])}
    return {**{k: v for k, v in defaults.items() if k in known}, **answer}
