"""Hostile server answers (issue 25, class 2): a chat completion or a /generate answer is
validated whole (isolate/measure/answers.py) before any of it is used. Wrong types, `true` for a
count, absurd but finite logprobs, malformed top-token lists: a failed probe naming the
field (`patchset probe` exit 1; the drift probe a one-line exit 4), never an internal
error (exit 70) and never a verdict computed on them.

The server below is a real HTTP server on 127.0.0.1 that answers every POST with one
body; `{TOKEN}` in it becomes the token the probe planted, so the answer would pass if
its shape were not checked.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from patchset.connect.tunnel import HttpResponse
from tests.hostutil import cli
from patchset.isolate.measure import drift, probe
from tests.unit.test_drift_answers import SPEC, Computing

TOKEN = re.compile(r"RECALL-[0-9A-F]{8}")


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        sent = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        found = TOKEN.search(sent)
        body = self.server.body.replace("{TOKEN}", found.group(0) if found else "none")
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.body = ""
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def chat_body(message: Any = None, usage: Any = None, **choice: Any) -> str:
    message = {"role": "assistant", "content": "{TOKEN}"} if message is None else message
    usage = {"prompt_tokens": 2000, "completion_tokens": 3} if usage is None else usage
    return json.dumps({"choices": [{"index": 0, "message": message, **choice}],
                       "usage": usage})


def logprobs(entry: Any) -> dict:
    return {"logprobs": {"content": [entry]}}


GOOD_ENTRY = {"token": "x", "logprob": -0.5, "top_logprobs": [{"token": "x", "logprob": -0.5}]}
CHAT_CASES = [
    ("message-is-text", chat_body(message="{TOKEN}"),
     "choices[0].message: expected an object, found a string"),
    ("content-is-number", chat_body(message={"content": 5}),
     "choices[0].message.content: expected a string or null, found an integer"),
    ("reasoning-is-list", chat_body(message={"content": "{TOKEN}", "reasoning_content": []}),
     "choices[0].message.reasoning_content: expected a string or null"),
    ("usage-is-list", chat_body(usage=[1]), "usage: expected an object or null, found a list"),
    ("count-is-true", chat_body(usage={"prompt_tokens": True}),
     "usage.prompt_tokens: expected an integer or null, found true or false"),
    ("count-is-float", chat_body(usage={"prompt_tokens": 2000.5}),
     "usage.prompt_tokens: expected an integer or null, found a number"),
    ("count-negative", chat_body(usage={"prompt_tokens": 2000, "completion_tokens": -3}),
     "usage.completion_tokens: -3 is negative"),
    ("no-choice", json.dumps({"choices": []}), "choices: no choice in the answer"),
    ("choices-is-object", json.dumps({"choices": {"0": {}}}),
     "choices: expected a list, found an object"),
    ("second-choice-bad", json.dumps({"choices": [{"message": {"content": "{TOKEN}"}}, 7]}),
     "choices[1]: expected an object"),
    ("logprob-positive", chat_body(**logprobs({**GOOD_ENTRY, "logprob": 5.0})),
     "choices[0].logprobs.content[0].logprob: logprob 5 is not a log probability"),
    ("logprob-absurd", chat_body(**logprobs({**GOOD_ENTRY, "logprob": -1e300})),
     "logprob -1e+300 is not a log probability"),
    ("logprob-true", chat_body(**logprobs({**GOOD_ENTRY, "logprob": True})),
     "content[0].logprob: expected a number, found true or false"),
    ("top-list-of-text", chat_body(**logprobs({**GOOD_ENTRY, "top_logprobs": ["x"]})),
     "content[0].top_logprobs[0]: expected an object, found a string"),
    ("top-logprob-absurd", chat_body(**logprobs(
        {**GOOD_ENTRY, "top_logprobs": [{"token": "x", "logprob": 3.5}]})),
     "top_logprobs[0].logprob: logprob 3.5 is not a log probability"),
    ("top-token-missing", chat_body(**logprobs(
        {**GOOD_ENTRY, "top_logprobs": [{"logprob": -1.0}]})),
     "top_logprobs[0].token: expected a string, found null"),
    ("deep-nesting", "[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ("nan", chat_body().replace("2000", "NaN"), "NaN is not a JSON number"),
    ("huge-int", chat_body().replace("2000", "9" * 5000), "integer with 5000 digits"),
]


@pytest.mark.parametrize("case", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_a_malformed_chat_answer_is_a_failed_probe_naming_the_field(server, capsys,
                                                                    case) -> None:
    _, body, fragment = case
    server.body = body
    url = f"http://127.0.0.1:{server.server_address[1]}"
    code, out, err = cli(capsys, "probe", "--url", url, "--kind", "recall", "--json")
    assert code == 1, (code, out, err)
    assert "Traceback" not in err
    [result] = json.loads(out)["results"]
    assert result["ok"] is False and result["unreachable"] is False
    assert result["reason"].startswith("not an OpenAI chat completion: /v1/chat/completions: ")
    assert fragment in result["reason"], result["reason"]


def test_a_well_formed_chat_answer_passes(server, capsys) -> None:
    """The control: the same server with a whole answer, logprobs included, passes."""
    server.body = chat_body(**logprobs(GOOD_ENTRY))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    code, out, err = cli(capsys, "probe", "--url", url, "--kind", "recall", "--json")
    assert code == 0, (out, err)
    assert json.loads(out)["results"][0]["prompt_tokens"] == 2000


class _Fixed:
    """An HttpEndpoint (connect/tunnel.py) answering every request with one body."""

    def __init__(self, body: str) -> None:
        self.body = body.encode()

    def request(self, method, path, body=None, headers=None, timeout=0.0) -> HttpResponse:
        return HttpResponse(200, {}, self.body)

    def describe(self) -> str:
        return "fixed"

    def close(self) -> None:
        pass


@pytest.mark.parametrize("case", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_the_library_probes_give_a_failed_result(case) -> None:
    _, body, fragment = case
    spec = probe.FidelitySpec(endpoint=_Fixed(body), kinds=("recall",))
    [result] = probe.fidelity(spec).results
    assert result.ok is False and fragment in result.reason, result.reason


# ---------------------------------------------------------------- /generate (drift)

def _spoil_logprobs(value: Any, key: str = "output_token_logprobs"):
    def spoil(body: dict, answer: dict) -> dict:
        entries = answer["meta_info"].get(key) or []
        if entries:
            entries[-1] = [value, entries[-1][1], None]
        return answer
    return spoil


def _spoil_tops(tops: Any):
    def spoil(body: dict, answer: dict) -> dict:
        answer["meta_info"]["output_top_logprobs"] = tops
        return answer
    return spoil


GENERATE_CASES = [
    ("decode-logprob-positive", _spoil_logprobs(5.0),
     r"output_token_logprobs\[7\]\[0\]: logprob 5 is not a log probability"),
    ("decode-logprob-absurd", _spoil_logprobs(-1e300), "logprob -1e\\+300 is not"),
    ("prefill-logprob-absurd", _spoil_logprobs(-800.0, "input_token_logprobs"),
     "logprob -800 is not a log probability"),
    ("logprob-true", _spoil_logprobs(True), r"\[0\]: expected a number, found true or false"),
    ("logprob-text", _spoil_logprobs("-0.5"), r"\[0\]: expected a number, found a string"),
    ("token-id-true", lambda b, a: {**a, "meta_info": {**a["meta_info"],
                                                       "output_token_logprobs": [
                                                           [-0.5, True, None]] * 8}},
     r"output_token_logprobs\[0\]\[1\]: expected an integer, found true or false"),
    ("entry-too-long", lambda b, a: {**a, "meta_info": {**a["meta_info"],
                                                        "output_token_logprobs": [
                                                            [-0.5, 1, None, 9]] * 8}},
     r"output_token_logprobs\[0\]: not \[logprob, token_id, text\]"),
    ("tops-of-text", _spoil_tops(["x"] * 8),
     r"output_top_logprobs\[0\]: expected a list or null, found a string"),
    ("tops-of-bad-entries", _spoil_tops([[["x", 1, None]]] * 8),
     r"output_top_logprobs\[0\]\[0\]\[0\]: expected a number, found a string"),
    ("tops-absurd-logprob", _spoil_tops([[[9.0, 1, None]]] * 8),
     "logprob 9 is not a log probability"),
    ("text-is-number", lambda b, a: {**a, "text": 5}, "text: expected a string or null"),
    ("negative-id", lambda b, a: {**a, "output_ids": [-1] * len(a["output_ids"])},
     r"output_ids\[0\]: -1 is negative"),
]


@pytest.mark.parametrize("case", GENERATE_CASES, ids=[c[0] for c in GENERATE_CASES])
def test_a_malformed_generate_answer_is_a_drift_error(case) -> None:
    _, spoil, words = case
    with pytest.raises(drift.DriftError, match=words):
        drift.measure(Computing(spoil), SPEC)


def test_the_drift_probe_cli_reports_a_malformed_answer_in_one_line(server, capsys) -> None:
    server.body = json.dumps({"text": "", "output_ids": [1, 2], "meta_info": {
        "input_token_logprobs": [[None, 1, None], [5.0, 2, None]],
        "output_token_logprobs": [[-0.1, 1, None], [-0.2, 2, None]]}})
    url = f"http://127.0.0.1:{server.server_address[1]}"
    code, out, err = cli(capsys, "probe", "--url", url, "--kind", "drift")
    assert code == 4, (code, out, err)
    [line] = [l for l in err.splitlines() if "error" in l]     # progress lines aside
    assert "Traceback" not in err and line.startswith("patchset: error: ")
    assert "drift probe: /generate: meta_info.input_token_logprobs[1][0]: logprob 5 is not" \
        in line, line


@pytest.mark.parametrize("value", ["nan", "+Inf", "-3", "1e400"])
def test_a_request_counter_that_is_no_count_is_unread(value: str) -> None:
    class Metrics:
        def get(self, path: str, timeout: float) -> bytes:
            return f"{drift.REQUESTS_METRIC} {value}\n".encode()
    assert drift.served_requests(Metrics(), 1.0) is None
