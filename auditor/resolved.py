"""Requested vs resolved, as data: auditor/data/resolved_args.yaml, loaded and validated.

Which ServerArgs fields the `resolved-args` check compares, each one's default, the values
that mean "decided later" (auto, unset), the rewrites the pinned SGLang does at startup
(with the live conditions under which it does them and the source lines), and how each
outcome is reported. Loaded by auditor.policy with the other policy files, so a bad file
is a one-line error naming file and field before any host is contacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.series import factnames
from patchset.series.model import Requirement

from .model import SEVERITIES
from .policyfile import AuditDataError, _load, _req

OUTCOMES = ("resolved", "overridden", "unknown", "unverified", "unread")
STATUSES = ("pass", "fail", "warn", "unknown")
ANY = "any"


@dataclass(frozen=True)
class Outcome:
    status: str
    severity: str


@dataclass(frozen=True)
class Rewrite:
    """What the pinned SGLang does to a flag at startup: requested `sources` (None: any)
    become `to` (ANY: a value the code picks) when every `when` condition holds."""

    sources: tuple[Any, ...] | None
    to: Any
    when: tuple[Requirement, ...]
    at: str
    why: str

    def explains(self, requested: Any, resolved: Any, same: Any) -> bool:
        """Whether this rewrite turns `requested` into `resolved` (`same`: the audit's loose
        equality), conditions aside."""
        return ((self.sources is None or any(same(requested, s) for s in self.sources))
                and (self.to == ANY or same(resolved, self.to)))


@dataclass(frozen=True)
class Flag:
    name: str                        # the ServerArgs field (moe_runner_backend)
    default: Any
    default_at: str
    unresolved: tuple[Any, ...]      # values that mean "not decided yet" (auto, None)
    aliases: dict[str, Any] = field(default_factory=dict)
    rewrites: tuple[Rewrite, ...] = ()
    report: dict[str, Outcome] = field(default_factory=dict)
    later: str = ""                  # where an unresolved value is decided, when never shown

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


def _outcomes(path: Path, where: str, data: Any, base: dict[str, Outcome]) -> dict[str, Outcome]:
    if data is None:
        return dict(base)
    if not isinstance(data, dict) or set(data) - set(OUTCOMES):
        raise AuditDataError(f"{path}: {where}: a mapping of {', '.join(OUTCOMES)}")
    out = dict(base)
    for name, spec in data.items():
        if not isinstance(spec, dict) or spec.get("status") not in STATUSES or \
                spec.get("severity") not in SEVERITIES:
            raise AuditDataError(f"{path}: {where}.{name}: needs status ({', '.join(STATUSES)})"
                                 f" and severity ({', '.join(SEVERITIES)})")
        out[name] = Outcome(spec["status"], spec["severity"])
    return out


def _values(path: Path, where: str, value: Any) -> tuple[Any, ...] | None:
    if value == ANY:
        return None
    if not isinstance(value, list):
        raise AuditDataError(f"{path}: {where}: a list of values, or `any`")
    return tuple(value)


def _rewrite(path: Path, where: str, item: Any) -> Rewrite:
    if not isinstance(item, dict) or not {"from", "to", "at", "why"} <= set(item) or \
            set(item) - {"from", "to", "at", "why", "when"}:
        raise AuditDataError(f"{path}: {where}: needs from, to, at, why (and optional when)")
    if not isinstance(item["at"], str) or not item["at"]:
        raise AuditDataError(f"{path}: {where}.at: the source lines, e.g. server_args.py:3787")
    when = item.get("when") or []
    if not isinstance(when, list):
        raise AuditDataError(f"{path}: {where}.when: a list of conditions")
    return Rewrite(_values(path, f"{where}.from", item["from"]), item["to"],
                   tuple(_req(path, f"{where}.when[{i}]", r) for i, r in enumerate(when)),
                   item["at"], " ".join(str(item["why"]).split()))


def load(path: Path) -> tuple[Flag, ...]:
    data = _load(path)
    base = _outcomes(path, "report", data.get("report"), {})
    if set(base) != set(OUTCOMES):
        raise AuditDataError(f"{path}: report: every outcome needs a default "
                             f"({', '.join(OUTCOMES)})")
    flags = data.get("flags")
    if not isinstance(flags, dict) or not flags:
        raise AuditDataError(f"{path}: flags: a mapping of ServerArgs fields")
    out = []
    for name, spec in flags.items():
        where = f"flags.{name}"
        bad = factnames.problem(f"server.{name}")
        if bad:
            raise AuditDataError(f"{path}: {where}: {bad}")
        if not isinstance(spec, dict) or not {"default", "default_at", "unresolved"} <= set(spec):
            raise AuditDataError(f"{path}: {where}: needs default, default_at, unresolved")
        unknown_keys = set(spec) - {"default", "default_at", "unresolved", "aliases",
                                    "rewrites", "report", "later"}
        if unknown_keys:
            raise AuditDataError(f"{path}: {where}: unknown key {sorted(unknown_keys)[0]!r}")
        aliases = spec.get("aliases") or {}
        if not isinstance(aliases, dict):
            raise AuditDataError(f"{path}: {where}.aliases: a mapping of spelling: value")
        out.append(Flag(
            name=str(name), default=spec["default"], default_at=str(spec["default_at"]),
            unresolved=_values(path, f"{where}.unresolved", spec["unresolved"]) or (),
            aliases={str(k): v for k, v in aliases.items()},
            rewrites=tuple(_rewrite(path, f"{where}.rewrites[{i}]", r)
                           for i, r in enumerate(spec.get("rewrites") or [])),
            report=_outcomes(path, f"{where}.report", spec.get("report"), base),
            later=" ".join(str(spec.get("later") or "").split())))
    return tuple(out)
