"""Drift verdicts that know their power: `above`, `bounded` or `inconclusive`.

A drift comparison (prefill vs decode, state A vs state B, a bisect's test state) ends as
one of three outcomes, each with the numbers that decide it:

* `above`: the drift exceeds the noise at the stated confidence;
* `bounded`: the drift beyond the noise is below the tolerance at the stated confidence
  (its upper confidence bound is shown and is below the tolerance);
* `inconclusive`: neither, at the sequences measured; with what it would take.

"within the noise" is not an outcome: not reaching significance says nothing about size.

**The unit of inference is the sequence**, not the token. Tokens of one sequence share
its context and the state a decode carries (their estimates are correlated), and the
per-token estimator exp(r) - 1 - r is heavy-tailed (at 61 layers a handful of tokens
carry a sequence's mean). For each sequence i, on the same tokens:

    drift_i = mean over its tokens of the estimator, A against B
    noise_i = the same between two replays of one state (B's replay 1 against replay 0)
    e_i     = drift_i - noise_i

**above**: an exact one-sided sign-flip test of the Wilcoxon signed-rank statistic of
the e_i. Valid because, with no drift, A is one more replay of B's state: drift_i and
noise_i are exchangeable (both compare a replay with replay 0 on the same tokens), so
e_i is symmetric about 0 whatever its distribution, heavy tails included; ranks keep one
outlier sequence from deciding (robust location). It assumes the sequences are
independent and that both sides saw the same batch conditions (the probe replays one
request at a time from a flushed cache: isolate/measure/drift.py). Exact by enumeration up to
EXACT_MAX sequences (the normal approximation with the tie correction beyond), so the
fewest sequences that can reach 99% are 7 (2^-7 < 0.01).

**bounded**: the mean of the e_i (the drift per token beyond the noise, averaged over
sequences) has a one-sided upper confidence bound below the tolerance: the larger of a
studentized bootstrap over sequences and the percentile bootstrap (seeded: the same
numbers give the same bound), taken at BOUND_MARGIN times less error than the stated
confidence. Both bootstraps are asymptotic and undercover right-skewed heavy-tailed
means: lognormal token tails of sigma 2 with 8 sequences, 94.5% for a nominal 99%. With
the margin, measured over 400 trials each (tests/unit/test_drift_decide.py checks the 16- and
32-sequence cases): sigma 1, 7-32 sequences, 99.25-99.75%; sigma 2, 16
sequences 99.25%, but 7-12 sequences 97.5-98.5%. So a bound is trusted from MIN_BOUNDED
(16) sequences on; below that a comparison can be `above` (the exact test needs 7) but not
`bounded`, except for a state that replays bit for bit, whose zeros are exact.

**No bound while one sequence alone reaches the tolerance**: where some |e_i| is at or
above the tolerance, the drift's tail reaches the scale that matters, a rarer sequence the
sample has not seen could move the mean past it, and the outcome is at most
inconclusive. Measured on the H200 depth bench's 61-layer sequences
(bench/kernels/results/drift-depth-h200-2026-12-03.json, tolerance 0.9x the pooled mean):
without this, 4-18% of 16- and 48-sequence samples bounded the drift below its true mean;
with it, at one look, none of the 48-sequence samples and 5 in 100 of the 16-sequence
ones in the 61-layer, 64-token cell (0 elsewhere; sequentially over 8 looks, 4 and 0 in
100: bench/RESULTS.md); the 8-32-layer cells keep their bounds at the
default tolerance. Deep models want more than 16 sequences before a bound (the budget).

**Minimum detectable drift**: the mean excess the signed-rank test finds with POWER at
this spread and count, (z_c + z_power) x sd / sqrt(n x 0.864): the normal approximation
with the test's efficiency against the t-test at its least over symmetric shapes
(Hodges and Lehmann, 1956; 3/pi = 0.955 at the normal, more under heavy tails).

**Zero noise** (a server that replays bit for bit: every noise_i exactly 0 over at
least two replays): any difference is drift. Then a drift above the logprobs' resolution
is `above` by itself, and its size is given with the same bootstrap interval.

The default tolerance is SGLang's own gate for this estimator: its KL tests pass when the
mean over sequences of the per-token k3 between prefill and decode is below 0.002
(`test/srt/test_swa_radix_cache_kl.py`, gpt-oss-20b), the same statistic as `drift` here.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Iterable, TypedDict

from patchset.isolate.measure.driftstats import RESOLUTION

OUTCOMES = ("above", "bounded", "inconclusive")
DEFAULT_CONFIDENCE = 0.99
DEFAULT_TOLERANCE = 0.002
POWER = 0.8
MIN_SEQUENCES = 7            # 2^-7 < 1 - 0.99: the fewest an exact test can call above
# Replays of one state: the noise is replay 1 against replay 0 (drift.sequence_noise), so
# two are the fewest that measure it; more than MAX_REPLAYS is a typo (each replays every
# sequence once more). The bounds of every command's --repeats and of a rollout's log.
MIN_REPLAYS, MAX_REPLAYS = 2, 50
MIN_BOUNDED = 16             # the fewest a bound is trusted on (coverage, heavy tails)
EXACT_MAX = 60               # enumerate the signed-rank distribution up to this many
RESAMPLES = 2000
BOUND_MARGIN = 10            # the bound's error is the stated one / 10 (heavy tails)
SEED = 20261203
EFFICIENCY = 0.864           # the signed-rank test's least efficiency against the t-test


@dataclass(frozen=True)
class Paired:
    """One sequence's drift and noise on the same tokens (means of the estimator)."""

    name: str
    drift: float
    noise: float
    tokens: int

    @property
    def excess(self) -> float:
        return self.drift - self.noise


@dataclass(frozen=True)
class Decision:
    outcome: str                     # above | bounded | inconclusive
    drift: float | None              # mean over sequences of drift_i - noise_i, per token
    low: float | None                # lower confidence bound of it
    upper: float | None              # upper confidence bound of it
    p_value: float | None            # the exact sign-flip test of "no drift beyond noise"
    tolerance: float
    confidence: float
    detectable: float | None         # minimum detectable drift at POWER, this noise and n
    sequences: int
    tokens: int
    noise: float | None              # mean over sequences of noise_i, per token
    needs: str = ""                  # inconclusive: what it would take
    why: str = ""
    deterministic: bool = False      # the noise was exactly zero: any difference is drift
    looks: int = 1                   # decisions a sequential probe could take (Bonferroni)

    @property
    def above(self) -> bool | None:
        """True above, False bounded, None inconclusive (the old two-valued field)."""
        return {"above": True, "bounded": False}.get(self.outcome)


class _Counts(TypedDict):
    """The fields of every Decision of one comparison: its terms and its data."""

    tolerance: float
    confidence: float
    sequences: int
    tokens: int
    looks: int


class _Figures(TypedDict):
    """The fields of a Decision that had enough data to measure."""

    drift: float
    low: float | None
    upper: float | None
    detectable: float | None
    noise: float
    deterministic: bool


def decide(pairs: Iterable[Paired], tolerance: float = DEFAULT_TOLERANCE,
           confidence: float = DEFAULT_CONFIDENCE, replays: int = 2,
           looks: int = 1) -> Decision:
    """The outcome of one comparison from its sequences (those with no comparable token
    are left out by the caller); `replays`: how many replays the noise came from;
    `looks`: how many times a sequential probe may decide on growing data (each look is
    held to 1/looks of the error, Bonferroni, so stopping at the first decided look keeps
    the stated confidence overall)."""
    stated = confidence
    confidence = 1 - (1 - confidence) / max(1, looks)
    got = [p for p in pairs if _finite(p.drift) and _finite(p.noise) and p.tokens > 0]
    tokens = sum(p.tokens for p in got)
    base = _Counts(tolerance=tolerance, confidence=stated, sequences=len(got), tokens=tokens,
                   looks=looks)
    if not got:
        return Decision("inconclusive", None, None, None, None, detectable=None, noise=None,
                        needs="a run that compares tokens (every logprob was missing, NaN "
                        "or infinite)", why="no tokens were compared", **base)
    if replays < MIN_REPLAYS:
        return Decision("inconclusive", None, None, None, None, detectable=None, noise=None,
                        needs="the noise: at least 2 replays of the state (--repeats 2+)",
                        why="the noise was not measured", **base)
    excess = [p.excess for p in got]
    mean, noise = statistics.fmean(excess), statistics.fmean(p.noise for p in got)
    low, upper = bounds(excess, 1 - (1 - confidence) / BOUND_MARGIN)
    deterministic = all(p.noise == 0.0 for p in got)
    detectable = minimum_detectable(excess, confidence)
    figures = _Figures(drift=mean, low=low, upper=upper, detectable=detectable, noise=noise,
                       deterministic=deterministic)
    if deterministic and max(p.drift for p in got) > RESOLUTION:
        return Decision("above", p_value=None, why=(
            f"the state replays bit for bit (noise 0 in every sequence): any difference is "
            f"drift; {_size(mean, low, upper, stated)}"), **figures, **base)
    p_value = signed_rank_p(excess)
    alpha = 1 - confidence
    if p_value <= alpha and statistics.fmean(x.drift for x in got) > RESOLUTION:
        return Decision("above", p_value=p_value, why=(
            f"drift beyond the noise in {sum(e > 0 for e in excess)} of {len(got)} "
            f"sequences, signed-rank p = {p_value:.2g} <= {alpha:.2g}; "
            f"{_size(mean, low, upper, stated)}"), **figures, **base)
    enough = len(got) >= (MIN_SEQUENCES if deterministic else MIN_BOUNDED)
    # enough sequences have an upper bound (bounds() has none below 2)
    if enough and upper is not None and upper < tolerance and not reaches(excess, tolerance):
        return Decision("bounded", p_value=p_value, why=(
            f"drift beyond the noise {mean:.3g} per token, at most {upper:.3g} at "
            f"{100 * stated:g}% < tolerance {tolerance:.3g} ({len(got)} sequences, "
            f"{tokens} tokens)"), **figures, **base)
    return Decision("inconclusive", p_value=p_value,
                    needs=_needs(excess, mean, upper, tolerance, detectable),
                    why=(f"not above the noise (p = {p_value:.2g} > {alpha:.2g}) and not bounded "
                         f"below {tolerance:.3g} (upper bound {_g(upper)}) with "
                         f"{len(got)} sequences"), **figures, **base)


# ---------------------------------------------------------------- the test

def signed_rank_p(values: list[float]) -> float:
    """One-sided p of the Wilcoxon signed-rank statistic (positive ranks' sum) under
    random signs: exact up to EXACT_MAX values (zeros dropped, ties averaged), else the
    normal approximation with the tie correction. 1.0 when nothing is nonzero."""
    nonzero = [v for v in values if v != 0.0]
    if not nonzero:
        return 1.0
    ranks = _ranks([abs(v) for v in nonzero])
    twice = [round(2 * r) for r in ranks]          # average ranks are halves: integers
    observed = sum(t for t, v in zip(twice, nonzero) if v > 0)
    if len(nonzero) <= EXACT_MAX:
        return _exact_tail(twice, observed)
    n = len(nonzero)
    mu = sum(twice) / 2
    sigma = math.sqrt(sum(t * t for t in twice) / 4)
    return 1 - statistics.NormalDist().cdf((observed - 0.5 - mu) / sigma)   # continuity


def _exact_tail(weights: list[int], observed: int) -> float:
    """P(sum of randomly signed weights' positive part >= observed): the distribution of
    the sum of a random subset of `weights`, by counting (a polynomial product)."""
    counts = {0: 1}
    for w in weights:
        nxt = dict(counts)
        for s, c in counts.items():
            nxt[s + w] = nxt.get(s + w, 0) + c
        counts = nxt
    total = 2 ** len(weights)
    return sum(c for s, c in counts.items() if s >= observed) / total


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


# ---------------------------------------------------------------- the interval

def bounds(values: list[float], confidence: float) -> tuple[float | None, float | None]:
    """One-sided lower and upper confidence bounds of the mean at `confidence`: the more
    conservative of the studentized and the percentile bootstrap over the values."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return None, None
    se = statistics.stdev(values) / math.sqrt(n)
    if se == 0.0:
        return mean, mean
    rng = random.Random(SEED)
    means, studentized = [], []
    for _ in range(RESAMPLES):
        sample = [values[rng.randrange(n)] for _ in range(n)]
        m = statistics.fmean(sample)
        s = statistics.stdev(sample) / math.sqrt(n)
        means.append(m)
        if s > 0:
            studentized.append((m - mean) / s)
    means.sort()
    studentized.sort()
    alpha = 1 - confidence
    pct_low, pct_high = _quantile(means, alpha), _quantile(means, confidence)
    if not studentized:
        return pct_low, pct_high
    t_low, t_high = _quantile(studentized, alpha), _quantile(studentized, confidence)
    return min(pct_low, mean - t_high * se), max(pct_high, mean - t_low * se)


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def minimum_detectable(values: list[float], confidence: float) -> float | None:
    """The mean excess the signed-rank test detects with POWER at this spread and count
    (normal approximation, the test's worst-case efficiency)."""
    if len(values) < 2:
        return None
    z = statistics.NormalDist()
    sd = statistics.stdev(values)
    return (z.inv_cdf(confidence) + z.inv_cdf(POWER)) * sd / math.sqrt(
        len(values) * EFFICIENCY)


def reaches(values: list[float], tolerance: float) -> bool:
    """Does one sequence alone drift by the tolerance or more (|e_i| >= tolerance)? Then
    the tail reaches the scale that matters and no bound on the mean is trusted."""
    return any(abs(v) >= tolerance for v in values)


def _needs(values: list[float], mean: float, upper: float | None, tolerance: float,
           detectable: float | None) -> str:
    """What would decide it: more sequences (to detect the drift seen, or to bound it
    below the tolerance), or a tolerance it can bound now."""
    n = len(values)
    if n < MIN_SEQUENCES:
        return (f"at least {MIN_SEQUENCES} sequences (with {n}, no test at this confidence "
                "can decide)")
    parts = []
    if upper is not None and upper < tolerance and reaches(values, tolerance):
        parts.append(f"a tolerance above the largest single sequence's drift "
                     f"({max(abs(v) for v in values):.3g}): one sequence alone reaches "
                     f"{tolerance:.3g}, so no bound on the mean is trusted")
    if n < MIN_BOUNDED:
        parts.append(f"at least {MIN_BOUNDED} sequences to bound it at all (a bound on "
                     "fewer heavy-tailed sequences undercovers)")
    if upper is not None and mean < tolerance and upper > mean:
        more = math.ceil(n * ((upper - mean) / (tolerance - mean)) ** 2)
        parts.append(f"about {more} sequences to bound it below {tolerance:.3g}")
    if detectable and mean > 0:
        parts.append(f"about {math.ceil(n * (detectable / mean) ** 2)} sequences to tell a "
                     f"drift of {mean:.3g} from the noise")
    if upper is not None:
        parts.append(f"a tolerance of {upper:.3g} or more would be bounded now")
    return "; or ".join(parts) or "more sequences"


def _size(mean: float, low: float | None, upper: float | None, confidence: float) -> str:
    return (f"drift beyond the noise {mean:.3g} per token, [{_g(low)}, {_g(upper)}] at "
            f"{100 * confidence:g}% each side")


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
