"""What the tracer saw: which targets of a patch ran in a server's processes.

The records (patchset/agent/tracer.py, gathered as Server.trace) say, per process, which
targets it watched and when each first ran. A patch is *observed* when a target of it ran
in any process of the server; *observed not to run* when the server served work (a
`~work` marker ran: a forward batch, a generate request) and none of its watched targets
did; otherwise the state stays *declared* (tracing off, or no work served yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from patchset.agent.staleness import PATCHES_VAR

from .model import Server

WORK = "~work"
MODULE = "<module>"


@dataclass(frozen=True)
class Observation:
    patch: str                       # name:sha12
    watched: bool                    # some process watched a target of it
    ran: tuple[dict, ...]            # {pid, title, target, first, via}
    work: tuple[dict, ...]           # the served-work markers that ran
    processes: int

    @property
    def not_run_after_work(self) -> bool:
        return self.watched and not self.ran and bool(self.work)


def records(server: Server) -> list[dict]:
    return list(server.trace.value or []) if server.trace.known else []


def observe(server: Server, patch: str) -> Observation | None:
    """`patch` is `name:sha12`; None when the server has no trace records at all."""
    recs = [r for r in records(server) if r.get("pid") is not None]
    if not recs:
        return None
    ran, imported, work, functions, watched = [], [], [], False, False
    for rec in recs:
        for target, patches in (rec.get("targets") or {}).items():
            hit = (rec.get("hits") or {}).get(target)
            mine = patch in (patches or [])
            module_only = target.endswith(":" + MODULE)
            watched |= mine
            functions |= mine and not module_only
            if hit is None:
                continue
            entry = {"pid": rec["pid"], "title": rec.get("title"), "target": target,
                     "first": hit.get("first"), "via": hit.get("via")}
            if mine:
                (imported if module_only else ran).append(entry)
            if WORK in {str(p) for p in patches or []}:
                work.append(entry)
    # a module import shows the code was loaded, not that the patched path ran: it counts
    # only for a patch whose every target is module-level
    return Observation(patch, watched, tuple(ran if functions else imported), tuple(work),
                       len(recs))


def loaded(server: Server) -> list[str] | None:
    """The patches (`name:sha12`) the server's processes loaded at start: its main
    process's PATCHSET_PATCHES (what deploy started it with); None when unknown."""
    env = server.main.environ
    if env.known and env.value.get(PATCHES_VAR) is not None:
        return env.value[PATCHES_VAR].split()
    for rec in records(server):
        if rec.get("started_with"):
            return str(rec["started_with"]).split()
    return None


def unavailable(server: Server) -> list[tuple[int | None, str]]:
    """(pid, why) for every note of a record that tracing failed somewhere."""
    return [(rec.get("pid"), why) for rec in records(server)
            for why in rec.get("unavailable") or []]


def describe(entry: dict) -> str:
    via = f" (via {entry['via']})" if entry.get("via") else ""
    return f"{entry['target']}{via} ran in pid {entry['pid']} ({entry.get('title')})"
