"""The canonical report: a Report as a JSON-able dict, versioned, redacted, schema-checked.

Every output format renders from this dict (never from the live objects), so redaction
happens once, here, for all of them: terminal, Markdown, HTML, JSON and JUnit show the
same redacted values, evidence included. The schema ships next to this module
(auditor/schema/report.schema.json) and `validate` checks a dict against it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Iterable

from patchset.agent.lib.facts.base import FactValue
from .model import COUNTED, STATUSES, HostFacts, Report, Server
from patchset.agent.lib.redact import redact

SCHEMA_FILE = Path(__file__).resolve().parent / "schema" / "report.schema.json"
SCHEMA_ID = "patchset-audit-report"
STATUS_ORDER = STATUSES                        # fail, warn, unknown, waived, pass
CHECK_COUNTS = ("pass", "fail", "warn", "unknown")   # summary.checks (waived: summary.waived)
SEVERITY_ORDER = ("high", "medium", "low", "info")


def fact(value: FactValue) -> dict:
    prov = value.provenance
    return {"value": value.value if value.known else None, "known": value.known,
            "reason": value.reason, "source": value.source,
            "provenance": dataclasses.asdict(prov) if prov else None}


def _server(server: Server) -> dict:
    return {"id": server.id, "kind": server.kind, "unit": server.unit, "pid": server.main.pid,
            "started": server.main.started, "argv": server.argv, "exe": server.exe,
            "cwd": server.cwd, "base_url": server.base_url, "model": server.model,
            "environ": fact(server.main.environ),
            "children": [{"pid": c.pid, "title": c.title, "started": c.started,
                          "environ": fact(c.environ)} for c in server.children],
            "server_info": fact(server.server_info), "model_info": fact(server.model_info),
            "health": fact(server.health), "imports": fact(server.imports),
            "server_args_log": fact(server.server_args_log)}


def _facts(f: HostFacts) -> dict:
    return {
        "clock": fact(f.clock), "gpus": fact(f.gpus), "tree": fact(f.tree),
        "unit_list": fact(f.unit_list),
        "units": {name: {"show": fact(u.show), "file": fact(u.file) if u.file else None,
                         "env_files": {p: fact(v) for p, v in u.env_files.items()}}
                  for name, u in f.units.items()},
        "servers": [_server(s) for s in f.servers],
        "checkpoints": {m: {"path": c.path, "how": c.how, "config": fact(c.config),
                            "hf_quant": fact(c.hf_quant), "index": fact(c.index),
                            "tensors": fact(c.tensors), "header_reads": c.header_reads}
                        for m, c in f.checkpoints.items()},
    }


def summary(report: Report) -> dict:
    from .api import exit_code
    return {"hosts": len(report.hosts),
            "unreachable": [h.host for h in report.hosts if not h.facts.reachable],
            "failed": [h.host for h in report.hosts if h.facts.reachable and h.facts.error],
            **tally((f.status, f.severity) for f in report.findings),
            "exit_code": exit_code(report)}


def tally(findings: Iterable[tuple[str, str]]) -> dict:
    """The summary's counts of (status, severity) pairs: `checks` by status (waived ones
    in none of them), `waived`, and `notes` (info findings that did not pass). One rule
    for a report and for the exporter's merge of per-host reports."""
    counts = {s: 0 for s in CHECK_COUNTS}
    waived = notes = 0
    for status, severity in findings:
        if status in counts:
            counts[status] += 1
        waived += status == "waived"
        notes += severity == "info" and status in COUNTED
    return {"checks": counts, "waived": waived, "notes": notes}


def to_dict(report: Report) -> dict:
    """The report as JSON data (schema `patchset-audit-report`), secrets redacted. A
    host's `probes` are the records its probe findings carry (one source, two views)."""
    from .api import probe_records
    data = {
        "schema": SCHEMA_ID, "schema_version": report.schema_version,
        "tool_version": report.tool_version, "generated": report.generated,
        "series": report.series, "summary": summary(report),
        "hosts": [{"host": h.host, "reachable": h.facts.reachable, "error": h.facts.error,
                   "hostname": h.facts.hostname, "gather_ms": h.facts.duration_ms,
                   "facts": _facts(h.facts),
                   "states": [dataclasses.asdict(s) for s in h.states],
                   "probes": probe_records(h)}
                  for h in report.hosts],
        "findings": [dataclasses.asdict(f) for f in sorted_findings(report.findings)],
        "symptom": dataclasses.asdict(report.symptom) if report.symptom else None,
        "waivers": report.waivers.to_dict() if report.waivers else None,
        "cohorts": [dataclasses.asdict(c) for c in report.cohorts],
    }
    return redact(json.loads(json.dumps(data, default=_json_default)))


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def sorted_findings(findings: list) -> list:
    """Worst first: status, then severity; stable within (check order)."""
    return sorted(findings, key=lambda f: (STATUS_ORDER.index(f.status),
                                           SEVERITY_ORDER.index(f.severity)))


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def validate(data: Any) -> list[str]:
    """Errors of `data` against the report schema (empty when it conforms)."""
    from .schemacheck import validate as check
    return check(data, schema())
