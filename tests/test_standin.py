"""The stand-in SGLang server and router (tests/standin/), against the real pinned source.

Locally: the stand-in runs from a venv made by ``install_standin_local`` whose
``.pth`` points at the cached SGLang 0.5.14 tree.  On a real nspawn host: the
tree is copied to /opt/sglang, ``install_standin`` makes /opt/venv, and prefill,
decode and router run as transient systemd units.  Ports: 31000+ (the hosts share
this machine's network namespace).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.hosts.nspawn import TestHost
from hostutil import free_port
from tests.standin.install import PAYLOAD, install_standin, install_standin_local

if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from sglang_standin import chat, derive, procs  # noqa: E402

MODEL = "/models/DeepSeek-V4-Flash"
SECRET = "sk-standin-secret"
TOKEN = "ZEBRA-42"


# ---------------------------------------------------------------- helpers




def http(method: str, url: str, body: Any = None, headers: dict | None = None,
         timeout: float = 10) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})} if data is not None else dict(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def get_json(url: str, **kw: Any) -> Any:
    status, body = http("GET", url, **kw)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


def wait_status(url: str, want: int = 200, timeout: float = 20, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = http("GET", url, timeout=2)[0]
        if last == want:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{url}: process exited with {proc.returncode}")
        time.sleep(0.05)
    raise AssertionError(f"{url}: status {last}, wanted {want}")


def conversation(filler_words: int = 20) -> list[dict]:
    filler = " ".join(f"word{i}" for i in range(filler_words))
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": f"Remember this: the token is {TOKEN}."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": f"Some filler: {filler}"},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "What was the token I gave you in turn 1?"},
    ]


def ask(base: str, messages: list[dict], **extra: Any) -> dict:
    status, body = http("POST", f"{base}/v1/chat/completions", {"model": "m", "messages": messages, **extra})
    assert status == 200, body[:300]
    return json.loads(body)


def proc_children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return sorted(out)


def proc_cmdline(pid: int) -> list[str]:
    """argv from /proc (setproctitle leaves the title then NUL padding: trailing NULs dropped)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def engine_children(pid: int) -> dict[str, int]:
    """{title: pid} of a server's children, without multiprocessing's resource tracker
    (a real spawn-based SGLang has one too)."""
    out = {}
    for c in proc_children(pid):
        argv = proc_cmdline(c)
        if not any("multiprocessing.resource_tracker" in a for a in argv):
            out[argv[0]] = c
    return out


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tree(pinned_base) -> Path:
    """The cached pinned SGLang tree (git layout: TREE/python/sglang); read only."""
    assert (pinned_base.repo / "python/sglang/srt/server_args.py").is_file()
    return pinned_base.repo


@pytest.fixture(scope="module")
def derived(tree: Path) -> derive.Derived:
    return derive.load(str(tree / "python/sglang"))


@pytest.fixture(scope="module")
def venv_python(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return install_standin_local(tmp_path_factory.mktemp("standin") / "venv", tree)


class Running:
    """A stand-in process started from the local venv; stopped with SIGTERM."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self._fh = open(log, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd="/")

    def stop(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._fh.close()

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")


@pytest.fixture
def launch(venv_python: str, tmp_path: Path) -> Iterator:
    """``launch(module, *args, env={...})`` starts ``VENV/bin/python -m module args``."""
    started: list[Running] = []

    def start(module: str, *args: str, env: dict[str, str] | None = None, wait: str | None = None) -> Running:
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
                "STANDIN_STARTUP_DELAY": "0.2"}
        run = Running([venv_python, "-m", module, *args], {**base, **(env or {})},
                      tmp_path / f"{module}-{len(started)}.log")
        started.append(run)
        if wait:
            try:
                wait_status(wait, proc=run.proc)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{run.output()}") from None
        return run

    yield start
    for run in started:
        run.stop()


# ---------------------------------------------------------------- derived from server_args.py


def test_fields_and_cli_are_derived_from_the_pinned_server_args(tree: Path, derived: derive.Derived) -> None:
    src = (tree / "python/sglang/srt/server_args.py").read_text()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    declared = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)]
    spec = derived.server_args
    assert list(spec.fields) == declared  # every dataclass field, in order
    assert spec.prog == "sglang serve"

    defaults = spec.defaults()
    # Read in python/sglang/srt/server_args.py (v0.5.14):
    assert defaults["page_size"] is None
    assert defaults["moe_runner_backend"] == "auto"
    assert defaults["moe_a2a_backend"] == "none"
    assert defaults["kv_cache_dtype"] == "auto"
    assert defaults["disaggregation_mode"] == "null"
    assert defaults["disaggregation_transfer_backend"] == "mooncake"
    assert defaults["disaggregation_bootstrap_port"] == 8998
    assert defaults["tp_size"] == 1 and defaults["port"] == 30000 and defaults["host"] == "127.0.0.1"
    assert defaults["api_key"] is None and defaults["watchdog_timeout"] == 300
    assert defaults["model_path"] is derive.MISSING

    opts = {name: o for o in spec.options for name in o["names"]}
    assert opts["--model-path"]["required"] and opts["--model"]["dest"] == "model_path"
    assert opts["--tensor-parallel-size"]["dest"] == "tp_size" and opts["--tp-size"]["type"] == "int"
    assert opts["--disaggregation-mode"]["choices"] == ["null", "prefill", "decode"]
    assert {"triton", "flashinfer_cutlass", "deep_gemm"} <= set(opts["--moe-runner-backend"]["choices"])
    assert opts["--context-length"]["type"] == "human_readable_int"  # the tree's own parser
    assert opts["--cuda-graph-max-bs"]["action"] == "DeprecatedAliasStoreAction"
    assert opts["--cuda-graph-max-bs"]["dest"] == "cuda_graph_max_bs_decode"
    assert opts["--lora-paths"]["action"] == "LoRAPathAction"

    # Every option string written in add_cli_args, and every annotated field's
    # --field-name, is accepted (cross-check against the source text).
    add_cli = src[src.index("    def add_cli_args(") : src.index("    def from_cli_args(")]
    for flag in re.findall(r'"(--[a-z0-9][a-z0-9-]*)"', add_cli):
        assert flag in opts, flag
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and ast.unparse(stmt.annotation).startswith("A["):
            text = ast.unparse(stmt.annotation)
            if "no_cli=True" in text or "cli_name=" in text:
                continue
            assert "--" + stmt.target.id.replace("_", "-") in opts, stmt.target.id

    values = spec.parse(["--model-path", MODEL, "--tp", "4", "--context-length", "128k",
                         "--moe-runner-backend", "triton", "--mem-fraction-static", "0.8"])
    assert values["tp_size"] == 4  # argparse prefix matching, as in SGLang's parser
    assert values["context_length"] == 128000 and values["mem_fraction_static"] == 0.8
    changed = {k for k in values if values[k] != defaults[k]}
    assert changed == {"model_path", "tp_size", "context_length", "moe_runner_backend", "mem_fraction_static"}


def test_scheduler_titles_follow_the_pinned_rule(derived: derive.Derived) -> None:
    """configure_scheduler_process: prefix DP, PP, ATTN_CP, MOE_DP, TP, EP (each only when > 1)."""
    import types

    base = derived.server_args.defaults()
    base["model_path"] = MODEL

    def titles(**kw: Any) -> list[str]:
        sa = types.SimpleNamespace(**{**base, **kw})
        return [r["title"] for r in procs.scheduler_ranks(sa, derived, dp_rank=None)]

    assert titles() == ["sglang::scheduler"]
    assert titles(tp_size=4) == [f"sglang::scheduler_TP{i}" for i in range(4)]
    assert titles(tp_size=4, ep_size=4) == [f"sglang::scheduler_TP{i}_EP{i}" for i in range(4)]
    assert titles(tp_size=2, pp_size=2) == ["sglang::scheduler_PP0_TP0", "sglang::scheduler_PP0_TP1",
                                            "sglang::scheduler_PP1_TP0", "sglang::scheduler_PP1_TP1"]
    assert derived.detokenizer_title == "sglang::detokenizer"


@pytest.mark.parametrize("args, message", [
    (["--model-path", MODEL, "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["--model-path", MODEL, "--moe-runner-backend", "nope"], "argument --moe-runner-backend: invalid choice: 'nope'"),
    (["--model-path", MODEL, "--tp-size", "four"],
     "argument --tp-size/--tensor-parallel-size: invalid int value: 'four'"),
    (["--port", "31000"], "the following arguments are required: --model-path/--model"),
])
def test_bad_command_line_exits_2_like_argparse(venv_python: str, args: list[str], message: str) -> None:
    res = subprocess.run([venv_python, "-m", "sglang.launch_server", *args], capture_output=True, text=True,
                         timeout=30, cwd="/", env={"PATH": os.environ["PATH"]})
    assert res.returncode == 2, res.stderr
    assert "usage: sglang serve [-h] --model-path MODEL_PATH" in res.stderr
    assert f"sglang serve: error: {message}" in res.stderr
    assert "Traceback" not in res.stderr


def test_import_hook_only_in_launch_server(venv_python: str, tree: Path) -> None:
    """Other processes of the venv see the real tree, untouched."""
    code = "import importlib.util, sys; print(importlib.util.find_spec('sglang').origin)"
    out = subprocess.run([venv_python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(tree / "python/sglang/__init__.py")


# ---------------------------------------------------------------- a running server


def test_server_info_processes_and_shutdown(launch, derived: derive.Derived) -> None:
    port, bport = free_port(), free_port()
    args = ["--model-path", MODEL, "--tp-size", "4", "--port", str(port), "--host", "127.0.0.1",
            "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bport),
            "--disaggregation-transfer-backend", "mooncake", "--moe-runner-backend", "triton",
            "--api-key", SECRET]
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "MMA_FLASHMLA": "1"}
    base = f"http://127.0.0.1:{port}"
    run = launch("sglang.launch_server", *args, env=env, wait=f"{base}/health")
    auth = {"Authorization": f"Bearer {SECRET}"}

    # /server_info: every ServerArgs field, defaults except what the command line set and
    # what _handle_missing_default_values fills in; plus scheduler info, states, version.
    assert http("GET", f"{base}/server_info")[0] == 401
    info = get_json(f"{base}/server_info", headers=auth)
    overridden = {"model_path": MODEL, "tp_size": 4, "port": port, "host": "127.0.0.1",
                  "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": bport,
                  "disaggregation_transfer_backend": "mooncake", "moe_runner_backend": "triton",
                  "api_key": SECRET}
    post_init = {"tokenizer_path": MODEL, "served_model_name": MODEL, "device": "cuda", "mm_process_config": {}}
    for name, default in derived.server_args.defaults().items():
        if name == "random_seed":
            assert isinstance(info[name], int)
            continue
        want = overridden.get(name, post_init.get(name, default))
        assert info[name] == json.loads(json.dumps(want, default=list)), name
    assert info["page_size"] is None and info["moe_runner_backend"] == "triton"
    assert info["api_key"] == SECRET  # the real server leaks it too: the audit must redact
    assert info["status"] == "ready" and info["max_req_input_len"] == 131071
    assert info["version"] == "0.5.14" and info["kv_events"] is None
    [state] = info["internal_states"]
    assert state["tp_size"] == 4 and state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    extra = set(info) - set(derived.server_args.fields)
    assert extra == {"status", "max_total_num_tokens", "max_req_input_len", "internal_states", "version", "kv_events"}
    assert get_json(f"{base}/get_server_info", headers=auth) == info  # deprecated alias

    model_info = get_json(f"{base}/model_info", headers=auth)
    assert model_info == {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True,
                          "preferred_sampling_params": None, "weight_version": "default",
                          "has_image_understanding": False, "has_audio_understanding": False,
                          "model_type": None, "architectures": None}
    assert get_json(f"{base}/get_model_info", headers=auth) == model_info
    models = get_json(f"{base}/v1/models", headers=auth)
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["id"] == MODEL and card["root"] == MODEL and card["owned_by"] == "sglang"
    assert card["max_model_len"] == 131072 and card["object"] == "model"
    assert http("GET", f"{base}/health")[0] == 200  # /health needs no key
    assert http("GET", f"{base}/nope", headers=auth)[0] == 404

    # The prefill's KV bootstrap server listens on --disaggregation-bootstrap-port.
    assert http("GET", f"http://127.0.0.1:{bport}/health") == (200, b"OK")

    # Processes: the main cmdline is what was exec'd and its environ what it was exec'd
    # with; the children carry setproctitle titles, and (no SPT_NOENV) setproctitle
    # padded their environ area with NULs, as on a real SGLang host.
    pid = run.proc.pid
    assert proc_cmdline(pid) == run.argv
    kids = engine_children(pid)
    assert sorted(kids) == ["sglang::detokenizer"] + [f"sglang::scheduler_TP{i}" for i in range(4)]
    for title, cpid in kids.items():
        raw = Path(f"/proc/{cpid}/cmdline").read_bytes()
        assert raw.startswith(title.encode() + b"\0") and not raw[len(title):].strip(b"\0")
        assert Path(f"/proc/{cpid}/comm").read_text().strip() == title[:15]
        environ = Path(f"/proc/{cpid}/environ").read_bytes()
        assert environ and not environ.strip(b"\0")  # clobbered: only NULs
    menv = proc_environ(pid)
    assert menv["MMA_FLASHMLA"] == "1" and "CUDA_DEVICE_MAX_CONNECTIONS" not in menv and "SGLANG_RUN_ID" not in menv

    out = run.output()
    assert "server_args=ServerArgs(model_path='/models/DeepSeek-V4-Flash'" in out
    assert f"api_key='{SECRET}'" in out and "The server is fired up and ready to roll!" in out
    assert "Endpoint '/get_server_info' is deprecated" in out

    assert run.stop() == 0
    time.sleep(0.2)
    assert not any(alive(c) for c in kids.values())


def test_children_environ_with_spt_noenv(launch) -> None:
    """With SPT_NOENV set, a child's /proc environ is readable: the parent's environment
    plus what _set_envs_and_config set, per-child CUDA_VISIBLE_DEVICES when
    SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS (maybe_reindex_device_id)."""
    port = free_port()
    env = {"SPT_NOENV": "1", "CUDA_VISIBLE_DEVICES": "4,5", "MMA_FLASHMLA": "1",
           "SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS": "1", "NCCL_CUMEM_ENABLE": "1"}
    run = launch("sglang.launch_server", "--model-path", MODEL, "--tp-size", "2", "--port", str(port),
                 env=env, wait=f"http://127.0.0.1:{port}/health")
    kids = engine_children(run.proc.pid)
    assert sorted(kids) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    for cpid in kids.values():
        cenv = proc_environ(cpid)
        assert cenv["NCCL_CUMEM_ENABLE"] == "1"  # set before launch: kept (enable_symm_mem is off)
        assert cenv["NCCL_NVLS_ENABLE"] == "0" and cenv["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
        assert cenv["CUDA_MODULE_LOADING"] == "AUTO" and cenv["TRTLLM_ENABLE_PDL"] == "1"
        assert cenv["CUTE_DSL_LOG_LEVEL"] == "30" and cenv["SGLANG_RUN_ID"].startswith("sglang-run-")
        assert cenv["MMA_FLASHMLA"] == "1" and "PYTHONPATH" not in cenv
    assert proc_environ(kids["sglang::scheduler_TP0"])["CUDA_VISIBLE_DEVICES"] == "4"
    assert proc_environ(kids["sglang::scheduler_TP1"])["CUDA_VISIBLE_DEVICES"] == "5"
    assert proc_environ(kids["sglang::detokenizer"])["CUDA_VISIBLE_DEVICES"] == "4,5"
    run_ids = {proc_environ(c)["SGLANG_RUN_ID"] for c in kids.values()}
    assert len(run_ids) == 1


def test_health_waits_for_startup_and_can_be_made_to_fail(launch) -> None:
    slow, failing = free_port(), free_port()
    launch("sglang.launch_server", "--model-path", MODEL, "--port", str(slow), env={"STANDIN_STARTUP_DELAY": "3"})
    launch("sglang.launch_server", "--model-path", MODEL, "--port", str(failing),
           env={"STANDIN_FAIL_HEALTH": "1"})
    wait_status(f"http://127.0.0.1:{slow}/health", 503)  # loading the "model"
    wait_status(f"http://127.0.0.1:{slow}/health", 200, timeout=10)
    wait_status(f"http://127.0.0.1:{failing}/server_info", 200)
    time.sleep(0.5)
    assert http("GET", f"http://127.0.0.1:{failing}/health")[0] == 503


def test_a_dead_scheduler_takes_the_server_down(launch) -> None:
    port = free_port()
    run = launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port), "--tp-size", "2",
                 wait=f"http://127.0.0.1:{port}/health")
    kids = engine_children(run.proc.pid)
    os.kill(kids["sglang::scheduler_TP1"], signal.SIGKILL)
    assert run.proc.wait(10) != 0
    time.sleep(0.2)
    assert not any(alive(k) for k in kids.values())


# ---------------------------------------------------------------- chat and faults


def test_chat_answers_from_what_it_sees_and_faults_change_that(launch) -> None:
    servers = {}
    for fault in ("", "drop_history", "truncate:12"):
        port = free_port()
        launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port),
               env={"STANDIN_FAULT": fault}, wait=f"http://127.0.0.1:{port}/health")
        servers[fault] = f"http://127.0.0.1:{port}"
    msgs = conversation()

    ok = ask(servers[""], msgs)
    assert ok["object"] == "chat.completion" and ok["model"] == "m"
    [choice] = ok["choices"]
    assert choice["message"] == {"role": "assistant", "content": TOKEN, "reasoning_content": None, "tool_calls": None}
    assert choice["finish_reason"] == "stop" and choice["index"] == 0
    assert ok["usage"]["prompt_tokens"] == chat.count_tokens(chat.normalize(msgs))
    assert ask(servers[""], msgs[:-1] + [{"role": "user", "content": "How many turns so far?"}])["choices"][0][
        "message"]["content"] == "3"

    dropped = ask(servers["drop_history"], msgs)
    assert dropped["choices"][0]["message"]["content"] == "I don't know."
    assert dropped["usage"]["prompt_tokens"] == len("You are helpful.".split()) + len(msgs[-1]["content"].split())

    truncated = ask(servers["truncate:12"], msgs)
    assert truncated["choices"][0]["message"]["content"] != TOKEN
    assert truncated["usage"]["prompt_tokens"] == 12
    short = [msgs[1], {"role": "user", "content": "token from turn 1?"}]
    assert ask(servers["truncate:12"], short)["choices"][0]["message"]["content"] == TOKEN  # fits: no loss

    cut = ask(servers[""], msgs[:2], max_tokens=2)
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 2

    status, body = http("POST", f"{servers['']}/v1/chat/completions",
                        {"messages": msgs, "stream": True, "stream_options": {"include_usage": True}})
    events = [line[len("data: "):] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"]["content"] == TOKEN
    assert chunks[-1]["usage"]["prompt_tokens"] == ok["usage"]["prompt_tokens"]

    assert http("POST", f"{servers['']}/v1/chat/completions", {"messages": []})[0] == 400


def test_each_request_runs_the_trees_sampling_params(launch, tree: Path) -> None:
    """Per request, the main process runs TokenizerManager.generate_request (module and
    qualname as in 0.5.14), which checks the request with the served tree's own
    SamplingParams: its error messages are the 400s, and an edit to that file on disk,
    made before the start, is what the server runs."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    source = tree / "python/sglang/srt/sampling/sampling_params.py"
    original = source.read_text()
    marker = "top_p must be in (0, 1]"
    source.write_text(original.replace(marker, "top_p out of range (edited tree)"))
    try:
        launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port),
               wait=f"{base}/health")
    finally:
        source.write_text(original)
    msgs = conversation()
    status, body = http("POST", f"{base}/v1/chat/completions", {"messages": msgs, "top_p": 1.5})
    assert status == 400 and "top_p out of range (edited tree), got 1.5" in body.decode()
    status, body = http("POST", f"{base}/v1/chat/completions",
                        {"messages": msgs, "min_tokens": 4, "max_tokens": 2})
    assert status == 400 and "min_new_tokens must be in [0, max_new_tokens(2)]" in body.decode()
    assert ask(base, msgs, temperature=0, stop=["never seen"])["choices"][0]["message"][
        "content"] == TOKEN


def test_unknown_fault_is_a_startup_error(venv_python: str) -> None:
    res = subprocess.run([venv_python, "-m", "sglang.launch_server", "--model-path", MODEL, "--port", str(free_port())],
                         capture_output=True, text=True, timeout=30, cwd="/",
                         env={"PATH": os.environ["PATH"], "STANDIN_FAULT": "drop_histroy"})
    assert res.returncode == 1 and "unknown fault 'drop_histroy'" in res.stderr


def test_router_joins_prefill_and_decode(launch, venv_python: str) -> None:
    """P/D through the router: the decode answers from what the prefill saw (KV via bootstrap)."""
    routers = {}
    for fault in ("", "drop_history"):
        p, b, d, r = free_port(), free_port(), free_port(), free_port()
        launch("sglang.launch_server", "--model-path", MODEL, "--port", str(p), "--disaggregation-mode", "prefill",
               "--disaggregation-bootstrap-port", str(b), env={"STANDIN_FAULT": fault},
               wait=f"http://127.0.0.1:{p}/health")
        launch("sglang.launch_server", "--model-path", MODEL, "--port", str(d), "--disaggregation-mode", "decode",
               wait=f"http://127.0.0.1:{d}/health")
        launch("sglang_router.launch_router", "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{p}", str(b),
               "--decode", f"http://127.0.0.1:{d}", "--host", "127.0.0.1", "--port", str(r),
               wait=f"http://127.0.0.1:{r}/health")
        routers[fault] = (f"http://127.0.0.1:{r}", f"http://127.0.0.1:{d}")

    clean, decode = routers[""]
    assert ask(clean, conversation())["choices"][0]["message"]["content"] == TOKEN
    assert get_json(f"{clean}/v1/models")["data"][0]["id"] == MODEL
    faulty, faulty_decode = routers["drop_history"]
    assert ask(faulty, conversation())["choices"][0]["message"]["content"] == "I don't know."  # prefill dropped it
    assert ask(faulty_decode, conversation())["choices"][0]["message"]["content"] == TOKEN  # decode itself is fine

    res = subprocess.run([venv_python, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--bogus"],
                         capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr


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
