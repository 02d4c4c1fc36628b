"""``python -m sglang.launch_server`` stand-in: same CLI, endpoints and JSON as SGLang 0.5.14.

What runs, in the order the real server does it:

1. the ``UserWarning`` ``launch_server.py`` prints, then ``--config FILE.yaml``
   merged in by the tree's ``ConfigArgumentMerger`` (derive.py; a bad file raises as
   upstream: traceback, exit 1), then argument parsing with the parser derived from
   the tree's ``server_args.py`` (unknown flag or bad value: argparse's message and
   exit code 2), then ``logging.basicConfig`` at ``--log-level``;
2. ``ServerArgs.from_cli_args`` and the deterministic part of
   ``__post_init__``: ``_handle_missing_default_values`` (tokenizer_path and
   served_model_name default to model_path, device "cuda", a random seed,
   ...).  The other post-init hooks need a GPU and the checkpoint
   (attention/MoE backend resolution, memory sizing, page size per model) and
   are NOT run: ``/server_info`` shows those fields as given on the command
   line (``auto``/``None``), which the audit must treat as "not resolved",
   unless ``STANDIN_RESOLVED_ARGS=field=value,...`` resolves them as the hooks
   would on the real GPU (``STANDIN_LOGGED_ARGS``: in the log line only);
3. ``_set_envs_and_config``'s environment edits (NCCL_*, CUDA_*, TRTLLM_*,
   CUTE_DSL_*, SGLANG_RUN_ID, PROMETHEUS_MULTIPROC_DIR, RLIMIT_NOFILE) and the
   ``server_args=ServerArgs(...)`` log line (secrets included, as upstream);
4. the children (procs.py); once each has reported ready (after renaming
   itself, as ``_wait_for_scheduler_ready``), the KV bootstrap server on
   ``--disaggregation-bootstrap-port`` in prefill mode, then the HTTP server on
   ``--host``/``--port``.  ``/health`` answers 503 while "loading"
   (``STANDIN_STARTUP_DELAY`` seconds, default 0.5) and during the warmup request
   (``_execute_server_warmup``, unless ``--skip-server-warmup``; its failure kills the
   server, as upstream), then "The server is fired up and ready to roll!" is logged;
   ``STANDIN_FAIL_HEALTH=1`` keeps ``/health`` at 503.  ``/health`` and
   ``/health_generate`` are upstream's one ``health_generate`` route: each sends a
   one-token request through the scheduler (a forward), except ``/health`` with
   ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false`` (generate.Generator.health_check).

The model runs in the scheduler children, never here (scheduler.py): the main process
talks to them through ``scheduler.SchedulerClient``; a call they do not answer within
``--watchdog-timeout`` seconds, or a forward that raises, is a 500.  Chat requests,
whose answers are scripted (chat.py), still make the scheduler run the forwards of
their prompt and completion tokens (``Engine._chat_forwards``).

Endpoints: ``/health``, ``/health_generate``, ``/server_info``,
``/get_server_info`` (deprecated alias, logs upstream's warning),
``/model_info``, ``/get_model_info``, ``/v1/models``, ``/v1/models/{model}``,
``/v1/chat/completions`` (JSON or SSE stream; answers from chat.py; each request first
goes through ``TokenizerManager.generate_request``, which runs the served tree's real
``SamplingParams`` as 0.5.14 does: see tokenizer_manager.py), ``/generate`` (POST/PUT:
``GenerateReqInput`` in, text/output_ids/meta_info with logprobs out, computed by the
toy model of toy.py; request and response shapes: generate.py) and ``/flush_cache``
(GET/POST: clears the toy's prefix cache).  With ``--api-key``/``--admin-api-key`` (on
the command line or in the ``--config`` file) the tree's own ``decide_request_auth``
decides (``/health*`` stays open), at the endpoint's auth level (``/flush_cache`` is
``ADMIN_OPTIONAL`` by its decorator in http_server.py, the others ``NORMAL``).

Faked, because there is no model or GPU: ``max_total_num_tokens``
(``STANDIN_MAX_TOTAL_TOKENS``, default 1048576), the context length
(``--context-length``, else ``max_position_embeddings`` from
``MODEL_PATH/config.json`` when that file exists, else 131072), memory usage
zeros in ``internal_states``, ``model_type``/``architectures`` (config.json or
null), and the model itself: ``/generate`` runs a tiny seeded model with its own
96-word vocabulary, not the checkpoint (toy.py says what it computes;
``STANDIN_NUMERICS_RULES`` and ``STANDIN_NONDETERMINISM`` shape its numerics).  In P/D
the prefill "transfers KV" by handing the decode what it saw of the conversation
through its bootstrap port (``/standin/kv/<room>``), so faults on either side show in
the answer; a request without bootstrap fields is answered directly in every mode (the
real decode would refuse it), for ``/generate`` too.  ``/generate`` with bootstrap fields
(what the router adds, one room per item) hands over for real: the prefill runs the
toy's PREFILL path and the first output token, puts the state stored at the end of the
prompt and the first token's metadata in the room, and answers once the decode has taken
it (``STANDIN_KV_TIMEOUT``, else a 500 "Prefill transfer failed ..."); the decode takes it
from ``/standin/kv/<room>`` on the prefill's bootstrap port and continues with its own
DECODE path and numerics (generate.py says what each answers).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import signal
import sys
import threading
import time
import types
import urllib.parse
import uuid
import warnings
from pathlib import Path
from typing import Any

from sglang_standin import chat, derive, generate, procs, scheduler, toy
from sglang_standin.httpd import Handler, Server, request, to_json

logger = logging.getLogger("sglang.srt.entrypoints.http_server")

DEFAULT_CONTEXT_LEN = 131072
DEFAULT_MAX_TOTAL_TOKENS = 1 << 20


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "y", "on")


class Engine:
    """The serving state behind the HTTP handlers."""

    def __init__(self, d: derive.Derived, values: dict[str, Any], faults: chat.Faults) -> None:
        self.d = d
        self.values = values
        self.faults = faults
        self.mode = values["disaggregation_mode"]
        self.ready = threading.Event()
        self.draining = False
        self.fail_health = _truthy(os.environ.get("STANDIN_FAIL_HEALTH"))
        self.hf_config = self._read_hf_config(values["model_path"])
        self.context_len = (
            values.get("context_length") or self.hf_config.get("max_position_embeddings") or DEFAULT_CONTEXT_LEN
        )
        self.max_total_num_tokens = int(os.environ.get("STANDIN_MAX_TOTAL_TOKENS") or DEFAULT_MAX_TOTAL_TOKENS)
        self.max_req_input_len = min(self.context_len - 1, self.max_total_num_tokens - 1)
        self.kv: dict[int, Any] = {}   # room -> what the prefill hands over (chat: what it saw)
        self.kv_taken: dict[int, threading.Event] = {}   # /generate rooms: set once the decode has it
        self.kv_lock = threading.Lock()
        self.kv_timeout = float(os.environ.get("STANDIN_KV_TIMEOUT") or 30.0)
        # under its real name, through the import system (see tokenizer_manager.py)
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.environ import envs   # the tree's (standard library only), as http_server.py
        self.envs = envs
        self.tokenizer_manager = TokenizerManager(self.hf_config)
        self.gen_spec = generate.Spec(d.tree)
        # the model runs in the scheduler children (connected once they are up): scheduler.py
        self.scheduler = scheduler.SchedulerClient(float(values["watchdog_timeout"]))
        self.generator = generate.Generator(
            self.gen_spec, values, self.scheduler, self.tokenizer_manager, self.context_len,
            self.max_req_input_len, self.max_total_num_tokens, self.mode)
        self.generator.transfer = self  # /generate P/D: kv_send / kv_receive / kv_abandon / kv_timeout

    @staticmethod
    def _read_hf_config(model_path: str) -> dict:
        try:
            data = json.loads((Path(model_path) / "config.json").read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    # -- /server_info -------------------------------------------------------

    def scheduler_info(self) -> dict:
        """``Scheduler.get_init_info`` keys (scheduler.py) with stand-in numbers."""
        known = {"max_total_num_tokens": self.max_total_num_tokens, "max_req_input_len": self.max_req_input_len}
        out = {}
        for key, src in self.d.scheduler_init_keys:
            if key is None:
                continue
            try:
                out[key] = ast.literal_eval(src)
            except ValueError:
                out[key] = known.get(key)
        return out

    def internal_states(self) -> list[dict]:
        """One per DP rank: ``vars(server_args)`` plus the keys ``get_internal_state`` adds."""
        fakes = {
            "last_gen_throughput": 0.0,
            "effective_max_running_requests_per_dp": self.values.get("max_running_requests"),
            "weight": 0.0, "kvcache": 0.0, "graph": 0.0, "token_capacity": self.max_total_num_tokens,
        }
        state = dict(self.values)
        for key, subkeys in self.d.internal_state_extra:
            state[key] = {k: fakes.get(k) for k in subkeys} if subkeys is not None else fakes.get(key)
        return [json.loads(to_json(state)) for _ in range(self.values["dp_size"])]

    def server_info(self) -> dict:
        """The dict http_server.py's ``server_info`` returns, key by key."""
        out: dict[str, Any] = {}
        for key, src in self.d.server_info_keys:
            if key is None and "asdict(server_args)" in src:
                out.update(json.loads(to_json(self.values)))
            elif key is None and "scheduler_info" in src:
                out.update(self.scheduler_info())
            elif key == "internal_states":
                out[key] = self.internal_states()
            elif key == "version":
                out[key] = self.d.version
            elif key == "kv_events":
                out[key] = self.d.describe_kv_events(self.values)
            elif key is not None:
                out[key] = None
                logger.warning("stand-in: /server_info key %r is not modelled", key)
        return out

    # -- /model_info, /v1/models -------------------------------------------------

    def model_info(self) -> dict:
        out: dict[str, Any] = {}
        for key, src in self.d.model_info_keys:
            if key is None:
                continue
            if ".server_args." in src:
                out[key] = self.values.get(src.rsplit(".", 1)[1])
            elif src.endswith("tokenizer_manager.model_path"):
                out[key] = self.values["model_path"]
            elif src.endswith(".is_generation"):
                out[key] = not self.values.get("is_embedding", False)
            elif src.startswith("getattr(model_config.hf_config"):
                call = ast.parse(src, mode="eval").body
                name = ast.literal_eval(call.args[1])  # type: ignore[attr-defined]
                default = ast.literal_eval(call.args[2]) if len(call.args) > 2 else None  # type: ignore[attr-defined]
                out[key] = self.hf_config.get(name, default)
            elif "understandable_model" in src:
                out[key] = False
            else:
                out[key] = None
        return out

    @property
    def served_model_name(self) -> str:
        return self.values.get("served_model_name") or self.values["model_path"]

    def model_card(self, name: str) -> dict:
        return self.d.shapes["ModelCard"].build(id=name, root=name, max_model_len=self.context_len)

    def models(self) -> dict:
        return self.d.shapes["ModelList"].build(data=[self.model_card(self.served_model_name)])

    # -- P/D "KV transfer" ------------------------------------------------------

    def kv_put(self, room: int, seen: Any) -> None:
        with self.kv_lock:
            self.kv[room] = seen
            while len(self.kv) > 4096:
                old = next(iter(self.kv))
                self.kv.pop(old)
                self.kv_taken.pop(old, None)

    def kv_take(self, room: int) -> Any:
        with self.kv_lock:
            got = self.kv.pop(room, None)
            taken = self.kv_taken.pop(room, None) if got is not None else None
        if taken is not None:
            taken.set()
        return got

    def kv_send(self, room: int, payload: dict) -> threading.Event:
        """A /generate prefill's hand-over; the event is set once the decode has taken it."""
        taken = threading.Event()
        with self.kv_lock:
            self.kv_taken[room] = taken
        self.kv_put(room, payload)
        return taken

    def kv_abandon(self, room: int) -> None:
        with self.kv_lock:
            self.kv.pop(room, None)
            self.kv_taken.pop(room, None)

    def kv_receive(self, host: str, port: int | None, room: int) -> Any:
        """A /generate decode's side: the prefill's hand-over (TimeoutError after kv_timeout)."""
        return self.kv_fetch(host, int(port or self.values["disaggregation_bootstrap_port"]), room)

    def kv_fetch(self, host: str, port: int, room: int) -> list[dict]:
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        url = f"http://{host}:{port}/standin/kv/{room}"
        deadline = time.monotonic() + self.kv_timeout
        while True:
            status, body, _ = request("GET", url, timeout=5)
            if status == 200:
                return json.loads(body)
            if time.monotonic() > deadline:
                raise TimeoutError(f"KV transfer from {host}:{port} room {room} timed out (last status {status})")
            time.sleep(0.02)

    # -- /v1/chat/completions --------------------------------------------------------

    def chat(self, body: dict) -> tuple[dict, dict]:
        """(response object, what the server saw) for a chat request."""
        messages = chat.normalize(body.get("messages"))
        from sglang.srt.managers.tokenizer_manager import sampling_kwargs
        self.tokenizer_manager.generate_request({"sampling_params": sampling_kwargs(body)})
        room = body.get("bootstrap_room")
        bhost = body.get("bootstrap_host")
        from_prefill = self.mode == "decode" and room is not None and bool(bhost)   # the KV comes over
        to_decode = self.mode == "prefill" and room is not None                      # the KV goes over
        if from_prefill:
            port = body.get("bootstrap_port") or self.values["disaggregation_bootstrap_port"]
            seen = self.faults.apply(self.kv_fetch(str(bhost), int(port), int(room)))
        else:
            seen = self.faults.apply(messages)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        text, finish, n_out = chat.complete(seen, max_tokens if isinstance(max_tokens, int) else None)
        n_in = chat.count_tokens(seen)
        self._chat_forwards(seen, n_out, prefill=not from_prefill, decode=not to_decode)
        if to_decode:  # after its forwards, as a real prefill sends the KV it computed
            self.kv_put(int(room), seen)
        shapes = self.d.shapes
        choice = shapes["ChatCompletionResponseChoice"].build(
            index=0, message=shapes["ChatMessage"].build(role="assistant", content=text),
            finish_reason=finish,
        )
        usage = shapes["UsageInfo"].build(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)
        resp = shapes["ChatCompletionResponse"].build(
            id=uuid.uuid4().hex, model=body.get("model") or self.served_model_name, choices=[choice], usage=usage,
        )
        return resp, {"messages": seen, "finish_reason": finish}

    def _chat_forwards(self, seen: list[dict], n_out: int, prefill: bool, decode: bool) -> None:
        """The forwards the scheduler runs for a chat request (the answer itself is chat.py's):
        prefill over what the server saw, as the toy tokenizes it, and a decode step per
        completion token after the first; in P/D the prefill server runs only the prefill and
        the decode server only the decode steps."""
        ids = self.generator.tok.encode(" ".join(m["content"] for m in seen))
        self.scheduler.model_work(ids, n_out, prefill=prefill, decode=decode)

    def stream_chunks(self, resp: dict, include_usage: bool) -> list[dict]:
        shapes = self.d.shapes
        choice = resp["choices"][0]
        common = {"id": resp["id"], "created": resp["created"], "model": resp["model"]}
        chunks = [
            shapes["ChatCompletionStreamResponse"].build(**common, choices=[
                shapes["ChatCompletionResponseStreamChoice"].build(
                    index=0, delta=shapes["DeltaMessage"].build(role="assistant", content=choice["message"]["content"]),
                )
            ]),
            shapes["ChatCompletionStreamResponse"].build(**common, choices=[
                shapes["ChatCompletionResponseStreamChoice"].build(
                    index=0, delta=shapes["DeltaMessage"].build(), finish_reason=choice["finish_reason"],
                )
            ]),
        ]
        if include_usage:
            chunks.append(shapes["ChatCompletionStreamResponse"].build(**common, choices=[], usage=resp["usage"]))
        return chunks

    def error(self, status: int, message: str, kind: str = "BadRequestError") -> dict:
        return self.d.shapes["ErrorResponse"].build(message=message, type=kind, code=status)


def make_handler(engine: Engine) -> type[Handler]:
    d = engine.d
    auth = d.auth
    api_key = engine.values.get("api_key")
    admin_api_key = engine.values.get("admin_api_key")

    def health(h: Handler) -> None:
        """http_server.py health_generate, the route of both paths: 503 while starting; /health
        is a plain 200 only with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION off (default on);
        else a one-token request runs (Generator.health_check): 503 if it gets no answer."""
        ok = engine.ready.is_set() and not engine.draining and not engine.fail_health
        if ok and not (h.path.split("?", 1)[0] == "/health"
                       and not engine.envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get()):
            ok = engine.generator.health_check(float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT") or 20))
        h.send_empty(200 if ok else 503)

    def server_info(h: Handler) -> None:
        h.send_json(200, engine.server_info())

    def get_server_info(h: Handler) -> None:
        if d.deprecated_server_info:
            logger.warning(d.deprecated_server_info)
        server_info(h)

    def model_info(h: Handler) -> None:
        h.send_json(200, engine.model_info())

    def get_model_info(h: Handler) -> None:
        if d.deprecated_model_info:
            logger.warning(d.deprecated_model_info)
        model_info(h)

    def models(h: Handler) -> None:
        h.send_json(200, engine.models())

    def model(h: Handler) -> None:
        name = h.path.split("?", 1)[0][len("/v1/models/"):]
        if name != engine.served_model_name:
            h.send_json(404, {"error": {"message": f"The model '{name}' does not exist",
                                        "type": "invalid_request_error", "param": "model",
                                        "code": "model_not_found"}})
            return
        h.send_json(200, engine.model_card(name))

    def chat_completions(h: Handler) -> None:
        ctype = (h.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        raw = h.read_body()
        if ctype != "application/json":
            h.send_json(400, engine.error(400, "Unsupported Media Type: Only 'application/json' is allowed"))
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
            resp, _ = engine.chat(body)
        except (TimeoutError, scheduler.SchedulerError) as exc:
            h.send_json(500, engine.error(500, str(exc), "InternalServerError"))
            return
        except ValueError as exc:
            h.send_json(400, engine.error(400, str(exc)))
            return
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            h.send_response(200)
            h.send_header("content-type", "text/event-stream")
            h.end_headers()
            for chunk in engine.stream_chunks(resp, include_usage):
                h.wfile.write(b"data: " + to_json(chunk) + b"\n\n")
            h.wfile.write(b"data: [DONE]\n\n")
            return
        h.send_json(200, resp)

    def generate_request(h: Handler) -> None:
        raw = h.read_body()
        ctype = (h.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        try:
            if ctype and not (ctype == "application/json" or ctype.endswith("+json")):
                raise generate.Invalid("body: input should be a valid dictionary or object to extract fields from")
            try:
                parsed = json.loads(raw)
            except ValueError as exc:
                raise generate.Invalid(f"body: JSON decode error: {exc}") from None
            body = generate.validate_body(parsed, engine.gen_spec)
        except generate.Invalid as exc:
            h.send_json(400, engine.error(400, str(exc), "Bad Request"))
            return
        if body.get("stream"):
            h.send_response(200)
            h.send_header("content-type", "text/event-stream")
            h.end_headers()
            try:
                for out in engine.generator.stream(body):
                    if "error" in out:
                        logger.error(f"[http_server] Error: {out['error']['message']}")
                    h.wfile.write(b"data: " + to_json(out) + b"\n\n")
            except Exception:  # e.g. SamplingParams(**bad kwargs): the stream just ends, as upstream
                logger.exception("stand-in: /generate")
                return
            h.wfile.write(b"data: [DONE]\n\n")
            return
        try:
            ret = engine.generator.generate(body)
        except generate.TransferFailed as exc:  # P/D abort with status 500 (HTTPException -> ErrorResponse)
            logger.error(f"[http_server] Error: {exc}")
            h.send_json(500, engine.error(500, str(exc), "500"))
            return
        except scheduler.SchedulerError as exc:  # the stand-in's: a forward failed, or no scheduler
            logger.error(f"[http_server] Error: {exc}")
            h.send_json(500, engine.error(500, str(exc), "InternalServerError"))
            return
        except ValueError as exc:
            logger.error(f"[http_server] Error: {exc}")
            h.send_json(400, {"error": {"message": str(exc)}})
            return
        except Exception:  # e.g. SamplingParams(**bad kwargs): upstream's unhandled 500
            logger.exception("stand-in: /generate")
            h.send_bytes(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        h.send_json(200, ret)

    def flush_cache(h: Handler) -> None:
        h.read_body()
        query = urllib.parse.parse_qs(h.path.split("?", 1)[1]) if "?" in h.path else {}
        raw = (query.get("timeout") or ["0"])[-1]
        try:
            timeout = float(raw)
            if not timeout >= 0.0:
                raise ValueError
        except ValueError:
            h.send_json(400, engine.error(400, f"query.timeout: input should be a number >= 0, got {raw!r}",
                                          "Bad Request"))
            return
        try:
            ok, message = engine.generator.flush(timeout)
        except scheduler.SchedulerError as exc:  # the cache lives in the scheduler: it must answer
            h.send_bytes(500, f"{exc}\n".encode(), None)
            return
        if ok:
            logging.getLogger("sglang.srt.managers.scheduler").info("Cache flushed successfully!")
            h.send_bytes(200, engine.gen_spec.flush_ok_text.encode(), None)
        else:
            if not message:
                logging.getLogger("sglang.srt.managers.scheduler").warning(
                    "Cache not flushed because there are pending requests.")
            h.send_bytes(400, (message or "Flush cache failed.\n").encode(), None)

    levels = {path: getattr(auth.AuthLevel, name) for path, name in engine.gen_spec.auth_levels.items()}

    class ServerHandler(Handler):
        routes = {
            ("GET", "/health"): health,
            ("GET", "/health_generate"): health,
            ("GET", "/server_info"): server_info,
            ("GET", "/get_server_info"): get_server_info,
            ("GET", "/model_info"): model_info,
            ("GET", "/get_model_info"): get_model_info,
            ("GET", "/v1/models"): models,
            ("POST", "/v1/chat/completions"): chat_completions,
            ("POST", "/generate"): generate_request,
            ("PUT", "/generate"): generate_request,
            ("GET", "/flush_cache"): flush_cache,
            ("POST", "/flush_cache"): flush_cache,
        }
        prefix_routes = [("GET", "/v1/models/", model)]

        def _dispatch(self, method: str) -> None:
            if api_key or admin_api_key:
                path = self.path.split("?", 1)[0]
                decision = auth.decide_request_auth(
                    method=method, path=path,
                    authorization_header=self.headers.get("Authorization"), api_key=api_key,
                    admin_api_key=admin_api_key, auth_level=levels.get(path, auth.AuthLevel.NORMAL),
                )
                if not decision.allowed:
                    self.read_body()
                    code = decision.error_status_code
                    self.send_json(code, {"error": "Unauthorized" if code == 401 else "Forbidden"})
                    return
            super()._dispatch(method)

    return ServerHandler


def make_bootstrap_handler(engine: Engine) -> type[Handler]:
    """The prefill's KV bootstrap server (``CommonKVBootstrapServer``: /route, /health)."""

    def health(h: Handler) -> None:
        h.send_bytes(200, b"OK", "text/plain; charset=utf-8")

    def route(h: Handler) -> None:
        h.read_body()
        if h.command == "PUT":
            h.send_bytes(200, b"OK", "text/plain; charset=utf-8")
        else:
            h.send_json(200, {})

    def kv(h: Handler) -> None:
        try:
            room = int(h.path.split("?", 1)[0].rsplit("/", 1)[1])
        except ValueError:
            h.send_json(400, {"detail": "bad room"})
            return
        seen = engine.kv_take(room)
        if seen is None:
            h.send_json(404, {"detail": "room not ready"})
        else:
            h.send_json(200, seen)

    class BootstrapHandler(Handler):
        routes = {("GET", "/health"): health, ("GET", "/route"): route, ("PUT", "/route"): route}
        prefix_routes = [("GET", "/standin/kv/", kv)]

    return BootstrapHandler


RESOLVED_ENV, LOGGED_ENV = "STANDIN_RESOLVED_ARGS", "STANDIN_LOGGED_ARGS"


def _env_args(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """``FIELD=VALUE,...`` of a knob (a VALUE is a Python literal, else a string): ServerArgs
    fields as a real server's startup hooks would resolve them (STANDIN_RESOLVED_ARGS:
    /server_info and the ``server_args=`` line; STANDIN_LOGGED_ARGS: that line only). A
    name that is no ServerArgs field is a startup error."""
    out: dict[str, Any] = {}
    for item in filter(None, (os.environ.get(name) or "").split(",")):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or key not in values:
            raise ValueError(f"{name}: {item!r} is not FIELD=VALUE of a ServerArgs field")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def _server_args_repr(values: dict[str, Any]) -> str:
    return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    d = derive.load(str(derive.locate_tree()))
    if d.launch_warning:
        message, filename, lineno = d.launch_warning
        warnings.warn_explicit(message, UserWarning, filename, lineno)
    argv = d.server_args.merged(argv)  # --config FILE.yaml, as prepare_server_args
    ns = d.server_args.parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(ns.log_level).upper(), logging.INFO),
        format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True,
    )
    values = d.server_args.from_namespace(ns)
    try:
        ruled = chat.rule_faults(os.environ.get(chat.RULES_ENV), derive.locate_tree(),
                                 dict(os.environ))
        faults = chat.Faults.parse(",".join([os.environ.get(chat.FAULT_ENV) or "", *ruled]))
        numerics = toy.Numerics.from_env(dict(os.environ), derive.locate_tree())
        scheduler.load_hooks(os.environ)  # checked here; the schedulers load it again
        resolved, logged = _env_args(RESOLVED_ENV, values), _env_args(LOGGED_ENV, values)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"stand-in: {exc}\n")
        sys.exit(1)
    d.server_args.missing_defaults(values)
    values.update(resolved)     # what the post-init hooks would resolve on a real GPU
    d.set_envs(types.SimpleNamespace(**values))
    logger.debug("stand-in: parts of _set_envs_and_config not run: %s", d.env_skipped)
    logger.info(f"server_args={_server_args_repr(dict(values, **logged))}")
    if str(faults) != "none":
        logger.warning("stand-in: injected faults: %s", faults)
    if str(numerics) != "float64":
        logger.warning("stand-in: toy model numerics: %s", numerics)

    children: list = []
    servers: list[Server] = []

    def on_signal(signum: int, frame: Any) -> None:
        raise SystemExit(0 if signum == signal.SIGTERM else 1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGQUIT, on_signal)  # a child failed (watchdog below), as upstream
    engine = Engine(d, values, faults)
    try:
        children = procs.launch_engine_children(values, d)
        procs.wait_ready(children)
        engine.scheduler.connect([end for child in children for end in child.work])
        if engine.mode == "prefill":
            bootstrap_port = values["disaggregation_bootstrap_port"]
            servers.append(Server(values["host"], bootstrap_port, make_bootstrap_handler(engine)))
            threading.Thread(target=servers[-1].serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        httpd = Server(values["host"], values["port"], make_handler(engine))
        servers.append(httpd)

        def ready() -> None:
            if not values.get("skip_server_warmup") and not values.get("is_embedding"):
                try:
                    engine.generator.warmup()
                except Exception:  # noqa: BLE001 - upstream: log, kill the server
                    logger.exception("Initialization failed. warmup error")
                    os.kill(os.getpid(), signal.SIGQUIT)
                    return
            engine.ready.set()
            if d.ready_message:
                logger.info(d.ready_message)

        timer = threading.Timer(float(os.environ.get("STANDIN_STARTUP_DELAY") or 0.5), ready)
        timer.daemon = True
        timer.start()
        threading.Thread(target=_watchdog, args=(engine, children), daemon=True).start()
        httpd.serve_forever(poll_interval=0.2)
    except (OSError, RuntimeError) as exc:
        logger.error("stand-in: %s", exc)
        raise SystemExit(1) from None
    finally:
        engine.draining = True
        procs.stop_children(children)
        for s in servers:
            s.server_close()


def _watchdog(engine: Engine, children: list) -> None:
    """SubprocessWatchdog: a child that dies takes the server down (SIGQUIT to self)."""
    while not engine.draining:
        for child in children:
            if not child.proc.is_alive() and not engine.draining:
                logging.getLogger("sglang.srt.utils.watchdog").error(
                    "Subprocess %s (pid=%d) crashed with exit code %s", child.name, child.pid, child.proc.exitcode
                )
                os.kill(os.getpid(), signal.SIGQUIT)
                return
        time.sleep(0.2)
