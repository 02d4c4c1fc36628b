"""The drift probe against answers that are not /generate's: a server (or something posing
as one) cannot crash it or make it compare garbage, and a damaged run file is bad input
named by its field. The fake server below computes its logprobs from the tokens (a fixed
function of the prefix), so a replay of the same tokens is consistent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.hostutil import cli
from patchset.isolate.measure import drift


class Computing:
    """A /generate that tokenizes words and scores each token by its prefix length."""

    def __init__(self, spoil=None) -> None:
        self.spoil = spoil or (lambda body, answer: answer)

    def describe(self) -> str:
        return "fake"

    def post(self, path: str, body: dict, timeout: float, want_json: bool = True):
        if path == "/flush_cache":
            return b"Cache flushed."
        ids = body.get("input_ids") or [0] + [len(w) for w in body["text"].split()][:300]
        n_new = body["sampling_params"]["max_new_tokens"]
        out = [(ids[-1] + i) % 50 + 1 for i in range(n_new)]
        seq = ids + out
        lp = [[None if i == 0 else -math.log(2 + (i % 7)), t, None] for i, t in enumerate(seq)]
        start = max(0, body.get("logprob_start_len", 0))
        answer = {"text": " ".join("w" for _ in out), "output_ids": out,
                  "meta_info": {"input_token_logprobs": lp[start:len(ids)],
                                "output_token_logprobs": lp[len(ids):]}}
        return self.spoil(body, answer)


SPEC = drift.DriftSpec(sizes=(1024,), output_tokens=8, repeats=3, second_turn=False, budget=0)


def test_a_computing_server_gives_a_consistent_run() -> None:
    run = drift.measure(Computing(), SPEC)
    [seq] = run.sequences
    assert len(seq.prefill_lp) == 3 and seq.prefill_lp[0][1:] == seq.decode_lp[1:]
    report = drift.prefill_vs_decode(run)
    assert report.overall.overall.mean == 0.0 and report.verdict.deterministic
    # one sequence decides nothing, even with no noise at all
    assert report.verdict.outcome == "inconclusive" and report.verdict.above is None
    assert "at least 7 sequences" in report.verdict.needs


def test_a_budget_adds_rounds_until_the_outcome_is_decided() -> None:
    """Rounds of conversations built with the next seeds (deterministic), each judged as
    one look: bit-for-bit replays with no difference are bounded from 7 sequences on."""
    spec = drift.DriftSpec(sizes=(1024,), output_tokens=8, repeats=2, second_turn=False,
                           budget=12)
    assert (spec.rounds, spec.judge.looks) == (12, 12)
    run = drift.measure(Computing(), spec)
    assert len(run.sequences) == 7 and len({s.name for s in run.sequences}) == 7
    assert run.sequences[1].name == "ops-1k#1/turn-1"
    report = drift.prefill_vs_decode(run, spec.judge)
    assert report.verdict.outcome == "bounded" and report.verdict.upper == 0.0


@pytest.mark.parametrize("spoil, words", [
    (lambda b, a: {**a, "output_ids": ["x"] * len(a["output_ids"])},
     r"output_ids\[0\]: expected an integer, found a string"),
    (lambda b, a: {**a, "output_ids": a["output_ids"][:-1]}, "do not match"),
    (lambda b, a: {**a, "meta_info": None}, "no meta_info"),
    (lambda b, a: [a, a], "one JSON object"),
    (lambda b, a: {**a, "meta_info": {**a["meta_info"], "input_token_logprobs": "x"}},
     r"meta_info.input_token_logprobs: expected a list or null"),
    (lambda b, a: {**a, "meta_info": {}}, "no input_token_logprobs list"),
    (lambda b, a: a if "text" in b else {**a, "meta_info": {
        **a["meta_info"], "input_token_logprobs": [[-1.0, 99, None]] * 9}},
     "not the sequence sent"),
])
def test_answers_that_are_not_generates_are_refused(spoil, words) -> None:
    with pytest.raises(drift.DriftError, match=words):
        drift.measure(Computing(spoil), SPEC)


def test_a_nan_logprob_compares_nothing() -> None:
    def nan(body, answer):
        if "input_ids" in body:
            answer["meta_info"]["input_token_logprobs"][-1][0] = float("nan")
        return answer
    report = drift.prefill_vs_decode(drift.measure(Computing(nan), SPEC))
    assert not math.isnan(report.overall.overall.mean) and report.overall.overall.tokens == 7   # 8 less the NaN


@pytest.mark.parametrize("field, value", [
    ("prompt_ids", ["1", 2]), ("output_ids", [-1]), ("decode_lp", ["x"]),
    ("prefill_lp", [[1.0]]), ("name", 3)])
def test_a_damaged_run_file_is_bad_input_naming_the_field(tmp_path: Path, capsys, field,
                                                          value) -> None:
    run = drift.measure(Computing(), SPEC)
    path = tmp_path / "run.json"
    drift.save_run(run, path)
    data = json.loads(path.read_text())
    data["sequences"][0][field] = value
    path.write_text(json.dumps(data))
    code, _, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                       "--against", str(path))
    assert code == 2 and "sequences[0]." in err and str(path) in err
    assert len(err.strip().splitlines()) == 1


def test_the_servers_request_counter_says_whether_the_replays_ran_alone() -> None:
    """/metrics' sglang:num_requests_total before and after the replays: more than the
    probe sent is someone else's traffic (the batch composition was not controlled); no
    counter is said to be unchecked, never taken for an idle server."""
    class Counting(Computing):
        def __init__(self, extra: int = 0) -> None:
            super().__init__()
            self.served, self.extra = 0.0, extra

        def post(self, path, body, timeout, want_json=True):
            self.served += 1
            return super().post(path, body, timeout, want_json)

        def get(self, path, timeout):
            assert path == "/metrics"
            self.served += self.extra
            return (f'# TYPE sglang:num_requests_total counter\n'
                    f'sglang:num_requests_total{{model_name="m"}} {self.served}\n').encode()

    assert drift.measure(Counting(), SPEC).traffic == []
    busy = drift.measure(Counting(extra=5), SPEC)
    assert busy.traffic and busy.traffic[0].startswith("concurrent traffic: the server "
                                                       "finished 5 requests besides")
    plain = drift.measure(Computing(), SPEC)
    assert plain.traffic[0].startswith("concurrent traffic unchecked")
    report = drift.prefill_vs_decode(busy)
    assert report.traffic == tuple(busy.traffic) and report.to_json()["traffic"]
