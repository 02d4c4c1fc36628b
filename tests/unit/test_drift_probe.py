"""`patchset probe --kind drift` against the real stand-in (its toy model computes every
logprob: tests/standin/payload/sglang_standin/toy.py), on this machine: a server whose
numerics rule rounds the carried state to bf16 (decode rounds every token, prefill once
per chunk) drifts above the noise, one without it stays within; A/B by numbers against a
saved run; the chart; bad input and an unreachable server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostutil import cli, free_port
from tests.unit.test_standin import MODEL, launch, tree, venv_python  # noqa: F401 - fixtures

NOISE = "1e-6"          # the stand-in's batch-order nondeterminism: replays differ a little


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("drift") / "rules.json"
    path.write_text(json.dumps([{"op": "state", "precision": "bf16",
                                 "env": "DRIFT_BF16", "equals": "1"}]))
    return path


def serve(launch, rules: Path, bf16: bool) -> str:  # noqa: F811
    port = free_port()
    launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port),
           env={"STANDIN_NUMERICS_RULES": str(rules), "STANDIN_NONDETERMINISM": NOISE,
                **({"DRIFT_BF16": "1"} if bf16 else {})},
           wait=f"http://127.0.0.1:{port}/health")
    return f"http://127.0.0.1:{port}"


def probe(capsys, url: str, *extra: str) -> tuple[int, dict]:
    code, out, err = cli(capsys, "probe", "--url", url, "--kind", "drift", "--sizes", "1k",
                         "--output-tokens", "48", "--format", "json", "--budget", "24",
                         *extra)
    assert out, err
    return code, json.loads(out)


def test_drift_above_noise_with_the_rule_within_without_and_ab(launch, rules, tmp_path,  # noqa: F811
                                                               capsys) -> None:
    plain, rounded = serve(launch, rules, False), serve(launch, rules, True)
    saved = tmp_path / "plain.json"
    code, quiet = probe(capsys, plain, "--save", str(saved))
    rep = quiet["report"]
    verdict = rep["verdict"]
    assert code == 0 and rep["kind"] == "prefill-vs-decode" and verdict["outcome"] == "bounded"
    assert verdict["above"] is False and verdict["upper"] < verdict["tolerance"] == 0.002
    names = [s["name"] for s in rep["sequences"]]      # rounds until decided, 16 at least
    assert names[:3] == ["ops-1k/turn-1", "ops-1k/turn-2", "ops-1k#1/turn-1"]
    assert 16 <= len(names) <= 24 and verdict["sequences"] == len(names)
    assert all(s["output_tokens"] == 48 and s["prompt_tokens"] > 700 for s in rep["sequences"])
    assert verdict["noise"] > 0 and verdict["looks"] == 12 and verdict["detectable"] > 0
    assert rep["overall"]["overall"]["tokens"] >= 16 * 47
    assert saved.stat().st_mode & 0o777 == 0o600 and quiet["saved"] == str(saved)

    code, loud = probe(capsys, rounded)
    drift = loud["report"]["overall"]["overall"]["mean"]
    assert code == 1 and loud["report"]["verdict"]["outcome"] == "above"
    assert drift > 100 * max(rep["overall"]["overall"]["mean"], 1e-15)
    assert "signed-rank p" in loud["report"]["verdict"]["why"]

    # A/B: the plain run's tokens replayed on the rounded server, and on itself
    code, ab = probe(capsys, rounded, "--against", str(saved))
    assert code == 1 and ab["report"]["kind"] == "a-b" and ab["report"]["verdict"]["above"]
    assert ab["report"]["against"] == str(saved)
    code, same = probe(capsys, plain, "--against", str(saved))
    assert code == 0 and same["report"]["verdict"]["above"] is False


def test_the_chart_is_inline_svg_with_its_points(launch, rules, capsys) -> None:  # noqa: F811
    url = serve(launch, rules, True)
    code, out, _ = cli(capsys, "probe", "--url", url, "--kind", "drift", "--sizes", "1k",
                       "--output-tokens", "48", "--format", "html", "--budget", "24")
    assert code == 1
    assert out.startswith("<!doctype html>") and "<script" not in out and "http" not in \
        out.split("<pre>")[0]
    import re
    table = out.split("<pre>")[1].split("</pre>")[0]
    sequences = len(set(re.findall(r"ops-1k(?:#\d+)?/turn-\d", table)))
    assert out.count("<svg") == 1 + sequences and sequences >= 2   # overall + each
    assert out.count('class="point"') >= 30 and 'class="noise"' in out
    assert 'data-position="' in out and "DRIFT above the noise" in out
    code, out, _ = cli(capsys, "probe", "--url", url, "--kind", "drift", "--sizes", "1k",
                       "--output-tokens", "48", "--budget", "24")
    assert code == 1 and "verdict: DRIFT above the noise" in out and "ops-1k/turn-1" in out
    assert "upper bound" in out and "tolerance 0.002" in out
    code, out, _ = cli(capsys, "probe", "--url", url, "--kind", "drift", "--sizes", "1k",
                       "--output-tokens", "48", "--budget", "0")  # 2 sequences: undecidable
    assert code == 5 and "verdict: INCONCLUSIVE" in out and "at least 7 sequences" in out


def test_bad_input_and_an_unreachable_server(tmp_path, capsys) -> None:
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    code, _, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                       "--against", str(bad))
    assert code == 2 and str(bad) in err and f"{bad}:1: (json): not JSON" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                       "--repeats", "1")               # one replay measures no noise
    assert code == 2 and "--repeats" in err
    code, out, _ = cli(capsys, "probe", "--url", f"http://127.0.0.1:{free_port()}", "--kind",
                       "drift", "--format", "json")
    assert code == 3 and json.loads(out)["unreachable"] is True
    code, _, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--save",
                       str(tmp_path / "x.json"))
    assert code == 2 and "--kind drift" in err
