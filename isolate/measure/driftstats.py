"""The numbers of a drift measurement: SGLang's per-token estimator and what is read off it.

The estimator is the one the pinned wheel's `sglang/test/kl_test_utils.py` uses
(`compare_kl_divergence`): with r = logprob_a - logprob_b of the same token at the same
position, k = exp(r) - 1 - r, an unbiased, never-negative estimate of KL(b || a) per
token (Schulman's k3). Its mean over tokens is the drift; SGLang compares it with a
per-model threshold, patchset with the noise measured on the same server state (a fixed
threshold cannot know how nondeterministic a deployment's batching is).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

BUCKETS = ((0, 2048, "0-2k"), (2048, 8192, "2k-8k"), (8192, 32768, "8k-32k"),
           (32768, None, "32k+"))
DEFAULT_K = 3.0                 # sigmas above the noise mean: 99.87% one-sided (normal)
# What a drift can be told from zero at all: servers return float32 logprobs, which resolve
# r to about 1e-7, so k = r^2/2 to about 5e-15; below this floor two series are the same.
RESOLUTION = 1e-12


def estimator(a: float, b: float) -> float:
    r = a - b
    return math.expm1(r) - r


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100): a value that occurred, no interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    tokens: int
    mean: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        return cls(len(values), statistics.fmean(values) if values else None,
                   percentile(values, 90), percentile(values, 99))


@dataclass(frozen=True)
class Comparison:
    """Two logprob series of the same tokens compared position by position."""

    overall: Summary
    buckets: dict[str, Summary]
    top1_agreement: float | None        # share of positions whose top-1 tokens agree
    first_divergence: int | None        # first position (absolute) where they differ
    points: tuple[tuple[int, float], ...] = ()   # (position, estimator), for the chart


def compare(a: list[float | None], b: list[float | None], start: int,
            top_a: list[int | None] | None = None,
            top_b: list[int | None] | None = None) -> Comparison:
    """`a` and `b` are logprobs of the tokens at positions start, start+1, ..."""
    pairs = [(start + i, estimator(x, y)) for i, (x, y) in enumerate(zip(a, b))
             if x is not None and y is not None]
    values = [k for _, k in pairs]
    buckets = {label: Summary.of([k for pos, k in pairs
                                  if pos >= lo and (hi is None or pos < hi)])
               for lo, hi, label in BUCKETS}
    agree, first = None, None
    if top_a is not None and top_b is not None:
        both = [(start + i, x, y) for i, (x, y) in enumerate(zip(top_a, top_b))
                if x is not None and y is not None]
        if both:
            agree = sum(x == y for _, x, y in both) / len(both)
            first = next((pos for pos, x, y in both if x != y), None)
    return Comparison(Summary.of(values), {k: v for k, v in buckets.items() if v.tokens},
                      agree, first, tuple(pairs))


def pooled(comparisons: list[Comparison]) -> Comparison:
    """Every comparison's tokens as one (overall figures of a run)."""
    pairs = [p for c in comparisons for p in c.points]
    values = [k for _, k in pairs]
    buckets = {label: Summary.of([k for pos, k in pairs
                                  if pos >= lo and (hi is None or pos < hi)])
               for lo, hi, label in BUCKETS}
    agreements = [(c.top1_agreement, c.overall.tokens) for c in comparisons
                  if c.top1_agreement is not None]
    weight = sum(n for _, n in agreements)
    firsts = [c.first_divergence for c in comparisons if c.first_divergence is not None]
    return Comparison(Summary.of(values), {k: v for k, v in buckets.items() if v.tokens},
                      sum(a * n for a, n in agreements) / weight if weight else None,
                      min(firsts) if firsts else None, tuple(pairs))


@dataclass(frozen=True)
class Verdict:
    """A drift against the noise of the same statistic on one server state.

    The test is on tokens, not on runs: the drift's per-token estimates against the
    noise's (the same estimator between replays of the same tokens on the same state),
    Welch-style: above when mean(drift) > mean(noise) + k x sqrt(se_drift^2 + se_noise^2).
    A handful of repeats would give the spread of a run's mean from two or three numbers;
    a run's hundreds of tokens give it properly (tokens of one sequence are not fully
    independent, so the confidence is nominal, and says so)."""

    drift: float | None
    noise: tuple[float, ...]            # the mean between replay j and replay 0, per j
    k: float = DEFAULT_K
    threshold: float | None = field(default=None)
    above: bool | None = None           # None: the noise could not be measured
    why: str = ""

    @classmethod
    def judge(cls, drift: list[float], noise: list[float], k: float = DEFAULT_K,
              repeats: tuple[float, ...] = ()) -> Verdict:
        mean = statistics.fmean(drift) if drift else None
        if mean is None:
            return cls(None, repeats, k, None, None, "no tokens were compared")
        if len(noise) < 2 or len(repeats) < 2:
            return cls(mean, repeats, k, None, None,
                       f"the noise needs at least 2 replays to compare, {len(repeats)} "
                       "measured (--repeats 3 or more)")
        threshold, base, se = _threshold(drift, noise, k)
        above = mean > threshold
        confidence = 100 * statistics.NormalDist().cdf(k)
        floor = " (floored at the resolution)" if threshold == RESOLUTION else ""
        why = (f"drift {mean:.3g} {'>' if above else '<='} noise {base:.3g} + {k:g} x "
               f"{se:.3g}{floor} = {threshold:.3g} ({len(drift)} tokens against "
               f"{len(noise)} of {len(repeats) + 1} replays; {confidence:.2f}% one-sided, "
               "nominal)")
        return cls(mean, repeats, k, threshold, above, why)


def _threshold(drift: list[float], noise: list[float], k: float) -> tuple[float, float, float]:
    """(threshold, noise mean, the combined standard error)."""
    base = statistics.fmean(noise)
    se = math.sqrt(statistics.variance(noise) / len(noise)
                   + (statistics.variance(drift) / len(drift) if len(drift) > 1 else 0.0))
    return max(base + k * se, RESOLUTION), base, se


def exceeds(drift: list[float], noise: list[float], k: float = DEFAULT_K) -> bool:
    """The verdict's test alone: is this drift above that noise?"""
    return bool(drift) and len(noise) >= 2 and statistics.fmean(drift) > _threshold(
        drift, noise, k)[0]


def noise_threshold(noise: list[float], k: float = DEFAULT_K) -> float:
    """The one threshold a bisect's report shows: what a group's mean drift would have to
    exceed if it had the noise's tokens and spread. The search judges each group by its
    own spread (isolate/search/driftsearch.py), which a large drift's is not."""
    return _threshold(noise, noise, k)[0] if len(noise) >= 2 else RESOLUTION
