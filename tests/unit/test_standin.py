"""The stand-in SGLang server and router (tests/standin/), against the real pinned source.

Locally: the stand-in runs from a venv made by ``install_standin_local`` whose
``.pth`` points at the cached SGLang 0.5.14 tree (on a real nspawn host, under systemd:
tests/system/test_standin_hosts.py).  Ports: 31000+ (the hosts share this machine's
network namespace).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.hostutil import free_port
from tests.standin.install import PAYLOAD, install_standin_local

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


# ---------------------------------------------------------------- /generate (toy model)


def gen(base: str, body: dict, status: int = 200, headers: dict | None = None) -> Any:
    code, raw = http("POST", f"{base}/generate", body, headers=headers, timeout=60)
    assert code == status, (code, raw[:400])
    return json.loads(raw)


def serve(launch, *args: str, env: dict | None = None) -> str:
    port = free_port()
    launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port), *args, env=env,
           wait=f"http://127.0.0.1:{port}/health")
    return f"http://127.0.0.1:{port}"


def prompts(n: int = 4) -> list[list[int]]:
    """Fixed token-id prompts over the toy vocabulary (BOS first)."""
    import random
    from sglang_standin import toy
    rng = random.Random(2026)
    return [[0] + [rng.randrange(2, toy.V) for _ in range(k)] for k in (37, 120, 200, 301)[:n]]


def kl_terms(a: list[float], b: list[float]) -> list[float]:
    """kl_test_utils.compare_kl_divergence's per-token exp(r) - 1 - r, r = a - b."""
    import math
    return [math.exp(x - y) - 1 - (x - y) for x, y in zip(a, b)]


def drift(base: str, new_tokens: int = 256) -> tuple[list[list[float]], float]:
    """kl_test_utils' probe: greedy generate with logprobs, flush, replay prompt + output as a
    prefill (max_new_tokens=0, logprob_start_len=len(prompt)); per prompt the exp(r)-1-r terms
    of output tokens 1.. (token 0's input logprob is upstream's leading None), and the largest
    |prefill - decode| logprob difference."""
    ps = prompts()
    sp = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    assert http("POST", f"{base}/flush_cache?timeout=30")[0] == 200
    outs = gen(base, {"input_ids": ps, "sampling_params": sp, "return_logprob": True})
    replays = gen(base, {"input_ids": [p + o["output_ids"] for p, o in zip(ps, outs)],
                         "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                         "logprob_start_len": [len(p) for p in ps]})
    terms, worst = [], 0.0
    for p, o, r in zip(ps, outs, replays):
        dec = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
        inp = r["meta_info"]["input_token_logprobs"]
        assert len(dec) == new_tokens and len(inp) == new_tokens
        assert inp[0][0] is None and [x[1] for x in inp] == o["output_ids"]
        pre = [x[0] for x in inp]
        terms.append(kl_terms(pre[1:], dec[1:]))
        worst = max(worst, max(abs(a - b) for a, b in zip(pre[1:], dec[1:])))
    return terms, worst


def test_toy_rounding_and_the_two_paths() -> None:
    """bf16/fp16 rounding (nearest, ties to even, one rounding step); DECODE and PREFILL are
    the same function (1e-12) without rules and differ once the stored state is rounded."""
    import math
    import struct
    from sglang_standin import toy

    bf = toy.round_bf16
    assert bf(1.0 + 2 ** -8) == 1.0                       # tie -> even mantissa
    assert bf(1.0 + 3 * 2 ** -8) == 1.0 + 2 ** -6          # tie -> even (upwards)
    assert bf(1.0 + 2 ** -8 + 2 ** -30) == 1.0 + 2 ** -7   # above the tie; via float32 it would be 1.0
    assert bf(-3.140625) == -3.140625 and bf(0.1) == struct.unpack("<f", struct.pack("<I", 0x3DCD0000))[0]
    tiny = 2.0 ** -133                                     # smallest bf16 subnormal
    assert bf(3.5e38) == math.inf and bf(0.6 * tiny) == tiny and bf(0.4 * tiny) == 0.0 and bf(1.5 * tiny) == 2 * tiny
    assert toy.round_fp16(1.0 + 2 ** -11) == 1.0 and toy.round_fp16(1.0 + 3 * 2 ** -11) == 1.0 + 2 ** -9
    assert toy.round_fp16(1e6) == math.inf and toy.round_fp16(0.1) == 0.0999755859375  # 0x2E66

    ids = prompts(1)[0] + prompts(4)[3][:200]
    for numerics, tol in ((toy.Numerics(), 1e-12), (toy.Numerics({"state": "bf16"}), None)):
        model = toy.ToyModel(numerics)
        _, pre = model.prefill(ids, 0, model.initial_state(), want_logits=lambda pos: True)
        state, diffs = model.initial_state(), []
        for t, x in enumerate(ids):
            state, logits = model.decode_step(x, t, state)
            a, b = toy.log_softmax(logits), toy.log_softmax(pre[t])
            diffs.append(max(abs(u - v) for u, v in zip(a, b)))
        if tol is not None:
            assert max(diffs) < tol
        else:
            assert diffs[0] < 1e-12 < diffs[1] and max(diffs[-50:]) > max(diffs[:50])


def test_generate_shapes_logprobs_and_errors(launch) -> None:
    """GenerateReqInput in, {text, output_ids, meta_info} out, as io_struct.py / tokenizer_manager.py
    / the scheduler shape them; ValueErrors are 400 {"error": {"message"}}, bad types 400 ErrorResponse."""
    base = serve(launch)
    assert get_json(f"{base}/server_info")["disable_radix_cache"] is False
    ids = prompts(1)[0]
    sp = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}

    one = gen(base, {"input_ids": ids, "sampling_params": sp})
    assert list(one) == ["text", "output_ids", "meta_info"]
    meta = one["meta_info"]
    assert list(meta)[:5] == ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions"]
    assert meta["finish_reason"] == {"type": "length", "length": 6} and meta["prompt_tokens"] == len(ids)
    assert meta["completion_tokens"] == 6 == len(one["output_ids"]) and meta["weight_version"] == "default"
    assert meta["cached_tokens"] == 0 and meta["cached_tokens_details"] is None
    assert "input_token_logprobs" not in meta and len(one["text"].split()) == 6

    # text: BOS + one id per word; a batch answers a list in order; rid "r" -> r_0, r_1
    txt = gen(base, {"text": "hello toy world", "sampling_params": sp, "return_logprob": True,
                     "logprob_start_len": 0, "return_text_in_logprobs": True, "rid": "single"})
    assert txt["meta_info"]["id"] == "single" and txt["meta_info"]["prompt_tokens"] == 4
    first = txt["meta_info"]["input_token_logprobs"]
    assert first[0] == [None, 0, "<s>"] and all(isinstance(x[0], float) and x[0] < 0 for x in first[1:])
    batch = gen(base, {"text": ["hello toy world", "x"], "sampling_params": sp, "rid": "r"})
    assert [b["meta_info"]["id"] for b in batch] == ["r_0", "r_1"]
    assert batch[0]["output_ids"] == txt["output_ids"] and batch[1]["meta_info"]["prompt_tokens"] == 2
    ibatch = gen(base, {"input_ids": [ids, ids[:5]], "sampling_params": [sp, {**sp, "max_new_tokens": 2}]})
    assert ibatch[0]["output_ids"] == one["output_ids"] and len(ibatch[1]["output_ids"]) == 2
    both = gen(base, {"text": "a b c d e f g", "input_ids": ids, "sampling_params": sp})  # upstream: ids win
    assert both["meta_info"]["prompt_tokens"] == len(ids) and both["output_ids"] == one["output_ids"]

    # logprob_start_len: -1 (default) -> no input logprobs; k -> prompt positions k.., first None
    def lp(**kw: Any) -> dict:
        return gen(base, {"input_ids": ids, "sampling_params": sp, "return_logprob": True, **kw})["meta_info"]

    default = lp()
    assert default["input_token_logprobs"] == [] and default["output_token_logprobs_length"] == 6
    out_lp = default["output_token_logprobs"]
    assert [x[1] for x in out_lp] == one["output_ids"] and all(x[2] is None for x in out_lp)
    full = lp(logprob_start_len=0)["input_token_logprobs"]
    assert [x[1] for x in full] == ids and full[0][0] is None and len(full) == len(ids)
    part = lp(logprob_start_len=30)["input_token_logprobs"]
    assert [x[1] for x in part] == ids[30:] and part[0][0] is None
    assert [x[0] for x in part[1:]] == [x[0] for x in full[31:]]   # same numbers, other window
    assert lp(logprob_start_len=len(ids))["input_token_logprobs"] == []
    assert "input_token_logprobs" not in gen(base, {"input_ids": ids, "sampling_params": sp,
                                                    "logprob_start_len": 3})["meta_info"]

    # top logprobs: [None, [[lp, id, text|None] * N], ...]; the greedy token is the top one
    top = lp(logprob_start_len=35, top_logprobs_num=3)
    assert top["input_top_logprobs"][0] is None and len(top["input_top_logprobs"]) == len(ids) - 35
    for row in top["input_top_logprobs"][1:] + top["output_top_logprobs"]:
        assert len(row) == 3 and row[0][0] >= row[1][0] >= row[2][0] and row[0][2] is None
    assert [r[0][1] for r in top["output_top_logprobs"]] == one["output_ids"]
    assert [r[0][0] for r in top["output_top_logprobs"]] == [x[0] for x in out_lp]
    for (value, token, _), row in zip(top["input_token_logprobs"][1:], top["input_top_logprobs"][1:]):
        assert value <= row[0][0]                      # nothing beats the top-1 at that position
        assert all(v == value for v, t, _ in row if t == token)

    # finish reasons: EOS (id 1) unless ignore_eos, stop_token_ids, max_new_tokens=0
    eos = gen(base, {"input_ids": ids, "sampling_params": {"max_new_tokens": 5, "logit_bias": {"1": 100.0}}})
    assert eos["output_ids"] == [1] and eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": 1}
    assert eos["text"] == ""
    no_eos = gen(base, {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True,
                                                              "logit_bias": {"1": 100.0}}})
    assert no_eos["output_ids"] == [1, 1, 1] and no_eos["meta_info"]["finish_reason"]["type"] == "length"
    stop_at = one["output_ids"][2]
    cut = one["output_ids"].index(stop_at) + 1
    stopped = gen(base, {"input_ids": ids, "sampling_params": {**sp, "ignore_eos": False,
                                                               "stop_token_ids": [stop_at]}})
    assert stopped["output_ids"] == one["output_ids"][:cut]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    prefill_only = gen(base, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True})
    assert prefill_only["output_ids"] == [] and prefill_only["meta_info"]["finish_reason"] == {
        "type": "length", "length": 0}
    assert prefill_only["meta_info"]["output_token_logprobs"] == []

    # stream: cumulative chunks, the last one finished, then [DONE]
    status, raw = http("POST", f"{base}/generate", {"input_ids": ids, "sampling_params": sp, "stream": True})
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]" and len(events) == 7
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["output_ids"] for c in chunks] == [one["output_ids"][:k] for k in range(1, 7)]
    assert chunks[0]["meta_info"]["finish_reason"] is None and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"

    # errors
    def err(body: dict) -> str:
        return gen(base, body, status=400)["error"]["message"]

    assert err({"sampling_params": sp}) == "Either text, input_ids or input_embeds should be provided."
    assert err({"input_ids": []}) == "input_ids cannot be empty."
    assert err({"text": "x", "sampling_params": {"max_new_tokens": -1}}) == "max_new_tokens must be at least 0, got -1."
    assert err({"text": "x", "sampling_params": {"top_p": 1.5}}) == "top_p must be in (0, 1], got 1.5."
    assert err({"input_ids": ids, "return_logprob": True, "logprob_start_len": 99}).startswith(
        f"req.logprob_start_len=99 is higher than the number of input tokens len(req.origin_input_ids)={len(ids)}")
    assert err({"text": ["a", "b"], "rid": ["same", "same"]}) == \
        "Duplicate request IDs detected within the request: ['same']"
    assert "outside the toy vocabulary" in err({"input_ids": [0, 500]})
    for bad in ({"text": 5}, {"input_ids": [1, "2"]}, {"text": "x", "return_logprob": "yes"},
                {"text": "x", "sampling_params": [1]}):
        shape = gen(base, bad, status=400)
        assert shape["object"] == "error" and shape["type"] == "Bad Request" and shape["code"] == 400, bad
    req = urllib.request.Request(f"{base}/generate", data=b"{not json", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as bad_json:
        urllib.request.urlopen(req, timeout=10)
    assert bad_json.value.code == 400 and json.loads(bad_json.value.read())["type"] == "Bad Request"


def test_generate_is_reproducible_and_uses_a_prefix_cache(launch) -> None:
    """Same request -> same ids and logprobs; greedy and sampling_seed reproducible; the
    radix-like cache reuses a stored prefill state at a chunk boundary (cached_tokens, same
    numbers), /flush_cache (ADMIN_OPTIONAL: the admin key) clears it; --disable-radix-cache."""
    base = serve(launch, "--api-key", SECRET, "--admin-api-key", "sk-admin")
    user, admin = {"Authorization": f"Bearer {SECRET}"}, {"Authorization": "Bearer sk-admin"}
    ids = prompts(4)[2]                     # 201 tokens: chunk boundaries at 64, 128, 192
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 32},
            "return_logprob": True, "logprob_start_len": 150, "top_logprobs_num": 2}
    assert gen(base, body, status=401)["error"] == "Unauthorized"
    a, b = gen(base, body, headers=user), gen(base, body, headers=user)
    assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) == 32
    for key in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
        assert a["meta_info"][key] == b["meta_info"][key], key
    assert a["meta_info"]["cached_tokens"] == 0
    assert b["meta_info"]["cached_tokens"] == 128   # longest boundary <= logprob_start_len
    assert b["meta_info"]["cached_tokens_details"] == {"device": 128, "host": 0}

    assert http("POST", f"{base}/flush_cache", headers=user)[0] == 401  # admin key required
    status, raw = http("POST", f"{base}/flush_cache", headers=admin)
    assert status == 200 and raw.decode().startswith("Cache flushed.\nPlease check backend logs")
    assert gen(base, body, headers=user)["meta_info"]["cached_tokens"] == 0
    assert http("GET", f"{base}/flush_cache?timeout=-1", headers=admin)[0] == 400

    def sample(seed: int | None, temperature: float = 1.0) -> list[int]:
        sp = {"temperature": temperature, "max_new_tokens": 24, "ignore_eos": True}
        if seed is not None:
            sp["sampling_seed"] = seed
        return gen(base, {"input_ids": ids[:20], "sampling_params": sp}, headers=user)["output_ids"]

    greedy = sample(None, 0.0)
    assert greedy == sample(None, 0.0) == sample(7, 0.0)  # temperature 0: greedy, the seed is moot
    s7 = sample(7)
    assert s7 == sample(7) and s7 != sample(8) and s7 != sample(None, 0.0)

    nocache = serve(launch, "--disable-radix-cache")
    assert get_json(f"{nocache}/server_info")["disable_radix_cache"] is True
    c1, c2 = gen(nocache, body), gen(nocache, body)
    assert c1["meta_info"]["cached_tokens"] == c2["meta_info"]["cached_tokens"] == 0
    assert c1["output_ids"] == c2["output_ids"] == a["output_ids"]


def test_replay_matches_decode_without_precision_rules(launch) -> None:
    """kl_test_utils' method on the stand-in: without rules the prefill logprobs of the
    output tokens equal the decode logprobs (different summation order only)."""
    terms, worst = drift(serve(launch))
    assert worst < 1e-9
    assert max(max(t) for t in terms) < 1e-18


def test_bf16_state_rule_makes_prefill_and_decode_drift(launch, tmp_path: Path) -> None:
    """A bf16 rule on the carried state (held: the file contains the text) rounds it every
    decode token but once per prefill chunk: exp(r)-1-r is far above the no-rule value and
    grows with the position in the output, as with reduced-precision KV."""
    rules = tmp_path / "numerics.json"
    rules.write_text(json.dumps([
        {"op": "state", "precision": "bf16", "file": "srt/layers/logits_processor.py",
         "contains": "def process_input_logprobs"},
    ]))
    clean = serve(launch)
    ruled = serve(launch, env={"STANDIN_NUMERICS_RULES": str(rules)})
    base_terms, _ = drift(clean)
    terms, worst = drift(ruled)
    flat = [x for t in terms for x in t]
    base_flat = [x for t in base_terms for x in t]
    mean, base_mean = sum(flat) / len(flat), sum(base_flat) / len(base_flat)
    assert mean > 1e-6 and mean > 100 * base_mean and 1e-3 < worst < 1.0

    def quarter(q: int) -> float:  # mean over the prompts of the q-th quarter of output positions
        return sum(sum(t[q * len(t) // 4:(q + 1) * len(t) // 4]) / (len(t) // 4) for t in terms) / len(terms)

    assert quarter(3) > 10 * quarter(0) and quarter(2) + quarter(3) > 5 * (quarter(0) + quarter(1))


def test_numerics_rules_need_every_condition(launch, tmp_path: Path) -> None:
    """A rule holds only when each condition it names holds: an env-gated "mix" rule takes
    effect with the variable set, a file rule whose text is not in the tree never does."""
    rules = tmp_path / "numerics.json"
    rules.write_text(json.dumps([
        {"op": "mix", "precision": "bf16", "env": "STANDIN_TEST_MIX", "equals": "1"},
        {"op": "state", "precision": "bf16", "file": "srt/layers/logits_processor.py",
         "contains": "this text is not in the tree"},
    ]))
    on = serve(launch, env={"STANDIN_NUMERICS_RULES": str(rules), "STANDIN_TEST_MIX": "1"})
    off = serve(launch, env={"STANDIN_NUMERICS_RULES": str(rules), "STANDIN_TEST_MIX": "0"})
    on_terms, _ = drift(on, new_tokens=128)
    off_terms, off_worst = drift(off, new_tokens=128)
    assert off_worst < 1e-9
    on_mean = sum(map(sum, on_terms)) / sum(map(len, on_terms))
    off_mean = sum(map(sum, off_terms)) / sum(map(len, off_terms))
    assert on_mean > 1e-9 and on_mean > 100 * off_mean


def test_nondeterminism_knob(launch) -> None:
    """STANDIN_NONDETERMINISM=EPS: two identical prefills differ slightly; EPS=0: bitwise equal."""
    body = {"input_ids": prompts(4)[3], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "logprob_start_len": 0}

    def logprobs(base: str) -> list[float]:
        return [x[0] for x in gen(base, body)["meta_info"]["input_token_logprobs"][1:]]

    noisy = serve(launch, env={"STANDIN_NONDETERMINISM": "1e-6"})
    calm = serve(launch)
    a, b = logprobs(noisy), logprobs(noisy)
    diff = max(abs(x - y) for x, y in zip(a, b))
    assert 0 < diff < 1e-3
    c, d = logprobs(calm), logprobs(calm)
    assert c == d and max(abs(x - y) for x, y in zip(a, c)) < 1e-3


@pytest.mark.parametrize("env, message", [
    ({"rules": [{"op": "state", "precision": "bf8"}]}, "unknown precision 'bf8'"),
    ({"rules": [{"op": "kv", "precision": "bf16", "env": "NEVER_SET", "equals": "1"}]}, "unknown op 'kv'"),
    ({"STANDIN_NONDETERMINISM": "lots"}, "STANDIN_NONDETERMINISM: not a number: 'lots'"),
])
def test_bad_numerics_knobs_are_startup_errors(venv_python: str, tmp_path: Path, env: dict, message: str) -> None:
    environ = {"PATH": os.environ["PATH"]}
    if "rules" in env:
        (tmp_path / "rules.json").write_text(json.dumps(env.pop("rules")))
        environ["STANDIN_NUMERICS_RULES"] = str(tmp_path / "rules.json")
    res = subprocess.run([venv_python, "-m", "sglang.launch_server", "--model-path", MODEL, "--port",
                          str(free_port())], capture_output=True, text=True, timeout=30, cwd="/",
                         env={**environ, **env})
    assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.startswith("stand-in:")]) == 1


# ---------------------------------------------------------------- where the forwards run


# A stand-in for patchset's tracer (no patchset code): a sitecustomize on the servers'
# PYTHONPATH whose meta-path finder wraps the loaders of the watched modules, records each
# ModelRunner.forward that returns (pid, forward_mode.name, is_draft_worker) and each call
# of the watched served-tree functions (pid, qualname), one line each, in $OBSERVE_LOG.
OBSERVER = r"""
import functools, importlib.abc, os, sys

LOG = os.environ.get("OBSERVE_LOG")
WATCH = {
    "sglang.srt.model_executor.model_runner": ["ModelRunner.forward"],
    "sglang.srt.model_executor.cuda_graph_config": ["default_cuda_graph_config", "PhaseConfig.__repr__"],
    "sglang.srt.environ": ["EnvField.is_set"],
}


def record(line):
    with open(LOG, "a") as fh:
        fh.write(f"{os.getpid()} {line}\n")


def wrap(owner, name, qualname):
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        out = fn(*args, **kwargs)
        if qualname == "ModelRunner.forward":
            record(f"forward {args[1].forward_mode.name} {args[0].is_draft_worker}")
        else:
            record(f"call {qualname}")
        return out

    setattr(owner, name, inner)


class Loader:
    def __init__(self, loader, name):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for qualname in WATCH[self.name]:
            *path, last = qualname.split(".")
            owner = module
            for part in path:
                owner = getattr(owner, part)
            wrap(owner, last, qualname)


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in WATCH:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                assert hasattr(spec.loader, "exec_module"), name
                spec.loader = Loader(spec.loader, name)
                return spec
        return None


if LOG:
    sys.meta_path.insert(0, Finder())
"""

# Standard-library-only served-tree code, one target form each (func, obj.attr.method, Class.method)
DECODE_HOOK = "sglang.srt.model_executor.cuda_graph_config:default_cuda_graph_config"
EXTEND_HOOK = "sglang.srt.environ:envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.is_set"
ANY_HOOK = "sglang.srt.model_executor.cuda_graph_config:PhaseConfig.__repr__"
RAISES = "sglang.srt.environ:envs.SGLANG_OPT_USE_TILELANG_MHC_PRE.__bool__"  # EnvField.__bool__ raises


class Observed:
    """The observer's log of one server: what each process ran since the last look."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.seen = 0

    def new(self) -> list[tuple[int, str, str]]:
        """(pid, "forward" | "call", detail) lines written since the last call (a forward's
        line is written before its scheduler answers, so before the HTTP answer)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        fresh, self.seen = lines[self.seen:], len(lines)
        return [(int(pid), kind, detail) for pid, kind, detail in (line.split(" ", 2) for line in fresh)]


def observed_server(launch, tmp_path: Path, *args: str, env: dict | None = None,
                    hooks: list | None = None) -> tuple[str, Running, Observed]:
    """A server with the observer on its PYTHONPATH (and *hooks* as STANDIN_FORWARD_HOOKS)."""
    obs = tmp_path / f"observer{len(list(tmp_path.glob('observer*')))}"
    obs.mkdir()
    (obs / "sitecustomize.py").write_text(OBSERVER)
    environ = {"PYTHONPATH": str(obs), "OBSERVE_LOG": str(obs / "log"), **(env or {})}
    if hooks is not None:
        (obs / "hooks.json").write_text(json.dumps(hooks))
        environ["STANDIN_FORWARD_HOOKS"] = str(obs / "hooks.json")
    port = free_port()
    run = launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port), *args, env=environ,
                 wait=f"http://127.0.0.1:{port}/health")
    return f"http://127.0.0.1:{port}", run, Observed(obs / "log")


def forwards(lines: list[tuple[int, str, str]], pid: int) -> list[str]:
    return [detail for p, kind, detail in lines if p == pid and kind == "forward"]


def calls(lines: list[tuple[int, str, str]], pid: int, qualname: str) -> int:
    return sum(1 for p, kind, detail in lines if p == pid and kind == "call" and detail == qualname)


def test_forward_modes_match_the_pinned_source(tree: Path) -> None:
    """The stand-in's ForwardMode has the pinned members, names and values, and its
    ModelRunner.forward the pinned signature (parsed from the tree, not imported)."""
    from sglang_standin.forward_batch_info import ForwardMode

    src = ast.parse((tree / "python/sglang/srt/model_executor/forward_batch_info.py").read_text())
    cls = next(n for n in src.body if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")
    pinned = [s.targets[0].id for s in cls.body if isinstance(s, ast.Assign) and ast.unparse(s.value) == "auto()"]
    assert [(m.name, m.value) for m in ForwardMode] == [(name, i) for i, name in enumerate(pinned, 1)]
    assert pinned[:2] == ["EXTEND", "DECODE"] and len(pinned) == 9
    assert [m.name for m in ForwardMode if m.is_extend()] == ["EXTEND", "MIXED", "TARGET_VERIFY", "SPLIT_PREFILL",
                                                             "DLLM_EXTEND"]

    def forward_args(path: Path) -> list[tuple[str, str | None]]:
        mod = ast.parse(path.read_text())
        fn = derive.find_funcdef(mod, "forward", within="ModelRunner")
        defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + [ast.unparse(d) for d in fn.args.defaults]
        return [(a.arg, d) for a, d in zip(fn.args.args, defaults)]

    ours = forward_args(PAYLOAD / "sglang_standin/model_runner.py")
    assert ours == forward_args(tree / "python/sglang/srt/model_executor/model_runner.py")
    assert ours[0] == ("self", None) and ours[1] == ("forward_batch", None) and len(ours) == 6


def test_the_scheduler_runs_every_forward(launch, tmp_path: Path) -> None:
    """Each TP rank's scheduler child -- never the main process -- runs ModelRunner.forward:
    EXTEND per prefill chunk (64 tokens), DECODE per decode step, with the hooks of each mode;
    the startup warmup and every health check run theirs (as 0.5.14's http_server.py does); a
    cached prefix skips its chunks until /flush_cache; a 400 runs none.  The answers are the
    toy model's, bit for bit."""
    from sglang_standin import toy

    hooks = [{"mode": "decode", "call": DECODE_HOOK}, {"mode": "extend", "call": EXTEND_HOOK},
             {"mode": "any", "call": ANY_HOOK}]
    base, run, seen = observed_server(launch, tmp_path, "--tp-size", "2", hooks=hooks)
    kids = engine_children(run.proc.pid)
    ranks = [kids["sglang::scheduler_TP0"], kids["sglang::scheduler_TP1"]]
    start = seen.new()
    assert {p for p, _, _ in start} == set(ranks)      # nothing in the main process or the detokenizer
    for pid in ranks:  # warmup: "The capital city of France is" + BOS, 8 tokens; then one /health
        assert forwards(start, pid) == ["EXTEND False"] + ["DECODE False"] * 7 + ["EXTEND False"]
        assert calls(start, pid, "EnvField.is_set") == 2 and calls(start, pid, "default_cuda_graph_config") == 7

    ids = prompts(4)[2]                                # 201 tokens: chunks of 64, 64, 64, 9
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 7, "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 150}
    first = gen(base, body)
    lines = seen.new()
    for pid in ranks:
        assert forwards(lines, pid) == ["EXTEND False"] * 4 + ["DECODE False"] * 6
        assert calls(lines, pid, "EnvField.is_set") == 4 and calls(lines, pid, "default_cuda_graph_config") == 6
        assert calls(lines, pid, "PhaseConfig.__repr__") == 10
    assert {p for p, _, _ in lines} == set(ranks)

    want = toy.Runner().run(toy.Request(input_ids=ids, max_new_tokens=7, top_k=1, ignore_eos=True,
                                        return_logprob=True, logprob_start_len=150))
    assert first["output_ids"] == want.output_ids
    assert [x[0] for x in first["meta_info"]["output_token_logprobs"]] == [v for v, _ in want.output_token_logprobs]
    assert [x[0] for x in first["meta_info"]["input_token_logprobs"]] == [v for v, _ in want.input_token_logprobs]

    again = gen(base, body)                            # the scheduler's cache: 128 of 150 cached
    assert again["meta_info"]["cached_tokens"] == 128 and again["output_ids"] == first["output_ids"]
    assert forwards(seen.new(), ranks[0]) == ["EXTEND False"] * 2 + ["DECODE False"] * 6
    assert http("POST", f"{base}/flush_cache")[0] == 200 and seen.new() == []
    assert gen(base, body)["meta_info"]["cached_tokens"] == 0
    assert forwards(seen.new(), ranks[1]) == ["EXTEND False"] * 4 + ["DECODE False"] * 6

    gen(base, {"input_ids": ids, "sampling_params": {"top_p": 1.5}}, status=400)    # SamplingParams
    gen(base, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 999}, status=400)
    gen(base, {"text": 5}, status=400)                                            # validation
    assert seen.new() == []

    assert http("GET", f"{base}/health")[0] == 200 and http("GET", f"{base}/health_generate")[0] == 200
    lines = seen.new()
    assert forwards(lines, ranks[0]) == forwards(lines, ranks[1]) == ["EXTEND False"] * 2

    ask(base, [{"role": "user", "content": "one two three"}], max_tokens=3)       # prefill + 2 steps
    assert forwards(seen.new(), ranks[0]) == ["EXTEND False"] + ["DECODE False"] * 2


def test_pd_splits_the_forwards_between_prefill_and_decode(launch, tmp_path: Path) -> None:
    """P/D: the prefill's scheduler runs the EXTEND forwards, the decode's the DECODE ones --
    for the warmup (fake bootstrap host: 1 EXTEND there, 7 DECODE here, before any request),
    for /generate and for chat through the router; a health check runs one EXTEND on the
    prefill and none on the decode (its one token comes with the fake hand-over)."""
    b = free_port()
    prefill, prun, pseen = observed_server(launch, tmp_path, "--disaggregation-mode", "prefill",
                                           "--disaggregation-bootstrap-port", str(b))
    decode, drun, dseen = observed_server(launch, tmp_path, "--disaggregation-mode", "decode")
    r = free_port()
    router = f"http://127.0.0.1:{r}"
    launch("sglang_router.launch_router", "--pd-disaggregation", "--prefill", prefill, str(b), "--decode", decode,
           "--host", "127.0.0.1", "--port", str(r), wait=f"{router}/health")
    [p_sched] = [pid for t, pid in engine_children(prun.proc.pid).items() if t.startswith("sglang::scheduler")]
    [d_sched] = [pid for t, pid in engine_children(drun.proc.pid).items() if t.startswith("sglang::scheduler")]

    def split() -> tuple[list[str], list[str]]:
        p_lines, d_lines = pseen.new(), dseen.new()
        assert {pid for pid, _, _ in p_lines} <= {p_sched} and {pid for pid, _, _ in d_lines} <= {d_sched}
        return forwards(p_lines, p_sched), forwards(d_lines, d_sched)

    # warmup, then the launch's /health polls (one 200 each) and the router's /health (one each)
    assert split() == (["EXTEND False"] * 3, ["DECODE False"] * 7)
    ids = prompts(2)[1]                                  # 121 tokens: 2 chunks
    out = gen(router, {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 5}})
    assert len(out["output_ids"]) == 5 and split() == (["EXTEND False"] * 2, ["DECODE False"] * 4)
    ask(router, [{"role": "user", "content": "one two three"}], max_tokens=3)
    assert split() == (["EXTEND False"], ["DECODE False"] * 2)
    assert http("GET", f"{prefill}/health")[0] == http("GET", f"{decode}/health")[0] == 200
    assert split() == (["EXTEND False"], [])


def test_a_failing_forward_is_a_500_and_health_follows_the_pinned_route(launch, tmp_path: Path) -> None:
    """A hook that raises in DECODE forwards fails exactly the requests that decode (500;
    the scheduler lives on), a one-token request runs no decode step and succeeds.  With
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION off, /health runs no forward, /health_generate
    still does; --skip-server-warmup: none at startup."""
    base, run, seen = observed_server(
        launch, tmp_path, "--skip-server-warmup", hooks=[{"mode": "decode", "call": RAISES}],
        env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"})
    [sched] = [pid for title, pid in engine_children(run.proc.pid).items() if title.startswith("sglang::scheduler")]
    assert seen.new() == []
    assert http("GET", f"{base}/health")[0] == 200 and seen.new() == []
    assert http("GET", f"{base}/health_generate")[0] == 200
    assert forwards(seen.new(), sched) == ["EXTEND False"]

    ids = prompts(1)[0]
    one = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}
    assert len(gen(base, one)["output_ids"]) == 1
    failed = gen(base, {**one, "sampling_params": {"temperature": 0, "max_new_tokens": 3}}, status=500)
    assert "Please use `envs.YOUR_FLAG.get()`" in failed["message"] and failed["code"] == 500
    status, raw = http("POST", f"{base}/generate", {**one, "sampling_params": {"max_new_tokens": 3}, "stream": True})
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
    assert status == 200 and events[-1]["error"]["code"] == 500
    assert forwards(seen.new(), sched) == ["EXTEND False"] * 3   # the DECODE forwards raised: none returned
    assert len(gen(base, one)["output_ids"]) == 1 and alive(sched)


def test_a_hung_scheduler_is_a_500_not_a_hang(launch) -> None:
    """A scheduler that does not answer within --watchdog-timeout: the request gets a 500;
    once it runs again, its late answer is dropped and the next request is answered."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port), "--watchdog-timeout", "2",
                 wait=f"{base}/health")
    [sched] = [pid for title, pid in engine_children(run.proc.pid).items() if title.startswith("sglang::scheduler")]
    body = {"input_ids": prompts(1)[0], "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    want = gen(base, body)["output_ids"]
    os.kill(sched, signal.SIGSTOP)
    try:
        started = time.monotonic()
        failed = gen(base, body, status=500)
        assert "did not answer run within 2s" in failed["message"] and time.monotonic() - started < 10
    finally:
        os.kill(sched, signal.SIGCONT)
    assert gen(base, body)["output_ids"] == want


@pytest.mark.parametrize("hooks, message", [
    ([{"mode": "prefill", "call": EXTEND_HOOK}], "hook 0: unknown mode 'prefill' (extend | decode | any)"),
    ([{"mode": "any", "call": "os:getcwd"}], "hook 0: call 'os:getcwd' is not sglang.srt.MODULE:QUALNAME"),
    ([{"mode": "any", "call": EXTEND_HOOK, "when": "always"}], "hook 0: must be an object with exactly"),
    ({"mode": "any", "call": EXTEND_HOOK}, "must be a JSON list of objects"),
    ("[{", "STANDIN_FORWARD_HOOKS: "),
])
def test_bad_forward_hooks_are_startup_errors(venv_python: str, tmp_path: Path, hooks: Any, message: str) -> None:
    path = tmp_path / "hooks.json"
    path.write_text(hooks if isinstance(hooks, str) else json.dumps(hooks))
    res = subprocess.run([venv_python, "-m", "sglang.launch_server", "--model-path", MODEL, "--port",
                          str(free_port())], capture_output=True, text=True, timeout=30, cwd="/",
                         env={"PATH": os.environ["PATH"], "STANDIN_FORWARD_HOOKS": str(path)})
    assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------------------- /generate through the P/D router


def pd_stack(launch, decode_envs: tuple = (None,)) -> tuple[list[str], str, list[str], int]:
    """One prefill, a decode server per entry of *decode_envs* (its environment) and a router
    over the prefill and each decode: (router URLs, prefill URL, decode URLs, bootstrap port)."""
    p, b = free_port(), free_port()
    launch("sglang.launch_server", "--model-path", MODEL, "--port", str(p), "--disaggregation-mode", "prefill",
           "--disaggregation-bootstrap-port", str(b), wait=f"http://127.0.0.1:{p}/health")
    routers, decode_urls = [], []
    for env in decode_envs:
        d, r = free_port(), free_port()
        launch("sglang.launch_server", "--model-path", MODEL, "--port", str(d), "--disaggregation-mode", "decode",
               env=env, wait=f"http://127.0.0.1:{d}/health")
        launch("sglang_router.launch_router", "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{p}", str(b),
               "--decode", f"http://127.0.0.1:{d}", "--host", "127.0.0.1", "--port", str(r),
               wait=f"http://127.0.0.1:{r}/health")
        routers.append(f"http://127.0.0.1:{r}")
        decode_urls.append(f"http://127.0.0.1:{d}")
    return routers, f"http://127.0.0.1:{p}", decode_urls, b


def probe_through(base: str, texts: list[str], new_tokens: int = 256) -> tuple[list[list[float]], float, float]:
    """isolate/measure/drift.py's requests (measure, generate, replay): flush; generate from text with
    sampling and logprobs from 0 (the prompt's ids from input_token_logprobs, the decode's
    logprobs from output_token_logprobs); flush; replay prompt + output with
    max_new_tokens=0 and logprob_start_len=len(prompt)-1.  Per sequence the exp(r)-1-r terms
    of every output token, the largest |prefill - decode| over tokens 1.., and over token 0."""
    assert http("POST", f"{base}/flush_cache", {})[0] == 200
    seqs = []
    for text in texts:
        out = gen(base, {"text": text, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1,
                         "return_text_in_logprobs": False,
                         "sampling_params": {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True,
                                             "sampling_seed": 0}})
        meta = out["meta_info"]
        seqs.append(([e[1] for e in meta["input_token_logprobs"]], out["output_ids"],
                     [e[0] for e in meta["output_token_logprobs"]]))
    assert http("POST", f"{base}/flush_cache", {})[0] == 200
    terms, worst, first = [], 0.0, 0.0
    for prompt, output, dec in seqs:
        assert len(output) == len(dec) == new_tokens and prompt[0] == 0
        replay = gen(base, {"input_ids": prompt + output, "return_logprob": True,
                            "logprob_start_len": len(prompt) - 1, "top_logprobs_num": 1,
                            "return_text_in_logprobs": False, "sampling_params": {"max_new_tokens": 0}})
        entries = replay["meta_info"]["input_token_logprobs"][-len(output):]
        assert [e[1] for e in entries] == output
        pre = [e[0] for e in entries]
        terms.append(kl_terms(pre, dec))
        worst = max(worst, max(abs(a - b) for a, b in zip(pre[1:], dec[1:])))
        first = max(first, abs(pre[0] - dec[0]))
    return terms, worst, first


def prompt_texts(n: int = 4) -> list[str]:
    from sglang_standin import toy
    return [toy.tokenizer().decode(p[1:]) for p in prompts(n)]


def test_router_generate_in_pd_answers_as_a_single_server(launch) -> None:
    """/generate through the router: the decode's answer with the prefill's input logprobs put in
    front (merge_logprobs_in_json), the same keys, tokens and numbers as one server answers
    (the first output logprob float32, as the metadata buffer carries it); a batch gets one room
    per item and is not merged; a stream is relayed; max_new_tokens=0 answers as upstream's
    decode does; errors come back in the router's error shape; the prefill's own answer and its
    hand-over; /flush_cache reaches every worker."""
    import struct
    (router,), prefill, (decode,), bport = pd_stack(launch)
    direct = serve(launch)
    fp32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # noqa: E731
    ids = prompts(2)[1]
    sp = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": sp, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 2}
    a, b = gen(router, body), gen(direct, body)
    assert list(a) == list(b) == ["text", "output_ids", "meta_info"] and list(a["meta_info"]) == list(b["meta_info"])
    ma, mb = a["meta_info"], b["meta_info"]
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"] and len(a["output_ids"]) == 8
    for key in ("finish_reason", "prompt_tokens", "completion_tokens", "output_token_logprobs_length"):
        assert ma[key] == mb[key], key
    assert ma["input_token_logprobs"] == mb["input_token_logprobs"]          # the prefill's, merged in
    out_a, out_b = ma["output_token_logprobs"], mb["output_token_logprobs"]
    assert out_a[0] == [fp32(out_b[0][0]), *out_b[0][1:]] and out_a[1:] == out_b[1:]
    assert ma["input_top_logprobs"] == [] and len(mb["input_top_logprobs"]) == len(ids)  # decode sends none
    assert [r[0][1] for r in ma["output_top_logprobs"]] == a["output_ids"]

    # the drift probe's generate (text, sampling with a seed): the same tokens as one server
    text = {"text": prompt_texts(1)[0], "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": 3}}
    ta, tb = gen(router, text), gen(direct, text)
    assert ta["output_ids"] == tb["output_ids"] and ta["meta_info"]["prompt_tokens"] == 38
    assert [e[1] for e in ta["meta_info"]["input_token_logprobs"]] == prompts(1)[0]

    # max_new_tokens=0 (the replay): the decode finishes on the prefill's first token with
    # finished_len 0 -- no output ids, that token's logprob kept (output_streamer.py)
    replay = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_logprob": True,
              "logprob_start_len": 30}
    ra, rb = gen(router, replay), gen(direct, replay)
    assert ra["output_ids"] == rb["output_ids"] == [] and ra["text"] == ""
    assert ra["meta_info"]["finish_reason"] == rb["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert ra["meta_info"]["input_token_logprobs"] == rb["meta_info"]["input_token_logprobs"]
    assert rb["meta_info"]["output_token_logprobs"] == [] and len(ra["meta_info"]["output_token_logprobs"]) == 1
    assert ra["meta_info"]["output_token_logprobs"][0][1] == out_b[0][1] and ra["meta_info"]["completion_tokens"] == 0

    # batches: input_ids lists get a room each, a text batch one room (r, r+1 on the servers);
    # a JSON list is not merged by the router (its merge reads one object's meta_info)
    for batch in ({"input_ids": [ids, prompts(1)[0]]}, {"text": ["hello toy world", "x y"]}):
        bb = {**batch, "sampling_params": sp, "return_logprob": True, "logprob_start_len": 0}
        pa, pb = gen(router, bb), gen(direct, bb)
        assert [x["output_ids"] for x in pa] == [x["output_ids"] for x in pb] and len(pa) == 2
        assert all(x["meta_info"]["input_token_logprobs"] == [] for x in pa)

    # stream: the decode's chunks relayed as they come
    status, raw = http("POST", f"{router}/generate", {"input_ids": ids, "sampling_params": sp, "stream": True})
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]" and len(events) == 9
    assert [json.loads(e)["output_ids"] for e in events[:-1]] == [a["output_ids"][:k] for k in range(1, 9)]

    # errors: both servers refuse, the router answers the decode's in its shape
    bad = gen(router, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 999}, status=400)
    assert bad["error"]["code"] == "decode_bad_request" and bad["error"]["type"] == "bad_request"
    assert bad["error"]["message"].startswith("req.logprob_start_len=999 is higher than")
    assert gen(router, {"input_ids": ids, "sampling_params": {"n": 2}}, status=400)["error"]["message"].startswith(
        "stand-in: parallel sampling (n > 1) with P/D bootstrap fields")

    # the prefill's own answer: one token, FINISH_LENGTH(length=0), answered once the "decode"
    # (here: this test) has taken the hand-over from the bootstrap port
    room = 4242
    got: dict = {}
    import threading
    t = threading.Thread(target=lambda: got.update(answer=gen(prefill, {
        **body, "bootstrap_host": "127.0.0.1", "bootstrap_port": bport, "bootstrap_room": room})))
    t.start()
    deadline = time.monotonic() + 10
    while True:
        status, raw = http("GET", f"http://127.0.0.1:{bport}/standin/kv/{room}")
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    t.join(10)
    hand = json.loads(raw)
    assert status == 200 and hand["output_id"] == a["output_ids"][0] and len(hand["S"]) == 12
    assert hand["output_token_logprob"] == out_a[0][0] and hand["cached_tokens"] == got["answer"]["meta_info"][
        "cached_tokens"]
    pa = got["answer"]
    assert pa["output_ids"] == a["output_ids"][:1] and pa["meta_info"]["finish_reason"] == {"type": "length",
                                                                                           "length": 0}
    assert pa["meta_info"]["input_token_logprobs"] == mb["input_token_logprobs"]
    assert pa["meta_info"]["output_token_logprobs"] == out_b[:1] and pa["meta_info"]["completion_tokens"] == 1

    # /flush_cache: POST to every worker; the prefill's prefix cache is cleared through the router
    plain = {"input_ids": ids, "sampling_params": sp}   # no input logprobs: the prefix cache may serve it
    for base in (router, decode):                        # decode: answered directly, from its own cache
        gen(base, plain)
        assert gen(base, plain)["meta_info"]["cached_tokens"] == 64        # router: the prefill's, via metadata
    status, raw = http("POST", f"{router}/flush_cache", {})
    assert status == 200 and json.loads(raw) == {
        "status": "success", "message": "Successfully flushed cache on all 2 HTTP workers",
        "workers_flushed": 2, "total_http_workers": 2, "total_workers": 2}
    assert gen(router, plain)["meta_info"]["cached_tokens"] == gen(decode, plain)["meta_info"]["cached_tokens"] == 0
    assert http("GET", f"{router}/flush_cache")[0] == 405   # an admin POST route, as upstream
    r2, gone = free_port(), f"http://127.0.0.1:{free_port()}"
    launch("sglang_router.launch_router", "--pd-disaggregation", "--prefill", prefill, str(bport),
           "--decode", gone, "--host", "127.0.0.1", "--port", str(r2))
    wait_status(f"http://127.0.0.1:{r2}/health", 503)
    status, raw = http("POST", f"http://127.0.0.1:{r2}/flush_cache", {})
    partial = json.loads(raw)
    assert status == 206 and partial["status"] == "partial_success" and partial["successful"] == [prefill]
    assert [f["worker"] for f in partial["failed"]] == [gone] and partial["workers_flushed"] == 1


def test_router_pd_replay_matches_decode_without_rules(launch) -> None:
    """The drift probe's method through the router: the replay runs on the prefill, the
    generated tokens' logprobs come from the decode continuing the prefill's hand-over; without
    rules they agree (1e-9; token 0 to float32, the metadata buffer's precision)."""
    (router,), _, _, _ = pd_stack(launch)
    terms, worst, first = probe_through(router, prompt_texts())
    assert worst < 1e-9 and first < 1e-6
    assert max(max(t[1:]) for t in terms) < 1e-18


def test_router_pd_decode_only_bf16_rule_drifts(launch, tmp_path: Path) -> None:
    """A bf16 "state" rule only in the DECODE server's environment: its decode steps round the
    carried state every token while the prefill (which answers the replay) does not, so
    exp(r)-1-r through the router is far above the same probe through a router over the same
    prefill and a clean decode, and grows over the output."""
    rules = tmp_path / "numerics.json"
    rules.write_text(json.dumps([{"op": "state", "precision": "bf16", "file": "srt/layers/logits_processor.py",
                                  "contains": "def process_input_logprobs"}]))
    (clean, ruled), _, _, _ = pd_stack(launch, decode_envs=(None, {"STANDIN_NUMERICS_RULES": str(rules)}))
    texts = prompt_texts()
    base_terms, base_worst, _ = probe_through(clean, texts)
    terms, worst, _ = probe_through(ruled, texts)
    flat = [x for t in terms for x in t[1:]]
    base_flat = [x for t in base_terms for x in t[1:]]
    mean, base_mean = sum(flat) / len(flat), sum(base_flat) / len(base_flat)
    assert base_worst < 1e-9 and mean > 1e-6 and mean > 100 * base_mean and 1e-3 < worst < 1.0
    late = sum(sum(t[3 * len(t) // 4:]) for t in terms)
    early = sum(sum(t[1:len(t) // 4]) for t in terms)
    assert late > 2 * early
