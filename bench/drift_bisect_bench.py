"""Restarts a bisect spends to find one culprit among n suspects: group testing by drift
(isolate/search/driftsearch.py, `patchset bisect --probe drift`) vs one at a time (today's
`patchset bisect` with a pass/fail probe).

Simulated on the stand-in's model: each suspect is a precision rule of the stand-in's toy
(tests/standin/payload/sglang_standin/toy.py); the culprit's rule rounds the carried state
to bf16, the others change nothing. A state is a set of suspects taken out; its A/B drift
is measured for real, by running the toy's decode and prefill paths on a shipped
conversation with that state's rules, against the starting state's tokens. The states
each strategy needs are counted (each one a restart of prefill and decode: minutes on a
real deployment); one at a time needs r states for the culprit ranked r-th, and every
unit restarts twice per state (prefill and decode) plus once more for the restore.

    python bench/drift_bisect_bench.py [--max-n 8] [--tokens 1024]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "standin" / "payload"))

from patchset.isolate.search import driftsearch  # noqa: E402
from patchset.isolate.measure.driftstats import compare, exceeds  # noqa: E402


def toy_states(tokens: int, output: int) -> dict[bool, tuple[list[float], list[float]]]:
    """The toy's numbers for the two kinds of state there are: the culprit's rule on (its
    patch still in) or off. For each, the prefill logprobs of the starting state's tokens
    (A/B) and the decode logprobs of a generation (prefill vs decode); base: rule on."""
    from sglang_standin import toy
    rule = toy.Runner(toy.Numerics({"state": "bf16"}, 1e-6))
    plain = toy.Runner(toy.Numerics({}, 1e-6))
    prompt = [0] + rule.tokenizer.encode(" ".join(f"w{i % 89}" for i in range(tokens)),
                                         add_special_tokens=False)
    first = rule.run(toy.Request(prompt, output, temperature=1.0, sampling_seed=1,
                                 ignore_eos=True, return_logprob=True,
                                 logprob_start_len=len(prompt)))
    seq = prompt + first.output_ids

    def prefill(runner: "toy.Runner") -> list[float]:
        done = runner.run(toy.Request(seq, 0, return_logprob=True,
                                      logprob_start_len=len(prompt) - 1))
        return [v for v, _ in done.input_token_logprobs][-output:]

    decode = [v for v, _ in first.output_token_logprobs]
    return {True: (prefill(rule), decode), False: (prefill(plain), prefill(plain))}, \
        prefill(rule), len(prompt)


def toy_measure(numbers: tuple, noise: list[float], culprit: str):
    states, base, start = numbers

    def measure(group: tuple[str, ...]) -> driftsearch.Measurement:
        rule_on = culprit not in group
        prefill, decode = states[rule_on]
        ab = compare(prefill, base, start).points
        pd = [v for _, v in compare(prefill, decode, start).points]
        return driftsearch.Measurement(tuple(v for _, v in ab), not exceeds(pd, noise),
                                       tuple(pos for pos, _ in ab))
    return measure


def noise_of(numbers: tuple) -> list[float]:
    """The noise: two replays of the starting state's tokens on the starting state."""
    states, base, start = numbers
    return [v for _, v in compare(states[True][0], base, start).points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    numbers = toy_states(args.tokens, 64)
    replays = noise_of(numbers)                     # the noise is measured once, as a bisect does
    noise = driftsearch.Noise.of(replays)
    for n in range(2, args.max_n + 1):
        names = [f"s{i + 1}" for i in range(n)]
        group, single = [], []
        for culprit in names:
            found = driftsearch.search(names, toy_measure(numbers, replays, culprit), noise)
            assert found.culprits == [culprit], (n, culprit, found)
            group.append(found.restarts)
            single.append(driftsearch.one_at_a_time(names, culprit))
        rows.append((n, max(group), statistics.fmean(group), max(single),
                     statistics.fmean(single), math.ceil(math.log2(n)) + 1))
    print(f"restarts (test states) to find one culprit among n suspects, every rank tried; "
          f"toy model, {args.tokens}-token prompt, {time.monotonic() - started:.1f} s")
    print(f"{'n':>3} {'group worst':>12} {'group mean':>11} {'one-by-one worst':>17} "
          f"{'one-by-one mean':>16} {'bound log2n+1':>14} {'unit restarts (group/one, worst)':>33}")
    for n, gw, gm, sw, sm, bound in rows:
        print(f"{n:>3} {gw:>12} {gm:>11.2f} {sw:>17} {sm:>16.2f} {bound:>14} "
              f"{2 * gw + 2:>16} / {2 * sw + 2:<14}")


if __name__ == "__main__":
    main()
