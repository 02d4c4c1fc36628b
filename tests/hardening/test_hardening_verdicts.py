"""Issue 25, class 10: "could not judge" never passes.

Where a probe, a trace or a bisect had nothing to judge by (a server that answers no text,
an answer cut at the token limit, two empty greedy answers, no token counts, no traced
server), the exit code and the report say so: exit 5 (INCONCLUSIVE, patchset.errors.MEANINGS)
and `unknown` / `could not judge`, never exit 0, `pass` or `ok`. A real failure stays a
failure (exit 1) and a real pass a pass (exit 0): the controls below.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostutil import cli, json_server

from patchset.auditor.render import view
from patchset.isolate.measure import probe as probe_mod
from patchset.isolate.search.bisect import BisectProbe


class Server:
    """An OpenAI-shaped chat server whose answer the test sets: `reply(body) -> dict`."""

    def __init__(self, url: str = "") -> None:
        self.url = url
        self.reply = lambda body: {}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    with json_server(lambda body, headers: srv.reply(json.loads(body))) as url:
        srv.url = url
        yield srv


def planted(body: dict) -> str:
    """The token the probe planted in its first message."""
    first = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return first.split("the token is ")[1].split(".")[0]


def answer(content, finish: str = "stop", reasoning: str | None = None, usage=True):
    def reply(body: dict) -> dict:
        words = sum(len((m.get("content") or "").split()) for m in body["messages"])
        text = content(body) if callable(content) else content
        message = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        out = {"choices": [{"message": message, "finish_reason": finish}]}
        if usage:
            out["usage"] = {"prompt_tokens": words, "completion_tokens": len(
                (text or "").split())}
        return out
    return reply


UNJUDGED = [
    ("no-text", answer("")),
    ("null-content", answer(None)),
    ("whitespace-only", answer("  \n ")),
    ("empty-with-empty-reasoning", answer("", reasoning="   ")),
    ("cut-at-the-token-limit", answer("Let me think about turn one and", finish="length")),
]


def probe(capsys, *argv: str) -> tuple[int, str, str]:
    return cli(capsys, "probe", *argv)


@pytest.mark.parametrize(("case", "reply"), UNJUDGED, ids=[c for c, _ in UNJUDGED])
@pytest.mark.parametrize("kind", ["recall", "needle"])
def test_a_probe_with_nothing_to_judge_exits_5_and_says_so(server: Server, capsys, case,
                                                            reply, kind) -> None:
    server.reply = reply
    code, out, err = probe(capsys, "--url", server.url, "--kind", kind, "--sizes", "1k",
                           "--json")
    assert code == 5, (out, err)
    data = json.loads(out)
    assert data["ok"] is False and data["inconclusive"] is True
    assert all(r["inconclusive"] and not r["ok"] for r in data["results"])
    assert all(r["reason"].startswith("could not judge") for r in data["results"])
    code, out, err = probe(capsys, "--url", server.url, "--kind", kind, "--sizes", "1k")
    assert code == 5
    assert " pass " not in out and "FAIL" not in out and "UNKNOWN" in out, out
    assert "0/1 probes passed, 1 could not judge" in err


def test_a_wrong_answer_still_fails_and_a_right_one_passes(server: Server, capsys) -> None:
    for reply, code_wanted in [(answer("I do not remember any token."), 1),
                               (answer("", reasoning="the token was in turn one"), 1),
                               (answer(planted), 0)]:
        server.reply = reply
        code, out, _ = probe(capsys, "--url", server.url, "--kind", "recall", "--json")
        result = json.loads(out)["results"][0]
        assert code == code_wanted and result["inconclusive"] is False, out
        assert result["ok"] is (code_wanted == 0)


def test_one_failed_and_one_unjudged_is_not_a_pass(server: Server, capsys) -> None:
    calls = []

    def mixed(body: dict) -> dict:
        calls.append(1)
        return answer("" if len(calls) % 2 else "no idea")(body)
    server.reply = mixed
    code, out, _ = probe(capsys, "--url", server.url, "--kind", "needle", "--sizes",
                         "1k,2k", "--json")
    results = json.loads(out)["results"]
    assert [r["inconclusive"] for r in results] == [True, False]
    assert code == 5 and not json.loads(out)["ok"]


def test_the_audit_view_of_an_unjudged_probe_is_unknown() -> None:
    record = {"ok": False, "unreachable": False, "inconclusive": True}
    assert view.probe_status(record) == "unknown"
    assert view.probe_status({"ok": False, "unreachable": False}) == "fail"


# ---------------------------------------------------------------- python3 -m patchset.isolate.measure.probe

@pytest.mark.parametrize(("which", "reply"), [
    ("greedy", answer("")),
    ("needle", answer("")),
    ("throughput", answer("", usage=False)),
])
def test_the_module_probes_exit_5_when_there_is_nothing_to_judge(server: Server, capsys,
                                                                  which, reply) -> None:
    server.reply = reply
    extra = {"greedy": ["--max-tokens", "8"], "needle": ["--tokens", "200"],
             "throughput": ["--parallel", "2"]}[which]
    code = probe_mod.main([which, "--url", server.url, *extra])
    data = json.loads(capsys.readouterr().out)
    assert code == 5 and data["judged"] is False and data["ok"] is False, data


def test_the_module_greedy_probe_passes_two_equal_real_answers(server: Server,
                                                               capsys) -> None:
    server.reply = answer("A hash map chains colliding keys.")
    assert probe_mod.main(["greedy", "--url", server.url, "--max-tokens", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["judged"] is True


# ---------------------------------------------------------------- bisect

def test_a_bisect_probe_that_could_not_judge_is_no_verdict(server: Server) -> None:
    """The bisect reads None (no verdict) where it read False (still fails) before: an
    unjudged starting state stops it with exit 5, an unjudged step leaves it undecided."""
    endpoint = probe_mod.direct(server.url)
    bp = BisectProbe(kinds=("recall",), sizes=(), endpoint=endpoint, timeout=10)
    server.reply = answer("")
    assert bp.run()[0] is None
    server.reply = answer("nothing")
    assert bp.run()[0] is False
    server.reply = answer(planted)
    assert bp.run()[0] is True


# ---------------------------------------------------------------- trace

def test_trace_with_nothing_observed_exits_5(series, seed, tmp_path: Path, monkeypatch,
                                            capsys) -> None:
    from tests.audit_facts import synth  # noqa: F401 (the seed's facts: no server traced)
    from patchset.connect.resolve import Hosts
    from tests.unit.test_audit_probe import Replay
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(Path(series.root))
    (tmp_path / "hosts.yaml").write_text("version: 1\nhosts:\n  gpu1:\n    address: 10.0.0.5\n")
    monkeypatch.setattr(Hosts, "audit_transport",
                        lambda resolver, spec: Replay(seed, series, spec))
    code, out, err = cli(capsys, "trace", "gpu1", "--inventory", str(tmp_path / "hosts.yaml"),
                         "--json")
    assert code == 5, (out, err)
    assert all(v["traced"] is False for v in json.loads(out))
    assert "gpu1: nothing observed (no traced server): trace could not judge it" in err
