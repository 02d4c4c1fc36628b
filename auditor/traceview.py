"""`patchset trace HOST`: per server and process, per patch, which targets ran and which
did not, from the audit's facts and states (the same gathering, one round trip).

A view, not a new judgement: the contradictions are the states' (auditor/states.py), so
`trace` and `audit` can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .model import Report
from .observed import WORK, records


@dataclass(frozen=True)
class TargetRow:
    target: str                      # module:qualname
    patches: tuple[str, ...]         # name:sha12 (or ~work: patchset's markers of work)
    ran: bool
    first: float | None = None
    via: str | None = None
    watched: str | None = None       # how it was watched, None: could not be


@dataclass(frozen=True)
class ProcessTrace:
    pid: int | None
    title: str | None
    mode: str | None
    targets: tuple[TargetRow, ...]
    unavailable: tuple[str, ...]


@dataclass(frozen=True)
class PatchTrace:
    patch: str
    state: str
    evidence: str
    contradiction: str | None
    reason: str


@dataclass
class ServerTrace:
    host: str
    server: str
    traced: bool
    why: str = ""                    # why there are no records
    processes: list[ProcessTrace] = field(default_factory=list)
    patches: list[PatchTrace] = field(default_factory=list)

    @property
    def contradictions(self) -> list[PatchTrace]:
        return [p for p in self.patches if p.contradiction]


def view(report: Report) -> list[ServerTrace]:
    out = []
    for host in report.hosts:
        if not host.facts.reachable or host.facts.error:
            continue
        for server in host.facts.sglang_servers:
            recs = records(server)
            st = ServerTrace(host.host, server.id, bool(recs),
                             "" if recs else server.trace.reason)
            live = {server.main.pid: server.main.title.split(" ")[0]} | {
                c.pid: c.title for c in server.children}
            st.processes = [_process(r, live) for r in recs]
            st.patches = [PatchTrace(s.patch, s.state, s.evidence, s.contradiction, s.reason)
                          for s in host.states if s.server == server.id]
            out.append(st)
    return out


def _process(rec: dict, live: dict[int, str]) -> ProcessTrace:
    """One process's record; its title as the process shows it now (a scheduler sets its
    title after the tracer's first record)."""
    hits, watched = rec.get("hits") or {}, rec.get("watched") or {}
    rows = tuple(TargetRow(t, tuple(p), t in hits, (hits.get(t) or {}).get("first"),
                           (hits.get(t) or {}).get("via"), watched.get(t))
                 for t, p in sorted((rec.get("targets") or {}).items(),
                                    key=lambda kv: (WORK in kv[1], kv[0])))
    return ProcessTrace(rec.get("pid"), live.get(rec.get("pid")) or rec.get("title"),
                        rec.get("mode"), rows,
                        tuple(rec.get("unavailable") or ()))


def to_json(views: list[ServerTrace]) -> list[dict]:
    return [dict(asdict(v), contradictions=[p.patch for p in v.contradictions])
            for v in views]
