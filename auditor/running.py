"""What a server runs for one ServerArgs field, read from its sources in order: one
reading for the `resolved-args` check and the fact table (`server.X` in `requires` and
the hazards), so a condition and the check never disagree on what a server runs.

SGLang rewrites some fields at startup (an `auto` backend is decided in ServerArgs'
hooks or in the scheduler), and /server_info may still show the undecided value. The
sources, first decided value wins: /server_info; its `internal_states` (each scheduler's
own ServerArgs; all must agree); the `server_args=` line the server logged at startup (its
unit's journal, redacted on the host)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from patchset.agent.lib.facts.base import FactValue, Provenance

from .model import Evidence, Server
from .values import same, shown

INFO = "/server_info"
SCHEDULERS = "/server_info internal_states (the scheduler's own value)"
JOURNAL = "the server_args= line it logged at startup (journal)"


@dataclass(frozen=True)
class Running:
    """The value a server runs for a field, where it was read (source "" when no source
    shows a decided value), why the earlier sources did not, and the evidence."""

    value: Any
    source: str
    whys: tuple[str, ...]
    evidence: list[Evidence] = field(default_factory=list)
    provenance: Provenance | None = None

    def fact(self, name: str) -> FactValue:
        if self.source:
            return FactValue(self.value, provenance=self.provenance, source=self.source)
        return FactValue.unknown(f"what {name} the server runs is not shown ("
                                 + "; ".join(self.whys) + "): set it explicitly in the "
                                 "unit to audit it", self.provenance)


def running(server: Server, name: str, unresolved: tuple[Any, ...]) -> Running:
    """`name` as `server` runs it; a value `same` as one of `unresolved` (auto, unset) is
    not decided and the next source is read."""
    def decided(value: Any) -> bool:
        return not any(same(value, u) for u in unresolved)
    info, log = server.server_info, server.server_args_log
    evidence = [Evidence.of(f"server_info {name}", info, shown(info.value.get(name))
                            if info.known else None),
                Evidence.of(f"journal server_args= {name}", log,
                            shown(log.value["args"].get(name)) if log.known else None)]
    whys: list[str] = []
    if info.known:
        if name in info.value and decided(info.value[name]):
            return Running(info.value[name], INFO, (), evidence, info.provenance)
        whys.append(f"/server_info says {shown(info.value[name])}" if name in info.value
                    else f"/server_info has no field {name}")
        ranks = [s[name] for s in info.value.get("internal_states") or []
                 if isinstance(s, dict) and name in s]
        values = {shown(v) for v in ranks if decided(v)}
        if len(values) == 1 and all(decided(v) for v in ranks):
            return Running(ranks[0], SCHEDULERS, tuple(whys), evidence, info.provenance)
        if len(values) > 1:
            whys.append(f"its internal_states disagree ({', '.join(sorted(values))})")
    else:
        whys.append(f"/server_info unavailable ({info.reason})")
    if not log.known:
        whys.append(f"no startup line: {log.reason}")
        return Running(None, "", tuple(whys), evidence, info.provenance)
    args = log.value["args"]
    if name in args and decided(args[name]):
        return Running(args[name], JOURNAL, tuple(whys), evidence, log.provenance)
    if name in args:
        whys.append(f"its startup server_args= line says {shown(args[name])}")
    elif name in log.value.get("unparsed", ()):
        whys.append(f"its startup server_args= line has {name} as no literal")
    else:
        whys.append(f"its startup server_args= line has no {name}" +
                    (" (the line is cut short)" if log.value.get("truncated") else ""))
    return Running(None, "", tuple(whys), evidence, log.provenance)
