"""Hostile JSON (issue 25, class 1): every JSON the tool did not just write itself goes
through one bounded loader (patchset/agent/lib/bounded.py). Deep nesting, huge integers,
NaN/Infinity/1e999, duplicate keys, lone surrogates and `true` where a number goes are
refused in one line naming the source and the field, never a traceback (exit 70): in a
saved drift run (exit 2), a bisect report given to `audit --measured` (exit 2), the
target's state file read by the engine (a corrupt-state error), the agent's wire lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostutil import cli
from patchset.isolate.measure import drift
from patchset import transport
from patchset.agent import engine

DEEP = "[" * 100_000 + "]" * 100_000
CASES = [
    ("deep-nesting", DEEP, "nested deeper than 64 levels"),
    ("deep-object", '{"a":' * 100_000 + "1" + "}" * 100_000, "nested deeper than 64 levels"),
    ("huge-int", '{"format": ' + "9" * 5000 + "}", "integer with 5000 digits"),
    ("huge-float", '{"format": 1e999}', "overflows a double"),
    ("negative-huge-float", '{"format": -1e999}', "overflows a double"),
    ("nan", '{"format": NaN}', "NaN is not a JSON number"),
    ("infinity", '{"format": Infinity}', "Infinity is not a JSON number"),
    ("duplicate-key", '{"format": 1, "format": 1}', "duplicate key 'format'"),
    ("lone-surrogate", '{"format": 1, "endpoint": "\\udc80"}', "unpaired surrogate"),
    ("not-utf8", b'{"format": "\xff"}', "not UTF-8"),
]


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _saved_run(tmp_path: Path) -> dict:
    from tests.unit.test_drift_answers import SPEC, Computing
    run = drift.measure(Computing(), SPEC)
    return run.to_json()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_saved_run_is_bad_input(tmp_path: Path, capsys, case) -> None:
    _, text, fragment = case
    path = _write(tmp_path / "run.json", text)
    code, out, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                         "--against", str(path))
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert str(path) in line and fragment in line, line


@pytest.mark.parametrize("field, value, fragment", [
    ("started", True, "started: expected a number, found true or false"),
    ("started", "1", "started: expected a number, found a string"),
    ("endpoint", 7, "endpoint: expected a string, found an integer"),
    ("spec", [], "spec: expected an object, found a list"),
    ("sequences", {}, "sequences: expected a list, found an object"),
])
def test_a_saved_run_field_of_the_wrong_type_is_named(tmp_path: Path, capsys, field, value,
                                                      fragment) -> None:
    data = _saved_run(tmp_path)
    data[field] = value
    path = _write(tmp_path / "run.json", json.dumps(data))
    code, _, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                       "--against", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert fragment in err and str(path) in err, err


@pytest.mark.parametrize("seq_field, value", [
    ("decode_lp", [True] * 8),          # true is no logprob
    ("decode_lp", [1e300] * 8),         # finite, but expm1 of it overflows the statistics
    ("decode_top", ["x"] * 8),          # a top token is an id
    ("prompt_ids", [True, 2]),          # true is no token id
])
def test_a_saved_run_value_out_of_range_is_named(tmp_path: Path, capsys, seq_field,
                                                 value) -> None:
    data = _saved_run(tmp_path)
    data["sequences"][0][seq_field] = value
    path = _write(tmp_path / "run.json", json.dumps(data))
    code, _, err = cli(capsys, "probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                       "--against", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "sequences[0]." in err, err


@pytest.mark.parametrize("case", CASES[:8], ids=[c[0] for c in CASES[:8]])
def test_a_hostile_bisect_report_is_bad_input(tmp_path: Path, case) -> None:
    from patchset.auditor.measured import MeasuredError, load
    from patchset.series.manifest import load_series
    _, text, fragment = case
    path = _write(tmp_path / "report.json", text)
    series = load_series(Path(__file__).resolve().parents[2] / "patches.yaml")
    with pytest.raises(MeasuredError) as caught:
        load(path, ["localhost"], series)
    assert caught.value.exit_code == 2
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_state_file_is_a_corrupt_state_not_a_crash(tmp_path: Path, case) -> None:
    """The engine reads the target's state, journal, lock and bisect records (on hosts
    too): whoever could write there must not crash or hang it."""
    _, text, fragment = case
    path = _write(tmp_path / "state.json", text)
    with pytest.raises(engine.EngineError) as caught:
        engine.read_json(path)
    assert str(path) in str(caught.value) and fragment in str(caught.value)
    assert engine.read_json(tmp_path / "absent.json") is None


def test_a_state_file_the_engine_wrote_reads_back(tmp_path: Path) -> None:
    value = {"version": 3, "applied": [{"name": "a", "n": 1, "x": 0.5, "ok": True}]}
    engine.write_json(tmp_path / "state.json", value, tmp_path)
    assert engine.read_json(tmp_path / "state.json") == value


@pytest.mark.parametrize("line", [DEEP, '{"event": "x", "n": ' + "9" * 5000 + "}",
                                  '{"result": {"ok": NaN}}', '{"result": {"ok": true, "n": 1e999}}'])
def test_hostile_agent_output_lines_are_not_results(line: str) -> None:
    """A line from the host that is not bounded JSON is output, not an event or result
    (the outcome then says the agent gave no result), never a traceback."""
    seen: list = []
    collector = transport.LineSink(seen.append)
    collector.line(line)
    assert collector.result is None and seen == [] and collector.other == [line]


def test_a_bisect_pending_record_that_is_not_json_is_empty() -> None:
    from patchset.errors import BisectPending
    result = transport.decode("h1", "apply", {"ok": False, "error": {
        "kind": "bisect_pending", "message": "held", "details": DEEP}})
    with pytest.raises(BisectPending) as caught:
        transport.raise_for("h1", result)
    assert caught.value.record == {}


@pytest.mark.parametrize("record, fragment", [
    ({"id": "b1", "pid": "abc"}, "pid: expected an integer or null, found a string"),
    ({"id": "b1", "pid": True}, "pid: expected an integer or null, found true or false"),
    ({"id": 7}, "id: expected a string, found an integer"),
    ({"id": "b1", "starting": "abc"}, "starting: expected a list or null, found a string"),
    ({"id": "b1", "starting": [1]}, "starting[0]: expected a string, found an integer"),
    ([], "(document): expected an object, found a list"),
])
def test_a_damaged_bisect_record_on_the_host_is_a_target_error(record, fragment) -> None:
    """A host's bisect record (read by the engine, shown by status, used to restore) is
    checked whole before the restore uses it: a one-line target error, not a crash."""
    import socket
    from types import SimpleNamespace

    from patchset.isolate.search import bisect
    from patchset.errors import TargetError
    if isinstance(record, dict):
        record = {"controller": socket.gethostname(), **record}
    host = SimpleNamespace(host=SimpleNamespace(name="h1"))
    with pytest.raises(TargetError) as caught:
        bisect.restore_abandoned(host, record, lambda _: None)
    assert str(caught.value).startswith("h1: the bisect record: ") and fragment in \
        str(caught.value), caught.value


def test_a_trace_record_whose_pid_is_true_is_no_process() -> None:
    """A tracer record read from a host names a process by its pid: `true` is no pid
    (it passed `isinstance(pid, int)`, and became process 1)."""
    from patchset.agent.lib.facts.trace import TraceRecords
    files = {"1.json": {"pid": True, "hits": {}}, "2.json": {"pid": 2, "hits": {}}}
    raw = {"command": "trace", "exit_code": 0, "stdout": json.dumps(files)}
    first, second = TraceRecords().process(raw)
    assert first["pid"] is None and first["unavailable"] == ["1.json: not a trace record"]
    assert second["pid"] == 2
