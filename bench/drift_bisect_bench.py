"""Restarts a bisect spends to find one culprit among n suspects: group testing by drift
(isolate/driftsearch.py, `patchset bisect --probe drift`) vs one at a time (today's
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

from isolate import driftsearch                                   # noqa: E402
from isolate.driftstats import Verdict, compare, pooled             # noqa: E402


def toy_measure(tokens: int, culprit_of: dict[str, bool]):
    """A measure() over the toy: S = every suspect in (the culprit's rule on)."""
    from sglang_standin import toy                                  # noqa: E402
    model = toy.Model()
    prompt = model.tokenizer.encode(" ".join(f"w{i % 97}" for i in range(tokens)))

    def run(rules: list) -> tuple[list[int], list[float], list[float]]:
        return model.sample_and_replay(prompt, 64, rules)

    s_rules = [toy.Rule("state", "bf16")] if any(culprit_of.values()) else []
    base_ids, _, base_prefill = run(s_rules)

    def measure(group: tuple[str, ...]) -> driftsearch.Measurement:
        rules = [] if any(culprit_of[g] for g in group) else s_rules
        _, decode, prefill = model.replay_and_decode(prompt, base_ids, rules)
        ab = compare(prefill, base_prefill, len(prompt)).overall.mean or 0.0
        pd = compare(prefill, decode, len(prompt)).overall.mean or 0.0
        return driftsearch.Measurement(ab, pd <= 1e-12)
    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    for n in range(2, args.max_n + 1):
        names = [f"s{i + 1}" for i in range(n)]
        group, single = [], []
        for culprit in names:
            measure = toy_measure(args.tokens, {x: x == culprit for x in names})
            found = driftsearch.search(names, measure, Verdict.judge(0.0, [0.0, 0.0]).threshold,
                                       0.0)
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
