"""The gates a rollout measures on a changed host (isolate/rollout/rollout.py decides what they
mean for the run): health, the audit of the changed servers, throughput against a short
load sent before the change, and the drift A/B against a saved baseline run.

Each gate is three-valued: pass, fail, or unknown when it could not measure (no answer,
an inconclusive drift); a gate not asked for is `skipped`, never a pass in disguise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.agent.lib import bounded
from patchset.connect.inventory import ROLE_NAMES
from patchset.deploy.units import unit_name
from patchset.errors import UsageError

from patchset.isolate.measure import drift
from patchset.isolate.search.hoststate import HostState
from patchset.isolate.rollout.rollout import (Before, GateResult, drift_verdict, new_severe,
                                              severe, states_off)


def load_baseline(path: Path, sha256: str | None = None) -> tuple[drift.DriftRun, str]:
    """The saved drift run the drift gate replays, and the sha256 of its bytes, read once
    (bounded: a FIFO or /dev/zero is refused). `sha256`: the content the rollout was
    started with; a file changed since is refused, never judged against."""
    try:
        data = bounded.read_bytes(path, drift.MAX_RUN_BYTES, "drift run")
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and digest != sha256:
            raise UsageError(f"--baseline {path}: its content changed since the rollout "
                             f"started (sha256 {digest[:12]}, logged {sha256[:12]}): put "
                             "the saved run back")
        return drift.DriftRun.from_json(bounded.loads(data, str(path), drift.MAX_RUN_BYTES),
                                        str(path)), digest
    except bounded.InputError as exc:
        raise UsageError(f"--baseline {exc}") from None
    except drift.DriftError as exc:
        raise UsageError(f"--baseline {exc}") from None


@dataclass
class FleetGates:
    """The real gates, over the command's host resolver (one SSH connection per host)."""

    series: Any
    resolver: Any                     # connect.resolve.Hosts
    transports: dict[str, Any]        # host -> Transport
    baseline: drift.DriftRun | None = None
    baseline_path: Path | None = None
    spec: drift.DriftSpec | None = None
    parallel: int = 4                 # throughput: concurrent requests of the short load
    max_drop: float = 0.5             # throughput may fall by at most this share
    api_key_env: str | None = None

    def before(self, host: str) -> Before:
        tps, why = self._throughput(host)
        return Before(tuple(severe(self._audit(host))), tps, why)

    def check(self, host: str, target: HostState, roles: list[str], before: Before,
              deployed: bool) -> list[GateResult]:
        report = self._audit(host)
        units = [unit_name(r) for r in roles]
        return [self._health(host, report, units), self._states(host, report, target, units,
                                                                before),
                self._load(host, before), self._drift(host)]

    # ------------------------------------------------------------ one gate each

    def _health(self, host: str, report: Any, units: list[str]) -> GateResult:
        """Healthy is measured, per changed unit: its unit finding passes (active, and an
        SGLang process runs in it) and its /health finding passes (answered 200). A
        finding that fails (or warns: active with no server in it) fails; a missing or
        unknown one is unknown, never healthy by default."""
        verdicts = [self._unit_health(report, u) for u in units]
        fails = [why for v, why in verdicts if v == "fail"]
        unknown = [why for v, why in verdicts if v == "unknown"]
        verdict = "fail" if fails else "unknown" if unknown else "pass"
        return GateResult("health", host, verdict, "; ".join(fails + unknown) or
                          f"{', '.join(units)} healthy")

    @staticmethod
    def _unit_health(report: Any, unit: str) -> tuple[str, str]:
        """(verdict, why) of one unit from its two findings: a fail or warn of either
        fails it; else both must have been measured passing."""
        bad, unmeasured = [], []
        for subject in (unit, f"{unit} /health"):
            found = [f for f in report.findings if f.id.startswith("server-health")
                     and f.subject == subject]
            bad += [f"{subject}: {f.status}: {f.message or f.found}" for f in found
                    if f.status in ("fail", "warn")]
            if not any(f.status == "pass" for f in found) or \
                    any(f.status == "unknown" for f in found):
                unmeasured.append(f"{subject}: not measured healthy "
                                  f"({', '.join(f.status for f in found) or 'no finding'})")
        if bad:
            return "fail", "; ".join(bad)
        return ("unknown", "; ".join(unmeasured)) if unmeasured else ("pass", "")

    def _states(self, host: str, report: Any, target: HostState, units: list[str],
                before: Before) -> GateResult:
        wrong, unknown = states_off(report, target, units,
                                    [p.name for p in self.series.patches])
        # a role canary leaves the host's other roles on the old code on purpose: what
        # the audit says of their units (stale, say) is not this step's doing
        left = tuple(unit_name(r) for r in ROLE_NAMES if unit_name(r) not in units)
        fresh = [f for f in new_severe(list(before.severe), severe(report))
                 if not f["subject"].startswith(left)]
        figures = {"new_high": fresh, "unknown_states": unknown}
        if wrong or fresh:
            return GateResult("audit", host, "fail", "; ".join(
                wrong + [f"new high finding {f['id']} on {f['subject']}" for f in fresh]),
                figures)
        if unknown:
            return GateResult("audit", host, "unknown", f"states unknown: {'; '.join(unknown)}",
                              figures)
        return GateResult("audit", host, "pass", f"states as intended on {', '.join(units)}; "
                          "no new high finding", figures)

    def _load(self, host: str, before: Before) -> GateResult:
        was = before.tokens_per_second
        now, why = self._throughput(host)
        figures = {"before": was, "after": now, "max_drop": self.max_drop}
        if was is None or now is None:
            return GateResult("throughput", host, "unknown",
                              f"not measured ({before.throughput_why or why})", figures)
        floor = was * (1 - self.max_drop)
        verdict = "pass" if now >= floor else "fail"
        return GateResult("throughput", host, verdict, f"{now:.1f} tok/s after, {was:.1f} "
                          f"before (floor {floor:.1f})", figures)

    def _drift(self, host: str) -> GateResult:
        if self.baseline is None or self.spec is None:
            return GateResult("drift", host, "skipped", "no --baseline run given")
        from patchset.errors import Unreachable
        from patchset.isolate.measure.probe import client_for
        client = client_for(host, None, None, self.api_key_env, resolver=self.resolver)
        try:
            now = drift.replay_saved(client, self.baseline, self.spec)
        except Unreachable as exc:
            return GateResult("drift", host, "unknown", f"no answer: {exc}")
        except drift.DriftError as exc:
            return GateResult("drift", host, "unknown", f"drift probe: {exc}")
        report = drift.a_b(self.baseline, now, self.spec.fixed, str(self.baseline_path))
        verdict, why = drift_verdict(report.verdict)
        return GateResult("drift", host, verdict, why, {
            "mean": report.overall.overall.mean, "outcome": report.verdict.outcome,
            "upper": report.verdict.upper, "tolerance": report.verdict.tolerance})

    # ------------------------------------------------------------ measurements

    def _audit(self, host: str) -> Any:
        from patchset.auditor import api as audit_api
        return audit_api.audit(self.series, [self.transports[host]])

    def _throughput(self, host: str) -> tuple[float | None, str]:
        """Tokens a second of a short load (`parallel` requests at once), or why not."""
        from patchset.isolate.measure import probe
        key = probe.api_key(self.api_key_env)   # bad input stops the run; never "unknown"
        try:
            got = probe.throughput(self.resolver.endpoint(host), self.parallel, key)
        except Exception as exc:        # any failure to measure is unknown, said as such
            return None, f"{type(exc).__name__}: {exc}"
        if not got.get("ok"):
            return None, "no completion tokens counted"
        return got.get("tokens_per_second"), ""
