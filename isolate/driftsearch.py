"""Which suspects carry a measured drift, in few restarts: group testing over the ranking.

A bisect by drift measures states of the host, each one restart of its servers (minutes
on a real deployment), so the number of states is what to save. A state is the starting
state S with a group G of suspects taken out (gates unset, or reverted). Two numbers come
back from each (isolate/driftbisect.py measures them):

* `ab`: the A/B drift between S and S - G (S's saved tokens replayed on both): how much
  taking G out moves the output, i.e. G's contribution;
* `cleared`: whether S - G's own prefill-vs-decode drift is back within the noise: G
  holds everything that made prefill and decode disagree.

The search (adaptive binary splitting, most likely first): split the group in two halves
in ranking order (gated suspects first, so the cheap env-only states come first), measure
the first half; if that clears the drift, the second half is not needed; otherwise the
second half's contribution is the group's minus the first's (contributions add: the
statement this rests on, true for independent small perturbations, and shown per step
so it can be checked) or is measured when the group's is not known. A half whose
contribution is within the noise is dropped whole. One culprit among n: at most
ceil(log2 n) + 1 states; each suspect ends with a contribution (measured or inferred)
and its interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Measurement:
    ab: float                  # A/B drift S vs S - group
    cleared: bool              # S - group's prefill-vs-decode drift within the noise


@dataclass
class Contribution:
    suspect: str
    value: float | None        # drift it carries (None: not attributable)
    low: float
    high: float
    how: str                   # measured | inferred | cleared-group | not-needed


@dataclass
class SearchResult:
    contributions: list[Contribution] = field(default_factory=list)
    states: list[tuple[str, ...]] = field(default_factory=list)   # groups measured, in order
    culprits: list[str] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return len(self.states)


Measure = Callable[[tuple[str, ...]], Measurement]


def search(order: list[str], measure: Measure, threshold: float, spread: float,
           k: float = 3.0, cheap: frozenset[str] = frozenset()) -> SearchResult:
    """`order`: the suspects, most likely first; `threshold`: a drift above it is real
    (noise mean + k sigma); `spread`: the noise's sigma (for the intervals); `cheap`: the
    suspects taken out without a code change (gates), which lead `order`: a group splits
    where they end whenever that split is as good as halving (no half larger than a
    power of two the halves would be), so a gate-driven culprit is found by gates only."""
    result = SearchResult()
    memo: dict[tuple[str, ...], Measurement] = {}

    def state(group: tuple[str, ...]) -> Measurement:
        if group not in memo:
            memo[group] = measure(group)
            result.states.append(group)
        return memo[group]

    def add(names: tuple[str, ...], value: float | None, how: str, width: float) -> None:
        for name in names:
            v = value if len(names) == 1 else None
            low = max(0.0, (v if v is not None else 0.0) - width)
            high = (v if v is not None else threshold) + width
            result.contributions.append(Contribution(name, v, low, high, how))
            if v is not None and v > threshold:
                result.culprits.append(name)

    def walk(group: tuple[str, ...], known: float | None, how: str) -> None:
        if len(group) == 1:
            value = known if known is not None else state(group).ab
            add(group, value, how if known is not None else "measured",
                k * spread * (math.sqrt(2) if how == "inferred" else 1.0))
            return
        half = split(group, cheap)
        first, second = group[:half], group[half:]
        m1 = state(first)
        if m1.ab > threshold:
            walk(first, m1.ab, "measured")
        else:
            add(first, None, "cleared-group", k * spread)
        if m1.cleared and m1.ab > threshold:
            add(second, None, "not-needed", k * spread)
            return
        if known is not None:
            rest, rest_how = known - m1.ab, "inferred"
        else:
            rest, rest_how = state(second).ab, "measured"
        if rest > threshold:
            walk(second, rest, rest_how)
        else:
            add(second, None, "cleared-group", k * spread)

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
