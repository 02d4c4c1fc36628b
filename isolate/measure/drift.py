"""`patchset probe --kind drift`: how far a live server's numerics move, in numbers.

SGLang's own method (the pinned wheel's `sglang/test/kl_test_utils.py`), through its
native `/generate` (request and response as `managers/io_struct.py` shapes them):

1. generate from each shipped conversation (isolate/measure/conversations.py) with sampling and
   logprobs, `logprob_start_len=0`: the response's `input_token_logprobs` carry the
   prompt's token ids as the server tokenized it (no local tokenizer), its
   `output_token_logprobs` the DECODE path's logprob of each sampled token;
2. replay prompt + output as one prefill (`max_new_tokens=0`,
   `logprob_start_len=len(prompt)`): the PREFILL path's logprob of the same tokens;
3. compare per token (isolate/measure/driftstats.py): mean, p90, p99 of exp(r) - 1 - r, by
   position bucket, top-1 agreement, first divergence; then the second-turn variant
   (turn 1 + its output + the next user turn), which in SGLang decodes on a cached prefix.

In a prefill/decode deployment the router sends the prompt to the prefill server and the
decode server continues: step 1 is then the decode server's numerics on the prefill
server's KV, step 2 the prefill server's alone, which is the path of the users' symptom.

The replay is repeated (`repeats`): the spread between replays of the same tokens on the
same state is the noise a drift is judged against (batching makes SGLang
nondeterministic). `--save RUN.json` keeps every sequence and logprob; `--against
RUN.json` replays the saved tokens on the server as it is now and reports the drift
between the two states, against the noise measured now.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from patchset.agent.lib import safewrite
from patchset.agent.lib.bounded import NUMBER, InputError, expect, read_json
from patchset.errors import TargetError, Unreachable, UsageError

from patchset.isolate.measure import answers
from patchset.isolate.measure import conversations as convs
from patchset.isolate.measure.driftdecide import (DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE,
                                                  Decision, Paired, decide)
from patchset.isolate.measure.driftstats import Comparison, compare, pooled

RUN_FORMAT = 1
DEFAULT_OUTPUT_TOKENS = 256
DEFAULT_REPEATS = 3
DEFAULT_TEMPERATURE = 1.0
DEFAULT_BUDGET = 48              # sequences: 8 rounds of the shipped 3 sizes x 2 turns
MAX_RUN_BYTES = 256 * 1024 * 1024


class Client(Protocol):
    """POSTs JSON to the server and returns the parsed answer (isolate/measure/httpjson.py); a
    client with `get(path, timeout) -> bytes` also lets the probe read the server's
    /metrics (its request counter: concurrent traffic)."""

    def post(self, path: str, body: dict, timeout: float, want_json: bool = True) -> Any: ...

    def describe(self) -> str: ...


class DriftError(Exception):
    """The server's answer is not what /generate returns (shape, lengths)."""


@dataclass
class Sequence:
    """One generation and its measurements: the tokens, and each path's logprobs."""

    name: str                    # "ops-16k/turn-1"
    prompt_ids: list[int]
    output_ids: list[int]
    decode_lp: list[float | None]
    decode_top: list[int | None]
    prefill_lp: list[list[float | None]] = field(default_factory=list)   # per replay
    prefill_top: list[int | None] = field(default_factory=list)

    @property
    def start(self) -> int:
        return len(self.prompt_ids)

    def check(self) -> str | None:
        """What is wrong with a sequence read from a file (None: nothing): the ids are
        sent back to a server, the logprobs compared."""
        if not isinstance(self.name, str):
            return "name: not a string"
        for field_name in ("prompt_ids", "output_ids"):
            if not _ints(getattr(self, field_name)):
                return f"{field_name}: not a list of token ids"
        n = len(self.output_ids)
        if not _floats(self.decode_lp, n) or not isinstance(self.prefill_lp, list) or \
                not all(_floats(r, n) for r in self.prefill_lp):
            return ("logprobs: not lists of log probabilities (numbers in "
                    f"[{answers.MIN_LOGPROB:g}, 0]), one per output token")
        for field_name in ("decode_top", "prefill_top"):
            tops = getattr(self, field_name)
            if not isinstance(tops, list) or not _ints([t for t in tops if t is not None]):
                return f"{field_name}: not a list of token ids or nulls"
        return None


@dataclass
class DriftSpec:
    sizes: tuple[int, ...] = convs.DEFAULT_SIZES
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    repeats: int = DEFAULT_REPEATS
    second_turn: bool = True
    seed: int = 0
    timeout: float = 600.0
    k: float = 3.0                   # a bisect's group test (isolate/search/driftsearch.py)
    tolerance: float = DEFAULT_TOLERANCE
    confidence: float = DEFAULT_CONFIDENCE
    budget: int = DEFAULT_BUDGET     # sequences at most (0: the shipped conversations once)

    @property
    def per_round(self) -> int:
        """Sequences one round adds: each conversation size, and its second turn."""
        return len(self.sizes) * (2 if self.second_turn else 1)

    @property
    def rounds(self) -> int:
        """Rounds a sequential measurement may take within the budget."""
        return max(1, self.budget // max(1, self.per_round))

    @property
    def judge(self) -> Judge:
        """The decision of a fresh measurement: as many looks as it may take rounds."""
        return Judge(self.tolerance, self.confidence, self.rounds)

    @property
    def fixed(self) -> Judge:
        """The decision on data that cannot grow (a saved run replayed: --against)."""
        return Judge(self.tolerance, self.confidence, 1)


@dataclass(frozen=True)
class Judge:
    """What a comparison is decided against (isolate/measure/driftdecide.py); `looks`: how many
    times a sequential measurement may decide on growing data."""

    tolerance: float = DEFAULT_TOLERANCE
    confidence: float = DEFAULT_CONFIDENCE
    looks: int = 1


@dataclass
class DriftRun:
    """What one probe measured on one server state: saved by --save, read by --against."""

    endpoint: str
    started: float
    spec: dict
    sequences: list[Sequence]
    seconds: float = 0.0
    format: int = RUN_FORMAT
    traffic: list[str] = field(default_factory=list)   # the replays' batch conditions

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str) -> DriftRun:
        if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
            raise DriftError(f"{where}: not a drift run of format {RUN_FORMAT} "
                             "(written by `patchset probe --kind drift --save`)")
        try:
            seqs = [Sequence(**expect(s, dict, where, ("sequences", i)))
                    for i, s in enumerate(expect(data.get("sequences"), list, where,
                                                 ("sequences",)))]
            run = cls(expect(data.get("endpoint"), str, where, ("endpoint",)),
                      expect(data.get("started"), NUMBER, where, ("started",)),
                      expect(data.get("spec"), dict, where, ("spec",)), seqs,
                      expect(data.get("seconds", 0.0), NUMBER, where, ("seconds",)),
                      traffic=[str(t)[:300] for t in expect(data.get("traffic") or [], list,
                                                            where, ("traffic",))][:64])
        except InputError as exc:
            raise DriftError(f"damaged drift run: {exc}") from None
        except TypeError as exc:
            raise DriftError(f"{where}: damaged drift run ({exc})") from None
        for i, seq in enumerate(run.sequences):
            bad = seq.check()
            if bad:
                raise DriftError(f"{where}: sequences[{i}].{bad}")
        return run


# ---------------------------------------------------------------- measuring

def measure(client: Client, spec: DriftSpec, say: Callable[[str], None] = lambda _: None,
            at_least: int = 0) -> DriftRun:
    """Generate from every conversation (and its second turn), replay each sequence
    `spec.repeats` times as prefill; within `spec.budget`, add a round of conversations
    (the next seed: deterministic) until prefill vs decode is decided (above or bounded)
    and there are `at_least` sequences (a bisect's baseline: enough for its states' A/B
    to be bounded), or the budget is spent. Every look is held to its share of the error
    (Judge.looks)."""
    started = time.time()
    sequences: list[Sequence] = []
    notes: list[str] = []
    run = DriftRun(client.describe(), started, asdict(spec), sequences)
    for round_ in range(spec.rounds):
        fresh = _generated(client, spec, spec.seed + round_, say)
        notes.append(_replay_all(client, fresh, spec, say))
        sequences += fresh
        run = DriftRun(client.describe(), started, asdict(spec), list(sequences),
                       round(time.time() - started, 3),
                       traffic=list(dict.fromkeys(n for n in notes if n)))
        if round_ + 1 < spec.rounds:
            outcome = prefill_vs_decode(run, spec.judge).verdict
            say(f"drift: {len(sequences)} sequences: {outcome.outcome}")
            if outcome.outcome != "inconclusive" and len(sequences) >= at_least:
                break
    return run


def _generated(client: Client, spec: DriftSpec, seed: int,
               say: Callable[[str], None]) -> list[Sequence]:
    """One round: a conversation per size (and its second turn), built with `seed`."""
    out: list[Sequence] = []
    flush(client, spec.timeout)
    for conv in convs.build_all(spec.sizes, seed):
        name = conv.name if seed == spec.seed else f"{conv.name}#{seed}"
        say(f"drift: {name}: generating {spec.output_tokens} tokens")
        first, text = generate(client, conv.text, spec, f"{name}/turn-1")
        out.append(first)
        if spec.second_turn:
            out.append(generate_turn(client, conv.text + text + conv.follow_up, spec,
                                     f"{name}/turn-2"))
    return out


def _replay_all(client: Client, sequences: list[Sequence], spec: DriftSpec,
                say: Callable[[str], None]) -> str:
    """Every sequence replayed `spec.repeats` times, one request at a time, from an
    empty cache: both sides of a comparison see the same batch composition (one
    sequence) and no cached prefix, unless someone else's traffic shares the server: the
    server's own request counter says (the returned note; "" when none was seen)."""
    flush(client, spec.timeout)
    before = served_requests(client, spec.timeout)
    for repeat in range(spec.repeats):
        say(f"drift: replay {repeat + 1} of {spec.repeats} of {len(sequences)} sequences")
        for seq in sequences:
            replay(client, seq, spec.timeout)
    return traffic_note(before, served_requests(client, spec.timeout),
                        spec.repeats * len(sequences))


REQUESTS_METRIC = "sglang:num_requests_total"     # observability/metrics_collector.py:1514


def served_requests(client: Client, timeout: float) -> float | None:
    """The server's count of finished requests (its /metrics, --enable-metrics), None
    when it cannot be read."""
    get = getattr(client, "get", None)
    if get is None:
        return None
    try:
        text = get("/metrics", min(timeout, 30.0)).decode("utf-8", "replace")
    except (DriftError, Unreachable):
        return None
    total, seen = 0.0, False
    for line in text.splitlines():
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name.strip() == REQUESTS_METRIC:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                return None
            if not math.isfinite(value) or value < 0:      # a count: NaN/inf/-1 is no count
                return None
            total += value
            seen = True
    return total if seen else None


def traffic_note(before: float | None, after: float | None, sent: int) -> str:
    """What the counter says of the replays' batch conditions."""
    if before is None or after is None:
        return ("concurrent traffic unchecked: the server's /metrics has no "
                f"{REQUESTS_METRIC} (start it with --enable-metrics)")
    other = after - before - sent
    if other > 0:
        return (f"concurrent traffic: the server finished {other:g} requests besides the "
                f"probe's {sent} replays: their batches were not the probe's alone (the "
                "noise may be larger than on an idle server)")
    return ""


def _replayed(client: Client, sequences: list[Sequence], spec: DriftSpec, started: float,
              say: Callable[[str], None]) -> DriftRun:
    """Every sequence replayed `spec.repeats` times, from an empty cache."""
    note = _replay_all(client, sequences, spec, say)
    return DriftRun(client.describe(), started, asdict(spec), sequences,
                    round(time.time() - started, 3), traffic=[note] if note else [])


def generate(client: Client, text: str, spec: DriftSpec, name: str,
             start: int = 0) -> tuple[Sequence, str]:
    """`start` 0: the prompt's ids come back in input_token_logprobs (no tokenizer here);
    -1: output logprobs only, so the server may serve the prompt from its prefix cache
    (SGLang matches no cached prefix when input logprobs from 0 are asked for)."""
    body = {"text": text, "return_logprob": True, "logprob_start_len": start,
            "top_logprobs_num": 1, "return_text_in_logprobs": False,
            "sampling_params": {"temperature": spec.temperature,
                                "max_new_tokens": spec.output_tokens, "ignore_eos": True,
                                "sampling_seed": spec.seed}}
    answer = _answer(client.post("/generate", body, spec.timeout))
    prompt = [e.token for e in _need(answer.input_logprobs, "input_token_logprobs")] \
        if start == 0 else []
    output = answer.output_ids
    decode = _need(answer.output_logprobs, "output_token_logprobs")
    if output is None or len(decode) != len(output):
        raise DriftError(f"{name}: output_ids and output_token_logprobs do not match")
    tops = answer.output_top or (None,) * len(output)
    return Sequence(name, prompt, list(output), [e.logprob for e in decode],
                    list(tops)), answer.text


def generate_turn(client: Client, text: str, spec: DriftSpec, name: str) -> Sequence:
    """The second turn: decoded on the cached turn 1 (start -1), then its prompt's ids
    read by a prefill of the same text (no decode)."""
    seq, _ = generate(client, text, spec, name, start=-1)
    body = {"text": text, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0}}
    answer = _answer(client.post("/generate", body, spec.timeout))
    seq.prompt_ids = [e.token for e in _need(answer.input_logprobs, "input_token_logprobs")]
    return seq


def replay(client: Client, seq: Sequence, timeout: float) -> None:
    """Prompt + output as one prefill. The window starts one token before the output:
    SGLang's first input logprob of a window is always None (as for token 0)."""
    body = {"input_ids": seq.prompt_ids + seq.output_ids, "return_logprob": True,
            "logprob_start_len": max(0, seq.start - 1), "top_logprobs_num": 1,
            "return_text_in_logprobs": False, "sampling_params": {"max_new_tokens": 0}}
    answer = _answer(client.post("/generate", body, timeout))
    entries = list(_need(answer.input_logprobs, "input_token_logprobs"))[-len(seq.output_ids):]
    if len(entries) != len(seq.output_ids):
        raise DriftError(f"{seq.name}: the replay returned {len(entries)} logprobs for "
                         f"{len(seq.output_ids)} output tokens")
    if [e.token for e in entries] != seq.output_ids:
        raise DriftError(f"{seq.name}: the replay's tokens are not the sequence sent")
    seq.prefill_lp.append([e.logprob for e in entries])
    if not seq.prefill_top:
        tops = list(answer.input_top or ())[-len(seq.output_ids):]
        seq.prefill_top = tops or [None] * len(seq.output_ids)


def flush(client: Client, timeout: float) -> None:
    """As kl_test_utils: the replay must not be served from what generation cached."""
    try:
        client.post("/flush_cache", {}, timeout, want_json=False)   # it answers plain text
    except DriftError:
        # a server without the endpoint (or refusing it): replays may be served from
        # cache, which is a prefill too; the numbers stay comparable (no answer at all is
        # Unreachable, not a DriftError: it goes up)
        pass


def replay_saved(client: Client, saved: DriftRun, spec: DriftSpec,
                 say: Callable[[str], None] = lambda _: None) -> DriftRun:
    """The saved run's token sequences replayed on the server as it is now."""
    started = time.time()
    now = [Sequence(s.name, list(s.prompt_ids), list(s.output_ids), list(s.decode_lp),
                    list(s.decode_top)) for s in saved.sequences]
    return _replayed(client, now, spec, started, say)


# ---------------------------------------------------------------- judging

@dataclass(frozen=True)
class SequenceDrift:
    name: str
    prompt_tokens: int
    output_tokens: int
    comparison: Comparison


@dataclass(frozen=True)
class DriftReport:
    """What a run says: decode vs prefill (one state), or state A vs state B (A/B)."""

    kind: str                              # "prefill-vs-decode" | "a-b"
    endpoint: str
    per_sequence: tuple[SequenceDrift, ...]
    overall: Comparison
    verdict: Decision                      # above | bounded | inconclusive, with figures
    seconds: float
    against: str | None = None
    traffic: tuple[str, ...] = ()          # what the server's counters said of the replays

    def to_json(self, points: bool = False) -> dict:
        def comp(c: Comparison) -> dict:
            out: dict[str, Any] = {
                "overall": asdict(c.overall),
                "buckets": {k: asdict(v) for k, v in c.buckets.items()},
                "top1_agreement": c.top1_agreement, "first_divergence": c.first_divergence}
            if points:
                out["points"] = [list(p) for p in c.points]
            return out
        return {"kind": self.kind, "endpoint": self.endpoint, "against": self.against,
                "seconds": self.seconds, "traffic": list(self.traffic),
                "overall": comp(self.overall),
                "verdict": dict(asdict(self.verdict), above=self.verdict.above),
                "sequences": [{"name": s.name, "prompt_tokens": s.prompt_tokens,
                               "output_tokens": s.output_tokens, **comp(s.comparison)}
                              for s in self.per_sequence]}


def prefill_vs_decode(run: DriftRun, judge: Judge = Judge(),
                      noise_of: DriftRun | None = None) -> DriftReport:
    """Decode's logprobs against the first replay's; the noise: replay 1 against replay
    0 of the same sequence (or `noise_of`'s, for a run replayed once: a bisect's test
    state)."""
    per = tuple(SequenceDrift(s.name, s.start, len(s.output_ids),
                              compare(s.prefill_lp[0], s.decode_lp, s.start, s.prefill_top,
                                      s.decode_top))
                for s in run.sequences if s.prefill_lp)
    overall = pooled([p.comparison for p in per])
    return DriftReport("prefill-vs-decode", run.endpoint, per, overall,
                       _judge(per, noise_of or run, judge), run.seconds,
                       traffic=tuple(run.traffic))


def a_b(saved: DriftRun, now: DriftRun, judge: Judge = Judge(), where: str = "",
        noise_of: DriftRun | None = None) -> DriftReport:
    """State A (saved) against state B (now), replay against replay, same tokens; the
    noise: B's replay 1 against its replay 0 on the same tokens, or `noise_of`'s where B
    was replayed once (a bisect's test state, judged against the starting state's
    noise)."""
    per = tuple(SequenceDrift(b.name, b.start, len(b.output_ids),
                              compare(b.prefill_lp[0], a.prefill_lp[0], b.start))
                for a, b in zip(saved.sequences, now.sequences) if a.prefill_lp and b.prefill_lp)
    overall = pooled([p.comparison for p in per])
    return DriftReport("a-b", now.endpoint, per, overall, _judge(per, noise_of or now, judge),
                       now.seconds, against=where or saved.endpoint,
                       traffic=tuple(dict.fromkeys(saved.traffic + now.traffic)))


def _judge(per: tuple[SequenceDrift, ...], state: DriftRun, judge: Judge) -> Decision:
    """Each sequence's drift paired with the noise on its own tokens (isolate/
    driftdecide.py: the sequence is the unit)."""
    noise = sequence_noise(state)
    pairs = [Paired(p.name, p.comparison.overall.mean, level, p.comparison.overall.tokens)
             for p in per if p.comparison.overall.mean is not None
             and (level := noise.get(p.name)) is not None]
    replays = min((len(s.prefill_lp) for s in state.sequences), default=0)
    return decide(pairs, judge.tolerance, judge.confidence, replays, judge.looks)


def sequence_noise(run: DriftRun) -> dict[str, float | None]:
    """Sequence name -> the mean estimator between its replay 0 and replay 1 (None: one
    replay, or no comparable token). Oriented as the drift is (replay 0 first, the other
    side second): exp(r) - 1 - r is not symmetric in r, so only this order makes drift_i
    and noise_i exchangeable when there is no drift."""
    return {s.name: compare(s.prefill_lp[0], s.prefill_lp[1], s.start).overall.mean
            if len(s.prefill_lp) > 1 else None for s in run.sequences}


def noise_pairs(run: DriftRun) -> list[Comparison]:
    """Replay j against replay 0 of the same state, every sequence pooled (j >= 1)."""
    return [pooled([compare(s.prefill_lp[j], s.prefill_lp[0], s.start)
                    for s in run.sequences])
            for j in range(1, min((len(s.prefill_lp) for s in run.sequences), default=0))]


def noise(run: DriftRun) -> list[float]:
    """The noise's per-token estimates: every replay against the first."""
    return [v for c in noise_pairs(run) for _, v in c.points]


# ---------------------------------------------------------------- files

def save_run(run: DriftRun, path: Path) -> None:
    """Atomically, 0600: a run holds the prompts' token ids (the shipped text), no keys."""
    safewrite.write_file(path, json.dumps(run.to_json()).encode(), 0o600, streams=True)


def load(path: Path) -> DriftRun:
    """A saved run, through the bounded reader (a FIFO, a device, a bomb is refused)."""
    try:
        data = read_json(path, MAX_RUN_BYTES, "drift run")
    except InputError as exc:
        raise DriftError(str(exc)) from None
    return DriftRun.from_json(data, str(path))


# ---------------------------------------------------------------- response shapes

def _answer(value: Any) -> answers.GenerateAnswer:
    """The server's answer validated whole (isolate/measure/answers.py), or a DriftError."""
    try:
        return answers.generate_answer(value)
    except InputError as exc:
        raise DriftError(str(exc)) from None


def _need(entries: tuple | None, key: str) -> tuple:
    if entries is None:
        raise DriftError(f"/generate's meta_info has no {key} list (return_logprob ignored?)")
    return entries


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _floats(value: Any, n: int) -> bool:
    """n logprobs or nulls, in the range answers.py takes from a server: a saved run is
    compared as the server's answers are."""
    low, high = answers.MIN_LOGPROB, answers.MAX_LOGPROB
    return isinstance(value, list) and len(value) == n and all(
        v is None or (type(v) in (int, float) and low <= v <= high) for v in value)


# ---------------------------------------------------------------- the probe command

@dataclass
class DriftOutcome:
    report: DriftReport | None
    run: DriftRun | None
    unreachable: bool = False
    error: str | None = None
    saved: str | None = None

    def to_json(self) -> dict:
        return {"unreachable": self.unreachable, "error": self.error, "saved": self.saved,
                "report": self.report.to_json(points=True) if self.report else None}


def probe_drift(client: Client, spec: DriftSpec, save: Path | None = None,
                against: Path | None = None,
                say: Callable[[str], None] = lambda _: None) -> DriftOutcome:
    """One `patchset probe --kind drift`: a bad saved run is the caller's input error
    (UsageError, nothing sent); no answer is `unreachable`; a server whose answers are
    not /generate's is a TargetError."""
    try:
        saved = load(against) if against else None
    except DriftError as exc:
        raise UsageError(f"--against {exc}") from None
    try:
        if saved is not None:
            run = replay_saved(client, saved, spec, say)
            report = a_b(saved, run, spec.fixed, str(against))
        else:
            run = measure(client, spec, say)
            report = prefill_vs_decode(run, spec.judge)
    except Unreachable as exc:
        return DriftOutcome(None, None, unreachable=True, error=str(exc))
    except DriftError as exc:
        raise TargetError(f"drift probe: {exc}") from None
    if save:
        save_run(run, save)
    return DriftOutcome(report, run, saved=str(save) if save else None)
