"""`patchset audit --probe`: the context-fidelity probes of `patchset probe`, run by the
audit against each host's endpoint (stand-in servers on this machine; the host's facts
are the seed deployment's, replayed), as report records and findings: counted, shown in
every format, corroborating `--symptom context-loss`, the API key never shown. Through
a real nspawn host's SSH connection: tests/system/test_audit_probe_hosts.py."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.audit_facts import synth
from tests.faketransport import FakeTransport
from tests.hostutil import free_port, json_server

from patchset.auditor import api, report
from patchset.auditor.rank import Access
from patchset.auditor.render import FORMATS, render
from patchset.connect.inventory import Host, Inventory
from patchset.connect.resolve import Hosts
from patchset.connect.tunnel import DirectEndpoint, endpoint_for, role_target
from patchset.isolate.measure import probe
from patchset.isolate.measure.probe import AuditProbes
from patchset.cli import main
from tests.unit import test_probe
from tests.unit.test_probe import SECRET

# test_probe's stand-ins (clean, drop_history, truncate:2000, behind the key SECRET), one
# set for this module: the same fixture function, registered here under its own name
stand_ins = pytest.fixture(scope="module", name="stand_ins")(test_probe.servers.__wrapped__)

HOST = "lab"
OPAQUE_KEY = "opaque-zebra-42-key"       # shaped like no known credential: only the key's
                                         # own redaction can hide it
COMPARE = "run before and after each step above and compare"


class Replay(FakeTransport):
    """A host whose agent answers the audit's gathering with a fixture's facts; counts
    gatherings, so bad input can be shown to stop before any."""

    def __init__(self, desc: dict, series, host: str = HOST) -> None:
        super().__init__(host)
        self.desc, self.series, self.gathered = desc, series, 0

    def answer(self, request: dict, on_event=None) -> dict:
        assert request["op"] == "audit"
        self.gathered += 1
        return synth.gather_result(self.desc, self.series)


def clean_seed() -> dict:
    """The seed with the hazard cleared (flashinfer_trtllm) and mhc-bf16 not applied:
    every check passes (33), so a probe alone decides the exit code."""
    desc = copy.deepcopy(synth.load("seed.yaml"))
    for server in desc["servers"]:
        server["argv"][server["argv"].index("triton")] = "flashinfer_trtllm"
        server["server_info"] = dict(server["server_info"],
                                     moe_runner_backend="flashinfer_trtllm")
    desc["tree"]["applied"].remove("mhc-bf16")
    return desc


def unpatched() -> dict:
    """The clean seed with no patch applied and no gate set: nothing for context-loss to
    suspect (patches, checks), so a probe is all the symptom section can say."""
    desc = clean_seed()
    desc["tree"]["applied"] = []
    envs = [s["env"] for s in desc["servers"]] + [
        f["values"] for u in desc["units"].values() for f in u["env_files"].values()]
    for env in envs:
        for gate in ("TRITON_INDEXER", "MMA_FLASHMLA"):
            env.pop(gate, None)
    return desc


def plan(url: str | None, kind: str = "recall", sizes: str | None = None,
         key_env: str | None = None, asked: list | None = None) -> AuditProbes:
    """The audit's plan with `url` as HOST's inventory role (None: the inventory gives
    none, and the facts' address is dialled from here: these stand-ins run on this
    machine). `asked` collects what the plan asked for: (host, at)."""
    spec = probe.FidelitySpec(kinds=probe.parse_kinds(kind), sizes=probe.parse_sizes(sizes),
                              api_key_env=key_env, timeout=30)

    def connect(host: str, at: tuple[str, int] | None = None) -> DirectEndpoint:
        if asked is not None:
            asked.append((host, at))
        return DirectEndpoint(url if at is None else f"http://{at[0]}:{at[1]}")
    return AuditProbes(spec, connect, by_role=frozenset({HOST} if url else ()))


def audited(series, desc: dict, probes: AuditProbes, symptom: str | None = None) -> dict:
    rep = api.audit(series, [Replay(desc, series)], symptom, Access(), probes=probes)
    data = report.to_dict(rep)
    assert report.validate(data) == []
    return data


def recall_counts() -> tuple[int, int]:
    """(words the recall probe sends, words a drop_history server sees: system + last)."""
    messages = probe.recall_messages("RECALL-X", probe.RECALL_FILLER_TURNS)
    sent = sum(len((m["content"] or "").split()) for m in messages)
    return sent, len(messages[0]["content"].split()) + len(messages[-1]["content"].split())


def probe_findings(data: dict) -> list[tuple[str, str, str]]:
    return [(f["id"], f["subject"], f["status"]) for f in data["findings"]
            if f["id"].startswith("probe[")]


@pytest.fixture()
def cli_env(series, tmp_path: Path, monkeypatch) -> dict:
    """cwd = the series; an inventory whose `lab` names no port (tests add one); the
    audit's transport replays facts (`desc`, swapped per test) instead of ssh."""
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(Path(series.root))
    env = {"desc": clean_seed(), "hosts": [], "inventory": tmp_path / "hosts.yaml",
           "endpoints": []}

    def transport(resolver, spec: str) -> Replay:
        host = Replay(env["desc"], series, spec)
        env["hosts"].append(host)
        return host

    def endpoint(resolver, spec: str, roles=None, at=None) -> DirectEndpoint:
        """The role's port on this machine, where the stand-ins run (no sshd to tunnel
        through here: test_probes_reach_a_loopback_server_through_ssh has one)."""
        env["endpoints"].append((spec, at))
        port = at[1] if at else role_target(resolver.inventory.resolve(spec)).port
        return DirectEndpoint(f"http://127.0.0.1:{port}")
    monkeypatch.setattr(Hosts, "audit_transport", transport)
    monkeypatch.setattr(Hosts, "endpoint", endpoint)
    return env


def inventory(env: dict, url: str) -> str:
    port = url.rsplit(":", 1)[1]
    env["inventory"].write_text(f"version: 1\nhosts:\n  {HOST}:\n    address: 127.0.0.1\n"
                                f"    roles:\n      decode: {{port: {port}}}\n")
    return str(env["inventory"])


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def echo_key() -> Iterator[str]:
    """An OpenAI-shaped server that answers with the bearer key it was sent (a proxy that
    leaks credentials), so the report has a key to redact."""
    def echo(body: bytes, headers: dict) -> dict:
        key = (headers.get("Authorization") or "").split()[-1]
        return {"choices": [{"message": {"content": f"your key: {key}"}}],
                "usage": {"prompt_tokens": 10**6}}
    with json_server(echo) as url:
        yield url


# ---------------------------------------------------------------- the library

def test_clean_server_probes_pass_as_records_and_findings(series, stand_ins, capsys) -> None:
    url = stand_ins["clean"]
    data = audited(series, clean_seed(), plan(url, "all", "1k,2k"))
    assert data["schema_version"] == "1.7"
    records = data["hosts"][0]["probes"]
    assert [(r["name"], r["probe"], r["size_tokens"], r["ok"], r["url"]) for r in records] == [
        ("recall", "recall", None, True, url), ("needle@1k", "needle", 1024, True, url),
        ("needle@2k", "needle", 2048, True, url)]
    for r in records:
        assert r["answer"] == r["expected"] and r["prompt_tokens"] == r["words_sent"]
        assert r["reason"] == "the planted token came back" and r["latency_ms"] > 0
    assert records[0]["words_sent"] == recall_counts()[0] and records[0]["tools"]
    assert probe_findings(data) == [("probe[recall]", f"recall {url}", "pass"),
                                    ("probe[needle]", f"needle@1k {url}", "pass"),
                                    ("probe[needle]", f"needle@2k {url}", "pass")]
    evidence = next(f for f in data["findings"] if f["id"] == "probe[recall]")["evidence"]
    assert evidence[0]["value"] == records[0]            # one record, two views
    assert evidence[0]["command"] == f"POST {url}/v1/chat/completions"     # a direct one
    # resolved-args: 10 passes, 2 notes (attention_backend unset -> dsv4, not counted)
    assert data["summary"]["checks"] == {"pass": 46, "fail": 0, "warn": 2, "unknown": 0}
    assert data["summary"]["exit_code"] == 0
    assert main(["probe", "--url", url, "--kind", "recall", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)["results"][0]
    assert set(alone) == set(records[0])                 # the `patchset probe --json` record


def test_dropped_history_is_a_failed_finding_that_sets_exit_1(series, stand_ins) -> None:
    url = stand_ins["drop"]
    data = audited(series, clean_seed(), plan(url, "all", "1k"))
    sent, seen = recall_counts()
    recall = data["hosts"][0]["probes"][0]
    assert (recall["ok"], recall["answer"], recall["words_sent"], recall["prompt_tokens"]) == \
        (False, "I don't know.", sent, seen)
    assert recall["reason"] == (f"the server saw {seen} prompt tokens of {sent} words sent: "
                                "context was dropped or truncated")
    assert probe_findings(data) == [("probe[recall]", f"recall {url}", "fail"),
                                    ("probe[needle]", f"needle@1k {url}", "fail")]
    failed = data["findings"][0]                         # worst first
    assert (failed["id"], failed["expected"], failed["found"], failed["severity"]) == \
        ("probe[recall]", recall["expected"], "I don't know.", "high")
    assert data["summary"]["checks"] == {"pass": 43, "fail": 2, "warn": 2, "unknown": 0}
    assert data["summary"]["exit_code"] == 1


def test_unreachable_or_missing_endpoint_is_unknown_not_a_verdict(series) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    data = audited(series, clean_seed(), plan(down))
    assert probe_findings(data) == [("probe[recall]", f"recall {down}", "unknown")]
    assert data["hosts"][0]["probes"][0]["reason"].startswith(f"cannot reach {down}: ")
    assert data["summary"]["exit_code"] == 1
    bare = clean_seed()
    bare["servers"] = []
    data = audited(series, bare, plan(None, "needle", "1k"))
    record = data["hosts"][0]["probes"][0]
    assert (record["name"], record["url"], record["unreachable"]) == ("needle@1k", "", True)
    assert record["reason"] == (f"no endpoint to probe: the inventory gives {HOST} no router "
                                "or decode port and no SGLang server runs there")
    assert probe_findings(data) == [("probe[needle]", "needle@1k", "unknown")]


def test_without_an_inventory_port_the_facts_choose_the_endpoint(series, stand_ins) -> None:
    """The prefill's base_url (P/D, no router): the URL the symptom's probe step names;
    the plan is asked for it as the host sees it (its loopback), not as a URL from here."""
    desc = clean_seed()
    port = int(stand_ins["clean"].rsplit(":", 1)[1])
    desc["servers"][0]["port"] = port
    asked: list = []
    data = audited(series, desc, plan(None, asked=asked), "context-loss")
    assert asked == [(HOST, ("127.0.0.1", port))]
    assert data["hosts"][0]["probes"][0]["url"] == stand_ins["clean"]
    assert data["hosts"][0]["probes"][0]["ok"]
    step = data["symptom"]["next_steps"][-1]
    assert step["command"] == f"patchset probe --url {stand_ins['clean']} --sizes 8k,16k,32k"


def test_a_listening_address_no_endpoint_takes_is_a_probe_not_run(series) -> None:
    """The facts are the host's word: a server address no endpoint sends to (the tunnel's
    check, before any connection) makes each probe a record that says why."""
    class Odd(Replay):
        def answer(self, request: dict, on_event=None) -> dict:
            result = super().answer(request, on_event)
            for server in result["raw"]["servers"]:
                server["base_url"] = "http://evil!host:30000"
            return result

    def connect(spec: str, at: tuple[str, int] | None = None):
        return endpoint_for(Host(name=spec, address="10.0.0.9"), at=at)
    spec = probe.FidelitySpec(kinds=("recall",), timeout=5)
    rep = api.audit(series, [Odd(clean_seed(), series)], None, Access(),
                    probes=AuditProbes(spec, connect))
    [record] = report.to_dict(rep)["hosts"][0]["probes"]
    assert (record["unreachable"], record["url"], record["reason"]) == (
        True, "", f"no endpoint to probe: {HOST}: 'evil!host' port 30000 is not an address "
                  "and port to send HTTP to")


def test_drift_plan_measures_through_the_endpoint_it_opens(series, stand_ins) -> None:
    """`audit --probe drift` (DriftAuditProbes): the inventory role asked of `connect`, the
    drift probe's /generate requests sent through that endpoint, one record per host."""
    url = stand_ins["clean"]
    roles = {"decode": {"port": int(url.rsplit(":", 1)[1])}}
    inventory = Inventory(None, {HOST: Host(name=HOST, address="10.0.0.9", roles=roles)}, None)
    asked: list = []

    def connect(spec: str, at: tuple[str, int] | None = None) -> DirectEndpoint:
        asked.append((spec, at))
        return DirectEndpoint(url)
    drift = probe.audit_probes("drift", "1k", None, 30, inventory, [HOST], connect)
    data = audited(series, clean_seed(), drift)
    [record] = data["hosts"][0]["probes"]
    assert asked == [(HOST, None)]
    assert (record["probe"], record["url"], record["unreachable"]) == ("drift", url, False)
    assert record["error"] is None and record["drift"]["verdict"]
    evidence = next(f for f in data["findings"] if f["id"] == "probe[drift]")["evidence"]
    assert evidence[0]["command"] == f"POST {url}/generate"


def test_context_loss_ranking_says_the_probe_reproduced_it(series, stand_ins) -> None:
    url = stand_ins["drop"]
    sent, seen = recall_counts()
    data = audited(series, synth.load("seed.yaml"), plan(url), "context-loss")
    step = data["symptom"]["next_steps"][-1]
    assert step["kind"] == "probe" and step["why"] == (
        f"reproduced by this audit's probes: recall {url} on {HOST}: the server saw {seen} "
        f"prompt tokens of {sent} words sent: context was dropped or truncated; {COMPARE}")
    # the step repeats the probes where they ran (the facts alone would name :30000)
    assert step["command"] == f"patchset probe --url {url} --sizes 8k,16k,32k"
    assert data["symptom"]["suspects"][0]["name"] == "mhc-bf16"    # corroboration only
    assert "probe" not in {s["name"].split()[0] for s in data["symptom"]["suspects"]}
    assert f"    {step['why']}" in render(data, "terminal", width=400)
    assert f"(cost 3, probe): {step['why']}" in render(data, "md")
    clean = audited(series, synth.load("seed.yaml"), plan(stand_ins["clean"]), "context-loss")
    assert clean["symptom"]["next_steps"][-1]["why"] == \
        f"not reproduced: this audit's 1 probe(s) passed; {COMPARE}"
    alone = audited(series, unpatched(), plan(url), "context-loss")
    assert alone["symptom"]["suspects"] == []
    assert [s["kind"] for s in alone["symptom"]["next_steps"]] == ["probe"]


def test_failed_probe_shown_in_every_human_format(series, stand_ins) -> None:
    url = stand_ins["drop"]
    data = audited(series, clean_seed(), plan(url))
    sent, seen = recall_counts()
    reason = f"the server saw {seen} prompt tokens of {sent} words sent: context was " \
             "dropped or truncated"
    token = data["hosts"][0]["probes"][0]["expected"]
    md = render(data, "md")
    assert f"Sent to {url}." in md
    assert f"| **FAIL** | recall | - | {sent} | {seen} | " in md
    assert f"#### FAIL probe\\[recall\\]: recall {url}" in md     # [ ] escaped
    assert f"- fidelity probe: FAIL recall at {url}: sent {sent} words, server saw {seen} " \
           "tokens, " in md
    root = ET.fromstring(render(data, "junit"))
    case = root.find("testsuite/testcase[@classname='probe[recall]']")
    assert case is not None and case.get("name") == f"recall {url}"
    assert case.find("failure").get("message") == \
        f"expected {token}, found I don't know.: {reason}"
    assert float(case.get("time")) >= 0 and "FAIL recall" in case.find("system-out").text
    assert root.get("failures") == "1" and root.get("tests") == "46"
    html = render(data, "html")
    assert html.count('<tr class="probe fail">') == 1
    assert '<tr class="finding fail"><td><span class="badge fail">fail</span></td>\n    ' \
           '<td>high</td><td><code>probe[recall]</code></td>' in html
    terminal = render(data, "terminal", width=300)
    row = next(line for line in terminal.splitlines() if "FAIL" in line)
    assert "recall" in row and f"{sent} words sent, {seen} seen" in row \
        and "I don't know." in row


# ---------------------------------------------------------------- the CLI

def test_cli_probe_exit_codes_follow_the_probe(cli_env: dict, stand_ins, capsys) -> None:
    inv = inventory(cli_env, stand_ins["clean"])
    code, out, err = cli(capsys, "audit", HOST, "--inventory", inv, "--probe", "needle",
                         "--probe-sizes", "1k", "--format", "json")
    data = json.loads(out)
    assert code == 0, err
    assert [(r["name"], r["ok"], r["url"]) for r in data["hosts"][0]["probes"]] == [
        ("needle@1k", True, stand_ins["clean"])]
    assert cli_env["endpoints"] == [(HOST, None)]        # the resolver's, for HOST's role
    inv = inventory(cli_env, stand_ins["drop"])
    code, out, err = cli(capsys, "audit", HOST, "--inventory", inv, "--probe", "recall",
                         "--format", "md", "-o", str(cli_env["inventory"].parent / "r.md"))
    assert code == 1 and out == ""
    assert err.startswith("1 host(s): 1 failed, 2 warnings, 0 unknown, 43 passed; 2 info "
                          "note(s), not counted; report ")
    assert "#### FAIL probe\\[recall\\]: recall " in (
        cli_env["inventory"].parent / "r.md").read_text()


def test_cli_on_localhost_gathers_for_real_and_probes_the_inventory_port(
        series, stand_ins, tmp_path: Path, monkeypatch, capsys) -> None:
    """No replayed facts: the real local gatherer (no managed tree here: `unknown`, exit
    1), and the probe at the port the inventory gives `localhost`."""
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(Path(series.root))
    port = stand_ins["drop"].rsplit(":", 1)[1]
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"version: 1\nhosts:\n  localhost:\n    address: localhost\n"
                   f"    roles:\n      decode: {{port: {port}}}\n")
    code, out, _ = cli(capsys, "audit", "localhost", "--inventory", str(inv), "--probe",
                       "recall", "--format", "json")
    data = json.loads(out)
    assert code == 1 and report.validate(data) == []
    assert not data["hosts"][0]["facts"]["tree"]["known"]
    assert probe_findings(data) == [("probe[recall]", f"recall {stand_ins['drop']}", "fail")]


def test_cli_bad_probe_options_exit_2_before_any_host(cli_env: dict, stand_ins, capsys) -> None:
    inv = inventory(cli_env, stand_ins["clean"])
    cases = {("--probe", "vibes"): "--probe 'vibes': expected one of recall, needle, all",
             ("--probe", "needle", "--probe-sizes", "8q"):
                 "--probe-sizes '8q': '8q' is not a size like 8k or 8192",
             ("--probe-sizes", "8k"): "--probe-sizes and --api-key-env need --probe "
                                      "recall|needle|all",
             ("--probe", "recall", "--api-key-env", "PATCHSET_TEST_UNSET_KEY"):
                 "--api-key-env PATCHSET_TEST_UNSET_KEY: the variable is not set"}
    for argv, message in cases.items():
        code, out, err = cli(capsys, "audit", HOST, "--inventory", inv, *argv)
        assert (code, out, err) == (2, "", f"patchset: error: {message}\n"), argv
    assert cli_env["hosts"] == []                         # no host was contacted


def test_cli_api_key_is_used_and_never_shown(cli_env: dict, stand_ins, echo_key, monkeypatch,
                                             tmp_path: Path, capsys) -> None:
    inv = inventory(cli_env, stand_ins["keyed"])
    code, out, _ = cli(capsys, "audit", HOST, "--inventory", inv, "--probe", "recall",
                       "--format", "json")
    assert code == 1
    assert json.loads(out)["hosts"][0]["probes"][0]["error"] == \
        'HTTP 401: {"error":"Unauthorized"}'
    monkeypatch.setenv("PROBE_KEY", SECRET)
    texts = []
    for fmt in FORMATS:
        code, out, err = cli(capsys, "audit", HOST, "--inventory", inv, "--probe", "recall",
                             "--api-key-env", "PROBE_KEY", "--format", fmt)
        assert code == 0, err
        texts.append(out + err)
    assert "probe[recall]" in texts[FORMATS.index("junit")]
    monkeypatch.setenv("PROBE_KEY", OPAQUE_KEY)
    inv = inventory(cli_env, echo_key)
    for fmt in FORMATS:
        code, out, err = cli(capsys, "audit", HOST, "--inventory", inv, "--probe", "recall",
                             "--api-key-env", "PROBE_KEY", "--format", fmt)
        assert code == 1, err
        texts.append(out + err)
    leaked = json.loads(texts[len(FORMATS) + FORMATS.index("json")])["hosts"][0]["probes"][0]
    assert leaked["answer"] == "your key: <redacted>" and not leaked["ok"]
    for text in texts:
        assert SECRET not in text and OPAQUE_KEY not in text
