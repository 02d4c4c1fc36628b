"""What ran agrees with what is declared: patchset's tracer, in every server process.

Deploy starts each server with the tracer (patchset/agent/lib/tracer.py; `trace: false` in
hosts.yaml turns it off), which records per process which of each applied patch's
functions ran. A declared state is a reasoning from `requires`; a record is a fact:

* `trace[inert-but-ran]` (high): a patch declared inert or gated off executed;
* `trace[declared-active-not-run]`: a process that watched all of an active patch's code
  returned forward passes of every mode its path serves, and none of that code ran: a
  dispatch condition is missing from its `requires` (read the code that chose another
  path). Request handling, rejected requests and other processes' work never count
  (auditor/observed.py);
* `trace[path-disagrees]`: a patch tagged prefill (decode) ran in a decode (extend)
  forward pass: its `path` tag is wrong (the seeds' "decode-only" kernels served prefill
  chunks);
* `trace[unavailable]`: a process could not watch everything (why, per pid).

A server without records (tracing off, or a unit patchset did not deploy) gets no finding
here: its patch states say `evidence: declared`.
"""

from __future__ import annotations

from ..model import Evidence, Finding
from ..observed import describe, modes_ran, path_disagreement, records, unavailable, word_for
from .base import AuditContext, Reporter

ID = "trace"
SEVERITY = "medium"
TAGS = ("process", "observed")
SUB_TAGS = ("inert-but-ran", "declared-active-not-run", "path-disagrees", "unavailable")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host, server in ctx.servers():
        subject = f"{server.id} (pid {server.main.pid})"
        if not records(server):
            continue            # tracing off: every state of this server says `declared`
        ev = (Evidence.of("trace records", server.trace, len(records(server))),)
        found_any = False
        for st in ctx.states(host, server).values():
            if st.contradiction == "inert-but-ran":
                found_any = True
                out.append(finding(
                    host.host, f"{server.id} {st.patch}", f"not run ({st.declared})",
                    "; ".join(describe(e) for e in st.ran[:3]), "fail", st.reason, ev,
                    sub="inert-but-ran", severity="high", patches=(st.patch,)))
            elif st.contradiction == "declared-active-not-run":
                found_any = True
                out.append(finding(
                    host.host, f"{server.id} {st.patch}", "its code ran after work",
                    "none of its code ran", "fail", st.reason, ev,
                    sub="declared-active-not-run", patches=(st.patch,)))
        for patch in ctx.series.patches:
            word = word_for(server, patch.name)
            wrong = path_disagreement(patch.path, modes_ran(server, word, patch.gate is not None)
                                      ) if word else None
            if wrong:
                found_any = True
                out.append(finding(host.host, f"{server.id} {patch.name}",
                                   f"runs in {patch.path} forward passes only", wrong, "fail",
                                   f"{patch.name}: {wrong}", ev, sub="path-disagrees",
                                   patches=(patch.name,)))
        for pid, why in unavailable(server):
            found_any = True
            out.append(finding(host.host, f"{subject} process {pid}", "every target watched",
                               why, "warn", f"pid {pid}: {why}", ev, sub="unavailable"))
        if not found_any:
            out.append(finding(host.host, subject, "what ran agrees with what is declared",
                               "agrees", "pass", "", ev))
    return out
