"""The tracer's cost per call after a target's first call (issue: observed execution).

Runs a small module in a child process with and without the tracer, exactly as deploy
installs it (sitecustomize.py + patchset_tracer.py first on PYTHONPATH), and times calls
after the first one: through the module attribute (what most callers do: on Python < 3.12
the original is back after the first call; sys.monitoring never replaces it), and through
a reference taken before the first call (a dispatch table: on < 3.12 it keeps the wrapper).
Prints a table; nothing is asserted (tests/unit/test_tracer.py checks behaviour).

    python bench/trace_bench.py [--calls 2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "patchset" / "agent"
MODULE = "def f(x):\n    return x\n\nclass K:\n    def m(self, x):\n        return x\n"
CHILD = r'''
import json, sys, time
import bm
held_f, k = bm.f, bm.K()
held_m = bm.K.m
n = int(sys.argv[1])

def per_call(fn, *args):
    fn(*args)                                   # the first call (recorded, if traced)
    best = None
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn(*args)
        dt = (time.perf_counter() - t) / n
        best = dt if best is None else min(best, dt)
    return best

def loop_only():
    best = None
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            pass
        dt = (time.perf_counter() - t) / n
        best = dt if best is None else min(best, dt)
    return best

base = loop_only()
print(json.dumps({
    "function, by attribute": per_call(lambda: bm.f(1)) - base,
    "function, reference held before the first call": per_call(held_f, 1) - base,
    "method, by attribute": per_call(lambda: k.m(1)) - base,
    "method, reference held before the first call": per_call(held_m, k, 1) - base,
}))
'''


def measure(site: Path, traced: bool, calls: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHSET_TRACE")}
    env["PYTHONPATH"] = f"{site / 'trace'}:{site}"
    if traced:
        env.update(PATCHSET_TRACE="b:000000000000=bm:f,bm:K.m",
                   PATCHSET_TRACE_DIR=str(site / "records"))
    out = subprocess.run([sys.executable, str(site / "child.py"), str(calls)], env=env,
                         cwd=site, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trace-bench-") as tmp:
        site = Path(tmp)
        (site / "trace").mkdir()
        (site / "records").mkdir(mode=0o700)
        shutil.copy(AGENT / "tracer.py", site / "trace" / "patchset_tracer.py")
        shutil.copy(AGENT / "sitecustomize.py", site / "trace" / "sitecustomize.py")
        (site / "bm.py").write_text(MODULE)
        (site / "child.py").write_text(CHILD)
        off = measure(site, False, args.calls)
        on = measure(site, True, args.calls)
        [record] = [json.loads(p.read_text()) for p in (site / "records").glob("*.json")]
    mode = record["mode"]
    print(f"tracer per-call cost after the first call: Python {sys.version.split()[0]}, "
          f"mode {mode}, {args.calls} calls x 5 runs (best), loop overhead subtracted")
    print(f"{'call':52} {'off ns':>8} {'on ns':>8} {'extra ns':>9}")
    for key in off:
        extra = (on[key] - off[key]) * 1e9
        print(f"{key:52} {off[key] * 1e9:8.1f} {on[key] * 1e9:8.1f} {extra:9.1f}")
    print(f"recorded: {sorted(record['hits'])} (target: < 500 ns extra per call; "
          "GPU work is never touched: the tracer sees Python calls only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
