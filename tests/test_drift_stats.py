"""The drift probe's arithmetic and search, without a server: the estimator is SGLang's,
the verdict is judged against measured noise (never a fixed threshold), the search finds
one culprit among n in at most ceil(log2 n) + 1 states, and the conversations are the same
text on every run."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from isolate import conversations, driftsearch
from isolate.driftstats import (RESOLUTION, Verdict, compare, estimator, exceeds, interval,
                                noise_threshold, percentile, pooled)


def test_estimator_is_kl_test_utils():
    """kl_test_utils.compare_kl_divergence: logr = input - output, (exp(logr) - 1) - logr."""
    for a, b in ((-0.1, -0.2), (-3.0, -1.0), (-1e-4, -1e-4)):
        assert estimator(a, b) == pytest.approx((math.exp(a - b) - 1) - (a - b), abs=1e-15)
        assert estimator(a, b) >= 0.0
    assert estimator(-1.0, -1.0) == 0.0


def test_compare_buckets_top1_and_first_divergence():
    a = [-0.1] * 10
    b = [-0.1] * 5 + [-0.3] * 5
    c = compare(a, b, start=2040, top_a=[1] * 10, top_b=[1] * 7 + [2, 1, 2])
    assert c.overall.tokens == 10
    assert set(c.buckets) == {"0-2k", "2k-8k"}
    assert c.buckets["0-2k"].tokens == 8 and c.buckets["2k-8k"].tokens == 2
    assert c.buckets["0-2k"].mean == pytest.approx(3 * estimator(-0.1, -0.3) / 8)
    assert c.top1_agreement == pytest.approx(0.8) and c.first_divergence == 2047
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0 and percentile([], 50) is None
    both = pooled([c, compare([-0.1], [-0.1], 0)])
    assert both.overall.tokens == 11 and both.first_divergence == 2047


def test_verdict_uses_the_noise_and_says_how():
    rng = random.Random(7)
    noise = [rng.expovariate(1e6) for _ in range(400)]          # mean 1e-6, per token
    repeats = (1.0e-6, 1.05e-6)
    shifted = [v + 4e-7 for v in noise[:200]]
    above = Verdict.judge(shifted, noise, repeats=repeats)
    assert above.above is True and above.threshold < 1.4e-6
    assert "99.87% one-sided" in above.why and "200 tokens against 400 of 3 replays" in above.why
    same = Verdict.judge([rng.expovariate(1e6) for _ in range(200)], noise, repeats=repeats)
    assert same.above is False
    assert exceeds(shifted, noise) and not exceeds(noise[:200], noise)
    assert Verdict.judge(shifted, noise, repeats=(1e-6,)).above is None   # one replay pair
    exact = Verdict.judge([1e-20] * 10, [0.0] * 20, repeats=(0.0, 0.0))   # identical replays
    assert exact.above is False and exact.threshold == RESOLUTION
    assert noise_threshold(noise) > statistics.fmean(noise)
    assert interval(1e-5, [1e-6, 1.2e-6, 0.8e-6]) == (pytest.approx(1e-5 - 6e-7),
                                                       pytest.approx(1e-5 + 6e-7))


def additive(contrib: dict[str, float], threshold: float):
    total = sum(contrib.values())

    def measure(group: tuple[str, ...]) -> driftsearch.Measurement:
        ab = sum(contrib.get(n, 0.0) for n in group)
        return driftsearch.Measurement(ab, total - ab <= threshold)
    return measure


@pytest.mark.parametrize("n", range(1, 9))
def test_one_culprit_in_at_most_log2_n_plus_1_states(n):
    names = [f"p{i}" for i in range(n)]
    bound = math.ceil(math.log2(n)) + 1 if n > 1 else 1
    for culprit in names:
        found = driftsearch.search(names, additive({culprit: 2e-4}, 1e-6), 1e-6, 1e-7)
        assert found.culprits == [culprit]
        assert found.restarts <= bound, (culprit, found.states)
        [mine] = [c for c in found.contributions if c.suspect == culprit]
        assert mine.value == pytest.approx(2e-4) and mine.low < 2e-4 < mine.high
        assert {c.suspect for c in found.contributions} == set(names)


@pytest.mark.parametrize("n", range(2, 9))
def test_gates_first_keeps_the_bound_and_needs_no_revert_for_a_gated_culprit(n):
    names = [f"p{i}" for i in range(n)]
    bound = math.ceil(math.log2(n)) + 1
    for gated in range(1, n):
        cheap = frozenset(names[:gated])
        for culprit in names:
            found = driftsearch.search(names, additive({culprit: 2e-4}, 1e-6), 1e-6, 1e-7,
                                       cheap=cheap)
            assert found.culprits == [culprit] and found.restarts <= bound
            if culprit in cheap and 2 ** (math.ceil(math.log2(n)) - 1) >= gated >= \
                    n - 2 ** (math.ceil(math.log2(n)) - 1):
                assert all(set(g) <= cheap for g in found.states), (n, gated, found.states)


def test_two_culprits_both_attributed_with_their_shares():
    names = [f"p{i}" for i in range(8)]
    found = driftsearch.search(names, additive({"p1": 3e-4, "p6": 1e-4}, 1e-6), 1e-6, 1e-7)
    assert sorted(found.culprits) == ["p1", "p6"]
    values = {c.suspect: c.value for c in found.contributions if c.value is not None}
    assert values["p1"] == pytest.approx(3e-4) and values["p6"] == pytest.approx(1e-4)


def test_nothing_above_noise_is_no_culprit():
    found = driftsearch.search(["a", "b", "c"], additive({}, 1e-6), 1e-6, 1e-7)
    assert found.culprits == [] and found.restarts == 2
    assert all(c.value is None and c.how == "cleared-group" for c in found.contributions)


def test_conversations_are_long_deterministic_and_use_tools():
    first = conversations.build(8192)
    again = conversations.build(8192)
    assert first == again and first.text.endswith("<|assistant|>\n")
    words = len(first.text.split())
    assert 8192 * conversations.WORDS_PER_TOKEN <= words < 8192
    assert "<tool_call>" in first.text and "<|tool|>" in first.text
    assert first.turns > 10 and "<|user|>" in first.follow_up
    assert conversations.build(8192, seed=1).text != first.text
    assert [c.name for c in conversations.build_all()] == ["ops-8k", "ops-16k", "ops-32k"]
