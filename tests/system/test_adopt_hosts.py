"""`patchset adopt` on a real nspawn host: a fork made from the pinned git tree (two local
commits: two of the project's real patches, committed by hand) installed into a
site-packages with one hand edit, served by the SGLang stand-in under deployed units.
`adopt` proposes the three changes on the right base; `--write` leaves every served byte
identical; `status` is then clean and `audit` gives each adopted patch a state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.hosts.hostsetup import ARGS, MODEL, TREE, VENV, checkpoint
from tests.hostutil import cli, free_ports, on_host
from tests.standin.install import install_standin

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
SITE = "/opt/site"                       # the served site-packages (wheel layout)
COMMITS = ["default-thinking-reasoning", "nvfp4-cutlass-swiglu-clamp"]
SERVED_HASHES = f"cd {SITE} && find sglang -type f ! -name '*.pyc' -print0 | sort -z | " \
                "xargs -0 sha256sum"


def hosts_yaml(env: dict, tree: str) -> Path:
    host, (prefill, decode, bootstrap) = env["host"], env["ports"]
    spec = {"address": host.ip, "port": host.port, "user": "root",
            "identity_file": str(host.client_key), "tree": tree, "python": f"{VENV}/bin/python",
            "serving": {"model_path": MODEL, "transfer_backend": "fake",
                        "env": {"STANDIN_STARTUP_DELAY": "0.2"}},
            "roles": {"prefill": {"gpus": "0,1", "port": prefill, "bootstrap_port": bootstrap,
                                  "extra_args": ARGS},
                      "decode": {"gpus": "2,3", "port": decode, "extra_args": ARGS}}}
    path = env["work"] / "fleet" / "hosts.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "default": host.name,
                                    "hosts": {host.name: spec}}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def env(host_factory, tmp_path_factory, host_client_key) -> dict:
    from tests.hosts.nspawn import write_known_hosts
    [host] = host_factory.start(1, prefix="adopt")
    work = tmp_path_factory.mktemp("adopt-hosts")
    known = write_known_hosts([host], work / "known_hosts")
    (work / "ssh_config").write_text("")
    doc = yaml.safe_load((ROOT / "patches.yaml").read_text())
    (work / "real").mkdir()
    (work / "real" / "patches.yaml").write_text((ROOT / "patches.yaml").read_text())
    (work / "real" / "patches").symlink_to(ROOT / "patches")
    doc["series"] = []
    (work / "fleet").mkdir()
    (work / "fleet" / "patches.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    yield {"host": host, "work": work, "known": known, "ports": free_ports(3)}
    host_factory.stop([host])


@pytest.fixture()
def adopt_env(env, monkeypatch):
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(env["known"]))
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(env["work"] / "ssh_config"))
    monkeypatch.setenv("PATCHSET_HOME", str(env["work"] / "home"))
    monkeypatch.chdir(env["work"] / "fleet")
    return env


def make_fork(env: dict, capsys) -> None:
    """The pinned tree (provisioned by an apply, then set back to the pin and forgotten),
    two local commits, installed into SITE with a hand edit, served by the stand-in."""
    host = env["host"]
    on_host(host, f"rm -rf {TREE} {SITE}")
    hosts_yaml(env, TREE)
    real = str(env["work"] / "real" / "patches.yaml")
    code, _, err = cli(capsys, "apply", "--only", COMMITS[0], host.name, "--series", real)
    assert code == 0, err
    on_host(host, f"cd {TREE} && rm -rf .patchset && git reset -q --hard refs/patchset/base "
            "&& git update-ref -d refs/patchset/base")
    for name in COMMITS:
        (host.live_root / "tmp" / f"{name}.patch").write_bytes((ROOT / "patches" /
                                                                f"{name}.patch").read_bytes())
        on_host(host, f"cd {TREE} && git apply /tmp/{name}.patch && git -c user.name=Fork "
                f"-c user.email=fork@example.com commit -qam 'fork: {name}'")
    on_host(host, f"mkdir -p {SITE} && cp -a {TREE}/python/sglang {SITE}/ && "
            f"printf '\\n# tuned here\\n' >> {SITE}/sglang/version.py")
    install_standin(host, venv=VENV, tree=TREE)
    on_host(host, f"echo {SITE} > $(ls -d {VENV}/lib/python3*/site-packages)/sglang_tree.pth")
    checkpoint(host)
    hosts_yaml(env, SITE)
    code, _, err = cli(capsys, "deploy", host.name, "--series", real)
    assert code == 0, err
    # the fork's servers were not started by patchset: units without its patch list
    on_host(host, "for u in sglang-prefill sglang-decode; do sed -i '/PATCHSET_PATCHES/d' "
            "$(systemctl show -P EnvironmentFiles $u | cut -d' ' -f1); done && "
            "systemctl restart sglang-prefill sglang-decode")


def test_adopt_proposes_writes_and_the_host_is_managed(adopt_env, capsys) -> None:
    host = adopt_env["host"]
    make_fork(adopt_env, capsys)
    served = on_host(host, SERVED_HASHES)
    code, out, err = cli(capsys, "adopt", host.name, "--checkout", TREE, "--json")
    assert code == 0, err
    plan = json.loads(out)
    head = on_host(host, f"git -C {TREE} rev-parse HEAD~2").strip()
    assert plan["base"]["source"] == "merge-base" and plan["base"]["commit"] == head
    assert plan["base"]["is_pin"] and plan["base"]["compared"] > 1000
    assert [p["source"].split()[0] for p in plan["patches"]] == ["commit", "commit", "hand"]
    assert [p["summary"] for p in plan["patches"][:2]] == [f"fork: {n}" for n in COMMITS]
    assert plan["patches"][2]["files"] == ["python/sglang/version.py"]
    assert all(p["trace_targets"] for p in plan["patches"][:2])
    assert not on_host(host, f"ls -A {SITE}/.patchset 2>/dev/null || true").strip()

    code, out, err = cli(capsys, "adopt", host.name, "--checkout", TREE, "--write", "--json",
                         "--author", "Ops <ops@example.com>")
    assert code == 0, err
    result = json.loads(out)
    assert len(result["written"]) == 3 and result["files_hashed"] == plan["base"]["compared"]
    assert on_host(host, SERVED_HASHES) == served

    code, out, err = cli(capsys, "status", host.name, "--json")
    text = out
    assert code == 0, out + err
    assert '"managed": true' in text and '"drift": []' in text

    code, out, err = cli(capsys, "audit", host.name, "--format", "json")
    assert out, err
    data = json.loads(out)
    got = {(s["server"], s["patch"]): s["state"] for s in data["hosts"][0]["states"]}
    for name in result["written"]:
        for unit in ("sglang-prefill.service", "sglang-decode.service"):
            assert got.get((unit, name)), (unit, name, got)


def test_bad_input_is_one_line_exit_2_and_changes_nothing(adopt_env, capsys) -> None:
    """After the adoption above: the host is managed, the manifest holds a series."""
    host = adopt_env["host"]
    manifest = Path("patches.yaml").read_bytes()
    served = on_host(host, SERVED_HASHES)
    state = on_host(host, f"sha256sum {SITE}/.patchset/state.json")
    on_host(host, "mkdir -p /opt/notsglang/numpy")
    for argv, words in [(["unknown-host"], "not in the inventory"),
                        ([host.name, "--target", "/opt/notsglang"], "no sglang tree"),
                        # the host is read first: an existing series is judged after
                        # the plan (a write killed before the host took it resumes)
                        ([host.name, "--write"], "already managed"),
                        ([host.name, "--write", "--force"], "already managed"),
                        ([host.name], "already managed")]:
        code, _, err = cli(capsys, "adopt", *argv)
        lines = [line for line in err.splitlines() if not line.endswith("...")]
        assert code == 2 and words in err and len(lines) == 1, err
    assert Path("patches.yaml").read_bytes() == manifest
    assert on_host(host, SERVED_HASHES) == served
    assert on_host(host, f"sha256sum {SITE}/.patchset/state.json") == state
