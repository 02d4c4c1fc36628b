"""Fidelity probes the `--symptom` next steps end with: small, bounded, standard library
(the records they fill are the audit's: auditor.model.ProbeResult).

    python3 -m patchset.isolate.measure.probe needle --url http://HOST:PORT --tokens 20000
        a multi-turn chat: turn 1 plants "the token is X", filler turns follow up to
        about N words, the last turn asks for the token of turn 1; pass if the answer has X
    python3 -m patchset.isolate.measure.probe greedy --url URL --max-tokens 2000
        the same greedy (temperature 0) generation twice; pass if identical
    python3 -m patchset.isolate.measure.probe throughput --url URL --parallel 32
        N parallel 256-token generations; prints completion tokens per second

Each prints one JSON line and exits 0 (pass) or 1 (fail, an HTTP error status included);
a server that cannot be reached exits 3, one that gives nothing to judge by (no text, no
token counts) 5, with "judged": false. `--api-key` or $SGLANG_API_KEY is sent as a
bearer token. Run it before and after each isolation step and compare.

`patchset probe` runs the context-fidelity pair below (`fidelity`): a multi-turn recall
with tools in the request (the shape of an agent session, where context loss is first
reported) and a single long-context needle per size; every result keeps its evidence
(prompt size sent and seen, answer, latency) so a pass/fail can be argued from the JSON.
Every request, of these and of the module's own commands, goes to an HTTP endpoint
(connect/tunnel.py): `--url` directly from this machine (DirectEndpoint), an inventory
host's router (else decode) through the host's own SSH connection, so a server bound to
the host's 127.0.0.1, or a host known only by an ssh-config alias, is probed as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from patchset.auditor.model import ProbeResult, size_label
from patchset.connect.tunnel import (DirectEndpoint, EndpointError, HttpEndpoint, endpoint_for,
                                     role_target)
from patchset.agent.lib.bounded import InputError
from patchset.errors import Unreachable, PatchsetError, UsageError

from patchset.isolate.measure.answers import ChatAnswer, chat_answer
from patchset.isolate.measure.drift import DriftSpec, probe_drift
from patchset.isolate.measure.httpjson import EndpointClient, HttpStatus, clip, request, shown

FILLER = ("The quick brown fox jumps over the lazy dog while the operator reads the "
          "deployment notes and checks the queue once more. ")


CHAT_PATH = "/v1/chat/completions"


def chat(endpoint: HttpEndpoint, messages: list[dict], max_tokens: int, key: str | None,
         timeout: float = 600, **extra: Any) -> ChatAnswer:
    """One chat completion through `endpoint` (connect/tunnel.py), validated whole
    (isolate/measure/answers.py); an HTTP error status is HttpStatus, no answer Unreachable,
    a body that is not a chat completion an InputError (a ValueError)."""
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return chat_answer(request(endpoint, "POST", CHAT_PATH, body, key, timeout), CHAT_PATH)


def direct(target: HttpEndpoint | str) -> HttpEndpoint:
    """An endpoint as given, or a URL (`--url`) as a direct connection to it."""
    return DirectEndpoint(parse_url(target)) if isinstance(target, str) else target


def _text(reply: ChatAnswer) -> str:
    return reply.content


def needle(target: HttpEndpoint | str, tokens: int, key: str | None) -> dict:
    token = "NEEDLE-" + secrets.token_hex(3).upper()
    messages = [{"role": "user", "content": f"Remember this: the token is {token}."},
                {"role": "assistant", "content": "Noted."}]
    words, turn = 0, 2
    per_turn = max(50, tokens // 20)
    while words < tokens and turn < 200:
        text = (FILLER * (per_turn // len(FILLER.split()) + 1))
        messages += [{"role": "user", "content": f"Turn {turn} notes: {text}"},
                     {"role": "assistant", "content": "Noted."}]
        words += len(text.split())
        turn += 1
    messages.append({"role": "user", "content": "What was the token in turn 1? Answer with "
                                                "the token only."})
    reply = chat(direct(target), messages, 32, key)
    answer = _text(reply)
    return {"probe": "needle", "ok": token in answer, "judged": bool(answer.strip()),
            "token": token, "answer": answer[:200], "prompt_words": words, "turns": turn,
            "usage": {"prompt_tokens": reply.prompt_tokens,
                      "completion_tokens": reply.completion_tokens}}


def greedy(target: HttpEndpoint | str, max_tokens: int, key: str | None) -> dict:
    endpoint = direct(target)
    messages = [{"role": "user", "content": "Write a detailed, step by step explanation of "
                                            "how a hash map handles collisions."}]
    first, second = (_text(chat(endpoint, messages, max_tokens, key)) for _ in range(2))
    same = first == second
    diverge = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                   None if same else min(len(first), len(second)))
    judged = bool(first.strip() or second.strip())   # two empty answers prove nothing
    return {"probe": "greedy", "ok": same and judged, "judged": judged, "chars": len(first),
            "diverges_at": diverge}


def throughput(target: HttpEndpoint | str, parallel: int, key: str | None) -> dict:
    endpoint = direct(target)
    messages = [{"role": "user", "content": "Count slowly from one to five hundred."}]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(parallel, 64)) as pool:
        replies = list(pool.map(lambda _: chat(endpoint, messages, 256, key),
                                range(parallel)))
    elapsed = time.monotonic() - start
    counts = [r.completion_tokens for r in replies]
    done = sum(c for c in counts if c is not None)
    return {"probe": "throughput", "ok": done > 0,
            "judged": done > 0 or all(c is not None for c in counts), "requests": parallel,
            "completion_tokens": done, "seconds": round(elapsed, 3),
            "tokens_per_second": round(done / elapsed, 1) if elapsed else None}


# ---------------------------------------------------------------- context fidelity (patchset probe)

FIDELITY_KINDS = ("recall", "needle")
DEFAULT_SIZES = (8192, 16384, 32768)
WORDS_PER_TOKEN = 0.75      # English prose: a real tokenizer gives >= 1 token per word
SEEN_FLOOR = 0.9            # usage.prompt_tokens below this share of the words sent = cut
ANSWER_TOKENS = 512         # room for a reasoning model to think before it answers
ANSWER_CHARS = 200          # kept of an answer: the token fits, a runaway reply does not
ERROR_CHARS = 300           # kept of an HTTP error body or transport error
RECALL_FILLER_TURNS = 6
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
QUESTION = "What was the token I gave you in turn 1? Answer with the token only."


@dataclass
class FidelitySpec:
    """What `patchset probe` asked for; the endpoint is a URL (a direct connection), an
    inventory host (its router, else decode, through its SSH connection), or `endpoint`,
    one the caller holds (`audit --probe`: the resolver's, on the connection the audit
    gathered through; the caller closes it)."""

    url: str | None = None
    host: str | None = None
    inventory: str | None = None
    kinds: tuple[str, ...] = FIDELITY_KINDS
    sizes: tuple[int, ...] = DEFAULT_SIZES
    api_key_env: str | None = None
    timeout: float = 600.0
    endpoint: HttpEndpoint | None = None


@dataclass
class FidelityReport:
    url: str                        # where the requests went (the endpoint's describe())
    host: str | None
    results: list[ProbeResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def unreachable(self) -> bool:
        return any(r.unreachable for r in self.results)

    @property
    def inconclusive(self) -> bool:
        """A probe answered with nothing to judge by: no verdict, never a pass."""
        return any(r.inconclusive for r in self.results)

    @property
    def exit_code(self) -> int:
        """3 unreachable, else 5 if a probe could not judge (with none failed, or a
        failed one: Exit.combine's worst), 1 a probe failed, 0 every probe passed."""
        from patchset.errors import Exit
        if self.unreachable:
            return Exit.UNREACHABLE
        return Exit.combine([Exit.INCONCLUSIVE if r.inconclusive else
                             Exit.OK if r.ok else Exit.FINDINGS for r in self.results])

    def to_json(self) -> dict:
        return {"url": self.url, "host": self.host, "ok": self.ok,
                "unreachable": self.unreachable, "inconclusive": self.inconclusive,
                "results": [asdict(r) for r in self.results]}


def parse_sizes(text: str | None, option: str = "--sizes") -> tuple[int, ...]:
    """`8k,16k,32k` -> token counts (k = 1024: context windows are powers of two).
    `option` names the flag in the error (`patchset audit` calls it --probe-sizes)."""
    from patchset.errors import UsageError
    if not text:
        return DEFAULT_SIZES
    sizes = []
    for item in text.replace(" ", "").split(","):
        number = item[:-1] if item.lower().endswith("k") else item
        if not number.isascii() or not number.isdigit() or int(number) <= 0 or len(number) > 9:
            raise UsageError(f"{option} {text!r}: {item!r} is not a size like 8k or 8192")
        size = int(number) * (1024 if number != item else 1)
        if size > MAX_SIZE:
            raise UsageError(f"{option} {text!r}: {item!r} is more than {MAX_SIZE // 1024}k "
                             "tokens (no served context window is larger)")
        sizes.append(size)
    return tuple(sizes)


MAX_SIZE = 2048 * 1024
_URL = re.compile(r"(https?)://([A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])"
                  r"(?::([0-9]{1,5}))?(/[A-Za-z0-9._~/-]{0,200})?")


def parse_url(text: str, option: str = "--url") -> str:
    """An endpoint the probes may POST to: http(s)://HOST[:PORT][/PATH], nothing else
    (no file:// or ftp://, no user:password@), without the trailing slash."""
    from patchset.errors import UsageError
    match = _URL.fullmatch(text)
    if not match or (match.group(3) and not 0 < int(match.group(3)) < 65536):
        raise UsageError(f"{option} {text!r}: expected http(s)://HOST[:PORT][/PATH]")
    return text.rstrip("/")


def parse_kinds(kind: str | None, option: str = "--kind") -> tuple[str, ...]:
    """One kind, or `all` (and no value) for every kind."""
    from patchset.errors import UsageError
    if kind is None or kind == "all":
        return FIDELITY_KINDS
    if kind not in FIDELITY_KINDS:
        raise UsageError(f"{option} {kind!r}: expected one of "
                         f"{', '.join(FIDELITY_KINDS + ('all',))}")
    return (kind,)


def fidelity(spec: FidelitySpec) -> FidelityReport:
    """Resolve the endpoint and key, run the asked probes; failures are results, not
    exceptions, so one report always comes back (bad input is a UsageError). An endpoint
    opened here (its own SSH connection, for an inventory host) is closed at the end."""
    key = api_key(spec.api_key_env)
    endpoint = spec.endpoint or open_endpoint(spec.url, spec.host, spec.inventory)
    try:
        report = FidelityReport(url=endpoint.describe(), host=spec.host)
        for probe, args in planned(spec):
            report.results.append(_guarded(probe, endpoint, key, spec.timeout, *args))
    finally:
        if spec.endpoint is None:
            endpoint.close()
    return report


def open_endpoint(url: str | None, host: str | None, inventory: str | None) -> HttpEndpoint:
    """`--url` as a direct connection, else the inventory host's router (else decode)
    through an SSH connection of the endpoint's own (localhost: direct)."""
    if url:
        return direct(url)
    entry = inventory_host(host, inventory)
    if role_target(entry) is None:
        raise _no_role(host)
    return endpoint_for(entry)


def planned(spec: FidelitySpec) -> list[tuple[Any, tuple]]:
    """The probes `spec` asks for, in report order: (probe function, its size args)."""
    out: list[tuple[Any, tuple]] = []
    for kind in spec.kinds:
        if kind == "recall":
            out.append((recall, ()))
        else:
            out += [(needle_at, (size,)) for size in spec.sizes]
    return out


def not_run(spec: FidelitySpec, host: str | None, reason: str) -> FidelityReport:
    """Every probe `spec` asks for, as a result that could not be sent (no endpoint to
    send it to): the audit still lists each probe, with why it has no verdict."""
    report = FidelityReport(url="", host=host)
    for probe, args in planned(spec):
        name = _probe_name(probe, args)
        report.results.append(ProbeResult(probe=name.split("@")[0], name=name, ok=False,
                                          reason=reason, expected="", error=reason,
                                          unreachable=True,
                                          size_tokens=args[0] if args else None))
    return report


def inventory_host(host: str | None, inventory: str | None) -> Any:
    """The inventory entry (deploy.inventory.Host) `patchset probe HOST` names."""
    from patchset.connect.inventory import load
    from patchset.errors import UsageError
    if not host:
        raise UsageError("probe: give HOST (an inventory name) or --url http://HOST:PORT")
    inv = load(inventory)
    if host not in inv.hosts:
        raise UsageError(f"probe: {host!r} is not in the inventory "
                         f"({inv.path or 'no hosts.yaml'}); use --url for other servers")
    return inv.hosts[host]


def _no_role(host: str | None) -> PatchsetError:
    return UsageError(f"probe: hosts.{host}.roles has no router or decode port; "
                      "add one or use --url")


def api_key(name: str | None) -> str | None:
    """The key in environment variable `name` (a UsageError when it is not set, so a
    typo fails before any probe is sent)."""
    from patchset.errors import UsageError
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise UsageError(f"--api-key-env {name}: the variable is not set")
    if not value.isascii() or not value.isprintable():
        raise UsageError(f"--api-key-env {name}: the key is not printable ASCII (a bearer "
                         "token cannot carry it)")
    return value


def _guarded(probe, endpoint: HttpEndpoint, key: str | None, timeout: float,
             *args: Any) -> ProbeResult:
    """Run one probe; a transport or HTTP failure becomes a failed result naming it."""
    where = endpoint.describe()
    try:
        return probe(endpoint, key, timeout, *args)
    except HttpStatus as exc:
        error, unreachable = f"HTTP {exc.status}: {exc.text()}", False
    except Unreachable as exc:
        error, unreachable = f"cannot reach {where}: {_reason(exc, where)}", True
    except EndpointError as exc:                 # an answer, but not bounded HTTP
        error, unreachable = str(exc), False
    except InputError as exc:                    # isolate/measure/answers.py: names the field
        error, unreachable = f"not an OpenAI chat completion: {exc}", False
    name = _probe_name(probe, args)
    error = shown(error, key, ERROR_CHARS)
    return ProbeResult(probe=name.split("@")[0], name=name, ok=False, reason=error,
                       expected="", error=error, unreachable=unreachable,
                       size_tokens=args[0] if args else None, url=where)


def _reason(exc: Exception, where: str) -> str:
    """An endpoint's failure without the `WHERE: ` it starts with (the result says it)."""
    text = str(exc)
    return text[len(where) + 2:] if text.startswith(where + ": ") else text


def _probe_name(probe: Any, args: tuple) -> str:
    name = probe.__name__.replace("needle_at", "needle")
    return name + (f"@{size_label(args[0])}" if args else "")


def recall(endpoint: HttpEndpoint, key: str | None, timeout: float = 600.0) -> ProbeResult:
    """Plant a token in turn 1 of an agent-shaped chat (tools defined, one tool round
    trip), ask for it after several turns: catches a server that drops history."""
    token = "RECALL-" + secrets.token_hex(4).upper()
    messages = recall_messages(token, RECALL_FILLER_TURNS)
    return _ask("recall", "recall", endpoint, key, timeout, token, messages, None,
                tools=True)


def needle_at(endpoint: HttpEndpoint, key: str | None, timeout: float,
              size: int) -> ProbeResult:
    """Plant a token at the very start of a prompt of about `size` tokens and ask for it
    last: a server that cuts or windows the context loses the start first."""
    token = "NEEDLE-" + secrets.token_hex(4).upper()
    messages = needle_messages(token, size)
    return _ask("needle", f"needle@{size_label(size)}", endpoint, key, timeout, token,
                messages, size, tools=False)


def recall_messages(token: str, filler_turns: int) -> list[dict]:
    messages: list[dict] = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools only "
                                      "for weather questions."},
        {"role": "user", "content": f"Remember this for later: the token is {token}. "
                                    "Reply with OK."},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": "{\"city\": \"Paris\", \"sky\": \"sunny\", \"celsius\": 21}"},
        {"role": "assistant", "content": "It is sunny in Paris, 21 degrees."},
    ]
    for i in range(filler_turns):
        messages += [{"role": "user", "content": f"Summarise note {i + 1} in one sentence: "
                                                 f"{FILLER * 3}"},
                     {"role": "assistant", "content": "A fox, a dog and an operator "
                                                      "checking the queue."}]
    messages.append({"role": "user", "content": QUESTION})
    return messages


def needle_messages(token: str, size: int) -> list[dict]:
    budget = max(50, int(size * WORDS_PER_TOKEN) - 40)
    filler = FILLER.split()
    document = " ".join(filler[i % len(filler)] for i in range(budget))
    return [{"role": "user", "content": f"Remember this: the token is {token}.\n\n{document}"},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": QUESTION}]


def _ask(probe: str, name: str, endpoint: HttpEndpoint, key: str | None, timeout: float,
         token: str, messages: list[dict], size: int | None, tools: bool) -> ProbeResult:
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    start = time.monotonic()
    reply = chat(endpoint, messages, ANSWER_TOKENS, key, timeout, **extra)
    latency = round((time.monotonic() - start) * 1000, 1)
    answer, reasoning = reply.content.strip(), reply.reasoning
    sent = sum(len((m.get("content") or "").split()) for m in messages)
    seen = reply.prompt_tokens
    ok, reason = _verdict(token, answer, reasoning, sent, seen, reply.finish_reason)
    return ProbeResult(probe=probe, name=name, ok=ok is True, reason=reason, expected=token,
                       answer=shown(answer, key, ANSWER_CHARS), size_tokens=size,
                       words_sent=sent, prompt_tokens=seen, latency_ms=latency,
                       turns=sum(m["role"] == "user" for m in messages), tools=tools,
                       url=endpoint.describe(), inconclusive=ok is None)


def _verdict(token: str, answer: str, reasoning: str, sent: int, seen: int | None,
             finish: Any = None) -> tuple[bool | None, str]:
    """Pass only if the token comes back and the server saw what was sent: a real
    tokenizer gives at least one token per word, so fewer means context was cut. None
    (could not judge, never a pass) when the server gave nothing to judge by: no text at
    all, or an answer cut at the token limit before it said the token."""
    if isinstance(seen, int) and seen < sent * SEEN_FLOOR:
        return False, (f"the server saw {seen} prompt tokens of {sent} words sent: "
                       "context was dropped or truncated")
    if token in answer:
        return True, "the planted token came back"
    if token in reasoning:
        return True, "the planted token came back (in reasoning_content)"
    if not answer and not reasoning.strip():
        return None, "could not judge: the server answered no text"
    if finish == "length":
        return None, (f"could not judge: the answer stopped at the {ANSWER_TOKENS}-token "
                      "limit before it gave a token")
    return False, f"the answer does not contain the planted token {token}"


# ---------------------------------------------------------------- audit --probe

# How `audit --probe` opens a host's endpoint: connect(spec, at=None) is the host's
# inventory role (router, else decode), connect(spec, at=(ADDRESS, PORT)) that address and
# port as seen from the host; the CLI passes deploy.resolve.Hosts.endpoint, so the probes
# travel on the SSH connection the audit gathers facts through (one host-key check).
Connect = Callable[..., HttpEndpoint]


class _PerHost:
    """Where an audit plan sends a host's probes (auditor.api.HostProbes.endpoint)."""

    connect: Connect
    specs: dict[str, str]                 # the transport's name for a host -> the spec given
    by_role: frozenset[str]               # hosts whose inventory role has a port

    def endpoint(self, host: str, at: tuple[str, int] | None) -> HttpEndpoint | None:
        """The host's inventory role when it has a port (as `patchset probe HOST`), else
        `at`, where its facts say an SGLang server listens (as seen from the host); None
        when neither."""
        spec = self.specs.get(host, host)
        if host in self.by_role:
            return self.connect(spec, at=None)
        return self.connect(spec, at=at) if at else None


@dataclass
class AuditProbes(_PerHost):
    """What `audit --probe` asked for, as the audit calls it (auditor.api.HostProbes): the
    probes (`spec`, its endpoint left empty) and how each host's endpoint is opened
    (`endpoint`); `run` sends them there and closes the endpoint."""

    spec: FidelitySpec
    connect: Connect
    specs: dict[str, str] = field(default_factory=dict)
    by_role: frozenset[str] = frozenset()

    def run(self, host: str, endpoint: HttpEndpoint) -> list[ProbeResult]:
        try:
            return fidelity(dataclasses.replace(self.spec, endpoint=endpoint,
                                                host=host)).results
        finally:
            endpoint.close()

    def not_run(self, host: str, reason: str) -> list[ProbeResult]:
        return not_run(self.spec, host, reason).results


@dataclass
class DriftAuditProbes(_PerHost):
    """`audit --probe drift`: the drift probe (isolate/measure/drift.py) against each host's
    endpoint, as one record per host (probe[drift]: evidence the numbers)."""

    spec: Any                             # isolate.drift.DriftSpec
    connect: Connect
    key_env: str | None = None
    specs: dict[str, str] = field(default_factory=dict)
    by_role: frozenset[str] = frozenset()

    def run(self, host: str, endpoint: HttpEndpoint) -> list[ProbeResult]:
        url, started = endpoint.describe(), time.monotonic()
        try:
            outcome = probe_drift(EndpointClient(endpoint, api_key(self.key_env)), self.spec)
        except Exception as exc:          # noqa: BLE001 - a failed probe is a record
            return [self._result(url, False, f"the drift probe failed: {exc}", str(exc),
                                 started)]
        finally:
            endpoint.close()
        if outcome.unreachable:
            return [self._result(url, False, "the endpoint could not be reached",
                                 outcome.error, started, unreachable=True)]
        rep = outcome.report
        assert rep is not None                  # reached: probe_drift made its report
        result = self._result(url, rep.verdict.outcome == "bounded", rep.verdict.why, None,
                              started, drift=rep.to_json(points=True))
        result.inconclusive = rep.verdict.outcome == "inconclusive"
        return [result]

    def not_run(self, host: str, reason: str) -> list[ProbeResult]:
        return [ProbeResult(probe="drift", name="drift", ok=False, reason=reason, expected="",
                            error=reason, unreachable=True)]

    @staticmethod
    def _result(url: str, ok: bool, reason: str, error: str | None, started: float,
                unreachable: bool = False, drift: dict | None = None) -> ProbeResult:
        return ProbeResult(probe="drift", name="drift", ok=ok, reason=reason,
                           expected="prefill vs decode bounded below the tolerance",
                           answer=clip(reason, ANSWER_CHARS), error=error,
                           unreachable=unreachable, url=url, drift=drift,
                           latency_ms=round((time.monotonic() - started) * 1000, 1))


def audit_probes(kind: str | None, sizes: str | None, key_env: str | None, timeout: float,
                 inventory: Any, specs: list[str],
                 connect: Connect) -> "AuditProbes | DriftAuditProbes | None":
    """`--probe KIND [--probe-sizes S] [--api-key-env NAME]` as the audit's probes, checked
    before any host is contacted (bad input is exit 2, not a report full of failed probes).
    The key itself stays in the environment: the spec holds only the variable's name.
    `connect` opens a host's endpoint (Connect above)."""
    from patchset.errors import UsageError
    if kind is None:
        if sizes or key_env:
            raise UsageError("--probe-sizes and --api-key-env need --probe recall|needle|all")
        return None
    api_key(key_env)
    hosts = {name: inventory.resolve(name) for name in specs}
    names = {host.name: name for name, host in hosts.items()}   # local -> localhost
    by_role = frozenset(host.name for host in hosts.values() if role_target(host))
    if kind == "drift":
        return DriftAuditProbes(DriftSpec(sizes=parse_sizes(sizes, "--probe-sizes"),
                                          timeout=timeout), connect, key_env, names, by_role)
    spec = FidelitySpec(kinds=parse_kinds(kind, "--probe"),
                        sizes=parse_sizes(sizes, "--probe-sizes"), api_key_env=key_env,
                        timeout=timeout)
    return AuditProbes(spec, connect, names, by_role)


def main(argv: list[str] | None = None) -> int:
    from patchset.errors import Exit
    parser = argparse.ArgumentParser(prog="python3 -m patchset.isolate.measure.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=("needle", "greedy", "throughput"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=32)
    parser.add_argument("--api-key", default=os.environ.get("SGLANG_API_KEY"))
    args = parser.parse_args(argv)
    key, failed = args.api_key, Exit.FINDINGS
    try:
        endpoint = direct(args.url)
        if args.probe == "needle":
            result: dict[str, Any] = needle(endpoint, args.tokens, key)
        elif args.probe == "greedy":
            result = greedy(endpoint, args.max_tokens, key)
        else:
            result = throughput(endpoint, args.parallel, key)
    except HttpStatus as exc:                  # the server answered: a failed probe
        error = f"HTTP {exc.status}: {exc.text()}"
    except PatchsetError as exc:               # bad --url (2), no answer (3), not HTTP (4)
        error, failed = str(exc), exc.exit_code
    except InputError as exc:                  # isolate/measure/answers.py: names the field
        error = f"not an OpenAI chat completion: {exc}"
    else:
        print(json.dumps(result))
        if not result["judged"]:
            return Exit.INCONCLUSIVE           # nothing to judge by: never a pass
        return Exit.OK if result["ok"] else Exit.FINDINGS
    print(json.dumps({"probe": args.probe, "ok": False,
                      "error": shown(error, key, ERROR_CHARS)}))
    return failed



def client_for(host: str | None, url: str | None, inventory: str | None,
               api_key_env: str | None, resolver: Any = None) -> EndpointClient:
    """The server a drift probe talks to: `--url` directly, else the inventory host's
    router, else its decode role, through the host's SSH connection (`resolver`'s, when
    the command holds one, so there is one connection and one host-key check)."""
    key = api_key(api_key_env)
    if resolver is not None and not url:
        return EndpointClient(resolver.endpoint(host), key)
    return EndpointClient(open_endpoint(url, host, inventory), key)


if __name__ == "__main__":
    sys.exit(main())
