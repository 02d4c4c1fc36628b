"""The typed wire (patchset/agent/lib/wire.py): every op has a request and a result, both
round-trip through JSON, and anything else is refused with one line naming the field."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from patchset import transport
from patchset.agent import main as agent_main
from patchset.agent.lib import wire
from patchset.agent.lib.protocol import PROTOCOL, Events
from patchset.errors import TargetError

AGENT = Path(wire.__file__).parent.parent        # patchset/agent: the host program


def test_every_op_is_one_entry_of_the_one_table() -> None:
    """An op is one `wire.Op`: its two records, the part of the host program that serves
    it and the function there. The agent dispatches by the table alone (no list of ops in
    main.py, protocol.py or a part), and each named function exists and says which records
    it takes and returns."""
    import importlib
    assert set(wire.OPS) == set(wire.REQUESTS) == set(wire.RESULTS)
    for name, op in wire.OPS.items():
        assert op.name == name and op.request.op == name
        assert issubclass(op.request, wire.Request) and issubclass(op.result, wire.Result)
        part = importlib.import_module(f"patchset.agent.{op.part}")
        function = getattr(part, op.function)
        returns = function.__annotations__["return"]
        assert op.result.__name__ in returns, (name, returns)
        assert callable(part.serve)
    assert agent_main.ISOLATED_OPS == ("deploy",)
    for module in ("main.py", "lib/protocol.py", "engine.py", "deployer.py", "gather.py",
                   "adoption.py"):
        source = (AGENT / module).read_text()
        assert "_OPS" not in source.replace("ISOLATED_OPS", ""), module


def test_a_part_refuses_an_op_it_does_not_serve() -> None:
    """A request sent to the wrong part is a usage failure naming it, not a wrong op run."""
    from patchset.agent import deployer, engine, gather
    status = wire.StatusRequest(target="/nowhere")
    for part in (deployer, gather):
        failure = part.serve(status)
        assert isinstance(failure, wire.Failure) and failure.kind == "usage"
        assert "does not serve the op 'status'" in failure.message
    failure = engine.serve(wire.FactsRequest(target="/nowhere"))
    assert isinstance(failure, wire.Failure) and failure.kind == "usage"


def test_no_agent_op_function_returns_a_bare_dict() -> None:
    """The op functions and the parts' frames take and return the wire's dataclasses."""
    entry: dict[str, set[str]] = {"main.py": {"serve"}}
    for op in wire.OPS.values():
        entry.setdefault(f"{op.part}.py", {"serve"}).add(op.function)
    entry["engine.py"].add("transition")
    entry["deployer.py"].add("_deploy_locked")
    for module, names in entry.items():
        tree = ast.parse((AGENT / module).read_text())
        found = {f.name: ast.unparse(f.returns) for f in ast.walk(tree)
                 if isinstance(f, ast.FunctionDef) and f.name in names}
        assert set(found) == names, module
        assert all(any(word in r for word in ("wire.", "Result", "Record")) and r != "dict"
                   for r in found.values()), (module, found)


def test_the_status_record_crosses_the_wire_typed_to_its_leaves() -> None:
    """status's result is the record the controller renders (no re-encoding on the way):
    its units, drift, applied patches, interpreter and interrupted work are records the
    wire checks field by field, and they come back as records, not dicts."""
    from patchset.agent.lib.records import (Drift, Interpreter, Interrupted, StatusPatch,
                                            StatusRecord, UnitStatus)
    record = StatusRecord(
        target="/t", kind="git", layout="wheel", managed=True,
        applied=[StatusPatch(name="a", sha256="ab" * 32, gate={"env": "X", "on": "1"})],
        drift=[Drift(path="python/x.py", expected="e" * 40, found=None)],
        interrupted=Interrupted(op="apply", id="t1", files=2, git_locks=None, next="n"),
        interpreter=Interpreter(python="/usr/bin/python3", managed=True),
        units=[UnitStatus(unit="u", role="decode", path="/etc/u", main_pid=7)])
    back = wire.decode_result("status", json.loads(json.dumps(wire.encode_result(record))))
    assert back == record and isinstance(back.units[0], UnitStatus)
    assert isinstance(back.drift[0], Drift) and back.drift[0].found is None
    bad = wire.encode_result(record)
    bad["units"][0]["main_pid"] = "7"
    with pytest.raises(wire.WireError, match=r"^the status result\.units\[0\]\.main_pid: "
                                             r"expected int, got str$"):
        wire.decode_result("status", bad)
    bad = wire.encode_result(record)
    del bad["drift"][0]["found"]
    with pytest.raises(wire.WireError, match=r"^the status result\.drift\[0\]: missing field "
                                             r"'found'$"):
        wire.decode_result("status", bad)


def sample(op: str) -> tuple[wire.Request, wire.Result]:
    request = wire.REQUESTS[op](target="/opt/sglang", tree="/opt/sglang", python="/usr/bin/python3")
    return request, wire.RESULTS[op]()


@pytest.mark.parametrize("op", sorted(wire.OPS))
def test_round_trip_through_json(op: str) -> None:
    request, result = sample(op)
    sent = json.loads(json.dumps(wire.encode_request(request)))
    assert sent["op"] == op and sent["protocol"] == PROTOCOL
    assert wire.decode_request(sent) == request
    back = wire.decode_result(op, json.loads(json.dumps(wire.encode_result(result))))
    assert back == result and type(back) is wire.RESULTS[op]
    failure = wire.Failure("locked", "held by pid 7", "details")
    assert wire.decode_result(op, wire.encode_result(failure)) == failure


def test_a_filled_request_round_trips_with_its_nested_values() -> None:
    from patchset.agent.lib.records import (BaseSource, FileChange, GitSource, PatchSpec,
                                            Recovered, TraceSpec)
    spec = PatchSpec(name="a", sha256="ab" * 32, file="patches/a.patch",
                     files=[FileChange(path="x", pre=None, post="c" * 40)],
                     trace=[TraceSpec(module="m", qualname="f")], gate={"env": "E", "on": "1"})
    request = wire.ApplyRequest(target="/t", lock_wait=2.5, dry_run=True, bisect="b1",
                                patches=[spec],
                                base_files={"python/x.py": None, "python/y.py": "ab" * 20},
                                upstream={"name": "sglang"}, provision=True,
                                base=BaseSource(git=GitSource(url="u", ref="r")))
    back = wire.decode_request(json.loads(json.dumps(wire.encode_request(request))))
    assert back == request and isinstance(back.patches[0].files[0], FileChange)
    sent = wire.encode_request(request)
    sent["patches"][0]["files"][0]["pre"] = 0
    with pytest.raises(wire.WireError, match=r"^the apply request\.patches\[0\]\.files\[0\]\.pre: "
                                             r"expected str, got int$"):
        wire.decode_request(sent)
    result = wire.RevertResult(changed=True, before=["a", "b"], after=["a"], reverted=["b"],
                               recovered=Recovered(removed=["b"]), head="c" * 40)
    assert wire.decode_result("revert", wire.encode_result(result)) == result


@pytest.mark.parametrize("field, value, message", [
    ("lock_wait", "5", "the apply request.lock_wait: expected float, got str"),
    ("dry_run", 1, "the apply request.dry_run: expected bool, got int"),
    ("target", None, "the apply request.target: expected str, got null"),
    ("patches", {}, "the apply request.patches: expected a list, got dict"),
    ("patches", [["x"]], "the apply request.patches[0]: expected a JSON object, got list"),
    ("base_files", {"x": 3}, "the apply request.base_files['x']: expected str, got int"),
    ("lock_wait", True, "the apply request.lock_wait: expected float, got bool"),
])
def test_a_wrong_type_is_refused_naming_the_field(field: str, value: object,
                                                   message: str) -> None:
    sent = dict(wire.encode_request(wire.ApplyRequest()), **{field: value})
    with pytest.raises(wire.WireError) as caught:
        wire.decode_request(sent)
    assert str(caught.value) == message and "\n" not in message


def test_an_int_is_a_float_on_the_wire() -> None:
    sent = dict(wire.encode_request(wire.CaptureRequest()), lock_wait=30)
    decoded = wire.decode_request(sent)
    assert decoded.lock_wait == 30.0 and type(decoded.lock_wait) is float


def test_a_missing_or_unknown_field_is_refused() -> None:
    sent = wire.encode_request(wire.RevertRequest(names=["a"]))
    missing = {k: v for k, v in sent.items() if k != "names"}
    with pytest.raises(wire.WireError, match=r"^the revert request: missing field 'names'$"):
        wire.decode_request(missing)
    with pytest.raises(wire.WireError, match=r"^the revert request: unknown field 'nmaes'$"):
        wire.decode_request(dict(sent, nmaes=["a"]))
    result = wire.encode_result(wire.StatusRecord())
    with pytest.raises(wire.WireError, match=r"^the status result: missing field 'units'$"):
        wire.decode_result("status", {k: v for k, v in result.items() if k != "units"})
    with pytest.raises(wire.WireError, match=r"^the status result: unknown field 'extra'$"):
        wire.decode_result("status", dict(result, extra=1))
    with pytest.raises(wire.WireError, match=r"'ok'"):
        wire.decode_result("status", {"units": []})
    with pytest.raises(wire.WireError, match=r"^the status result\.error: missing field"):
        wire.decode_result("status", {"ok": False, "error": {"kind": "x"}})


def test_another_protocol_version_is_refused_by_the_agent() -> None:
    for version in (PROTOCOL - 1, PROTOCOL + 1, None, "2"):
        sent = dict(wire.encode_request(wire.StatusRequest(target="/nonexistent")),
                    protocol=version)
        if version is None:
            del sent["protocol"]
        out = agent_main.serve_json(sent, Path("."), Events(sink=lambda e: None))
        assert out["ok"] is False and out["error"]["kind"] == "protocol"
        assert f"the agent speaks protocol {PROTOCOL}" in out["error"]["message"]


def test_a_bad_request_reaches_no_op(monkeypatch) -> None:
    """A request that fails the wire's checks is answered before any op function runs."""
    called = []
    monkeypatch.setattr(agent_main, "serve", lambda *a: called.append(a))
    sent = dict(wire.encode_request(wire.ApplyRequest()), patches="all")
    out = agent_main.serve_json(sent, Path("."), Events(sink=lambda e: None))
    assert out == {"ok": False, "error": {"kind": "protocol", "details": "",
                                          "message": "the apply request.patches: expected a "
                                                     "list, got str"}}
    out = agent_main.serve_json({"op": "rm -rf", "protocol": PROTOCOL}, Path("."),
                                Events(sink=lambda e: None))
    assert out["error"] == {"kind": "usage", "message": "unknown op (not shown)", "details": ""}
    assert called == []


def test_the_controller_refuses_a_result_of_the_wrong_shape() -> None:
    """A result the wire does not accept is a TargetError naming host and field."""
    with pytest.raises(TargetError) as caught:
        transport.decode("gpu1", "apply", {"ok": True, "changed": "yes"})
    assert str(caught.value) == ("gpu1: the agent's answer does not match this patchset's "
                                 "protocol (the apply result: missing field 'recovered')")
    whole = wire.encode_result(wire.ApplyResult())
    with pytest.raises(TargetError, match=r"the apply result\.changed: expected bool, got str"):
        transport.decode("gpu1", "apply", dict(whole, changed="yes"))


def test_stamp_fills_target_tree_and_python_and_keeps_the_type() -> None:
    request = wire.DeployRequest(tree="/srv/tree", state_sha256="s")
    stamped = transport.stamp(request, "/opt/sglang", "/usr/bin/python3")
    assert type(stamped) is wire.DeployRequest and stamped.target == "/opt/sglang"
    assert stamped.tree == "/srv/tree" and stamped.python == "/usr/bin/python3"
    assert transport.stamp(wire.StatusRequest(), "/t").tree == "/t"
    assert transport.workdir_name(stamped, "ab") == "patchset-deploy-ab"


def test_the_shipped_request_is_the_encoded_one(tmp_path: Path) -> None:
    import io
    import tarfile
    request = wire.CaptureRequest(target="/t", lock_wait=1.0)
    with tarfile.open(fileobj=io.BytesIO(transport.bundle(request))) as tar:
        member = tar.extractfile("request.json")
        assert member is not None
        assert json.loads(member.read()) == wire.encode_request(request)
        assert f"{transport.AGENT_NAME}/lib/wire.py" in tar.getnames()


def test_wire_runs_on_the_oldest_host_python() -> None:
    """Hosts may have python3.8: the annotations must resolve there (typing.List, not
    list[...]; Optional, not X | None) and wire.py imports only the stdlib."""
    tree = ast.parse((AGENT / "lib" / "wire.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            text = ast.unparse(node.annotation)
            assert "|" not in text and not text.startswith(("list[", "dict[")), text
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module in ("__future__", "dataclasses", "typing"), node.module
    for cls in {c for op in wire.OPS.values() for c in (op.request, op.result)}:
        assert dataclasses.is_dataclass(cls)
