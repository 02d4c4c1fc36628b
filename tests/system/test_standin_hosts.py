"""The stand-in SGLang server and router (tests/standin/) on a real nspawn host: the
pinned tree copied to /opt/sglang, ``install_standin`` makes /opt/venv, and prefill, decode
and router run as transient systemd units (the local tests: tests/unit/test_standin.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hosts.nspawn import TestHost
from tests.hostutil import free_port
from tests.standin.install import install_standin
from tests.unit.test_standin import MODEL, TOKEN, ask, conversation, wait_status
from tests.unit.test_standin import tree  # noqa: F401 - the fixture used here

pytestmark = pytest.mark.hosts


# ---------------------------------------------------------------- on a real nspawn host


def _host(host: TestHost, *argv: str, timeout: float = 60) -> str:
    res = host.exec(list(argv), timeout=timeout)
    assert res.returncode == 0, f"{argv}: {res.stdout}{res.stderr}"
    return res.stdout


def test_on_a_real_host_under_systemd(one_host: TestHost, tree: Path) -> None:
    dest = one_host.live_root / "opt/sglang/python"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree / "python", dest, ignore=shutil.ignore_patterns("__pycache__"))
    python = install_standin(one_host)
    assert python == "/opt/venv/bin/python"
    assert install_standin(one_host) == python  # idempotent
    origin = _host(one_host, python, "-c", "import importlib.util; print(importlib.util.find_spec('sglang').origin)")
    assert origin.strip() == "/opt/sglang/python/sglang/__init__.py"

    p, b, d, r = free_port(), free_port(), free_port(), free_port()
    units = {
        "standin-prefill": ["-p", ("Environment=CUDA_VISIBLE_DEVICES=0,1 MMA_FLASHMLA=1 SPT_NOENV=1 "
                                   "STANDIN_STARTUP_DELAY=0.3"),
                            python, "-m", "sglang.launch_server", "--model-path", MODEL, "--tp-size", "2",
                            "--port", str(p), "--host", "127.0.0.1", "--disaggregation-mode", "prefill",
                            "--disaggregation-bootstrap-port", str(b), "--disaggregation-transfer-backend",
                            "mooncake", "--moe-runner-backend", "triton"],
        "standin-decode": ["-p", "Environment=CUDA_VISIBLE_DEVICES=2,3 STANDIN_STARTUP_DELAY=0.3",
                           python, "-m", "sglang.launch_server", "--model-path", MODEL, "--tp-size", "2",
                           "--port", str(d), "--host", "127.0.0.1", "--disaggregation-mode", "decode"],
        "standin-router": [python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                           "--prefill", f"http://127.0.0.1:{p}", str(b), "--decode", f"http://127.0.0.1:{d}",
                           "--host", "127.0.0.1", "--port", str(r)],
    }
    try:
        for unit, argv in units.items():
            _host(one_host, "systemd-run", f"--unit={unit}", "-p", "Type=exec", *argv)
        wait_status(f"http://127.0.0.1:{r}/health", 200, timeout=30)

        def children(unit: str) -> tuple[int, dict[str, int]]:
            main = int(_host(one_host, "systemctl", "show", "-p", "MainPID", "--value", unit).strip())
            kids = {}
            for line in _host(one_host, "ps", "-eo", "pid=,ppid=,args=").splitlines():
                pid, ppid, args = line.split(None, 2)
                if int(ppid) == main and "resource_tracker" not in args:
                    kids[args.strip()] = int(pid)
            return main, kids

        def environ(pid: int) -> dict[str, str]:
            raw = _host(one_host, "cat", f"/proc/{pid}/environ")
            return dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)

        main, kids = children("standin-prefill")
        cmdline = _host(one_host, "cat", f"/proc/{main}/cmdline").split("\0")[:-1]
        assert cmdline == units["standin-prefill"][2:]
        assert sorted(kids) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
        for title, pid in kids.items():
            assert _host(one_host, "cat", f"/proc/{pid}/cmdline").rstrip("\0") == title
            env = environ(pid)  # readable: the unit sets SPT_NOENV
            assert env["NCCL_CUMEM_ENABLE"] == "0" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
            assert env["MMA_FLASHMLA"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
        menv = environ(main)
        assert menv["MMA_FLASHMLA"] == "1" and "CUDA_DEVICE_MAX_CONNECTIONS" not in menv
        dmain, dkids = children("standin-decode")
        assert sorted(dkids) == sorted(kids)
        assert all(environ(pid) == {} for pid in dkids.values())  # no SPT_NOENV: clobbered
        assert environ(dmain)["CUDA_VISIBLE_DEVICES"] == "2,3"

        info = json.loads(_host(one_host, "curl", "-sf", f"http://127.0.0.1:{p}/server_info"))
        assert info["tp_size"] == 2 and info["disaggregation_mode"] == "prefill" and info["version"] == "0.5.14"
        assert info["moe_runner_backend"] == "triton" and info["page_size"] is None
        assert ask(f"http://127.0.0.1:{r}", conversation())["choices"][0]["message"]["content"] == TOKEN

        _host(one_host, "systemctl", "stop", "standin-prefill")
        left = _host(one_host, "ps", "-eo", "pid=").split()
        assert not set(map(str, kids.values())) & set(left)  # children went with the unit
    finally:
        one_host.exec(["systemctl", "stop", *units], timeout=60)
        one_host.exec(["systemctl", "reset-failed", *units], timeout=60)
