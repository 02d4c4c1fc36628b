"""``/generate`` and ``/flush_cache`` of the stand-in, computed by the toy model (toy.py).

The request goes the way SGLang 0.5.14 takes it (references into the pinned tree):

* body: the fields of ``GenerateReqInput`` (``srt/managers/io_struct.py`` l.138-285)
  with their types checked as pydantic would (a wrong type is FastAPI's
  ``RequestValidationError``, turned into a 400 ``ErrorResponse`` with type
  ``"Bad Request"`` by ``http_server.py`` l.495-539; the message is the stand-in's,
  not pydantic's text).  ``input_ids`` is checked by the tree's own
  ``validate_optional_list_i64_1d_2d`` (``srt/utils/field_validators.py``, run for real).
  Unknown fields are ignored, as for a pydantic dataclass;
* ``normalize_batch_and_arguments`` (io_struct.py l.294-648): "Either text, input_ids
  or input_embeds should be provided."; single vs batch decided by ``text`` when it is
  given (else by ``input_ids``); both ``text`` and ``input_ids`` may be given, then the
  ids are what is computed on (``_tokenize_one_request`` takes ``input_ids`` first,
  tokenizer_manager.py l.803) -- upstream does not reject that; parallel sampling
  (``n``); rids (``RID_i`` for a batch with one rid string); per-item
  ``return_logprob``/``logprob_start_len``/``top_logprobs_num`` (default -1 and 0);
* per sub-request: text is tokenized with BOS (the toy tokenizer); the context-length
  checks of ``_validate_one_request`` (tokenizer_manager.py l.937-999, messages
  verbatim); ``TokenizerManager.generate_request`` (the stand-in's, running the tree's
  real ``SamplingParams``: its ``ValueError`` is the 400);
* the scheduler (``srt/managers/scheduler.py`` l.2160-2195): input length against
  ``max_req_input_len``; ``logprob_start_len`` ignored without ``return_logprob``; -1
  with ``return_logprob`` means "output tokens only" (start = prompt length); a start
  beyond the prompt is the abort upstream answers as 400 (message verbatim);
  ``max_new_tokens`` clamped as ``init_req_max_new_tokens`` (l.1852-1871);
* input logprobs as ``logprob_result_processor.py`` l.25-80 builds them: for
  ``logprob_start_len = k`` the entries cover prompt positions k..P-1, the first value is
  ``None`` (whatever k is) and the i-th is the logprob of token k+i given the tokens
  before it; top logprobs likewise ``[None, ...]``;
* output: ``{"text", "output_ids", "meta_info"}`` (tokenizer_manager.py l.1860-2058):
  ``meta_info`` has the keys that file builds (its first ``meta_info`` dict and the
  ``reasoning_tokens``/``completion_tokens``/``cached_tokens`` update are read from
  the tree at startup and must match, else the stand-in refuses to start), the logprob
  lists ``[logprob, token_id, text or None]`` (``detokenize_logprob_tokens``),
  ``output_token_logprobs_length``, ``cached_tokens_details`` (``None``, or
  ``{"device": N, "host": 0}``: output_streamer.py l.58-90), ``e2e_latency`` and
  ``response_sent_to_client_ts``; ``finish_reason`` as ``FINISH_LENGTH`` /
  ``FINISH_MATCHED_TOKEN`` / ``FINISH_MATCHED_STR`` ``to_json()``; ``output_ids`` run
  through the stop token (EOS included), ``text`` without it;
* a batch answers a JSON list; ``stream`` answers SSE chunks (cumulative, one per
  output token, ``index`` in a batch), then ``data: [DONE]``; a ``ValueError`` while
  streaming is an error event (http_server.py l.769-813);
* errors: ``{"error": {"message": ...}}`` with 400 (``_create_error_response``,
  http_server.py l.1937).

Prefill/decode disaggregation (a prefill or decode server, a body with
``bootstrap_room``/``bootstrap_host``, as the router sends it; a body without them is
answered directly in every mode, as for chat; a ``null``-mode server ignores them):

* the fields per item as ``_normalize_bootstrap_params`` makes them (io_struct.py
  l.616-648: a scalar room r gives r, r+1, ... over a batch; lists are taken as given);
* PREFILL server: ``_process_req`` sets max_new_tokens = 1 (disaggregation/prefill.py
  l.303-307): the toy's PREFILL path over the prompt (its prefix cache, its input logprobs
  from ``logprob_start_len``) and the first output token; the hand-over -- the state
  stored at the end of the prompt (the "KV") plus what ``MetadataBuffers.set_buf`` carries
  (disaggregation/utils.py l.312-357: the first output id, ``cached_tokens``, and with
  ``return_logprob`` that token's logprob and top logprobs, float32 as the buffers are) --
  goes into the room on the bootstrap port; the answer is sent once the decode has taken
  it (``process_disagg_prefill_inflight_queue``, prefill.py l.719-830), with
  ``finish_reason`` ``FINISH_LENGTH(length=0)`` and the one token; no taker within
  ``STANDIN_KV_TIMEOUT``: a 500 "Prefill transfer failed ..." as the transfer failure abort;
* DECODE server: the hand-over from ``/standin/kv/<room>`` on the prefill's bootstrap port
  (``_commit_transfer_to_req``, decode.py l.1477-1590: the first output id and its
  logprobs appended, ``cached_tokens`` from the prefill), then ``update_finish_state`` on
  that token (``process_batch_result_prebuilt``, scheduler_components/batch_result_processor.py
  l.82-99) and the decode server's own DECODE path (its numerics rules, its
  nondeterminism) from the handed-over state; nothing cached on the decode (its KV is a
  chunk cache by default, pd_disaggregation_hook.py).  The answer has the full shape, with
  ``input_token_logprobs`` (and ``input_top_logprobs``) empty: "Decode server does not send
  input logprobs" (output_streamer.py l.403-433) -- the router puts the prefill's in front.
  ``max_new_tokens=0``: the prefill's token finishes it with ``finished_len`` 0, so no
  ``output_ids``, ``completion_tokens`` 0, ``finish_reason`` length 0, and
  ``output_token_logprobs`` holding that one token's (``logprob_end = max(len, 1)``).
  No hand-over within ``STANDIN_KV_TIMEOUT``: a 500 "Decode transfer failed ...";
* a ``sampling_seed`` gives the same tokens as one server (the decode skips the draw the
  prefill's first sample took); refused with a 400 naming the stand-in: parallel sampling
  (``n > 1``) and ``token_ids_logprob`` (the metadata buffer does not carry the first
  token's), and a missing room (or, on a decode, host).

Refused with a 400 that names the stand-in (instead of answering something the toy
does not compute): penalties, grammars (regex/json_schema/ebnf/structural_tag),
multimodal data, input_embeds, LoRA, sessions, hidden states, custom logit processors,
and ids outside the toy vocabulary.

The model (``Generator.runner``) is a ``scheduler.SchedulerClient`` in a server: every
prefill chunk and decode step runs in a scheduler child as one ``ModelRunner.forward``
(scheduler.py); a request refused here (any 400) runs none.  Health checks
(``health_check``) and the startup warmup (``warmup``) are requests as upstream sends them
itself; in P/D with ``FAKE_BOOTSTRAP_HOST`` (read from disaggregation/utils.py), for which
the prefill hands nothing over and the decode continues from a fake hand-over (id 0, zero
state) instead of waiting for one.

``/flush_cache`` (GET/POST, ``?timeout=S``; http_server.py l.839-855 and
``scheduler_components/flush_wrapper.py``): clears the toy's prefix cache when no
``/generate`` is running (waiting up to ``timeout`` for that), answering the tree's own
success text, else 400 with upstream's failure message.  Its auth level
(``ADMIN_OPTIONAL``) is read from the decorator in http_server.py.
"""

from __future__ import annotations

import ast
import copy
import logging
import math
import threading
import time
import uuid
from collections import Counter
from typing import Any, Iterator

from sglang_standin import derive, toy
from sglang_standin.scheduler import SchedulerError

logger = logging.getLogger("sglang.srt.entrypoints.http_server")


class Invalid(Exception):
    """The body does not validate (FastAPI's RequestValidationError -> 400 ErrorResponse)."""


class TransferFailed(Exception):
    """A P/D hand-over did not happen in time: the request is aborted with status 500
    (``prepare_abort(..., INTERNAL_SERVER_ERROR)``; the tokenizer manager raises it as an
    ``HTTPException``, http_server.py answers an ``ErrorResponse``)."""

    def __init__(self, message: str, rid: str) -> None:
        super().__init__(message)
        self.rid = rid

    def abort_chunk(self) -> dict:
        """What a stream gets instead: the chunk with ``FINISH_ABORT.to_json()`` (meta_info cut
        to id and finish_reason: the stand-in's)."""
        return {"text": "", "output_ids": [], "meta_info": {"id": self.rid, "finish_reason": {
            "type": "abort", "message": str(self), "status_code": 500, "err_type": None}}}


# ---------------------------------------------------------------- read from the tree


class Spec:
    """What /generate and /flush_cache take from the served tree (strict)."""

    META_SOURCES = {  # value source in _handle_batch_output -> what the stand-in puts there
        "rid": "id", "recv_obj.finished_reasons[i]": "finish_reason",
        "recv_obj.prompt_tokens[i]": "prompt_tokens", "self.server_args.weight_version": "weight_version",
        "recv_obj.retraction_counts[i]": "num_retractions", "recv_obj.reasoning_tokens[i]": "reasoning_tokens",
        "recv_obj.completion_tokens[i]": "completion_tokens", "recv_obj.cached_tokens[i]": "cached_tokens",
    }

    def __init__(self, tree: derive.SourceTree) -> None:
        tm = tree.scope("sglang.srt.managers.tokenizer_manager").module
        fn = derive.find_funcdef(tm, "_handle_batch_output", within="TokenizerManager")
        self.meta_head = self._keys(derive.dict_keys_returned(fn))
        tail = None
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "meta_info.update" and node.args
                    and isinstance(node.args[0], ast.Dict)
                    and any(isinstance(k, ast.Constant) and k.value == "completion_tokens"
                            for k in node.args[0].keys)):
                tail = [(k.value if isinstance(k, ast.Constant) else None, ast.unparse(v))
                        for k, v in zip(node.args[0].keys, node.args[0].values)]
                break
        if tail is None:
            raise derive.DerivationError("tokenizer_manager.py: no meta_info.update({... completion_tokens ...})")
        self.meta_tail = self._keys(tail)
        http = tree.scope("sglang.srt.entrypoints.http_server").module
        self.auth_levels = {path: self._auth_level(http, path) for path in ("/generate", "/flush_cache")}
        self.flush_ok_text = self._flush_text(http)
        fv = tree.scope("sglang.srt.utils.field_validators")
        self.validate_input_ids = fv.real().validate_optional_list_i64_1d_2d
        # health checks and warmup: a fake bootstrap host skips the KV transfer (disaggregation/
        # utils.py _is_fake_transfer); health-check rids start with this prefix (constants.py)
        self.fake_bootstrap_host = self._constant(tree, "sglang.srt.disaggregation.utils", "FAKE_BOOTSTRAP_HOST")
        self.health_rid_prefix = self._constant(tree, "sglang.srt.constants", "HEALTH_CHECK_RID_PREFIX")

    @staticmethod
    def _constant(tree: derive.SourceTree, module: str, name: str) -> str:
        value = tree.scope(module).lookup(name)
        if not isinstance(value, str):
            raise derive.DerivationError(f"{module}.{name} is not a string constant")
        return value

    def _keys(self, pairs: list[tuple[str | None, str]]) -> list[tuple[str, str]]:
        out = []
        for key, src in pairs:
            what = self.META_SOURCES.get(src)
            if key is None or what is None or what != key:
                raise derive.DerivationError(f"tokenizer_manager.py: meta_info[{key!r}] = {src} is not modelled")
            out.append((key, what))
        return out

    @staticmethod
    def _route_fn(http: ast.Module, path: str) -> ast.AST:
        for node in ast.walk(http):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in node.decorator_list:
                    if (isinstance(dec, ast.Call) and ast.unparse(dec.func).startswith("app.")
                            and dec.args and isinstance(dec.args[0], ast.Constant) and dec.args[0].value == path):
                        return node
        raise derive.DerivationError(f"http_server.py: no route {path}")

    def _auth_level(self, http: ast.Module, path: str) -> str:
        fn = self._route_fn(http, path)
        for dec in fn.decorator_list:  # type: ignore[attr-defined]
            if isinstance(dec, ast.Call) and ast.unparse(dec.func) == "auth_level" and dec.args:
                return ast.unparse(dec.args[0]).rsplit(".", 1)[-1]
        return "NORMAL"

    def _flush_text(self, http: ast.Module) -> str:
        fn = self._route_fn(http, "/flush_cache")
        for node in ast.walk(fn):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "ret.success":
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "content":
                        return ast.literal_eval(stmt.value)
        raise derive.DerivationError("http_server.py: flush_cache success content not found")


# ---------------------------------------------------------------- body validation


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(body: dict, name: str, ok: Any, what: str) -> None:
    if name in body and body[name] is not None and not ok(body[name]):
        raise Invalid(f"{name}: input should be {what}, got {type(body[name]).__name__} {body[name]!r:.80}")


def validate_body(body: Any, spec: Spec) -> dict:
    """GenerateReqInput(**body) as pydantic validates it (types only)."""
    if not isinstance(body, dict):
        raise Invalid("body: input should be an object (GenerateReqInput)")

    def list_of(pred: Any) -> Any:
        return lambda v: isinstance(v, list) and all(pred(x) for x in v)

    def one_or_list(pred: Any) -> Any:
        return lambda v: pred(v) or list_of(pred)(v)

    is_bool = lambda v: isinstance(v, bool)  # noqa: E731
    _check(body, "text", one_or_list(lambda v: isinstance(v, str)), "a string or a list of strings")
    if body.get("input_ids") is not None:
        try:
            spec.validate_input_ids(body["input_ids"])
        except ValueError as exc:
            raise Invalid(f"input_ids: {exc}") from None
    _check(body, "sampling_params", one_or_list(lambda v: isinstance(v, dict)), "a dict or a list of dicts")
    _check(body, "return_logprob", one_or_list(is_bool), "a bool or a list of bools")
    _check(body, "logprob_start_len", one_or_list(_is_int), "an int or a list of ints")
    _check(body, "top_logprobs_num", one_or_list(_is_int), "an int or a list of ints")
    _check(body, "token_ids_logprob", lambda v: list_of(_is_int)(v) or list_of(list_of(_is_int))(v),
           "a list of ints or a list of lists of ints")
    _check(body, "rid", one_or_list(lambda v: isinstance(v, str)), "a string or a list of strings")
    for name in ("return_text_in_logprobs", "stream", "return_prompt_token_ids", "log_metrics",
                 "return_routed_experts", "return_entropy"):
        _check(body, name, is_bool, "a bool")
    _check(body, "return_hidden_states", one_or_list(is_bool), "a bool or a list of bools")
    _check(body, "bootstrap_host", one_or_list(lambda v: isinstance(v, str)), "a string or a list of strings")
    _check(body, "bootstrap_port", one_or_list(lambda v: v is None or _is_int(v)),
           "an int or a list of optional ints")
    _check(body, "bootstrap_room", one_or_list(_is_int), "an int or a list of ints")
    return body


# ---------------------------------------------------------------- the request


STANDIN = "stand-in: "


class Generator:
    """Per-server /generate state: the model (*runner*: toy.Runner's interface; in a server
    the scheduler.SchedulerClient, so the model runs in the scheduler children), in-flight count."""

    def __init__(self, spec: Spec, values: dict, runner: Any, tokenizer_manager: Any,
                 context_len: int, max_req_input_len: int, max_total_num_tokens: int, mode: str) -> None:
        self.spec = spec
        self.values = values
        self.runner = runner
        self.tok = runner.tokenizer
        self.tokenizer_manager = tokenizer_manager
        self.context_len = context_len
        self.max_req_input_len = max_req_input_len
        self.max_total_num_tokens = max_total_num_tokens
        self.mode = mode
        self.transfer: Any = None  # the server's KV hand-over (server.Engine: kv_send/kv_receive/...)
        self._busy = 0
        self._idle = threading.Condition()

    # -- normalize_batch_and_arguments --------------------------------------------

    def normalize(self, body: dict) -> tuple[bool, list[dict], int]:
        """(is_single, sub-requests in answer order, parallel_sample_num)."""
        text, input_ids, input_embeds = body.get("text"), body.get("input_ids"), body.get("input_embeds")
        if (text is None and input_ids is None and input_embeds is None) or (
                text is not None and input_ids is not None and input_embeds is not None):
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        if text is not None:
            is_single = isinstance(text, str)
            batch_size = 1 if is_single else len(text)
        elif input_ids is not None:
            if len(input_ids) == 0:
                raise ValueError("input_ids cannot be empty.")
            is_single = _is_int(input_ids[0])
            batch_size = 1 if is_single else len(input_ids)
        else:
            if not self.values.get("disable_radix_cache"):
                raise ValueError(
                    "input_embeds is provided while disable_radix_cache is False. "
                    "Please add `--disable-radix-cache` when you launch the server "
                    "if you want to use input_embeds as inputs.")
            raise ValueError(STANDIN + "input_embeds is not modelled by the toy model")

        sp = body.get("sampling_params")
        if sp is None:
            n = 1
        elif isinstance(sp, dict):
            n = sp.get("n", 1)
        else:
            if not sp:
                raise ValueError(STANDIN + "sampling_params is an empty list")
            n = sp[0].get("n", 1)
            if any(n != p.get("n", 1) for p in sp):
                raise ValueError("The parallel_sample_num should be the same for all samples in sample params.")
        if not _is_int(n) or n < 1:
            raise ValueError(STANDIN + f"n must be a positive integer, got {n!r}")
        if n > 1 and is_single:
            is_single = False
            text = [text] if text is not None else None
            input_ids = [input_ids] if input_ids is not None else None

        pd = self.mode in ("prefill", "decode") and any(
            body.get(k) is not None for k in ("bootstrap_room", "bootstrap_host"))
        if pd and n > 1:
            raise ValueError(STANDIN + "parallel sampling (n > 1) with P/D bootstrap fields is not modelled")
        if pd and body.get("token_ids_logprob"):
            raise ValueError(STANDIN + "token_ids_logprob with P/D bootstrap fields is not modelled (the "
                             "metadata buffer does not carry the first token's, disaggregation/utils.py)")
        rid = body.get("rid")
        common = {k: body.get(k) for k in ("return_text_in_logprobs", "return_prompt_token_ids", "stream")}
        if is_single:
            return True, [{
                "text": text, "input_ids": input_ids, "sampling_params": sp or {},
                "rid": rid if rid is not None else uuid.uuid4().hex,
                "return_logprob": bool(body.get("return_logprob")),
                "logprob_start_len": -1 if body.get("logprob_start_len") is None else body["logprob_start_len"],
                "top_logprobs_num": body.get("top_logprobs_num") or 0,
                "token_ids_logprob": body.get("token_ids_logprob") or None,
                "bootstrap": self._bootstrap(body.get("bootstrap_host"), body.get("bootstrap_port"),
                                             body.get("bootstrap_room")) if pd else None, **common,
            }], 1

        num = batch_size * n
        if text is not None:
            if not isinstance(text, list):
                raise ValueError("Text should be a list for batch processing.")
        elif not isinstance(input_ids, list) or not isinstance(input_ids[0], list):
            raise ValueError("input_ids should be a list of lists for batch processing.")
        if input_ids is not None and (not isinstance(input_ids, list) or len(input_ids) < batch_size
                                      or not all(isinstance(x, list) for x in input_ids[:batch_size])):
            raise ValueError(STANDIN + "text is a batch but input_ids is not a list of as many lists")
        if rid is None:
            rids = [uuid.uuid4().hex for _ in range(num)]
        elif isinstance(rid, str):
            rids = [f"{rid}_{i}" for i in range(num)]
        else:
            if len(rid) != batch_size:
                raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
            rids = list(rid)
        sps = [{}] * num if sp is None else [sp] * num if isinstance(sp, dict) else list(sp) * n

        def per_item(name: str, default: Any) -> list:
            param = body.get(name)
            if param is None:
                return [default] * num
            if not isinstance(param, list):
                return [param] * num
            if n > 1:
                raise ValueError(f"Cannot use list {name} with parallel_sample_num > 1")
            return param

        rl, lsl, tln = (per_item("return_logprob", False), per_item("logprob_start_len", -1),
                        per_item("top_logprobs_num", 0))
        tid = body.get("token_ids_logprob")
        if not tid:
            tids = [None] * num
        elif not isinstance(tid[0], list):
            tids = [copy.deepcopy(tid) for _ in range(num)]
        elif n > 1:
            raise ValueError("Cannot use list token_ids_logprob with parallel_sample_num > 1")
        else:
            tids = tid
        if len(set(rids)) != len(rids):
            dup = [r for r, c in Counter(rids).items() if c > 1]
            raise ValueError(f"Duplicate request IDs detected within the request: {dup}")
        # _normalize_bootstrap_params (io_struct.py l.616-648): a scalar room r becomes
        # r, r+1, ... per item, a scalar host/port is repeated, lists are taken as they are
        boot_host, boot_port, boot_room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port",
                                                                  "bootstrap_room"))
        hosts = boot_host if isinstance(boot_host, list) else [boot_host] * num
        ports = boot_port if isinstance(boot_port, list) else [boot_port] * num
        rooms = (boot_room if isinstance(boot_room, list) else
                 [None] * num if boot_room is None else [boot_room + i for i in range(num)])
        subs = []
        for i in range(batch_size):  # obj[i] (io_struct.py __getitem__)
            try:
                subs.append({
                    "text": text[i] if text is not None else None,
                    "input_ids": input_ids[i] if input_ids is not None else None,
                    "sampling_params": sps[i], "rid": rids[i], "return_logprob": bool(rl[i]),
                    "logprob_start_len": lsl[i], "top_logprobs_num": tln[i] or 0,
                    "token_ids_logprob": tids[i] or None,
                    "bootstrap": self._bootstrap(hosts[i], ports[i], rooms[i]) if pd else None, **common,
                })
            except IndexError:
                raise ValueError(STANDIN + "a per-item list is shorter than the batch") from None
        return False, subs, n

    def _bootstrap(self, host: Any, port: Any, room: Any) -> dict:
        """One item's bootstrap fields; the stand-in needs the room (and, on a decode, the
        prefill's host) to find the hand-over."""
        if room is None or (self.mode == "decode" and not host):
            raise ValueError(STANDIN + "P/D /generate needs bootstrap_room"
                             + (" and bootstrap_host" if self.mode == "decode" else "") + " for every item")
        return {"host": host, "port": port, "room": room}

    # -- one sub-request: tokenizer manager, then scheduler checks --------------------

    def prepare(self, sub: dict) -> tuple[toy.Request, dict]:
        if sub["input_ids"] is not None:
            ids = list(sub["input_ids"])
        else:
            ids = self.tok.encode(sub["text"])
        if not ids:
            raise ValueError(STANDIN + "an empty prompt is not modelled by the toy model")
        if not all(_is_int(t) for t in ids):
            raise ValueError(STANDIN + "one prompt's input_ids must be a flat list of ints")
        bad = [t for t in ids if not 0 <= t < toy.V]
        if bad:
            raise ValueError(STANDIN + f"input_ids {bad[:5]} are outside the toy vocabulary [0, {toy.V})")
        sp_dict = sub["sampling_params"]
        if not isinstance(sp_dict, dict):
            raise ValueError(STANDIN + "each sampling_params must be a dict")
        # _validate_one_request (tokenizer_manager.py l.937-999)
        n_in = len(ids)
        if n_in >= self.context_len:
            if self.values.get("allow_auto_truncate"):
                del ids[self.context_len:]
                n_in = len(ids)
            else:
                raise ValueError(f"The input ({n_in} tokens) is longer than the "
                                 f"model's context length ({self.context_len} tokens).")
        mnt = sp_dict.get("max_new_tokens")
        if _is_int(mnt) and mnt + n_in > self.context_len:
            if self.values.get("allow_auto_truncate"):
                sp_dict = {**sp_dict, "max_new_tokens": max(0, self.context_len - n_in)}
            else:
                raise ValueError(
                    f"Requested token count exceeds the model's maximum context length "
                    f"of {self.context_len} tokens. You requested a total of {mnt + n_in} "
                    f"tokens: {n_in} tokens from the input messages and "
                    f"{mnt} tokens for the completion. Please reduce the number "
                    f"of tokens in the input messages or the completion to fit within the limit.")
        tids = sub["token_ids_logprob"]
        if tids:
            if not all(_is_int(t) for t in tids):
                raise ValueError("token_ids_logprob must be a flat list of integers.")
            for t in tids:
                if t < 0 or t >= toy.V:
                    raise ValueError(f"token_ids_logprob contains out-of-vocabulary token id "
                                     f"{t}; valid range is [0, {toy.V}).")
        # _create_tokenized_object: the tree's SamplingParams, through TokenizerManager.generate_request
        sp = self.tokenizer_manager.generate_request({"sampling_params": sp_dict})
        for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0)):
            if getattr(sp, name) != neutral:
                raise ValueError(STANDIN + f"{name} is not modelled by the toy model")
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            if getattr(sp, name, None) is not None:
                raise ValueError(STANDIN + f"{name} (grammar) is not modelled by the toy model")
        bias = {}
        for key, val in (sp.logit_bias or {}).items():
            try:
                tokid = int(key)
            except (TypeError, ValueError):
                raise ValueError(STANDIN + f"logit_bias key {key!r} is not a token id") from None
            if not 0 <= tokid < toy.V:
                raise ValueError(STANDIN + f"logit_bias token {tokid} is outside the toy vocabulary")
            bias[tokid] = float(val)
        # scheduler.py handle_generate_request
        if n_in >= self.max_req_input_len and not self.values.get("allow_auto_truncate"):
            raise ValueError(f"Input length ({n_in} tokens) exceeds the maximum allowed length "
                             f"({self.max_req_input_len} tokens). Use a shorter input or enable "
                             f"--allow-auto-truncate.")
        if n_in >= self.max_req_input_len:
            del ids[self.max_req_input_len:]
            n_in = len(ids)
        page = self.values.get("page_size") or 1
        paged = -(-n_in // page) * page
        max_new = max(0, min(sp.max_new_tokens if sp.max_new_tokens is not None else 1 << 30,
                             self.max_req_input_len - n_in - 1,
                             self.max_total_num_tokens - paged - page - 1))
        return_logprob = sub["return_logprob"]
        start = sub["logprob_start_len"]
        if not return_logprob:
            start = -1
        if start == -1:
            start = n_in if return_logprob else -1
        elif start < -1:
            raise ValueError(STANDIN + f"logprob_start_len={start} (< -1) is not meaningful")
        if start > n_in:
            raise ValueError(f"req.logprob_start_len={start} is higher than the number of input tokens "
                             f"len(req.origin_input_ids)={n_in}. Please use a smaller logprob_start_len.")
        top_n = max(sub["top_logprobs_num"], 0) if return_logprob else 0
        if top_n > toy.V:
            raise ValueError(STANDIN + f"top_logprobs_num {top_n} exceeds the toy vocabulary ({toy.V})")
        req = toy.Request(
            input_ids=ids, max_new_tokens=max_new, temperature=sp.temperature, top_k=sp.top_k,
            top_p=sp.top_p, min_p=sp.min_p, min_new_tokens=sp.min_new_tokens, ignore_eos=sp.ignore_eos,
            stop_token_ids=frozenset(sp.stop_token_ids or ()), stop_strs=tuple(sp.stop_strs or ()),
            stop_regex_strs=tuple(sp.stop_regex_strs or ()), no_stop_trim=sp.no_stop_trim,
            skip_special_tokens=sp.skip_special_tokens, logit_bias=bias, sampling_seed=sp.sampling_seed,
            return_logprob=return_logprob, logprob_start_len=start, top_logprobs_num=top_n,
            token_ids_logprob=list(tids) if (tids and return_logprob) else None,
        )
        return req, sub

    # -- the answer ---------------------------------------------------------------

    def _lp(self, pairs: list | None, with_text: bool) -> list | None:
        if pairs is None:
            return None
        return [[_num(v), t, self.tok.token_text(t) if with_text else None] for v, t in pairs]

    def _lp_lists(self, per_pos: list | None, with_text: bool) -> list | None:
        if per_pos is None:
            return None
        return [self._lp(p, with_text) if p else None for p in per_pos]

    def output(self, req: toy.Request, sub: dict, res: toy.Result, started: float,
               upto: int | None = None, final: bool = True, first: bool = True) -> dict:
        """The dict _handle_batch_output yields (cut to *upto* output tokens for a stream)."""
        k = len(res.output_ids) if upto is None else upto
        out_ids = res.output_ids[:k]
        values = {"id": sub["rid"], "finish_reason": res.finish_reason if final else None,
                  "prompt_tokens": len(req.input_ids), "weight_version": self.values.get("weight_version"),
                  "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": len(out_ids),
                  "cached_tokens": res.cached_tokens}
        meta: dict[str, Any] = {key: values[what] for key, what in self.spec.meta_head}
        if req.return_logprob:
            wt = bool(sub.get("return_text_in_logprobs"))
            n_lp = max(k, 1) if final else k
            meta["input_token_logprobs"] = self._lp(res.input_token_logprobs, wt)
            meta["output_token_logprobs"] = self._lp(res.output_token_logprobs[:n_lp], wt)
            meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
            if req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = self._lp_lists(res.input_top_logprobs, wt)
                meta["output_top_logprobs"] = self._lp_lists(res.output_top_logprobs[:n_lp], wt)
            if req.token_ids_logprob is not None:
                meta["input_token_ids_logprobs"] = self._lp_lists(res.input_token_ids_logprobs, wt)
                meta["output_token_ids_logprobs"] = self._lp_lists(res.output_token_ids_logprobs[:n_lp], wt)
        for key, what in self.spec.meta_tail:
            meta[key] = values[what]
        meta["cached_tokens_details"] = {"device": res.cached_tokens, "host": 0} if res.cached_tokens else None
        if final:
            meta["e2e_latency"] = time.monotonic() - started
        if first:  # set once, on the first chunk sent (_wait_one_response)
            meta["response_sent_to_client_ts"] = time.time()
        text = res.text if final else self.tok.decode(out_ids, skip_special_tokens=req.skip_special_tokens)
        out = {"text": text, "output_ids": out_ids, "meta_info": meta}
        if sub.get("return_prompt_token_ids"):
            out["prompt_token_ids"] = list(req.input_ids)
        return out

    # -- entry points -----------------------------------------------------------------

    def _enter(self) -> None:
        with self._idle:
            self._busy += 1

    def _leave(self) -> None:
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def _run_all(self, body: dict) -> tuple[bool, list[tuple[toy.Request, dict, toy.Result]], float]:
        started = time.monotonic()
        is_single, subs, n = self.normalize(body)
        prepared = [self.prepare(sub) for sub in subs]
        done = []
        if n == 1:
            sent: list[tuple[dict, Any]] = []
            try:
                for req, sub in prepared:
                    boot = sub.get("bootstrap")
                    if boot is None:
                        res = self.runner.run(req)
                    elif self.mode == "prefill":
                        res, waiter = self._prefill(req, sub, boot)
                        if waiter is not None:
                            sent.append((sub, waiter))
                    else:
                        res = self._resume(req, sub, boot)
                    done.append((req, sub, res))
                while sent:  # answered once the decode has the KV (process_disagg_prefill_inflight_queue)
                    self._await_transfer(*sent[0])
                    sent.pop(0)
            finally:
                for sub, _ in sent:
                    self.transfer.kv_abandon(int(sub["bootstrap"]["room"]))
            return is_single, done, started
        # parallel sampling: the common prefix first (max_new_tokens=0), then n samples each
        # with a fresh rid (tokenizer_manager.py l.1573-1625)
        for req, sub in prepared:
            pre = copy.copy(req)
            pre.max_new_tokens, pre.return_logprob = 0, False
            self.runner.run(pre)
        for req, sub in prepared:
            for _ in range(n):
                done.append((req, {**sub, "rid": uuid.uuid4().hex}, self.runner.run(req)))
        return False, done, started

    # -- P/D: the prefill hands over, the decode continues -------------------------------

    def _prefill(self, req: toy.Request, sub: dict, boot: dict) -> tuple[toy.Result, Any]:
        """The prefill server's part: the PREFILL path over the prompt and the first output
        token (``_process_req`` sets max_new_tokens = 1, prefill.py l.303-307), then the
        hand-over -- the stored state at the end of the prompt (the KV) and what
        ``MetadataBuffers.set_buf`` carries (disaggregation/utils.py l.312-357: the first
        output id, cached_tokens, the first token's logprob and top logprobs, as float32) --
        put in the bootstrap room.  The answer finishes with ``FINISH_LENGTH(length=0)``
        (prefill.py l.765) and carries the input logprobs."""
        pre = copy.copy(req)
        pre.max_new_tokens = 1
        res = self.runner.run(pre)
        res.finish_reason = {"type": "length", "length": 0}
        first_lp, first_top = None, None
        if pre.return_logprob:
            first_lp = toy.round_fp32(res.output_token_logprobs[0][0])
            if pre.top_logprobs_num > 0:
                first_top = [[toy.round_fp32(v), t] for v, t in res.output_top_logprobs[0]]
        assert res.kv is not None
        payload = {"kind": "generate", "rid": sub["rid"], "output_id": res.output_ids[0],
                   "cached_tokens": res.cached_tokens, "output_token_logprob": first_lp,
                   "output_top_logprobs": first_top, "S": list(res.kv.S), "m": list(res.kv.m)}
        if boot["host"] == self.spec.fake_bootstrap_host:  # health check / warmup: no transfer
            return res, None
        return res, self.transfer.kv_send(int(boot["room"]), payload)

    def _await_transfer(self, sub: dict, waiter: Any) -> None:
        room = int(sub["bootstrap"]["room"])
        started = time.monotonic()
        if not waiter.wait(self.transfer.kv_timeout):
            raise TransferFailed(
                f"Prefill transfer failed for request rank=0 req.rid={sub['rid']!r} req.bootstrap_room={room} "
                f"with exception Request {room} timed out after {time.monotonic() - started:.1f}s "
                f"in KVPoll.Bootstrapping", sub["rid"])

    def _resume(self, req: toy.Request, sub: dict, boot: dict) -> toy.Result:
        """The decode server's part: the hand-over from the prefill's bootstrap port
        (``_commit_transfer_to_req``, decode.py l.1477-1590), then this server's DECODE path
        from that state; no input logprobs (output_streamer.py l.403-433: "Decode server
        does not send input logprobs"), the router merges the prefill's in."""
        room = int(boot["room"])
        started = time.monotonic()
        try:
            got = (self._fake_handover() if boot["host"] == self.spec.fake_bootstrap_host
                   else self.transfer.kv_receive(str(boot["host"]), boot["port"], room))
        except TimeoutError:
            got = None
        if not isinstance(got, dict) or got.get("kind") != "generate":
            raise TransferFailed(
                f"Decode transfer failed for request rank=0 decode_req.req.rid={sub['rid']!r} "
                f"decode_req.req.bootstrap_room={room} with exception Request {room} timed out after "
                f"{time.monotonic() - started:.1f}s in KVPoll.WaitingForInput", sub["rid"])
        state = toy.State(tuple(got["S"]), tuple(got["m"]))
        top = got.get("output_top_logprobs")
        if top is not None:
            top = [(v, t) for v, t in top[: req.top_logprobs_num]]
        return self.runner.resume(req, state, int(got["output_id"]), got.get("output_token_logprob"), top,
                                  int(got.get("cached_tokens") or 0))

    @staticmethod
    def _fake_handover() -> dict:
        """A fake transfer's "KV" (decode.py l.1500): nothing arrives; the metadata buffers'
        zeros (first output id 0) and a zero state stand for it."""
        state = toy.ToyModel().initial_state()
        return {"kind": "generate", "output_id": 0, "cached_tokens": 0, "output_token_logprob": None,
                "output_top_logprobs": None, "S": list(state.S), "m": list(state.m)}

    def health_check(self, timeout: float) -> bool:
        """``health_generate`` (http_server.py l.562-634): a one-token request (``input_ids``
        [0], temperature 0, a ``HEALTH_CHECK`` rid; in P/D the fake bootstrap host) down the
        whole path: TokenizerManager.generate_request here, the scheduler's forward there --
        a prefill chunk (EXTEND); a P/D decode, taking a fake hand-over, runs none.  Skipped
        while a request runs (scheduler.py l.1633: only when fully idle), which is healthy.
        False: no answer within *timeout* or it failed (upstream: 503 after the timeout)."""
        if self._busy:
            return True
        body: dict[str, Any] = {"rid": f"{self.spec.health_rid_prefix}_{uuid.uuid4().hex}", "input_ids": [0],
                                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                                "log_metrics": False}
        if self.mode != "null":
            body.update(bootstrap_host=self.spec.fake_bootstrap_host, bootstrap_room=0)
        answered = threading.Event()

        def run() -> None:
            try:
                self.generate(body)
                answered.set()
            except Exception:  # noqa: BLE001 - no answer is the 503
                logger.exception("stand-in: health check request failed")

        threading.Thread(target=run, daemon=True).start()
        return answered.wait(timeout)

    def warmup(self) -> None:
        """``_execute_server_warmup`` (http_server.py l.1968-2110): the request SGLang sends
        itself before it reports ready (not with ``--skip-server-warmup``): 8 greedy tokens of
        "The capital city of France is" (``input_ids`` [10, 11, 12] with
        ``--skip-tokenizer-init``), one per DP rank; in P/D ``input_ids`` [10, 11, 12, 13] with
        the fake bootstrap host (the prefill runs its EXTEND forward, the decode its DECODE
        steps after a fake hand-over).  Raises what the request raises."""
        dp, tp = self.values["dp_size"], self.values["tp_size"]
        sp: dict[str, Any] = {"temperature": 0, "max_new_tokens": 8}
        if self.mode != "null":
            body: dict[str, Any] = {
                "sampling_params": {**sp, "temperature": 0.0, "ignore_eos": True},
                "bootstrap_host": [self.spec.fake_bootstrap_host] * dp,
                "bootstrap_room": [i * (2 ** 63 // dp) + (i % tp) for i in range(dp)],
                "input_ids": [[10, 11, 12, 13]] * dp}
        elif self.values.get("skip_tokenizer_init"):
            body = {"sampling_params": sp, "input_ids": [10, 11, 12] if dp == 1 else [[10, 11, 12]] * dp}
        else:
            text = "The capital city of France is"
            body = {"sampling_params": sp, "text": text if dp == 1 else [text] * dp}
        self.generate(body)

    def generate(self, body: dict) -> Any:
        """The JSON answer (ValueError: 400 ``{"error": {"message"}}``)."""
        self._enter()
        try:
            is_single, done, started = self._run_all(body)
        finally:
            self._leave()
        outs = [self.output(req, sub, res, started) for req, sub, res in done]
        return outs[0] if is_single else outs

    def stream(self, body: dict) -> Iterator[dict]:
        """SSE payloads: cumulative chunks per output token, an error event on ValueError."""
        self._enter()
        try:
            is_single, done, started = self._run_all(body)
        except ValueError as exc:
            yield {"error": {"message": str(exc), "type": "invalid_request_error", "code": 400,
                             "retryable": False}}
            return
        except TransferFailed as exc:
            yield exc.abort_chunk()
            return
        except SchedulerError as exc:  # the stand-in's: a forward failed or the scheduler is gone
            yield {"error": {"message": str(exc), "type": "internal_server_error", "code": 500,
                             "retryable": False}}
            return
        finally:
            self._leave()
        for index, (req, sub, res) in enumerate(done):
            total = len(res.output_ids)
            for k in range(1, total):
                chunk = self.output(req, sub, res, started, upto=k, final=False, first=k == 1)
                if not is_single:
                    chunk["index"] = index
                yield chunk
            chunk = self.output(req, sub, res, started, first=total <= 1)
            if not is_single:
                chunk["index"] = index
            yield chunk

    def flush(self, timeout: float) -> tuple[bool, str]:
        """FlushCacheReqOutput(success, message) as flush_wrapper.py decides it."""
        with self._idle:
            if self._busy and timeout > 0:
                deadline = time.monotonic() + timeout
                while self._busy and time.monotonic() < deadline:
                    self._idle.wait(min(deadline - time.monotonic(), 1.0))
                if self._busy:
                    return False, "Timed out waiting for idle state."
            if self._busy:
                return False, ""
            self.runner.flush()
        return True, ""


def _num(v: Any) -> Any:
    """A logprob as ORJSON writes it (non-finite floats become null)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
