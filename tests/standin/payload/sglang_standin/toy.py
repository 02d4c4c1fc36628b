"""A tiny deterministic language model for ``/generate`` (standard library, pure Python).

Nothing here is scripted: every token id, logprob and top-k list the stand-in reports
for ``/generate`` is computed by the model below, on the token ids of the request.

Tokenizer (:class:`Tokenizer`): a fixed vocabulary of ``V`` = 96 entries built from a
seeded generator (``random.Random(SEED)``): id 0 ``<s>`` (BOS, prepended to text input
as SGLang's tokenizers do with ``add_special_tokens``), id 1 ``</s>`` (EOS), then
pseudo-words.  Text is split on whitespace; a word not in the vocabulary is hashed
(CRC-32) onto an id in ``[2, V)``.  Decoding joins the words with spaces
(``skip_special_tokens`` drops BOS/EOS).

Model (:class:`ToyModel`, weights drawn once from ``random.Random(SEED)``), per token
``x`` at position ``t``:

* embedding ``e = E[x]`` (width ``D`` = 12, rows of equal norm), expanded into ``N`` = 4
  residual streams (per-stream scales, then mixed by a fixed doubly stochastic matrix);
* "attention": a causal recurrent state ``S_t = lam * S_{t-1} + (1 - lam) * (Wv e + p_t)``
  (per-channel decay ``lam`` in [0.968, 0.999]: a decayed running sum, O(n*D), not
  O(n^2); ``p_t`` sinusoids of the absolute position, as RoPE gives attention a sense of
  order), read out as ``Wo (sigmoid(Wq e + p'_t) * S_t)`` and added to the streams;
* a hyper-connection step as DeepSeek-V4's mHC: the streams are aggregated with
  weights ``softmax(b + alpha * m_{t-1})``, go through an MLP (``W2 tanh(W1 rms(u))``),
  are mixed by a second fixed doubly stochastic matrix and receive the MLP output;
  ``m`` is a carried per-stream statistic, ``m_t = mu * m_{t-1} + (1 - mu) tanh(<X_i, g_i>)``
  (the mixing step's input that is carried from token to token);
* ``h = rms(R sum_i c_i X_i)``, logits ``= s * h . E^T`` (tied embedding; the fixed
  projection ``R`` keeps the model from merely repeating its input), log-softmax.

Two code paths compute this same function:

* DECODE (:meth:`ToyModel.decode_step`): one token at a time; the carried ``S`` and
  ``m`` are STORED after every token (output tokens 1..: token 0 is sampled from the
  prefill's last position, as in SGLang);
* PREFILL (:meth:`ToyModel.prefill`): chunks of ``C`` = 64 tokens; inside a chunk the
  partial sums are accumulated from zero and added to the chunk's starting state
  (``S_t = lam^i * S_b + P_i``: another summation order); the state is STORED only at
  chunk boundaries and at the end of the prompt (the KV handed to decode).

Every prefill chunk and every decode step goes through ``ToyModel.forward(mode, step)``
(``"EXTEND"`` / ``"DECODE"``): in a server the scheduler child wraps each in
``ModelRunner.forward`` (scheduler.py), so the model runs where SGLang runs it; the default
(``run_here``) just calls the step.  Numbers are the same either way.

In prefill/decode disaggregation the two paths run on two servers: the prefill
server's :meth:`Runner.run` stops after the first output token and its
``Result.kv`` (the state stored at the end of the prompt) is handed over (server.py,
generate.py); the decode server's :meth:`Runner.resume` continues from it with its
own DECODE steps, so each server's precision rules apply to its own part.

Without precision rules both paths agree to ~1e-15 in logprobs.  A precision rule
(``STANDIN_NUMERICS_RULES=FILE``, read once at startup, see :class:`Numerics`) rounds
the carried state (op ``state``) and/or the mixing statistic (op ``mix``) to bf16 or
fp16 (or fp32) each time it is stored: decode rounds every token, prefill once per
chunk, so the two paths drift apart, more with every decoded token -- the way
reduced-precision KV / kernels differ between a real prefill and decode.  Several
holding rules for one op: the coarsest precision wins.

Speed (pure Python, one core): an 8k-token prefill takes ~0.5-1 s (~1.2 s with logits
at every position), 256 decode steps ~0.03 s.

``STANDIN_NONDETERMINISM=EPS``: each request draws (``os.urandom``-seeded) a relative
jitter of size EPS on every logit: run-to-run differences as batching changes reduction
order in real SGLang, the same whatever the precision rules.  (The chunk size stays C:
with it drawn per request too, a bf16 rule's prefill rounding moved with every replay and
a server's replays disagreed with each other as much as with another state's, so no A/B
could tell two states apart.)  Default 0: bitwise reproducible.

:class:`PrefixCache` keeps the stored states at chunk boundaries (from prefill and
decode, as the radix cache keeps the KV of everything computed), keyed by the token
prefix; a request reuses the longest cached prefix allowed (``cached_tokens``).

What is faked: the weights are random, the vocabulary is not the served model's
(``V`` is tiny; ``/model_info`` still describes the real model), there are no layers
beyond the one attention-like and one MLP sublayer, and no GPU kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import os
import random
import re
import struct
import threading
import zlib
from operator import mul
from typing import Any, Callable, Sequence, TypeVar

from sglang_standin import chat

SEED = 20260514
V = 96          # vocabulary
D = 12          # width
N = 4           # residual streams (hyper-connections)
HIDDEN = 24     # MLP width
C = 64          # prefill chunk (the "kernel tile")
BOS, EOS = 0, 1
SPECIAL = {BOS: "<s>", EOS: "</s>"}

NUMERICS_ENV = "STANDIN_NUMERICS_RULES"
NONDET_ENV = "STANDIN_NONDETERMINISM"
OPS = ("state", "mix")

T = TypeVar("T")
# How a model step runs: forward(mode, step) -> step's result, with mode "EXTEND" (a prefill
# chunk) or "DECODE" (one token).  The scheduler's wraps each step in ModelRunner.forward
# (scheduler.py); the default (run_here) just calls it.
Forward = Callable[[str, Callable[[], Any]], Any]


# ---------------------------------------------------------------- rounding


def round_bf16(x: float) -> float:
    """*x* rounded to the nearest bfloat16 (ties to even), in one rounding step from the
    double (no double rounding through float32); overflow gives +-inf as on a GPU."""
    if x != x or x in (math.inf, -math.inf) or x == 0.0:
        return x
    ax = abs(x)
    if ax < 2.0 ** -126:  # bf16 subnormals: multiples of 2^-133 (exact scaling)
        q = 2.0 ** -133
        return math.copysign(round(ax / q) * q, x)
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    lsb = (bits >> 45) & 1  # 52 - 7 explicit bf16 mantissa bits
    bits = (bits + (1 << 44) - 1 + lsb) & ~((1 << 45) - 1)
    y = struct.unpack("<d", struct.pack("<Q", bits))[0]
    if abs(y) >= 2.0 ** 128:
        return math.copysign(math.inf, x)
    return y


def round_fp16(x: float) -> float:
    """*x* rounded to the nearest IEEE half (struct ``e``: ties to even); overflow: +-inf."""
    try:
        return struct.unpack("<e", struct.pack("<e", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def round_fp32(x: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


ROUNDERS: dict[str, Callable[[float], float]] = {"bf16": round_bf16, "fp16": round_fp16, "fp32": round_fp32}
_COARSENESS = {"fp32": 0, "fp16": 1, "bf16": 2}  # several rules on one op: the coarsest wins


# ---------------------------------------------------------------- startup knobs


@dataclasses.dataclass(frozen=True)
class Numerics:
    """Precision per op (``None``: float64) and the nondeterminism EPS, read at startup."""

    precision: dict = dataclasses.field(default_factory=dict)   # op -> "bf16" | "fp16" | "fp32"
    eps: float = 0.0

    @classmethod
    def from_env(cls, environ: dict, pkg_dir: Any) -> "Numerics":
        """ValueError (a startup error) on an unknown op/precision or a bad EPS."""
        precision: dict[str, str] = {}
        rules_file = environ.get(NUMERICS_ENV)
        if rules_file:
            for i, rule in enumerate(chat.load_rules(rules_file)):
                op, prec = rule.get("op"), rule.get("precision")
                if op not in OPS:
                    raise ValueError(f"{NUMERICS_ENV}: rule {i}: unknown op {op!r} ({' | '.join(OPS)})")
                if prec not in ROUNDERS:
                    raise ValueError(f"{NUMERICS_ENV}: rule {i}: unknown precision {prec!r} "
                                     f"({' | '.join(ROUNDERS)})")
                if chat.rule_holds(rule, pkg_dir, environ):
                    if op not in precision or _COARSENESS[prec] > _COARSENESS[precision[op]]:
                        precision[op] = prec
        raw = (environ.get(NONDET_ENV) or "").strip()
        try:
            eps = float(raw) if raw else 0.0
        except ValueError:
            raise ValueError(f"{NONDET_ENV}: not a number: {raw!r}") from None
        if not (eps >= 0.0 and math.isfinite(eps)):
            raise ValueError(f"{NONDET_ENV}: must be a finite number >= 0, got {raw!r}")
        return cls(precision, eps)

    def __str__(self) -> str:
        parts = [f"{op}={p}" for op, p in sorted(self.precision.items())]
        if self.eps:
            parts.append(f"nondeterminism={self.eps:g}")
        return ",".join(parts) or "float64"


# ---------------------------------------------------------------- tokenizer


_CONS = "bdfghklmnprstvz"
_VOWELS = "aeiou"


class Tokenizer:
    """Words <-> ids over the fixed toy vocabulary."""

    def __init__(self, rng: random.Random) -> None:
        words: list[str] = []
        seen = set(SPECIAL.values())
        while len(words) < V - len(SPECIAL):
            w = "".join(rng.choice(_CONS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3)))
            if w not in seen:
                seen.add(w)
                words.append(w)
        self.id_to_word = [SPECIAL[BOS], SPECIAL[EOS], *words]
        self.word_to_id = {w: i for i, w in enumerate(self.id_to_word)}
        self.bos_token_id, self.eos_token_id = BOS, EOS
        self.vocab_size = V

    def word_id(self, word: str) -> int:
        got = self.word_to_id.get(word)
        if got is not None:
            return got
        return len(SPECIAL) + zlib.crc32(word.encode("utf-8", "surrogatepass")) % (V - len(SPECIAL))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.word_id(w) for w in str(text).split()]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(self.id_to_word[i] for i in ids
                        if 0 <= i < V and not (skip_special_tokens and i in SPECIAL))

    def token_text(self, token_id: int) -> str:
        """One token as ``tokenizer.batch_decode([[id]])`` gives it (specials kept)."""
        return self.id_to_word[token_id] if 0 <= token_id < V else ""


# ---------------------------------------------------------------- weights


def _gauss(rng: random.Random, rows: int, cols: int, scale: float) -> list[list[float]]:
    return [[rng.gauss(0.0, 1.0) * scale for _ in range(cols)] for _ in range(rows)]


def _matvec(m: Sequence[Sequence[float]], v: Sequence[float]) -> list[float]:
    return [sum(map(mul, row, v)) for row in m]


def _doubly_stochastic(rng: random.Random, n: int) -> list[list[float]]:
    """Sinkhorn-normalized exp(random): the fixed mixing matrix of the streams (as mHC's
    H_res lies on the Birkhoff polytope)."""
    m = [[math.exp(rng.gauss(0.0, 1.0)) for _ in range(n)] for _ in range(n)]
    for _ in range(50):
        m = [[x / sum(row) for x in row] for row in m]
        cols = [sum(m[i][j] for i in range(n)) for j in range(n)]
        m = [[m[i][j] / cols[j] for j in range(n)] for i in range(n)]
    return m


def _rms(v: Sequence[float]) -> list[float]:
    inv = 1.0 / math.sqrt(sum(map(mul, v, v)) / len(v) + 1e-6)
    return [x * inv for x in v]


class _Weights:
    def __init__(self, rng: random.Random) -> None:
        # Rows of equal norm sqrt(D): no token is favoured by its norm alone.
        self.E = [_rms(row) for row in _gauss(rng, V, D, 1.0)]
        wv = _gauss(rng, D, D, 1.0 / math.sqrt(D))
        wq = _gauss(rng, D, D, 1.0 / math.sqrt(D))
        self.Wo = _gauss(rng, D, D, 1.5 / math.sqrt(D))
        self.lam = [1.0 - 10.0 ** -rng.uniform(1.5, 3.0) for _ in range(D)]
        self.one_minus_lam = [1.0 - x for x in self.lam]
        self.mu = 0.99
        self.W1 = _gauss(rng, HIDDEN, D, 1.0 / math.sqrt(D))
        self.W2 = _gauss(rng, D, HIDDEN, 1.0 / math.sqrt(HIDDEN))
        scales = [[1.0 + 0.5 * rng.uniform(-1, 1) for _ in range(D)] for _ in range(N)]
        self.H_res1 = _doubly_stochastic(rng, N)
        self.H_res2 = _doubly_stochastic(rng, N)
        self.post1 = [rng.uniform(0.5, 1.5) for _ in range(N)]
        self.post2 = [rng.uniform(0.5, 1.5) for _ in range(N)]
        self.pre_bias = [rng.gauss(0.0, 0.5) for _ in range(N)]
        self.alpha = 3.0
        self.g = [[rng.gauss(0.0, 1.0) / math.sqrt(D) for _ in range(D)] for _ in range(N)]
        self.readout = [rng.uniform(0.5, 1.5) for _ in range(N)]
        # Positions (as RoPE gives attention a sense of order): sinusoids of the absolute
        # position added to the state's input and to the read-out gate.
        self.pos_freq = [2.0 * math.pi / 10.0 ** rng.uniform(0.5, 2.5) for _ in range(2 * D)]
        self.pos_phase = [rng.uniform(0.0, 2.0 * math.pi) for _ in range(2 * D)]
        self.pos_amp_v = list(self.one_minus_lam)
        self.pos_amp_q = 1.0
        self.logit_scale = 2.5 / math.sqrt(D)
        self.R = _gauss(rng, D, D, 1.0 / math.sqrt(D))  # final projection (no "copy the input" bias)
        # Per-token tables (functions of the token id only).
        self.A = []    # (1 - lam) * Wv e: the state's input
        self.Q = []    # Wq e: the read-out gate's logits
        self.X0 = []   # the N streams of e after the first fixed mixing
        for x in range(V):
            e = self.E[x]
            v = _matvec(wv, e)
            self.A.append([a * b for a, b in zip(self.one_minus_lam, v)])
            self.Q.append(_matvec(wq, e))
            streams = [[s * c for s, c in zip(scales[i], e)] for i in range(N)]
            self.X0.append([[sum(self.H_res1[i][j] * streams[j][k] for j in range(N)) for k in range(D)]
                            for i in range(N)])
        self.E_cols = [[self.E[j][k] * self.logit_scale for j in range(V)] for k in range(D)]


_WEIGHTS: _Weights | None = None
_TOKENIZER: Tokenizer | None = None
_LOCK = threading.Lock()


def _build() -> tuple[_Weights, Tokenizer]:
    global _WEIGHTS, _TOKENIZER
    with _LOCK:
        if _WEIGHTS is None:
            rng = random.Random(SEED)
            _TOKENIZER = Tokenizer(rng)
            _WEIGHTS = _Weights(rng)
    assert _TOKENIZER is not None
    return _WEIGHTS, _TOKENIZER


def tokenizer() -> Tokenizer:
    return _build()[1]


# ---------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class State:
    """What is carried from token to token (the "KV"): attention state and mix statistic."""

    S: tuple
    m: tuple


def log_softmax(logits: Sequence[float]) -> list[float]:
    mx = max(logits)
    lse = mx + math.log(sum([math.exp(v - mx) for v in logits]))
    return [v - lse for v in logits]


def run_here(mode: str, step: Callable[[], T]) -> T:
    """The default :data:`Forward`: the step runs in this process, outside any ModelRunner."""
    return step()


class ToyModel:
    def __init__(self, numerics: Numerics | None = None, forward: Forward = run_here) -> None:
        self.w, self.tokenizer = _build()
        self.numerics = numerics or Numerics()
        self.forward = forward
        prec = self.numerics.precision
        self._round_state = ROUNDERS[prec["state"]] if "state" in prec else None
        self._round_mix = ROUNDERS[prec["mix"]] if "mix" in prec else None

    def initial_state(self) -> State:
        return State((0.0,) * D, (0.0,) * N)

    def _store(self, S: Sequence[float], m: Sequence[float]) -> State:
        """The carried state as it is written to the cache (rounded by the precision rules)."""
        rs, rm = self._round_state, self._round_mix
        return State(tuple(map(rs, S)) if rs else tuple(S), tuple(map(rm, m)) if rm else tuple(m))

    def _inputs(self, x: int, t: int) -> tuple[list[float], list[float]]:
        """Token *x* at position *t*: (the state's input, the read-out gate)."""
        w = self.w
        sins = [math.sin(f * t + ph) for f, ph in zip(w.pos_freq, w.pos_phase)]
        a = [v + amp * sn for v, amp, sn in zip(w.A[x], w.pos_amp_v, sins)]
        aq = w.pos_amp_q
        gate = [1.0 / (1.0 + math.exp(-(q + aq * sn))) for q, sn in zip(w.Q[x], sins[D:])]
        return a, gate

    def _body(self, x: int, gate: Sequence[float], S_t: Sequence[float],
              m_prev: Sequence[float]) -> tuple[list[float], list[float]]:
        """Everything after the attention state: (z_t for the mix statistic, final h)."""
        w = self.w
        qs = [a * b for a, b in zip(gate, S_t)]
        y1 = [sum(map(mul, row, qs)) for row in w.Wo]
        X0 = w.X0[x]
        X1 = [[a + p * b for a, b in zip(X0[i], y1)] for i, p in enumerate(w.post1)]
        logits_pre = [b + w.alpha * mi for b, mi in zip(w.pre_bias, m_prev)]
        mx = max(logits_pre)
        ex = [math.exp(v - mx) for v in logits_pre]
        tot = sum(ex)
        wts = [v / tot for v in ex]
        u2 = [sum(wts[i] * X1[i][k] for i in range(N)) for k in range(D)]
        u2n = _rms(u2)
        hid = [math.tanh(sum(map(mul, row, u2n))) for row in w.W1]
        y2 = [sum(map(mul, row, hid)) for row in w.W2]
        H = w.H_res2
        X2 = []
        for i in range(N):
            Hi = H[i]
            p = w.post2[i]
            X2.append([Hi[0] * X1[0][k] + Hi[1] * X1[1][k] + Hi[2] * X1[2][k] + Hi[3] * X1[3][k] + p * y2[k]
                       for k in range(D)])
        z = [math.tanh(sum(map(mul, X2[i], w.g[i]))) for i in range(N)]
        c = w.readout
        hsum = [c[0] * X2[0][k] + c[1] * X2[1][k] + c[2] * X2[2][k] + c[3] * X2[3][k] for k in range(D)]
        return z, _rms(_matvec(w.R, hsum))

    def logits(self, h: Sequence[float]) -> list[float]:
        cols = self.w.E_cols
        acc = [h[0] * v for v in cols[0]]
        for k in range(1, D):
            hk = h[k]
            acc = [a + hk * b for a, b in zip(acc, cols[k])]
        return acc

    # -- DECODE: one token, state stored after it ---------------------------------

    def decode_step(self, x: int, t: int, state: State) -> tuple[State, list[float]]:
        """Token *x* at position *t* from the state stored after position t - 1: one DECODE
        forward (:attr:`forward`)."""
        return self.forward("DECODE", functools.partial(self._decode, x, t, state))

    def _decode(self, x: int, t: int, state: State) -> tuple[State, list[float]]:
        w = self.w
        a, gate = self._inputs(x, t)
        S_t = [l * s + ai for l, s, ai in zip(w.lam, state.S, a)]
        z, h = self._body(x, gate, S_t, state.m)
        mu = w.mu
        m_t = [mu * mi + (1.0 - mu) * zi for mi, zi in zip(state.m, z)]
        return self._store(S_t, m_t), self.logits(h)

    # -- PREFILL: chunks, state stored at chunk boundaries --------------------------

    def prefill(self, ids: Sequence[int], start: int, state: State, *, chunk: int = C,
                want_logits: Callable[[int], bool] = lambda pos: False,
                on_boundary: Callable[[int, State], None] | None = None,
                ) -> tuple[State, dict[int, list[float]]]:
        """Process ``ids[start:]`` from *state* (the stored state after ``ids[:start]``).

        Returns the state stored at the end (the KV handed to decode) and the logits at
        the positions *want_logits* selects.  *on_boundary(pos, state)* sees each state
        stored at a chunk boundary (``pos`` tokens processed).  Each chunk is one EXTEND
        forward (:attr:`forward`); the cache insert stays outside it, as the radix cache's."""
        out: dict[int, list[float]] = {}
        n = len(ids)
        pos = start
        while pos < n:
            end = min(pos + chunk, n)
            state, logits = self.forward(
                "EXTEND", functools.partial(self._extend, ids, pos, end, state, want_logits))
            out.update(logits)
            pos = end
            if on_boundary is not None and (pos - start) % chunk == 0:
                on_boundary(pos, state)
        return state, out

    def _extend(self, ids: Sequence[int], pos: int, end: int, state: State,
                want_logits: Callable[[int], bool]) -> tuple[State, dict[int, list[float]]]:
        """One prefill chunk ``ids[pos:end]`` from *state*: the partial sums accumulated from
        zero and added to the chunk's starting state; (state stored at its end, its logits)."""
        w = self.w
        lam, mu = w.lam, w.mu
        out: dict[int, list[float]] = {}
        S_b, m_b = state.S, state.m
        P = [0.0] * D
        lam_i = [1.0] * D
        Pm = [0.0] * N
        mu_i = 1.0
        m_prev: Sequence[float] = m_b
        S_t: list[float] = list(S_b)
        for t in range(pos, end):
            x = ids[t]
            a, gate = self._inputs(x, t)
            P = [l * p + ai for l, p, ai in zip(lam, P, a)]
            lam_i = [li * l for li, l in zip(lam_i, lam)]
            S_t = [li * s + p for li, s, p in zip(lam_i, S_b, P)]
            z, h = self._body(x, gate, S_t, m_prev)
            Pm = [mu * p + (1.0 - mu) * zi for p, zi in zip(Pm, z)]
            mu_i *= mu
            m_prev = [mu_i * mb + p for mb, p in zip(m_b, Pm)]
            if want_logits(t):
                out[t] = self.logits(h)
        return self._store(S_t, m_prev), out


# ---------------------------------------------------------------- prefix cache


class PrefixCache:
    """Stored states at chunk boundaries, keyed by the token prefix (radix-cache-like)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._entries: dict[tuple, State] = {}
        self._by_len: dict[int, int] = {}
        self._lock = threading.Lock()

    def put(self, prefix: Sequence[int], state: State) -> None:
        key = tuple(prefix)
        with self._lock:
            if key in self._entries:
                self._entries.pop(key)
            else:
                self._by_len[len(key)] = self._by_len.get(len(key), 0) + 1
            self._entries[key] = state
            while len(self._entries) > self.capacity:
                old = next(iter(self._entries))
                self._entries.pop(old)
                self._drop_len(len(old))

    def _drop_len(self, n: int) -> None:
        self._by_len[n] -= 1
        if not self._by_len[n]:
            del self._by_len[n]

    def match(self, ids: Sequence[int], max_len: int) -> tuple[int, State | None]:
        """The longest cached prefix of *ids* no longer than *max_len*."""
        with self._lock:
            for n in sorted((k for k in self._by_len if 0 < k <= max_len), reverse=True):
                got = self._entries.get(tuple(ids[:n]))
                if got is not None:
                    self._entries[tuple(ids[:n])] = self._entries.pop(tuple(ids[:n]))  # LRU
                    return n, got
        return 0, None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_len.clear()

    def __len__(self) -> int:
        return len(self._entries)


# ---------------------------------------------------------------- one request


@dataclasses.dataclass
class Request:
    """One request as the scheduler holds it (already validated)."""

    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 1 << 30
    top_p: float = 1.0
    min_p: float = 0.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: frozenset = frozenset()
    stop_strs: tuple = ()
    stop_regex_strs: tuple = ()
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict = dataclasses.field(default_factory=dict)
    sampling_seed: int | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1      # already resolved: the scheduler's req.logprob_start_len
    top_logprobs_num: int = 0
    token_ids_logprob: list | None = None
    use_cache: bool = True


@dataclasses.dataclass
class Result:
    output_ids: list[int]           # through the stop condition
    text: str
    finish_reason: dict
    cached_tokens: int
    # (value, token id) pairs as the scheduler holds them; None: not requested
    input_token_logprobs: list | None = None
    output_token_logprobs: list | None = None
    input_top_logprobs: list | None = None
    output_top_logprobs: list | None = None
    input_token_ids_logprobs: list | None = None
    output_token_ids_logprobs: list | None = None
    # the state stored at the end of the prompt (what a P/D prefill hands the decode)
    kv: State | None = None


def _top(lps: Sequence[float], k: int) -> list[tuple[float, int]]:
    idx = heapq.nlargest(k, range(len(lps)), key=lps.__getitem__)
    return [(lps[i], i) for i in idx]


class Runner:
    """The model, its cache and the per-request loop (prefill, then decode)."""

    def __init__(self, numerics: Numerics | None = None, cache: bool = True, forward: Forward = run_here) -> None:
        self.model = ToyModel(numerics, forward)
        self.tokenizer = self.model.tokenizer
        self.cache = PrefixCache() if cache else None
        self.eps = self.model.numerics.eps

    def _jitter(self, logits: list[float], rng: random.Random | None) -> list[float]:
        if rng is None:
            return logits
        e = self.eps
        return [v * (1.0 + e * (2.0 * rng.random() - 1.0)) for v in logits]

    def _choose(self, logits: list[float], req: Request, n_out: int,
                rng: random.Random) -> tuple[int, list[float]]:
        """(next token, logprobs of the distribution it was drawn from)."""
        if req.logit_bias:
            logits = list(logits)
            for tok, bias in req.logit_bias.items():
                logits[tok] += bias
        if n_out < req.min_new_tokens:
            logits = list(logits)
            for tok in {EOS, *req.stop_token_ids}:
                if 0 <= tok < V:
                    logits[tok] = -math.inf
        t = req.temperature
        lps = log_softmax([v / t for v in logits] if t != 1.0 else logits)
        if req.top_k == 1:
            best = max(range(V), key=logits.__getitem__)
            return best, lps
        order = sorted(range(V), key=lambda i: -lps[i])[: min(req.top_k, V)]
        probs = [math.exp(lps[i]) for i in order]
        if req.top_p < 1.0:
            keep, acc = [], 0.0
            for i, p in zip(order, probs):
                keep.append((i, p))
                acc += p
                if acc >= req.top_p:
                    break
            order, probs = [i for i, _ in keep], [p for _, p in keep]
        if req.min_p > 0.0:
            floor = req.min_p * probs[0]
            pairs = [(i, p) for i, p in zip(order, probs) if p >= floor]
            order, probs = [i for i, _ in pairs], [p for _, p in pairs]
        r = rng.random() * sum(probs)
        acc = 0.0
        for i, p in zip(order, probs):
            acc += p
            if r < acc:
                return i, lps
        return order[-1], lps

    def _finish(self, req: Request, out: list[int]) -> dict | None:
        """update_finish_state for the last accepted token (schedule_batch.py order)."""
        if len(out) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        if req.stop_strs or req.stop_regex_strs:
            tail = self.tokenizer.decode(out, skip_special_tokens=req.skip_special_tokens)
            for s in req.stop_strs:
                if s in tail:
                    return {"type": "stop", "matched": s}
            for rx in req.stop_regex_strs:
                if re.search(rx, tail):
                    return {"type": "stop", "matched": rx}
        if not req.ignore_eos:
            tok = out[-1]
            if tok in req.stop_token_ids or tok == EOS:
                return {"type": "stop", "matched": tok}
        return None

    def _rngs(self, req: Request, entropy: bytes | None) -> tuple[random.Random | None, random.Random]:
        """(logit jitter, sampler) of one request: seeded from *entropy* (32 bytes) when
        given, so that every TP rank's scheduler draws the same (as SGLang's ranks sample the
        same token), else from ``os.urandom``; the sampler from ``sampling_seed`` if set."""
        entropy = entropy or os.urandom(32)
        nondet = random.Random(entropy[:16]) if self.eps > 0 else None
        sampler = random.Random(req.sampling_seed if req.sampling_seed is not None else entropy[16:32])
        return nondet, sampler

    def run(self, req: Request, entropy: bytes | None = None) -> Result:
        ids = req.input_ids
        n = len(ids)
        nondet, sampler = self._rngs(req, entropy)
        chunk = C

        # Prefix reuse: at most input_len - 1 and, for input logprobs, logprob_start_len
        # (Req._compute_max_prefix_len).
        max_prefix = n - 1
        if req.return_logprob and req.logprob_start_len >= 0:
            max_prefix = min(max_prefix, req.logprob_start_len)
        cached, state = (0, None)
        if self.cache is not None and req.use_cache:
            cached, state = self.cache.match(ids, max(max_prefix, 0))
        if state is None:
            cached, state = 0, self.model.initial_state()

        # Positions whose logits are needed: input logprobs from logprob_start_len, and the
        # last position (it samples the first output token).
        lp_start = req.logprob_start_len if req.return_logprob else n
        want_input = req.return_logprob and lp_start < n
        need_last = req.max_new_tokens > 0

        def want(pos: int) -> bool:
            return (want_input and pos >= lp_start) or (need_last and pos == n - 1)

        def keep(pos: int, st: State, seq: Sequence[int] = ids) -> None:
            if self.cache is not None:
                self.cache.put(seq[:pos], st)

        state, logits_at = self.model.prefill(ids, cached, state, chunk=chunk, want_logits=want,
                                              on_boundary=keep)
        res = Result([], "", {}, cached, kv=state)

        tids = req.token_ids_logprob
        if req.return_logprob:
            vals: list = [None]
            tops: list = [None]
            tid_vals: list = [None]
            for pos in range(lp_start, n - 1):
                lps = log_softmax(self._jitter(logits_at[pos], nondet))
                vals.append(lps[ids[pos + 1]])
                if req.top_logprobs_num > 0:
                    tops.append(_top(lps, req.top_logprobs_num))
                if tids is not None:
                    tid_vals.append([(lps[t], t) for t in tids])
            if lp_start < n:
                res.input_token_logprobs = list(zip(vals, ids[lp_start:]))
                res.input_top_logprobs = tops if req.top_logprobs_num > 0 else None
                res.input_token_ids_logprobs = tid_vals if tids is not None else None
            else:
                res.input_token_logprobs = []
                res.input_top_logprobs = [] if req.top_logprobs_num > 0 else None
                res.input_token_ids_logprobs = [] if tids is not None else None
            res.output_token_logprobs = []
            res.output_top_logprobs = [] if req.top_logprobs_num > 0 else None
            res.output_token_ids_logprobs = [] if tids is not None else None

        if req.max_new_tokens == 0:  # prefill only: no sampling (tp_worker.py)
            res.finish_reason = {"type": "length", "length": 0}
            return res

        tok, lps = self._choose(self._jitter(logits_at[n - 1], nondet), req, 0, sampler)
        self._record(req, res, tok, lps)
        self._decode(req, res, [tok], list(ids) + [tok], state, nondet, sampler, keep)
        return res

    def _record(self, req: Request, res: Result, tok: int, lps: Sequence[float]) -> None:
        """The output logprobs of one sampled token (if asked for)."""
        if req.return_logprob:
            res.output_token_logprobs.append((lps[tok], tok))
            if req.top_logprobs_num > 0:
                res.output_top_logprobs.append(_top(lps, req.top_logprobs_num))
            if req.token_ids_logprob is not None:
                res.output_token_ids_logprobs.append([(lps[t], t) for t in req.token_ids_logprob])

    def _decode(self, req: Request, res: Result, out: list[int], seq: list[int], state: State,
                nondet: random.Random | None, sampler: random.Random,
                keep: Callable[[int, State, Sequence[int]], None] | None) -> None:
        """The DECODE loop after the first output token (already in *out*, *seq* and *res*):
        the finish check, then a decode step from the stored *state* and the next sample."""
        while True:
            finish = self._finish(req, out)
            if finish is not None:
                break
            state, logits = self.model.decode_step(out[-1], len(seq) - 1, state)
            if keep is not None and len(seq) % C == 0:
                keep(len(seq), state, seq)
            tok, lps = self._choose(self._jitter(logits, nondet), req, len(out), sampler)
            out.append(tok)
            seq.append(tok)
            self._record(req, res, tok, lps)
        if finish.get("type") == "length":  # finished_len = max_new_tokens (schedule_batch.py)
            out = out[: req.max_new_tokens]
        res.output_ids = out
        res.finish_reason = finish
        text_ids = out
        if finish.get("type") == "stop" and isinstance(finish.get("matched"), int) and not req.no_stop_trim:
            text_ids = out[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=req.skip_special_tokens)
        if isinstance(finish.get("matched"), str):
            pos = text.find(finish["matched"])
            if pos != -1:
                text = text[: pos + len(finish["matched"])] if req.no_stop_trim else text[:pos]
        res.text = text

    def resume(self, req: Request, state: State, first: int, first_logprob: float | None,
               first_top: list | None, cached_tokens: int, entropy: bytes | None = None) -> Result:
        """A P/D decode: continue *req* from the prefill's hand-over -- the *state* stored at
        the end of the prompt, the first output token the prefill sampled and its logprob /
        top logprobs (as the metadata buffer carries them) -- with this server's DECODE path
        and numerics.  No input logprobs (the decode computes none: output_streamer.py) and
        nothing cached (a decode server's KV cache is a chunk cache by default)."""
        nondet, sampler = self._rngs(req, entropy)
        if req.top_k != 1:  # the draw the prefill's sample of the first token took
            sampler.random()
        res = Result([], "", {}, cached_tokens)
        if req.return_logprob:
            res.input_token_logprobs = []
            res.input_top_logprobs = [] if req.top_logprobs_num > 0 else None
            res.output_token_logprobs = [(first_logprob, first)]
            res.output_top_logprobs = [list(first_top or [])] if req.top_logprobs_num > 0 else None
        ids = list(req.input_ids)
        self._decode(req, res, [first], ids + [first], state, nondet, sampler, None)
        return res

    def model_work(self, ids: Sequence[int], new_tokens: int, prefill: bool, decode: bool) -> None:
        """The forwards a request costs whose answer is not the toy's (chat: chat.py scripts
        it): PREFILL chunks over *ids* (if *prefill*), then ``new_tokens - 1`` greedy DECODE
        steps (if *decode*; from the initial state when no prefill ran here, as a P/D decode
        continuing another server's prompt).  Results are dropped, nothing is cached."""
        state, tok, n = self.model.initial_state(), ids[-1], len(ids)
        if prefill:
            state, logits = self.model.prefill(ids, 0, state, want_logits=lambda pos: pos == n - 1)
            tok = max(range(V), key=logits[n - 1].__getitem__)
        if not decode:
            return
        for t in range(n, n + new_tokens - 1):
            state, step_logits = self.model.decode_step(tok, t, state)
            tok = max(range(V), key=step_logits.__getitem__)

    def flush(self) -> None:
        if self.cache is not None:
            self.cache.clear()
