"""A server's answers as typed records, each validated whole before any of it is used.

Why whole: the probes used to index into a parsed answer where they needed it, so a
server (or something posing as one) that put a list where an object goes, `true` where a
count goes, a logprob of 5 or of -1e300, or a top-token list of strings, surfaced as an
AttributeError, an overflow in the statistics, or a verdict computed on garbage. Here
every field the probes read is checked for its exact type and range first; what is not
an answer of the expected shape is one `InputError` naming the field
(`/generate: meta_info.output_token_logprobs[3][0]: ...`), which each probe turns into a
failed probe (never an internal error).

The logprob range: a log probability is <= 0. Float32 rounding of log_softmax (and the
stand-in server's perturbation) gives a likely token tiny positive values, hence the
slack MAX_LOGPROB. The floor MIN_LOGPROB is where the statistics stop being numbers: the
drift estimator takes expm1(a - b) of two logprobs of one token (isolate/measure/driftstats.py),
which overflows a double past 709.78, so two logprobs in [-700, 0] always compare, and a
token the model gives e**-700 (~1e-304) was neither sampled nor is it worth comparing.
A NaN or infinite logprob cannot come out of JSON (patchset/agent/lib/bounded.py refuses
it); one built in code (a fake server) compares nothing, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from patchset.agent.lib.bounded import NUMBER, InputError, expect, loads
from patchset.agent.lib.bounded import field_name as _name

MAX_LOGPROB = 1e-3
MIN_LOGPROB = -700.0
OPTIONAL_TEXT = (str, type(None))
OPTIONAL_COUNT = (int, type(None))


def logprob(value: Any, source: str, path: tuple) -> float | None:
    """A log probability in range; None for a missing one (SGLang's first input entry)
    and for a non-finite one built in code."""
    if value is None or (type(value) is float and not math.isfinite(value)):
        return None
    expect(value, NUMBER, source, path)
    if not MIN_LOGPROB <= value <= MAX_LOGPROB:
        raise InputError(source, None, _name(path), f"logprob {value:.6g} is not a log "
                         f"probability (outside [{MIN_LOGPROB:g}, 0])")
    return float(value)


def count(value: Any, source: str, path: tuple) -> int | None:
    """A token count or token id: a non-negative integer (never `true`), or null."""
    expect(value, OPTIONAL_COUNT, source, path)
    if value is not None and value < 0:
        raise InputError(source, None, _name(path), f"{value} is negative")
    return value


def _get(obj: dict, key: str, kinds: tuple | type, source: str, path: tuple) -> Any:
    return expect(obj.get(key), kinds, source, path + (key,))


# ---------------------------------------------------------------- OpenAI chat completions

@dataclass(frozen=True)
class TopToken:
    token: str
    logprob: float | None


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float | None
    top: tuple[TopToken, ...]


@dataclass(frozen=True)
class ChatAnswer:
    """The first choice's text, its reasoning, the usage counts and token logprobs."""

    content: str
    reasoning: str
    prompt_tokens: int | None
    completion_tokens: int | None
    logprobs: tuple[TokenLogprob, ...] | None
    finish_reason: str | None = None     # "stop", "length", ...: why the answer ended


def chat_answer(body: bytes | str, source: str) -> ChatAnswer:
    """A /v1/chat/completions body, parsed (bounded) and validated whole."""
    data = expect(loads(body, source), dict, source)
    choices = _get(data, "choices", list, source, ())
    if not choices:
        raise InputError(source, None, "choices", "no choice in the answer")
    parsed = [_choice(c, source, ("choices", i)) for i, c in enumerate(choices)]
    usage = _get(data, "usage", (dict, type(None)), source, ()) or {}
    counts = {k: count(usage.get(k), source, ("usage", k))
              for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    content, reasoning, lps = parsed[0]
    finish = _get(choices[0], "finish_reason", OPTIONAL_TEXT, source, ("choices", 0))
    return ChatAnswer(content, reasoning, counts["prompt_tokens"],
                      counts["completion_tokens"], lps, finish)


def _choice(choice: Any, source: str, path: tuple) -> tuple:
    expect(choice, dict, source, path)
    message = _get(choice, "message", dict, source, path)
    where = path + ("message",)
    content = _get(message, "content", OPTIONAL_TEXT, source, where) or ""
    reasoning = _get(message, "reasoning_content", OPTIONAL_TEXT, source, where) or ""
    for i, call in enumerate(_get(message, "tool_calls", (list, type(None)), source, where)
                             or []):
        expect(call, dict, source, where + ("tool_calls", i))
    lps = _get(choice, "logprobs", (dict, type(None)), source, path)
    return content, reasoning, _chat_logprobs(lps, source, path + ("logprobs",))


def _chat_logprobs(lps: dict | None, source: str, path: tuple) -> tuple | None:
    if lps is None:
        return None
    items = _get(lps, "content", (list, type(None)), source, path) or []
    return tuple(_token_logprob(item, source, path + ("content", i))
                 for i, item in enumerate(items))


def _token_logprob(item: Any, source: str, path: tuple) -> TokenLogprob:
    expect(item, dict, source, path)
    tops = _get(item, "top_logprobs", (list, type(None)), source, path) or []
    top = []
    for i, entry in enumerate(tops):
        where = path + ("top_logprobs", i)
        expect(entry, dict, source, where)
        top.append(TopToken(_get(entry, "token", str, source, where),
                            logprob(entry.get("logprob"), source, where + ("logprob",))))
    return TokenLogprob(_get(item, "token", str, source, path),
                        logprob(item.get("logprob"), source, path + ("logprob",)), tuple(top))


# ---------------------------------------------------------------- SGLang /generate

@dataclass(frozen=True)
class Entry:
    """One position of SGLang's `*_token_logprobs`: [logprob, token_id, text]."""

    logprob: float | None
    token: int


@dataclass(frozen=True)
class GenerateAnswer:
    """SGLang's /generate answer (managers/io_struct.py), the fields the drift probe
    reads; a list absent from the answer is None (the caller says which it needs)."""

    text: str
    output_ids: tuple[int, ...] | None
    input_logprobs: tuple[Entry, ...] | None
    output_logprobs: tuple[Entry, ...] | None
    input_top: tuple[int | None, ...] | None      # the top-1 token id per position
    output_top: tuple[int | None, ...] | None


GENERATE = "/generate"


def generate_answer(answer: Any, source: str = GENERATE) -> GenerateAnswer:
    """A parsed /generate answer (one object, or a list of one), validated whole."""
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    if not isinstance(answer, dict):
        raise InputError(source, None, "(document)", "did not answer one JSON object")
    meta = answer.get("meta_info")
    if not isinstance(meta, dict):
        raise InputError(source, None, "meta_info", "no meta_info object (is this SGLang's "
                         "/generate?)")
    ids = _get(answer, "output_ids", (list, type(None)), source, ())
    return GenerateAnswer(
        _get(answer, "text", OPTIONAL_TEXT, source, ()) or "",
        None if ids is None else tuple(_id(t, source, ("output_ids", i))
                                       for i, t in enumerate(ids)),
        _entries(meta, "input_token_logprobs", source),
        _entries(meta, "output_token_logprobs", source),
        _tops(meta, "input_top_logprobs", source),
        _tops(meta, "output_top_logprobs", source))


def _id(value: Any, source: str, path: tuple) -> int:
    got = count(expect(value, int, source, path), source, path)
    assert got is not None                  # expect() let only an int through
    return got


def _entries(meta: dict, key: str, source: str) -> tuple[Entry, ...] | None:
    items = _get(meta, key, (list, type(None)), source, ("meta_info",))
    if items is None:
        return None
    return tuple(_entry(e, source, ("meta_info", key, i)) for i, e in enumerate(items))


def _entry(entry: Any, source: str, path: tuple) -> Entry:
    expect(entry, (list, tuple), source, path)
    if len(entry) < 2 or len(entry) > 3:
        raise InputError(source, None, _name(path), "not [logprob, token_id, text]")
    if len(entry) == 3:
        expect(entry[2], OPTIONAL_TEXT, source, path + (2,))
    return Entry(logprob(entry[0], source, path + (0,)), _id(entry[1], source, path + (1,)))


def _tops(meta: dict, key: str, source: str) -> tuple[int | None, ...] | None:
    positions = _get(meta, key, (list, type(None)), source, ("meta_info",))
    if positions is None:
        return None
    out = []
    for i, position in enumerate(positions):
        where = ("meta_info", key, i)
        expect(position, (list, type(None)), source, where)
        entries = [_entry(e, source, where + (j,)) for j, e in enumerate(position or [])]
        out.append(entries[0].token if entries else None)
    return tuple(out)
