"""`patchset trace HOST`: per server and process, per patch, which targets ran and which
did not, from the audit's facts and states (the same gathering, one round trip).

A view, not a new judgement: the contradictions are the states' (auditor/states.py), so
`trace` and `audit` can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .model import Report
from .observed import ProcessRecord, is_marker, name, records, split_flag


EVIDENCE = {"+": "own", "=": "unconditional", "?": "conditional", "!": "kernel", "": "module"}


@dataclass(frozen=True)
class TargetRow:
    target: str                      # module:qualname
    patches: tuple[str, ...]         # name:sha12 (or ~forward: the server's forward entry)
    ran: bool                        # a call returned (not via an enclosing function)
    first: float | None = None       # first entry
    via: str | None = None
    watched: str | None = None       # how it was watched, None: not (yet) watchable
    returned: float | None = None
    raised: str | None = None
    modes: tuple[str, ...] = ()      # forward modes it was seen in ('-': outside any)
    why: str | None = None           # why it is not watched
    evidence: str = ""               # what a returned call shows: own | unconditional |
                                     # conditional | kernel | module (tracer.FLAGS)


@dataclass(frozen=True)
class ProcessTrace:
    pid: int | None
    title: str | None
    mode: str | None
    targets: tuple[TargetRow, ...]
    unavailable: tuple[str, ...]
    forwards: dict[str, int] = field(default_factory=dict)   # forward mode -> count


@dataclass(frozen=True)
class PatchTrace:
    patch: str
    state: str
    evidence: str
    contradiction: str | None
    reason: str
    observation: str | None = None
    modes: tuple[str, ...] = ()


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
            st.patches = [PatchTrace(s.patch, s.state, s.evidence, s.contradiction, s.reason,
                                     s.observation, s.modes)
                          for s in host.states if s.server == server.id]
            out.append(st)
    return out


def unobserved(report: Report, views: list[ServerTrace]) -> list[str]:
    """Hosts reached whose servers left no trace record (or that run none): nothing was
    observed there, so `trace` has no verdict for them (exit 5), never a pass."""
    traced = {v.host for v in views if v.traced}
    return [h.host for h in report.hosts
            if h.facts.reachable and not h.facts.error and h.host not in traced]


def _process(rec: dict, live: dict[int, str]) -> ProcessTrace:
    """One process's record; its title as the process shows it now (a scheduler sets its
    title after the tracer's first record)."""
    typed = ProcessRecord.of(rec)
    rows = []
    for target, patches in sorted(typed.targets.items(),
                                  key=lambda kv: (is_marker(kv[1]), kv[0])):
        hit, watch = typed.hits.get(target), typed.watched.get(target)
        rows.append(TargetRow(name(target), patches, bool(hit and hit.ran),
                              hit.first if hit else None, hit.via if hit else None,
                              watch.how if watch else None, hit.returned if hit else None,
                              hit.raised if hit else None,
                              tuple(sorted(hit.modes)) if hit else (),
                              watch.why if watch else None,
                              "forward entry" if is_marker(patches) else
                              EVIDENCE[split_flag(target)[0]]))
    now = live.get(typed.pid) if typed.pid is not None else None
    return ProcessTrace(typed.pid, now or typed.title, rec.get("mode"),
                        tuple(rows), typed.unavailable,
                        {m: f.count for m, f in sorted(typed.forwards.items())})


def to_json(views: list[ServerTrace]) -> list[dict]:
    return [dict(asdict(v), contradictions=[p.patch for p in v.contradictions])
            for v in views]
