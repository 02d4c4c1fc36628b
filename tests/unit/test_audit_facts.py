"""Fact parsers, driven by data: tests/audit_facts/facts/<fact>.<case>.json holds the fact,
its arguments, the command it must run, the raw record the gatherer got, and the parsed
value expected (or `unknown`: a substring of the reason). One driver for all of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.agent.lib.facts import FACTS, get

CASES = sorted((Path(__file__).parents[1] / "audit_facts" / "facts").glob("*.json"))


def _normalise(value):
    return json.loads(json.dumps(value))     # tuples -> lists, as in the data files


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fact_case(path: Path) -> None:
    case = json.loads(path.read_text())
    fact = get(case["fact"])
    assert fact.command(**case["args"]).render() == case["command"]
    value = fact.collect(dict(case["raw"], command=case["command"]))
    if "unknown" in case:
        assert not value.known, value
        assert case["unknown"] in value.reason
    else:
        assert value.known, value.reason
        assert _normalise(value.value) == case["expected"]
    assert value.provenance.command == case["command"]
    assert value.provenance.exit_code == case["raw"].get("exit_code")


def test_every_fact_has_a_case() -> None:
    covered = {json.loads(p.read_text())["fact"] for p in CASES}
    get("gpu.GpuList")        # registers every area
    assert set(FACTS) <= covered, sorted(set(FACTS) - covered)


def test_an_unparsable_output_is_unknown_not_a_crash() -> None:
    value = get("http.ServerInfo").collect({"command": "GET x", "exit_code": 0,
                                            "status": 200, "stdout": "{not json"})
    assert not value.known and "unparsable output of `GET x`" in value.reason
