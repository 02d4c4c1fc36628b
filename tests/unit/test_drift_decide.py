"""The three-outcome drift decision (isolate/measure/driftdecide.py) on synthetic data with a known
effect: sequence-level, heavy-tailed per-token estimates (lognormal, as the 61-layer GPU
model's: a handful of tokens carry a sequence's mean).

Rates are measured over a few hundred seeded trials; each assertion allows three binomial
standard errors around the nominal rate, so it fails when the method misses its level,
not by chance (the seeds are fixed: the same numbers every run)."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from patchset.isolate.measure import driftdecide as dd
from patchset.isolate.measure.driftdecide import Paired, decide


def _sequence_mean(rng: random.Random, scale: float, tokens: int = 64,
                   sigma: float = 2.0) -> float:
    return statistics.fmean(scale * rng.lognormvariate(0, sigma) for _ in range(tokens))


def _pairs(rng: random.Random, n: int, effect: float, sigma: float = 2.0,
           spread: float = 1.0) -> list[Paired]:
    """n sequences; the noise's scale varies per sequence (long and short contexts, by
    lognormal `spread`); a drift adds its own heavy-tailed per-token estimates of mean
    effect x e^(sigma^2/2)."""
    out = []
    for i in range(n):
        scale = 1e-5 * rng.lognormvariate(0, spread)
        drift = _sequence_mean(rng, scale, sigma=sigma)
        if effect:
            drift += _sequence_mean(rng, effect, sigma=sigma)
        out.append(Paired(f"s{i}", drift, _sequence_mean(rng, scale, sigma=sigma), 64))
    return out


def _rate_ok(hits: int, trials: int, nominal: float) -> bool:
    return hits / trials <= nominal + 3 * math.sqrt(nominal * (1 - nominal) / trials)


@pytest.fixture()
def fast(monkeypatch):
    monkeypatch.setattr(dd, "RESAMPLES", 400)


def test_the_signed_rank_p_is_exact() -> None:
    """Against brute force over every sign vector, ties and zeros included."""
    rng = random.Random(3)
    for values in ([rng.gauss(0.3, 1) for _ in range(9)], [1, -1, 2, 2, -3, 0, 4, 5]):
        nonzero = [v for v in values if v != 0]
        ranks = dd._ranks([abs(v) for v in nonzero])
        observed = sum(r for r, v in zip(ranks, nonzero) if v > 0)
        count = sum(sum(r for r, s in zip(ranks, signs) if s) >= observed - 1e-9
                    for signs in itertools.product((0, 1), repeat=len(nonzero)))
        assert dd.signed_rank_p(values) == pytest.approx(count / 2 ** len(nonzero))
    assert dd.signed_rank_p([1.0] * 7) == pytest.approx(2 ** -7)
    assert dd.signed_rank_p([0.0, 0.0]) == 1.0


def test_false_above_is_at_the_nominal_rate_under_heavy_tails() -> None:
    """No drift: A is one more replay of B's state. 99%: at most 1% false `above`."""
    rng = random.Random(5)
    for n in (8, 16, 40, 80):                          # exact up to 60, normal beyond
        trials = 400
        hits = sum(dd.signed_rank_p([p.excess for p in _pairs(rng, n, 0.0)]) <= 0.01
                   for _ in range(trials))
        assert _rate_ok(hits, trials, 0.01), (n, hits)


def test_the_upper_bound_covers_the_true_drift(fast) -> None:
    """The bound `bounded` rests on, at the stated 99% (with the margin): it is below
    the true mean excess at most 1% of the time, for heavy tails and few sequences."""
    rng = random.Random(9)
    effect = 2e-5
    for sigma, n in ((1.0, 8), (2.0, 16), (2.0, 32)):
        true = effect * math.exp(sigma ** 2 / 2)
        trials = 300
        misses = 0
        for _ in range(trials):
            values = [p.excess for p in _pairs(rng, n, effect, sigma)]
            misses += dd.bounds(values, 1 - 0.01 / dd.BOUND_MARGIN)[1] < true
        assert _rate_ok(misses, trials, 0.01), (sigma, n, misses)


def test_never_bounded_below_a_true_effect_and_above_at_the_stated_power(fast) -> None:
    """With a tolerance at the true effect, `bounded` (a false clear) stays at or below
    the nominal error; at twice the minimum detectable drift the test finds it at least
    80% of the time (POWER)."""
    rng = random.Random(13)
    effect, n = 3e-5, 16
    true = effect * math.exp(2.0)
    runs = [decide(_pairs(rng, n, effect), tolerance=true) for _ in range(200)]
    assert _rate_ok(sum(r.outcome == "bounded" for r in runs), 200, 0.01)
    detectable = statistics.median(r.detectable for r in runs)
    strong = 2 * detectable / math.exp(2.0)
    found = [decide(_pairs(rng, n, strong), tolerance=1.0) for _ in range(100)]
    assert sum(r.outcome == "above" for r in found) >= 80 - 3 * math.sqrt(100 * 0.8 * 0.2)


def test_each_outcome_with_its_numbers(fast) -> None:
    rng = random.Random(17)
    above = decide(_pairs(rng, 16, 5e-4))
    assert above.outcome == "above" and above.above is True and above.p_value < 0.01
    assert above.low > 0 and above.upper > above.drift > above.low
    assert "signed-rank p" in above.why
    bounded = decide(_pairs(rng, 32, 0.0, sigma=0.5, spread=0.2), tolerance=1e-3)
    assert bounded.outcome == "bounded" and bounded.above is False
    assert bounded.upper < 1e-3 and "< tolerance" in bounded.why
    small = decide(_pairs(rng, 16, 0.0), tolerance=1e-9)
    assert small.outcome == "inconclusive" and small.above is None
    assert "sequences to bound it" in small.needs or "would be bounded now" in small.needs
    few = decide(_pairs(rng, 5, 5e-4))
    assert few.outcome == "inconclusive" and "at least 7 sequences" in few.needs


def test_nan_empty_and_unmeasured_noise_are_inconclusive() -> None:
    none = decide([])
    assert none.outcome == "inconclusive" and none.why == "no tokens were compared"
    nan = decide([Paired("s", float("nan"), 0.0, 10), Paired("t", 0.1, float("inf"), 10)])
    assert nan.outcome == "inconclusive" and nan.sequences == 0
    once = decide([Paired(f"s{i}", 0.1, 0.0, 10) for i in range(9)], replays=1)
    assert once.outcome == "inconclusive" and "2 replays" in once.needs


def test_zero_noise_makes_any_difference_drift(fast) -> None:
    """A state that replays bit for bit: a difference in 2 sequences is drift already;
    none at all, over 7 sequences, is bounded at 0."""
    some = decide([Paired("a", 3e-6, 0.0, 64), Paired("b", 0.0, 0.0, 64)])
    assert some.outcome == "above" and some.deterministic and "bit for bit" in some.why
    same = decide([Paired(f"s{i}", 0.0, 0.0, 64) for i in range(7)])
    assert same.outcome == "bounded" and same.upper == 0.0


def test_no_bound_while_one_sequence_alone_reaches_the_tolerance(fast) -> None:
    """The 61-layer case: rare sequences drift by far more than the rest, both ways
    (the noise's tail is as heavy as the drift's), so the mean looks small and so does its
    bootstrap bound. With a sequence at or above the tolerance by itself, no bound on the
    mean is trusted; the report says why. Above that sequence's size, it is bounded."""
    rng = random.Random(21)
    excess = [rng.gauss(0.0, 5e-6) for _ in range(40)] + [0.01, -0.01] * 4
    pairs = [Paired(f"s{i}", 1e-3 + e, 1e-3, 64) for i, e in enumerate(excess)]
    assert dd.reaches(excess, 0.005) and not dd.reaches(excess, 0.02)
    one = decide(pairs, tolerance=0.005)
    assert one.outcome == "inconclusive" and one.upper < 0.005, one
    assert "one sequence alone reaches" in one.needs
    assert decide(pairs, tolerance=0.02).outcome == "bounded"
