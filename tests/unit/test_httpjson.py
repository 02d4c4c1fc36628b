"""The one JSON-over-HTTP client of isolate/ (isolate/measure/httpjson.py): probe and drift send
through it, with one redaction policy, and no answer is the one Unreachable (exit 3)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from patchset.errors import Exit, Unreachable
from patchset.isolate.measure import httpjson, probe
from patchset.isolate.measure.drift import DriftError

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-" + "k" * 24


class Endpoint:
    """A stand-in HttpEndpoint: answers (status, body), or raises what it is given."""

    def __init__(self, status: int = 200, body: bytes = b"{}", fail: Exception | None = None):
        self.status, self.body, self.fail, self.sent = status, body, fail, []

    def describe(self) -> str:
        return "http://gpu1:30000"

    def request(self, method, path, data, headers, timeout):
        self.sent.append((method, path, data, dict(headers)))
        if self.fail:
            raise self.fail
        return SimpleNamespace(status=self.status, body=self.body)


def test_one_exchange_sends_json_and_the_key_as_a_bearer() -> None:
    end = Endpoint(body=b'{"ok": 1}')
    assert httpjson.request(end, "POST", "/x", {"a": 1}, KEY, 5) == b'{"ok": 1}'
    method, path, data, headers = end.sent[0]
    assert (method, path, json.loads(data)) == ("POST", "/x", {"a": 1})
    assert headers == {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    httpjson.request(end, "GET", "/metrics", None, None, 5)
    assert end.sent[1][2] is None and end.sent[1][3] == {}


def test_a_refusal_is_shown_redacted_then_clipped_by_drift_and_probe() -> None:
    body = (f"bad key {KEY} " + "x" * 1000).encode()
    with pytest.raises(DriftError) as err:
        httpjson.EndpointClient(Endpoint(401, body), KEY).post("/generate", {}, 5)
    assert KEY not in str(err.value) and "HTTP 401: bad key <redacted> x" in str(err.value)
    assert len(str(err.value)) < 400
    result = probe._guarded(lambda e, k, t: probe.chat(e, [], 1, k), Endpoint(401, body),
                            KEY, 5)
    assert KEY not in result.error and result.error.startswith("HTTP 401: bad key <redacted>")
    assert not result.unreachable
    cut = httpjson.shown("x" * 20 + KEY, KEY, 25)      # clipped inside the key's place
    assert cut == "x" * 20 + "<red\u2026" and "sk-" not in cut


def test_no_answer_is_the_one_unreachable_in_drift_and_probe() -> None:
    gone = Endpoint(fail=Unreachable("http://gpu1:30000: unreachable (refused)"))
    with pytest.raises(Unreachable) as err:
        httpjson.EndpointClient(gone).post("/generate", {}, 5)
    assert err.value.exit_code == Exit.UNREACHABLE
    result = probe._guarded(lambda e, k, t: probe.chat(e, [], 1, k), gone, None, 5)
    assert result.unreachable and result.error == "cannot reach http://gpu1:30000: " \
        "unreachable (refused)"


def test_only_the_client_sends_a_request() -> None:
    """Every other isolate/ module sends through httpjson.request (one client)."""
    found = [f"{p.name}:{n.lineno}" for p in sorted((ROOT / "isolate").glob("*.py"))
             if p.name != "httpjson.py" for n in ast.walk(ast.parse(p.read_text("utf-8")))
             if isinstance(n, ast.Attribute) and n.attr == "request"
             and not (isinstance(n.value, ast.Name) and n.value.id == "httpjson")]
    assert found == []
