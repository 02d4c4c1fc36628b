"""Which suspects carry a measured drift, in few restarts: group testing over the ranking.

A bisect by drift measures states of the host, each one restart of its servers (minutes
on a real deployment), so the number of states is what to save. A state is the starting
state S with a group G of suspects taken out (gates unset, or reverted). Two things come
back from each (isolate/search/bisect.py measures them):

* the A/B drift between S and S - G, per token (S's saved tokens replayed on both, so
  the same positions every state): how much taking G out moves the output. Net of the
  noise's mean (two replays of one state differ by that much already), it is G's
  contribution;
* `cleared`: whether S - G's own prefill-vs-decode drift is bounded below the
  tolerance: G holds everything that made prefill and decode disagree.

The search (adaptive binary splitting, most likely first): split the group in two halves
in ranking order (gated suspects first, so the cheap env-only states come first), measure
the first half; if that clears the drift, the second half is not needed; otherwise the
second half's contribution is the group's minus the first's (contributions add: the
statement this rests on, true for independent small perturbations, and shown per step
so it can be checked) or is measured when the group's is not known. A half whose
contribution cannot be told from zero is dropped whole. One culprit among n: at most
ceil(log2 n) + 1 states; each suspect ends with a contribution (measured or inferred)
and its interval.

A group is cleared only when its contribution is bounded below the tolerance (value +
k x se < tolerance); one neither told from zero nor bounded is `undecided`: the search
does not descend into it, and the bisect says which suspects remain undecided and why
(isolate/measure/driftdecide.py: "within the noise" is not an outcome). Standard errors are over
sequences (the unit of inference: tokens of one sequence are correlated), from the
per-token values' keys.

With the values keyed by (sequence, position), as a bisect keys them, a group is decided
as driftdecide decides a comparison: per sequence, its mean A/B net of that sequence's own
noise; real when the exact signed-rank test rejects at the confidence k stands for
(99.87% for k = 3), bounded when the bootstrap bound on at least 16 sequences is below
the tolerance. Values keyed by token alone (the unit tests' simulations) keep the
standard-error test below.

Telling a contribution from zero uses its own standard error, not only the noise's: a
large drift's A/B varies from one measurement to the next far more than two replays of
one state do (the drift times the jitter, token by token), and a group measured on fewer
tokens than the noise has a wider spread than the noise's. A measured contribution is
real when it exceeds k x sqrt(se^2 + se_noise^2) (Welch, as driftstats.Verdict); an
inferred one is the token-by-token difference of two measurements of the same tokens, so
its error is the paired one; either way its interval is value +- that k x se.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from patchset.isolate.measure.driftdecide import (BOUND_MARGIN, DEFAULT_TOLERANCE, MIN_BOUNDED,
                                                  bounds, reaches, signed_rank_p)
from patchset.isolate.measure.driftstats import RESOLUTION


def _se(values: Sequence[float]) -> float:
    """The standard error of the mean of `values` (0 for fewer than two)."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def _sequence_se(values: Sequence[float], keys: Sequence) -> float:
    """The standard error of the mean over sequences: per-token values grouped by their
    key's sequence (key = (sequence, position)), each sequence's mean one observation;
    without keys, over the values."""
    if not keys or len(keys) != len(values) or not isinstance(keys[0], tuple):
        return _se(values)                       # no sequences named: the values' own
    groups: dict = {}
    for key, value in zip(keys, values):
        groups.setdefault(key[0], []).append(value)
    means = [statistics.fmean(v) for v in groups.values()]
    # few sequences: their spread, but never below the per-token standard error
    return max(_se(means), _se(values)) if len(means) > 1 else _se(values)


@dataclass(frozen=True)
class Noise:
    """Two replays of the starting state against each other: the A/B drift of a group
    that changes nothing has this mean; `se` is the standard error of that mean;
    `by_sequence`: each sequence's own (replay 1 against replay 0, on its tokens), what a
    group's per-sequence A/B is paired with."""

    mean: float
    se: float
    by_sequence: dict = field(default_factory=dict)

    @classmethod
    def of(cls, values: Sequence[float], by_sequence: dict | None = None) -> Noise:
        return cls(statistics.fmean(values) if values else 0.0, _se(values),
                   {k: v for k, v in (by_sequence or {}).items() if v is not None})


@dataclass(frozen=True)
class Measurement:
    """One test state: the A/B drift of S vs S - group, token by token in the order of
    S's saved tokens (the same positions in every state), and whether S - group's own
    prefill-vs-decode drift is bounded below the tolerance."""

    values: tuple[float, ...]
    cleared: bool
    keys: tuple = ()           # which token each value is (sequence, position): the pairing

    @property
    def ab(self) -> float:
        return statistics.fmean(self.values) if self.values else 0.0


@dataclass(frozen=True)
class Effect:
    """A contribution in numbers: net of the noise's mean, with its standard error and
    the per-token values it came from (for a paired difference); `excess`: per sequence,
    its mean A/B net of that sequence's own noise (or, for an inferred rest, the paired
    difference): the unit the decision is taken on, as isolate/measure/driftdecide.py takes it,
    when the values are keyed by (sequence, position)."""

    value: float
    se: float
    values: tuple[float, ...] = ()
    keys: tuple = ()
    excess: tuple[float, ...] = ()

    @classmethod
    def measured(cls, m: Measurement, noise: Noise) -> Effect:
        means = _by_sequence(m.values, m.keys)
        excess = tuple(v - noise.by_sequence.get(name, noise.mean)
                       for name, v in means.items())
        return cls(m.ab - noise.mean, math.hypot(_sequence_se(m.values, m.keys), noise.se),
                   tuple(v - noise.mean for v in m.values), m.keys, excess)

    def minus(self, part: Effect) -> Effect:
        """The rest of a group once its `part` is known: token by token when both were
        measured on the same tokens (the errors then pair), else the errors add."""
        if len(self.values) > 1 and self.keys and self.keys == part.keys:
            diff = tuple(a - b for a, b in zip(self.values, part.values))
            return Effect(statistics.fmean(diff), _sequence_se(diff, self.keys), diff,
                          self.keys, tuple(_by_sequence(diff, self.keys).values()))
        return Effect(self.value - part.value, math.hypot(self.se, part.se))

    def real(self, k: float) -> bool:
        """Told from zero: by sequence, the exact signed-rank test at the confidence k
        standard errors stand for (k = 3: 99.87%); else above k standard errors; and
        above what logprobs resolve either way."""
        if self.excess:
            alpha = 1 - statistics.NormalDist().cdf(k)
            return signed_rank_p(list(self.excess)) <= alpha and self.value > RESOLUTION
        return self.value > k * self.se and self.value > RESOLUTION

    def bounded(self, k: float, tolerance: float) -> bool:
        """Its upper bound is below the tolerance: by sequence, the bootstrap bound of
        driftdecide on at least MIN_BOUNDED sequences; values keyed by token alone: k
        standard errors above it."""
        if self.excess:
            upper = self.interval(k)[1]
            return len(self.excess) >= MIN_BOUNDED and upper < tolerance and \
                not reaches(list(self.excess), tolerance)
        return self.value + k * self.se < tolerance

    def interval(self, k: float) -> tuple[float, float]:
        """(low, high): the bootstrap bounds over sequences (with driftdecide's margin),
        else value -+ k standard errors."""
        if len(self.excess) >= 2:
            confidence = statistics.NormalDist().cdf(k)
            low, high = bounds(list(self.excess), 1 - (1 - confidence) / BOUND_MARGIN)
            assert low is not None and high is not None     # two values or more have both
            return float(low), float(high)
        return self.value - k * self.se, max(self.value, 0.0) + k * self.se


def _by_sequence(values: Sequence[float], keys: Sequence) -> dict:
    """Sequence name -> the mean of its values (keys (sequence, position)); {} when the
    values are not keyed by sequence."""
    if not keys or len(keys) != len(values) or not isinstance(keys[0], tuple):
        return {}
    groups: dict = {}
    for key, value in zip(keys, values):
        groups.setdefault(key[0], []).append(value)
    return {name: statistics.fmean(v) for name, v in groups.items()}


@dataclass
class Contribution:
    suspect: str
    value: float | None        # drift it carries, net of the noise (None: not attributable)
    low: float
    high: float
    how: str                   # measured | inferred | cleared-group | not-needed | undecided
    above: bool = False        # told from zero at the search's k: it carries drift


@dataclass
class SearchResult:
    contributions: list[Contribution] = field(default_factory=list)
    states: list[tuple[str, ...]] = field(default_factory=list)   # groups measured, in order
    culprits: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)   # neither told from zero nor bounded

    @property
    def restarts(self) -> int:
        return len(self.states)


Measure = Callable[[tuple[str, ...]], Measurement]


def search(order: list[str], measure: Measure, noise: Noise, k: float = 3.0,
           cheap: frozenset[str] = frozenset(),
           tolerance: float = DEFAULT_TOLERANCE) -> SearchResult:
    """`order`: the suspects, most likely first; `noise`: two replays of the starting
    state (a group's contribution is its A/B drift net of the noise's mean); `k`: how many
    standard errors make a contribution real; `cheap`: the suspects taken out without a
    code change (gates), which lead `order`: a group splits where they end whenever that
    split is as good as halving (no half larger than a power of two the halves would be),
    so a gate-driven culprit is found by gates only."""
    result = SearchResult()
    memo: dict[tuple[str, ...], Measurement] = {}
    unknown = Effect(0.0, noise.se)          # a group never measured: the noise's bound

    def state(group: tuple[str, ...]) -> tuple[Measurement, Effect]:
        if group not in memo:
            memo[group] = measure(group)
            result.states.append(group)
        return memo[group], Effect.measured(memo[group], noise)

    def add(names: tuple[str, ...], effect: Effect, how: str) -> None:
        low, high = effect.interval(k)
        for name in names:
            alone = len(names) == 1 and how in ("measured", "inferred")
            above = alone and effect.real(k)
            value = max(effect.value, 0.0) if alone else None     # a drift is never < 0
            result.contributions.append(Contribution(
                name, value, max(0.0, low) if alone else 0.0, max(high, 0.0), how, above))
            if above:
                result.culprits.append(name)
            if how == "undecided":
                result.undecided.append(name)

    def settle(names: tuple[str, ...], effect: Effect) -> None:
        """A group not told from zero: cleared when bounded below the tolerance, else
        undecided (never cleared on an inconclusive measurement)."""
        add(names, effect, "cleared-group" if effect.bounded(k, tolerance) else "undecided")

    def walk(group: tuple[str, ...], known: Effect | None, how: str) -> None:
        if len(group) == 1:
            effect = known if known is not None else state(group)[1]
            if effect.real(k):
                add(group, effect, how)
            else:
                settle(group, effect)
            return
        half = split(group, cheap)
        first, second = group[:half], group[half:]
        m1, e1 = state(first)
        if e1.real(k):
            walk(first, e1, "measured")
        else:
            settle(first, e1)
        if m1.cleared and e1.real(k):
            add(second, known.minus(e1) if known is not None else unknown, "not-needed")
            return
        if known is not None:
            rest, rest_how = known.minus(e1), "inferred"
        else:
            rest, rest_how = state(second)[1], "measured"
        if rest.real(k):
            walk(second, rest, rest_how)
        else:
            settle(second, rest)

    if order:
        walk(tuple(order), None, "measured")
    return result


def split(group: tuple[str, ...], cheap: frozenset[str]) -> int:
    """Where to cut `group`: at the end of its cheap prefix if both parts then fit in
    2^(ceil(log2 n) - 1) (the depth of halving stays ceil(log2 n)), else in half."""
    n = len(group)
    top = 2 ** (math.ceil(math.log2(n)) - 1)
    prefix = next((i for i, name in enumerate(group) if name not in cheap), n)
    return prefix if 0 < prefix < n and n - top <= prefix <= top else (n + 1) // 2


def one_at_a_time(order: list[str], culprit: str) -> int:
    """States today's bisect uses to find `culprit`: one per suspect until it flips."""
    return order.index(culprit) + 1
