"""Shapes of the report dict that every human-facing renderer shows the same way."""

from __future__ import annotations

import math
import time
from typing import Any

from ..model import PROBE_EVIDENCE, size_label
from . import chart


def when(epoch: Any) -> str:
    if not isinstance(epoch, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))


def short(value: Any, limit: int = 80) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        text = ", ".join(str(v) for v in value)
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items())
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def role_of(server: dict) -> str:
    info = server["server_info"]
    if info["known"] and isinstance(info["value"], dict):
        mode = info["value"].get("disaggregation_mode")
        if mode:
            return str(mode)
    argv = server.get("argv") or []
    if "--disaggregation-mode" in argv:
        i = argv.index("--disaggregation-mode")
        if i + 1 < len(argv):
            return argv[i + 1]
    return "router" if server["kind"] == "router" else "null"


def servers(host: dict) -> list[dict]:
    out = []
    for s in host["facts"]["servers"]:
        health = s["health"]
        imports = s["imports"]
        out.append({
            "id": s["id"], "kind": s["kind"], "role": role_of(s), "pid": s["pid"],
            "started": when(s["started"]), "url": s.get("base_url") or "-",
            "health": (str(health["value"].get("status")) if health["known"] and
                       health["value"] else f"unknown: {health['reason']}"),
            "imports": imports["value"]["origin"] if imports["known"] and imports["value"]
            else f"unknown: {imports['reason']}",
            "backend": (s["server_info"]["value"] or {}).get("moe_runner_backend", "-")
            if s["server_info"]["known"] else "-"})
    return out


def matrix(host: dict) -> tuple[list[str], list[dict]]:
    """(server columns, rows of {patch, cells: {server: state}, evidence: {server:
    observed | declared | none yet}, reasons: {server: why}})."""
    columns: list[str] = []
    rows: dict[str, dict] = {}
    for st in host["states"]:
        col = st["server"] or "host"
        if col not in columns:
            columns.append(col)
        row = rows.setdefault(st["patch"], {"patch": st["patch"], "cells": {},
                                            "evidence": {}, "reasons": {}})
        row["cells"][col] = st["state"]
        row["evidence"][col] = evidence_of(st)
        row["reasons"][col] = "; ".join(filter(None, (st["reason"], st.get("observation"))))
    return columns, list(rows.values())


def evidence_of(state: dict) -> str:
    """observed (the tracer showed it), none yet (traced, nothing conclusive) or declared
    (tracing off: from `requires` only)."""
    if state.get("evidence") == "observed":
        return "observed"
    return "none yet" if state.get("observation") else "declared"


def gpus(host: dict) -> str:
    g = host["facts"]["gpus"]
    if not g["known"]:
        return f"unknown: {g['reason']}"
    names: dict[str, int] = {}
    for row in g["value"]:
        key = f"{row['name']} (compute_cap {row['compute_cap']})"
        names[key] = names.get(key, 0) + 1
    return ", ".join(f"{n}x {k}" for k, n in names.items())


def tree(host: dict) -> str:
    t = host["facts"]["tree"]
    if not t["known"]:
        return f"unknown: {t['reason']}"
    v = t["value"]
    if not v.get("managed"):
        return f"{v.get('target')}: not managed by patchset"
    up = v.get("upstream") or {}
    applied = ", ".join(a["name"] for a in v.get("applied") or []) or "none"
    return (f"{v.get('target')} ({v.get('kind')}), {up.get('name')} {up.get('version')}, "
            f"last apply {v.get('updated')}; applied: {applied}")


def findings_by_host(data: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {h["host"]: [] for h in data["hosts"]}
    for f in data["findings"]:
        out.setdefault(f["host"], []).append(f)
    return out


def evidence_line(ev: dict) -> str:
    if ev["what"] == PROBE_EVIDENCE and isinstance(ev["value"], dict):
        return f"{ev['what']}: {probe_line(ev['value'])}"
    where = f" [{ev['command']} -> exit {ev['exit_code']}, {ev['duration_ms']} ms]" \
        if ev.get("command") else ""
    return f"{ev['what']}: {short(ev['value'], 120)}{where}"


# ---------------------------------------------------------------- waivers (waivers.yaml)

def waiver_line(waiver: dict) -> str:
    """A waived finding's waiver, in one phrase (the justification is shown on its own)."""
    return (f"waived by {waiver['who']} until {waiver['expires']} (was {waiver['status']}; "
            f"{waiver['file']}:{waiver['line']})")


def waivers(data: dict) -> list[dict]:
    """The report's waivers, one row each: {state: applied|expired|unused, where, ...}."""
    section = data.get("waivers") or {}
    return [{"state": state, "where": f"{section['file']}:{w['line']}", **w}
            for state in ("applied", "expired", "unused") for w in section.get(state) or []]


# ---------------------------------------------------------------- fidelity probes

def probe_status(record: dict) -> str:
    """The status of the probe's finding (auditor.api.probe_findings' rule): an endpoint
    not reached, or an answer with nothing to judge by, is not a verdict."""
    return "pass" if record["ok"] else "unknown" if record["unreachable"] or record.get(
        "inconclusive") else "fail"


def probe_row(record: dict) -> dict:
    """One probe as every renderer shows it (the same words as `patchset probe`)."""
    status = probe_status(record)
    seen = "-" if record["prompt_tokens"] is None else str(record["prompt_tokens"])
    size = record["size_tokens"]
    return {"status": status, "mark": {"pass": "pass", "fail": "FAIL"}.get(status, status),
            "name": record["name"], "size": size_label(size) if size else "-",
            "sent": record["words_sent"], "seen": seen,
            "prompt": f"sent {record['words_sent']} words, server saw {seen} tokens",
            "latency": f"{record['latency_ms']:.0f} ms", "url": record["url"] or "-",
            "answer": short(record["answer"], 60) if record["answer"] else "-",
            "reason": record["reason"]}


def probes(host: dict) -> list[dict]:
    return [probe_row(r) for r in host.get("probes") or []]


def probe_line(record: dict) -> str:
    row = probe_row(record)
    return (f"{row['mark']} {row['name']} at {row['url']}: {row['prompt']}, {row['latency']}, "
            f"answer {row['answer']!r}: {row['reason']}")


def probe_of(finding: dict) -> dict | None:
    """The probe record a finding carries as evidence (probe[...] findings), else None."""
    return next((ev["value"] for ev in finding["evidence"] if ev["what"] == PROBE_EVIDENCE
                 and isinstance(ev["value"], dict)), None)


# ---------------------------------------------------------------- drift (--probe drift, --measured)

def drift_charts(host: dict) -> list[dict]:
    """Per drift probe of the host ({title, svg}): the drift by token position, overall
    and per sequence, against the tolerance (an older record: the noise threshold)
    (`points` of the record; a record without them shows its position buckets' means as
    bars)."""
    out = []
    for record in host.get("probes") or []:
        figures = record.get("drift")
        if record.get("probe") != "drift" or not isinstance(figures, dict):
            continue
        verdict = figures.get("verdict")
        if not isinstance(verdict, dict):
            verdict = {}
        # the line: the tolerance (a decision, since 1.6), an older record's noise threshold
        threshold = _number(verdict.get("tolerance", verdict.get("threshold")))
        where = f" at {record['url']}" if record.get("url") else ""
        parts = [(f"overall{where}: drift by position", figures.get("overall"))]
        parts += [(str(s.get("name", "sequence")), s) for s in figures.get("sequences") or []
                  if isinstance(s, dict)]
        for title, figure in parts:
            if isinstance(figure, dict):
                out.append({"title": title, "svg": _position_chart(figure, threshold, title)})
    return out


def _position_chart(figure: dict, threshold: float | None, title: str) -> str:
    points = [(int(p[0]), float(p[1])) for p in figure.get("points") or []
              if isinstance(p, (list, tuple)) and len(p) == 2
              and all(_number(v) is not None for v in p)]
    if points or "points" in figure:
        return chart.svg(points, threshold, title)
    buckets = figure.get("buckets")
    if not isinstance(buckets, dict):
        buckets = {}
    return chart.bars([(label, _number(b.get("mean")), _number(b.get("mean")),
                        _number(b.get("p99")))
                       for label, b in buckets.items() if isinstance(b, dict)],
                      threshold, f"{title} (mean by position bucket, to p99)")


def measured(data: dict) -> list[dict]:
    """Each `--measured` bisect: {run, contributions, steps} (two bar charts: each
    suspect's contribution with its interval, each test state's A/B drift)."""
    symptom = data.get("symptom") or {}
    out = []
    for run in symptom.get("measured") or []:
        threshold = _number(run.get("threshold"))
        where = f"{run['host']}, bisect {run['id']}"
        out.append({
            "run": run,
            "contributions": chart.bars(
                [(c["suspect"], _number(c["value"]), _number(c["low"]), _number(c["high"]))
                 for c in run["contributions"]], threshold,
                f"measured contribution per suspect ({where})"),
            "steps": chart.bars(
                [(f"step {st['number']}", _number(st["ab"]), None, None)
                 for st in run["steps"]], threshold,
                f"A/B drift of each test state against the start ({where})")})
    return out


# what a contribution that is not above the noise was found to be (driftsearch's `how`):
# only `cleared-group` rests on a bound below the tolerance
_NOT_ABOVE = {"undecided": "undecided", "cleared-group": "bounded below the tolerance",
              "not-needed": "not needed (the drift was gone without it)"}


def measured_cell(suspect: dict) -> str:
    """A suspect's measured contributions, one phrase per host ("-" when unmeasured)."""
    parts = []
    for m in suspect.get("measured") or []:
        value = "cleared" if m["value"] is None else number(m["value"])
        verdict = "above the noise" if m["above"] else _NOT_ABOVE.get(
            m.get("how"), "not told from the noise")
        parts.append(f"{m['host']}: {value} [{number(m['low'])}, {number(m['high'])}] "
                     f"{verdict}")
    return "; ".join(parts) or "-"


def number(value: Any) -> str:
    """A drift figure, 3 significant digits ("-" for none)."""
    shown = _number(value)
    return "-" if shown is None else f"{shown:.3g}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
