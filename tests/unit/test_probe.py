"""`patchset probe` against the stand-in SGLang server run locally (as test_standin does):
the probes pass on a faithful server and catch dropped history and truncated context."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from patchset.cli import main
from tests.hostutil import free_port
from tests.standin.install import install_standin_local

MODEL = "/models/DeepSeek-V4-Flash"
SECRET = "sk-probe-secret-123"



def wait_health(url: str, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"stand-in exited with {proc.returncode}")
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"{url}/health never became ready")


@pytest.fixture(scope="module")
def servers(pinned_base, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One stand-in per fault (and one behind an API key), for the whole module."""
    python = install_standin_local(tmp_path_factory.mktemp("standin") / "venv",
                                   pinned_base.repo)
    logs = tmp_path_factory.mktemp("logs")
    kinds = {"clean": ("", []), "drop": ("drop_history", []), "trunc": ("truncate:2000", []),
             "keyed": ("", ["--api-key", SECRET])}
    running: list[subprocess.Popen] = []
    urls = {}
    try:
        for kind, (fault, extra) in kinds.items():
            port = free_port()
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
                   "STANDIN_STARTUP_DELAY": "0.2", "STANDIN_FAULT": fault}
            with open(logs / f"{kind}.log", "wb") as log:
                proc = subprocess.Popen([python, "-m", "sglang.launch_server", "--model-path",
                                         MODEL, "--port", str(port), *extra], env=env,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd="/")
            running.append(proc)
            urls[kind] = f"http://127.0.0.1:{port}"
            wait_health(urls[kind], proc)
        yield urls
    finally:
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def probe(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["probe", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def by_name(report: dict) -> dict[str, dict]:
    return {r["name"]: r for r in report["results"]}


def test_a_faithful_server_passes_with_evidence(servers, capsys) -> None:
    code, report, err = probe(capsys, "--url", servers["clean"], "--sizes", "1k,4k", "--json")
    assert code == 0, err
    results = by_name(report)
    assert list(results) == ["recall", "needle@1k", "needle@4k"]
    recall = results["recall"]
    assert recall["ok"] and recall["tools"] and recall["turns"] >= 8
    assert recall["answer"] == recall["expected"] and recall["expected"].startswith("RECALL-")
    assert recall["prompt_tokens"] == recall["words_sent"] and recall["latency_ms"] > 0
    needle = results["needle@4k"]
    assert needle["ok"] and needle["size_tokens"] == 4096
    assert 2900 < needle["prompt_tokens"] == needle["words_sent"] < 4096


def test_dropped_history_is_caught(servers, capsys) -> None:
    code, report, _ = probe(capsys, "--url", servers["drop"], "--sizes", "1k", "--json")
    assert code == 1 and not report["ok"]
    for result in report["results"]:
        assert not result["ok"] and result["answer"] == "I don't know."
        assert result["prompt_tokens"] < result["words_sent"] * 0.1
        assert "dropped or truncated" in result["reason"]


def test_truncated_context_is_caught_at_the_size_it_bites(servers, capsys) -> None:
    code, report, _ = probe(capsys, "--url", servers["trunc"], "--kind", "needle",
                            "--sizes", "1k,4k", "--json")
    results = by_name(report)
    assert code == 1 and list(results) == ["needle@1k", "needle@4k"]
    assert results["needle@1k"]["ok"]
    cut = results["needle@4k"]
    assert not cut["ok"] and cut["prompt_tokens"] == 2000 and cut["answer"] != cut["expected"]
    code, report, _ = probe(capsys, "--url", servers["trunc"], "--kind", "recall", "--json")
    assert code == 0 and by_name(report)["recall"]["ok"]      # a short chat fits


def test_inventory_host_uses_its_decode_port(servers, tmp_path: Path, capsys) -> None:
    """`localhost` in the inventory is this machine: a direct connection to its role's
    port (an SSH host's goes through its SSH connection: test_audit_probe's host test)."""
    port = servers["clean"].rsplit(":", 1)[1]
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"version: 1\nhosts:\n  localhost:\n    address: localhost\n"
                         f"    roles:\n      decode: {{port: {port}}}\n"
                         "  bare:\n    address: 10.0.0.9\n    roles:\n"
                         "      prefill: {port: 30000}\n")
    code, report, err = probe(capsys, "localhost", "--inventory", str(inventory), "--kind",
                              "recall", "--json")
    assert code == 0, err
    assert report["host"] == "localhost" and report["url"] == servers["clean"]
    assert report["results"][0]["url"] == servers["clean"]
    code, _, err = probe(capsys, "ghost", "--inventory", str(inventory))
    assert code == 2 and "'ghost' is not in the inventory" in err
    code, _, err = probe(capsys, "bare", "--inventory", str(inventory))
    assert code == 2 and "hosts.bare.roles has no router or decode port" in err
    code, _, err = probe(capsys, "lab", "--url", servers["clean"])
    assert code == 2 and "exactly one of HOST or --url" in err
    code, _, err = probe(capsys, "--url", servers["clean"], "--sizes", "8q")
    assert code == 2 and "--sizes '8q'" in err


def test_api_key_from_the_environment_is_used_and_never_shown(servers, monkeypatch,
                                                              capsys) -> None:
    code, report, _ = probe(capsys, "--url", servers["keyed"], "--kind", "recall", "--json")
    assert code == 1 and "HTTP 401" in report["results"][0]["error"]
    code, _, err = probe(capsys, "--url", servers["keyed"], "--api-key-env", "PROBE_KEY")
    assert code == 2 and "PROBE_KEY: the variable is not set" in err
    monkeypatch.setenv("PROBE_KEY", SECRET)
    code = main(["probe", "--url", servers["keyed"], "--sizes", "1k", "--api-key-env",
                 "PROBE_KEY", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["ok"]
    code = main(["probe", "--url", servers["keyed"], "--sizes", "1k", "--api-key-env",
                 "PROBE_KEY"])
    text, err = capsys.readouterr()
    assert code == 0 and "pass recall" in text and "3/3" not in text and "2/2" in err
    assert SECRET not in out + text + err


def test_unreachable_endpoint_exits_3(capsys) -> None:
    port = free_port()
    code, report, _ = probe(capsys, "--url", f"http://127.0.0.1:{port}", "--kind", "recall",
                            "--json")
    assert code == 3 and report["unreachable"]
    assert report["results"][0]["error"] == (f"cannot reach http://127.0.0.1:{port}: "
                                             "unreachable (Connection refused)")


def test_the_next_step_scripts_send_to_a_direct_url(servers, capsys) -> None:
    """`python3 -m patchset.isolate.measure.probe needle|greedy|throughput --url` (the symptoms' next steps):
    a DirectEndpoint; an HTTP error status is a failed probe (1), no answer 3, a bad URL 2;
    the key never shown."""
    from patchset.isolate.measure.probe import main as script

    def run(*argv: str) -> tuple[int, dict]:
        code = script(list(argv))
        return code, json.loads(capsys.readouterr().out)
    code, result = run("needle", "--url", servers["clean"] + "/", "--tokens", "500")
    assert code == 0 and result["ok"] and result["answer"] == result["token"]
    code, result = run("greedy", "--url", servers["clean"], "--max-tokens", "64")
    assert code == 0 and result["ok"] and result["chars"] > 0
    code, result = run("throughput", "--url", servers["clean"], "--parallel", "4")
    assert code == 0 and result["requests"] == 4 and result["completion_tokens"] > 0
    code, result = run("needle", "--url", servers["keyed"], "--tokens", "100", "--api-key",
                       "not-" + SECRET)
    assert code == 1 and result["error"].startswith("HTTP 401: ")
    assert SECRET not in json.dumps(result)
    port = free_port()
    code, result = run("greedy", "--url", f"http://127.0.0.1:{port}")
    assert code == 3 and result["error"] == (f"http://127.0.0.1:{port}: unreachable "
                                             "(Connection refused)")
    code, result = run("greedy", "--url", "file:///etc/passwd")
    assert code == 2 and "expected http(s)://HOST[:PORT][/PATH]" in result["error"]
