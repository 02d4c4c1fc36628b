"""`patchset serve` at fleet size: one /metrics scrape's time and size with 8 hosts x 6
patches x 3 servers, and the exporter's memory over 1000 audit cycles.

The audits are fed, not run (no hosts): the exporter's `evaluate` returns the fleet's
report built from one synthetic report dict per host, each in the shape
auditor.report.to_dict gives (the fields auditor/metrics.py reads: servers,
states, findings, probes with drift figures), with the seed deployment's patches, states
and checks (tests/audit_facts/seed.yaml) spread over three servers per host. A scrape is
a real HTTP GET of the exporter's /metrics on loopback (auditor/exporter.py, the server
`patchset serve` runs), in the text format and in OpenMetrics. The memory figures are the
process's RSS and tracemalloc's traced bytes after cycles 10, 100, 500 and 1000 (one
cycle = one audit of every host, each report a new dict; every tenth cycle the servers get
new pids, as after a deploy, so the exporter's per-process records turn over), with a
scrape after every cycle.

    python bench/metrics_bench.py [--hosts 8] [--servers 3] [--cycles 1000] [--scrapes 50]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
import urllib.request
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchset.auditor import exporter, report                               # noqa: E402
from patchset.auditor.api import Gathered                                   # noqa: E402
from patchset.auditor.model import HostFacts                                # noqa: E402

PATCHES = ("default-thinking-reasoning", "nvfp4-cutlass-swiglu-clamp", "triton-dsa-indexer",
           "indexer-bf16-gemm", "mma-splitk-decode", "mhc-bf16")
# the seed's states (prefill, decode); a third server serves decode like the second
SEED = {"default-thinking-reasoning": ("active", "active"),
        "nvfp4-cutlass-swiglu-clamp": ("not-applied", "not-applied"),
        "triton-dsa-indexer": ("gated-off", "active"), "indexer-bf16-gemm": ("active", "inert"),
        "mma-splitk-decode": ("gated-off", "active"), "mhc-bf16": ("active", "active")}
PER_SERVER = (("server-health[unit]", "high", "pass"), ("server-health[health]", "high", "pass"),
              ("imported-tree", "high", "pass"), ("stale-process", "high", "pass"),
              ("gate-env", "high", "pass"), ("gate-env", "high", "pass"),
              ("gpu-arch", "medium", "pass"), ("secrets[cmdline]", "medium", "pass"),
              ("hazard[nvfp4-cutlass-no-swiglu-clamp]", "high", "fail"))
PER_HOST = tuple((f"pd-consistency[{k}]", "high", "pass") for k in (
    "model_path", "model_type", "quantization", "quant_algo", "kv_cache_dtype", "page_size",
    "disaggregation_transfer_backend", "tp_size")) + (
    ("tree-drift", "high", "pass"), ("pinned-base", "high", "pass"),
    ("foreign-commits", "medium", "pass"), ("checkpoint-dtypes[narrowed]", "medium", "warn"),
    ("checkpoint-dtypes[nvfp4-experts]", "medium", "pass"))


def servers(n: int) -> list[str]:
    return ["sglang-prefill.service"] + [f"sglang-decode{'' if i == 0 else f'-{i}'}.service"
                                         for i in range(n - 1)]


def host_report(host: str, n_servers: int, cycle: int) -> dict:
    """One host's report dict for audit cycle `cycle` (pids change every tenth cycle)."""
    ids = servers(n_servers)
    epoch = 1_796_000_000 + cycle * 300
    pid0 = 1000 + (cycle // 10) * 100
    states = [{"patch": p, "host": host, "server": sid,
               "state": SEED[p][0 if i == 0 else 1], "reason": "r", "conditions": [],
               "evidence": "declared"} for i, sid in enumerate(ids) for p in PATCHES]
    findings = [{"id": cid, "host": host, "subject": f"{sid} subject {cid}", "expected": "e",
                 "found": "f", "status": status, "severity": sev, "message": "m",
                 "evidence": [], "patches": []}
                for sid in ids for cid, sev, status in PER_SERVER]
    findings += [{"id": cid, "host": host, "subject": f"/opt/sglang {cid}", "expected": "e",
                  "found": "f", "status": status, "severity": sev, "message": "m",
                  "evidence": [], "patches": []} for cid, sev, status in PER_HOST]
    probes = [{"probe": "recall", "name": "recall", "ok": True, "latency_ms": 120.0 + cycle % 7,
               "unreachable": False},
              {"probe": "needle", "name": "needle@8k", "ok": True, "latency_ms": 900.0,
               "unreachable": False},
              {"probe": "drift", "name": "drift", "ok": False, "latency_ms": 20000.0,
               "unreachable": False, "drift": {
                   "overall": {"overall": {"tokens": 1536, "mean": 3.5e-5 * (1 + cycle % 3),
                                           "p90": 9e-5, "p99": 2e-4}},
                   "verdict": {"threshold": 4e-11, "above": True,
                               "noise": [5e-12, 6e-12]}}}]
    counts = {s: 0 for s in report.STATUS_ORDER}
    for f in findings:
        counts[f["status"]] += 1
    return {"schema": report.SCHEMA_ID, "schema_version": "1.5", "tool_version": "0.1.0",
            "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
            "series": {"manifest": "patches.yaml",
                       "upstream": {"name": "sglang", "version": "0.5.14"},
                       "patches": list(PATCHES)},
            "summary": {"hosts": 1, "unreachable": [], "failed": [], "checks": counts,
                        "exit_code": 1},
            "hosts": [{"host": host, "reachable": True, "error": None, "hostname": host,
                       "gather_ms": 400.0 + cycle % 11,
                       "facts": {"servers": [{"id": sid, "kind": "server", "pid": pid0 + i,
                                              "started": float(epoch - 60)}
                                             for i, sid in enumerate(ids)]},
                       "states": states, "probes": probes}],
            "findings": findings, "symptom": None}


def fleet_report(gathered: list[Gathered], n_servers: int, cycle: int) -> dict:
    """What the exporter's `evaluate` gives for these hosts: their reports as one."""
    parts = [host_report(g.facts.host, n_servers, cycle) for g in gathered]
    data = dict(parts[0])
    data["hosts"] = [h for d in parts for h in d["hosts"]]
    data["findings"] = [f for d in parts for f in d["findings"]]
    data["summary"] = {**data["summary"], "hosts": len(parts), "checks": {
        s: sum(d["summary"]["checks"][s] for d in parts) for s in data["summary"]["checks"]}}
    return data


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def scrape(url: str, accept: str | None = None) -> tuple[float, int]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
    return time.perf_counter() - start, len(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=50)
    args = parser.parse_args(argv)
    hosts = [f"gpu{i + 1}" for i in range(args.hosts)]
    cycle = [0]
    ex = exporter.Exporter(hosts, lambda h: Gathered(HostFacts(h)),
                           lambda gathered: fleet_report(gathered, args.servers, cycle[0]),
                           interval=300, log=lambda m: None)
    address, port = ex.serve("127.0.0.1", 0)
    url = f"http://{address}:{port}/metrics"
    for h in hosts:
        ex.audit_once(h)
    text = ex.metrics_text()[0].decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    rows = []
    for label, accept in (("text 0.0.4", None), ("OpenMetrics", "application/openmetrics-text;"
                                                 "version=1.0.0")):
        scrape(url, accept)                                  # warm
        times, size = [], 0
        for _ in range(args.scrapes):
            t, size = scrape(url, accept)
            times.append(t)
        rows.append((f"one /metrics scrape, {label}", f"{statistics.median(times) * 1e3:.2f} ms",
                     f"{min(times) * 1e3:.2f} - {max(times) * 1e3:.2f} ms",
                     f"{size} bytes ({size / 1024:.1f} KiB), {series} series"))
    started = time.perf_counter()
    for h in hosts:
        ex.audit_once(h)
    publish = (time.perf_counter() - started) / len(hosts)
    rows.append(("one audit finished (the fleet's report fed, families, report.json)",
                 f"{publish * 1e3:.2f} ms", "", "per host audit, off the scrape path"))

    marks, memory = {10, 100, 500, args.cycles}, []
    tracemalloc.start()
    for n in range(1, args.cycles + 1):
        cycle[0] = n
        for h in hosts:
            ex.audit_once(h)
        scrape(url)
        if n in marks:
            gc.collect()
            memory.append((n, rss_kib(), tracemalloc.get_traced_memory()[0]))
    tracemalloc.stop()
    ex.stop()
    print(f"patchset serve at fleet size: {args.hosts} hosts x {len(PATCHES)} patches x "
          f"{args.servers} servers, fed reports (no hosts); Python "
          f"{sys.version.split()[0]}, prometheus_client {metadata.version('prometheus_client')}")
    print()
    print("| what | median | min - max | notes |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print("| after audit cycles | RSS | traced by tracemalloc | notes |")
    print("|---|---|---|---|")
    base = next(m for m in memory if m[0] == 100)
    for n, rss, traced in memory:
        note = "" if n < 100 else f"{(rss - base[1]) / 1024:+.1f} MiB RSS, " \
            f"{(traced - base[2]) / 1024:+.1f} KiB traced since cycle 100"
        print(f"| {n} ({n * len(hosts)} audits) | {rss / 1024:.1f} MiB | "
              f"{traced / 1024:.1f} KiB | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
