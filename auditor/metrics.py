"""The audit report as Prometheus metrics: report dict -> metric families -> text.

Everything here reads the canonical report dict (auditor.report.to_dict: already redacted),
so `patchset audit --format prometheus` and `patchset serve`'s /metrics say the same. Label
values are ids only: host specs, server (unit) ids, patch names, check ids, states,
statuses, probe names; never a subject, a message, an expected/found value or anything
else a host or a patch author wrote as free text, and each is cut to LABEL_CHARS of
LABEL_SAFE (anything else becomes `_`), so a hostile value can neither blow up
cardinality nor carry a secret.

The statuses are those of the report (summary.checks' keys, plus any a finding carries),
never a list of this module's: a status a later check adds (waivers' `waived`) gets its
series without a change here.
"""

from __future__ import annotations

import calendar
import re
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:                       # imported by the two exporters only (start-up)
    from prometheus_client.registry import Collector

PREFIX = "patchset_"
LABEL_SAFE = re.compile(r"[^A-Za-z0-9_.:@/+=\[\]-]")
LABEL_CHARS = 128
HAZARD = "hazard"                     # check id of the hazards (hazard[NAME])
STALE = "stale-process"               # check id of the stale-process check (and sub-tags)
FIRING = "fail"                       # the hazard check's status when its conditions hold


def label(value: Any) -> str:
    """A label value: the id as it is when it is one (`sglang-decode.service`,
    `hazard[nvfp4-cutlass-no-swiglu-clamp]`, `root@10.0.0.5:22`), otherwise with every
    other character replaced by `_`, at most LABEL_CHARS."""
    return LABEL_SAFE.sub("_", "" if value is None else str(value))[:LABEL_CHARS]


def epoch(stamp: str | None) -> float | None:
    """The report's `generated` (`2026-11-29T12:00:00Z`) as epoch seconds."""
    try:
        return float(calendar.timegm(time.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def statuses(data: dict) -> list[str]:
    """Every status the report knows: summary.checks' keys in their order, then any other
    a finding carries."""
    known = list(data.get("summary", {}).get("checks", {}))
    return known + sorted({f["status"] for f in data.get("findings", [])} - set(known))


def host_ok(host: dict) -> bool:
    return bool(host.get("reachable")) and not host.get("error")


def server_of(subject: str, servers: Iterable[str]) -> str:
    """The server a finding is about: the longest server id its subject starts with
    (`sglang-decode.service (pid 2000)`, `sglang-prefill.service: NVFP4 ...`), else ''."""
    best = ""
    for sid in servers:
        if len(sid) > len(best) and (subject == sid or subject.startswith((sid + " ", sid + ":"))):
            best = sid
    return best


def _servers(host: dict) -> list[dict]:
    return (host.get("facts") or {}).get("servers") or []


class Families:
    """Metric families under construction: `gauge(name, help, labels)` then `add(...)`.
    Families come out in the order they were declared, each once."""

    def __init__(self) -> None:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        self._kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        self.by_name: dict[str, Any] = {}

    def family(self, kind: str, name: str, doc: str, labels: tuple[str, ...]) -> Any:
        if name not in self.by_name:
            self.by_name[name] = self._kinds[kind](PREFIX + name, doc, labels=list(labels))
        return self.by_name[name]

    def gauge(self, name: str, doc: str, labels: tuple[str, ...], values: tuple,
              value: float) -> None:
        self.family("gauge", name, doc, labels).add_metric([label(v) for v in values],
                                                           float(value))

    def counter(self, name: str, doc: str, labels: tuple[str, ...], values: tuple,
                value: float) -> None:
        self.family("counter", name, doc, labels).add_metric([label(v) for v in values],
                                                             float(value))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.by_name.values())


def report_families(data: dict, last_success: dict[str, float] | None = None,
                    deployed: dict[tuple[str, str], dict[str, str]] | None = None,
                    out: Families | None = None) -> Families:
    """The families of one report dict. `last_success` (host -> epoch seconds) is the
    exporter's memory of each host's last successful audit; without it a host audited
    successfully in this report has the report's time. `deployed` ((host, server) ->
    {patch: state}) is the exporter's record of each patch's state in the first audit of
    the server's current process (auditor/exporter.py); without it (a one-shot audit) the
    patch_deployed_state family is left out."""
    fam = out or Families()
    generated = epoch(data.get("generated"))
    fam.gauge("build_info", "patchset version, report schema and upstream pin (always 1)",
              ("version", "schema_version", "upstream", "upstream_version"),
              (data.get("tool_version"), data.get("schema_version"),
               data.get("series", {}).get("upstream", {}).get("name"),
               data.get("series", {}).get("upstream", {}).get("version")), 1)
    if generated is not None:
        fam.gauge("report_timestamp_seconds", "when the report was generated", (), (),
                  generated)
    names = statuses(data)
    by_host: dict[str, list[dict]] = {}
    for f in data.get("findings", []):
        by_host.setdefault(f["host"], []).append(f)
    for host in data.get("hosts", []):
        _host(fam, host, by_host.get(host["host"], []), names, generated,
              last_success, deployed)
    for c in data.get("cohorts") or []:
        fam.gauge("server_cohort", "the server's cohort (inventory) and the hash of what it "
                  "runs: patches and hashes, tree, gates, loaded patches (always 1; "
                  "PatchsetCohortMismatch fires on two hashes in one cohort and role)",
                  ("host", "server", "role", "cohort", "hash"),
                  (c["host"], c["server"], c["role"], c["cohort"], c["hash"]), 1)
    return fam


def last_success_gauge(fam: Families, host: str, when: float) -> None:
    """The series PatchsetNoSuccessfulAudit watches: from a report, or from `serve`'s
    schedule while no report is published yet."""
    fam.gauge("last_success_timestamp_seconds", "when the host was last audited "
              "successfully", ("host",), (host,), when)


def _host(fam: Families, host: dict, findings: list[dict], names: list[str],
          generated: float | None, last_success: dict[str, float] | None,
          deployed: dict[tuple[str, str], dict[str, str]] | None) -> None:
    h = host["host"]
    H = ("host",)
    fam.gauge("host_up", "1 when the host's facts were gathered (reachable, no agent error)",
              H, (h,), host_ok(host))
    fam.gauge("host_reachable", "1 when the host could be reached", H, (h,),
              bool(host.get("reachable")))
    fam.gauge("gather_duration_seconds", "how long the host's one gather round trip took",
              H, (h,), (host.get("gather_ms") or 0) / 1000)
    when = (last_success or {}).get(h) if last_success is not None else \
        (generated if host_ok(host) else None)
    if when is not None:
        last_success_gauge(fam, h, when)
    servers = _servers(host)
    for s in servers:
        if s.get("started") is not None:
            fam.gauge("server_start_time_seconds", "when the server's main process started",
                      ("host", "server"), (h, s["id"]), s["started"])
    for st in host.get("states", []):
        fam.gauge("patch_state", "the patch's effective state in the server (always 1; "
                  "state and evidence in the labels)",
                  ("host", "server", "patch", "state", "evidence"),
                  (h, st.get("server") or "", st["patch"], st["state"],
                   st.get("evidence") or "declared"), 1)
    if deployed is not None:
        for (dh, server), patches in deployed.items():
            if dh != h:
                continue
            for patch, state in patches.items():
                fam.gauge("patch_deployed_state", "the patch's state in the first audit "
                          "of the server's current process (the deploy or restart that "
                          "started it; always 1)", ("host", "server", "patch", "state"),
                          (h, server, patch, state), 1)
    _findings(fam, h, findings, names, [s["id"] for s in servers], servers)
    for probe in host.get("probes", []):
        _probe(fam, h, probe)


def _findings(fam: Families, h: str, findings: list[dict], names: list[str],
              server_ids: list[str], servers: list[dict]) -> None:
    counts: Counter = Counter()
    per_status: Counter = Counter(f["status"] for f in findings)
    stale: Counter = Counter()
    for f in findings:
        server = server_of(f["subject"], server_ids)
        counts[(server, f["id"], f["severity"], f["status"])] += 1
        check = f["id"].split("[", 1)[0]
        if check == HAZARD and "[" in f["id"]:
            fam.gauge("hazard_firing", "1 when the hazard's conditions hold in the server "
                      "(hazards.yaml), 0 when it is cleared or does not apply",
                      ("host", "server", "hazard"), (h, server, f["id"][len(HAZARD) + 1:-1]),
                      f["status"] == FIRING)
        if check == STALE:
            stale[server] += f["status"] == FIRING
    for (server, check, severity, status), n in sorted(counts.items()):
        fam.gauge("check_findings", "findings of a check (id with its sub-tag) by status",
                  ("host", "server", "check", "check_severity", "status"),
                  (h, server, check, severity, status), n)
    for status in names:
        fam.gauge("findings", "the host's findings by status", ("host", "status"),
                  (h, status), per_status.get(status, 0))
    for s in servers:
        if s.get("kind", "server") == "server":
            fam.gauge("stale_process", "1 when the server's process runs other code than "
                      "the tree and its unit give it now (stale-process fails)",
                      ("host", "server"), (h, s["id"]), stale.get(s["id"], 0) > 0)


def _probe(fam: Families, h: str, probe: dict) -> None:
    key = ("host", "probe", "name")
    values = (h, probe.get("probe"), probe.get("name"))
    fam.gauge("probe_ok", "1 when the probe passed (fidelity: the planted token came back; "
              "drift: bounded below the tolerance)", key, values, bool(probe.get("ok")))
    fam.gauge("probe_reachable", "1 when the probe's endpoint answered", key, values,
              not probe.get("unreachable"))
    fam.gauge("probe_latency_seconds", "the probe's request time", key, values,
              (probe.get("latency_ms") or 0) / 1000)
    drift = probe.get("drift") or {}
    overall = (drift.get("overall") or {}).get("overall") or {}
    verdict = drift.get("verdict") or {}
    figures = (("drift_mean", "mean per-token KL estimate, prefill vs decode (or A/B)",
                overall.get("mean")),
               ("drift_p99", "p99 of the per-token KL estimate", overall.get("p99")),
               ("drift_tokens", "tokens the drift was measured on", overall.get("tokens")),
               ("drift_tolerance", "the drift per token that matters (bounded below it: "
                "a pass)", verdict.get("tolerance")),
               ("drift_upper", "the upper confidence bound of the drift beyond the noise, "
                "per token", verdict.get("upper")),
               ("drift_detectable", "the smallest drift the probe could tell from the noise "
                "at 80% power", verdict.get("detectable")),
               ("drift_above", "1 when the drift is above the noise, 0 bounded below the "
                "tolerance (absent: inconclusive)", verdict.get("above")),
               ("drift_noise_mean", "mean per-token KL estimate between replays of the same "
                "tokens (the noise)", _noise(verdict.get("noise"))))
    for name, doc, value in figures:
        if value is not None:
            fam.gauge("probe_" + name, doc, key, values, float(value))


def _noise(value: Any) -> float | None:
    """The decision's mean noise; an older report's list of replay means, averaged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    listed = [v for v in value or [] if type(v) in (int, float)] \
        if isinstance(value, list) else []
    return sum(listed) / len(listed) if listed else None


def collector(families: Iterable[Any]) -> Collector:
    """A prometheus_client collector that yields the families it was given (register it
    with a CollectorRegistry). A subclass of Collector: an ABC up to prometheus_client
    0.23, a Protocol since 0.24, so only a subclass is a Collector to the type checker
    at every version in range."""
    from prometheus_client.registry import Collector

    class Fixed(Collector):
        def __init__(self, listed: list[Any]) -> None:
            self.families = listed

        def collect(self) -> Iterator[Any]:
            return iter(self.families)

    return Fixed(list(families))


def text(families: Iterable[Any]) -> str:
    """The Prometheus text exposition format (0.0.4) of the families."""
    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(families))
    return generate_latest(registry).decode("utf-8")


def render(data: dict) -> str:
    """`--format prometheus`: the report's families as text (write it with `-o FILE`,
    atomically, for node_exporter's textfile collector)."""
    return text(report_families(data))
