"""The audit's declared knowledge, loaded from auditor/data/*.yaml and validated.

hazards.yaml   upstream hazards: conditions (fact/op/value, like `requires`) + what clears them
tensors.yaml   tensor patterns to read, dtypes patches assume, dtypes quant formats imply
symptoms.yaml  how each symptom weighs paths, states, hazards and checks when ranking
resolved_args.yaml  the ServerArgs flags SGLang rewrites at startup (auditor/resolved.py)

Policy is data (ansible-lint's profiles): the ranking and the hazard findings change by
editing these files, never the code. A bad file is a one-line error naming file and field.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.agent.lib.records import TensorPattern
from patchset.series.model import PATHS, Requirement

from .model import SEVERITIES, STATES
from .policyfile import AuditDataError, _load, _req
from .resolved import load as load_flags

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Mitigation:
    kind: str
    cost: int
    title: str


@dataclass(frozen=True)
class Hazard:
    id: str
    title: str
    severity: str
    path: str
    when: tuple[Requirement, ...]
    fixed_by: tuple[str, ...]
    why: str
    mitigations: tuple[Mitigation, ...] = ()


@dataclass(frozen=True)
class Assumption:
    patch: str
    tensors: tuple[str, ...]
    computes_in: str
    why: str


@dataclass(frozen=True)
class Expectation:
    id: str
    when: Requirement
    tensors: dict[str, str]
    why: str


@dataclass(frozen=True)
class Symptom:
    name: str
    title: str
    aliases: tuple[str, ...]
    kind: str
    paths: dict[str, float]
    states: dict[str, float]
    tier: dict[str, float]
    hazard: float
    checks: dict[str, float]
    probe: dict[str, Any]            # command, why, reproduced_by (a list)
    measured_by: tuple[str, ...] = ()   # probes whose bisect (--measured) ranks it


@dataclass(frozen=True)
class Policy:
    hazards: tuple[Hazard, ...]
    assumptions: tuple[Assumption, ...]
    expectations: tuple[Expectation, ...]
    patterns: tuple[TensorPattern, ...]
    symptoms: dict[str, Symptom]
    severity_weight: dict[str, float]
    implicated: float
    min_score: float
    next_steps_fraction: float = 0.25
    observed: float = 1.0               # x for a state the tracer observed (it ran)
    not_implicating: tuple[str, ...] = ()   # finding ids that name a patch but clear it
    remedies: dict[str, dict] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    resolved_args: tuple = ()           # auditor.resolved.Flag: the requested-vs-resolved data

    def symptom(self, name: str) -> Symptom:
        for symptom in self.symptoms.values():
            if name == symptom.name or name in symptom.aliases:
                return symptom
        raise AuditDataError(f"unknown symptom {name!r} (known: "
                             f"{', '.join(sorted(self.symptoms))})")


DTYPE_BITS = {"F64": 64, "I64": 64, "U64": 64, "C64": 64, "F32": 32, "I32": 32, "U32": 32,
              "F16": 16, "BF16": 16, "I16": 16, "U16": 16, "F8_E4M3": 8, "F8_E5M2": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I8": 8, "U8": 8, "BOOL": 8,
              "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4}


@functools.lru_cache(maxsize=4)
def load(directory: str | None = None) -> Policy:
    base = Path(directory) if directory else DATA
    hz_path, t_path, s_path = base / "hazards.yaml", base / "tensors.yaml", base / "symptoms.yaml"
    hz, tz, sy = _load(hz_path), _load(t_path), _load(s_path)
    hazards = []
    for i, h in enumerate(hz.get("hazards") or []):
        where = f"hazards[{i}]"
        if h.get("severity") not in SEVERITIES:
            raise AuditDataError(f"{hz_path}: {where}.severity: one of {', '.join(SEVERITIES)}")
        if h.get("path", "both") not in PATHS:
            raise AuditDataError(f"{hz_path}: {where}.path: one of {', '.join(PATHS)}")
        hazards.append(Hazard(
            id=str(h["id"]), title=str(h["title"]), severity=h["severity"],
            path=h.get("path", "both"),
            when=tuple(_req(hz_path, f"{where}.when[{j}]", r) for j, r in
                       enumerate(h.get("when") or [])),
            fixed_by=tuple(h.get("fixed_by") or ()), why=" ".join(str(h.get("why", "")).split()),
            mitigations=tuple(Mitigation(m["kind"], int(m["cost"]), m["title"])
                              for m in h.get("mitigations") or [])))
    assumptions = tuple(Assumption(a["patch"], tuple(a["tensors"]), a["computes_in"],
                                   " ".join(str(a.get("why", "")).split()))
                        for a in tz.get("assumptions") or [])
    for a in assumptions:
        if a.computes_in not in DTYPE_BITS:
            raise AuditDataError(f"{t_path}: assumptions: unknown dtype {a.computes_in!r}")
    expectations = tuple(Expectation(e["id"], _req(t_path, f"expectations.{e['id']}.when",
                                                   e["when"]),
                                     dict(e["tensors"]), str(e.get("why", "")))
                         for e in tz.get("expectations") or [])
    weights = sy.get("weights") or {}
    symptoms = {}
    for name, s in (sy.get("symptoms") or {}).items():
        bad = set(s.get("states") or {}) - set(STATES)
        if bad:
            raise AuditDataError(f"{s_path}: symptoms.{name}.states: unknown {sorted(bad)}")
        symptoms[name] = Symptom(
            name=name, title=s["title"], aliases=tuple(s.get("aliases") or ()),
            kind=s.get("kind", "quality"), paths=dict(s.get("paths") or {}),
            states=dict(s.get("states") or {}),
            tier=dict(s.get("tier") or weights.get("tier") or {}),
            hazard=float(s.get("hazard", 0.0)), checks=dict(s.get("checks") or {}),
            probe=dict(s.get("probe") or {}),
            measured_by=tuple(str(p) for p in s.get("measured_by") or ()))
    return Policy(hazards=tuple(hazards), assumptions=assumptions, expectations=expectations,
                  patterns=_patterns(t_path, tz.get("patterns") or ()), symptoms=symptoms,
                  severity_weight=dict(weights.get("severity") or {}),
                  implicated=float(weights.get("implicated", 1.0)),
                  observed=float(weights.get("observed", 1.0)),
                  not_implicating=tuple(weights.get("not_implicating") or ()),
                  min_score=float(weights.get("min_score", 0.0)),
                  next_steps_fraction=float(weights.get("next_steps_fraction", 0.25)),
                  remedies=dict(sy.get("remedies") or {}),
                  resolved_args=_resolved_args(base),
                  sources={"hazards": str(hz_path), "tensors": str(t_path),
                           "symptoms": str(s_path),
                           "resolved_args": str(_resolved_args_path(base))})


def _patterns(path: Path, items: Any) -> tuple[TensorPattern, ...]:
    """tensors.yaml's `patterns`: each a glob of tensor names and how many to read."""
    if not isinstance(items, list):
        raise AuditDataError(f"{path}: patterns: expected a list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"pattern", "max"} or \
                not isinstance(item.get("pattern"), str) or \
                type(item.get("max", 1000)) is not int or item.get("max", 1000) < 1:
            raise AuditDataError(f"{path}: patterns[{i}]: expected {{pattern: GLOB, max: N}} "
                                 "(N a whole number of at least 1)")
        out.append(TensorPattern(pattern=item["pattern"], max=item.get("max", 1000)))
    return tuple(out)


def _resolved_args_path(base: Path) -> Path:
    """resolved_args.yaml of the policy directory; the shipped one for a directory that has
    none (it describes the pinned SGLang, not a deployment)."""
    path = base / "resolved_args.yaml"
    return path if path.exists() else DATA / "resolved_args.yaml"


def _resolved_args(base: Path) -> tuple:
    return load_flags(_resolved_args_path(base))
